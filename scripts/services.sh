#!/usr/bin/env bash
# Test services the suite needs besides our own processes, installed from
# Debian's packages when missing: a throwaway PostgreSQL (for the L-Bone's
# PostgreSQL store), headless Chromium + ChromeDriver (for the dashboard),
# promtool (to check the metrics endpoints), iproute2 (for the network lab), fuse3, rsync, sqlite3 and gcc (for xio).
#
#   source scripts/services.sh   # exports LORS_TEST_PG_URL, LORS_REQUIRE_SERVICES,
#                                # LORS_CHROMIUM, LORS_CHROMEDRIVER, LORS_PROMTOOL;
#                                # stops PostgreSQL on exit
set -euo pipefail

_apt_install() {
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

_pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

if [ -z "$(_pg_bin)" ]; then
    echo "installing PostgreSQL (Debian package postgresql)"
    _apt_install postgresql
fi
# The network-lab tests (crates/cli/tests/it/lab.rs) build namespaces and
# tbf links with iproute2 (ip, tc).
if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
    echo "installing iproute2 (network lab)"
    _apt_install iproute2
fi
# The lab's wire with distance (crates/wan) is checked with ping.
if ! command -v ping >/dev/null 2>&1; then
    echo "installing iputils-ping (the lab's wire with distance)"
    _apt_install iputils-ping
fi
# xio: the FUSE tests mount with fuser's own mount(2) as root or fusermount3
# (package fuse3) otherwise, and run rsync and sqlite3 on it; the C test
# program is compiled with gcc against libxio.so.
_need=()
command -v fusermount3 >/dev/null 2>&1 || _need+=(fuse3)
command -v sqlite3 >/dev/null 2>&1 || _need+=(sqlite3)
command -v rsync >/dev/null 2>&1 || _need+=(rsync)
# The mount served by unmodified servers: Debian's nginx, fetched with curl.
command -v nginx >/dev/null 2>&1 || _need+=(nginx)
command -v curl >/dev/null 2>&1 || _need+=(curl)
command -v gcc >/dev/null 2>&1 || _need+=(gcc libc6-dev)
if [ "${#_need[@]}" -gt 0 ]; then
    echo "installing ${_need[*]} (xio: FUSE mount, the servers on it, C test program)"
    _apt_install "${_need[@]}"
fi
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    echo "installing Chromium and ChromeDriver (Debian packages chromium, chromium-driver)"
    _apt_install chromium chromium-driver
fi

# A private cluster on a free port, owned by the postgres user when we are
# root (the server refuses to run as root), trusted local connections only.
_pg="$(_pg_bin)"
_pg_dir="$(mktemp -d /tmp/lors-pg.XXXXXX)"
_pg_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
_as_pg() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}
[ "$(id -u)" -ne 0 ] || chown postgres "$_pg_dir"
_as_pg "$_pg/initdb" -D "$_pg_dir/data" -U postgres --auth=trust -E UTF8 >/dev/null
_as_pg "$_pg/pg_ctl" -D "$_pg_dir/data" -l "$_pg_dir/log" -w -o "-p $_pg_port -k $_pg_dir -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null
_lors_services_stop() {
    _as_pg "$_pg/pg_ctl" -D "$_pg_dir/data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$_pg_dir"
}
trap _lors_services_stop EXIT

export LORS_TEST_PG_URL="postgres://postgres@127.0.0.1:$_pg_port/postgres"
export LORS_REQUIRE_SERVICES=1
if ! command -v promtool >/dev/null 2>&1; then
    echo "installing promtool (Debian package prometheus)"
    _apt_install prometheus
fi

export LORS_CHROMIUM="$(command -v chromium)"
export LORS_PROMTOOL="$(command -v promtool)"
export LORS_CHROMEDRIVER="$(command -v chromedriver)"
echo "PostgreSQL $("$_pg/postgres" --version | awk '{print $3}') on 127.0.0.1:$_pg_port; $("$LORS_CHROMIUM" --version 2>/dev/null | head -n 1)"
