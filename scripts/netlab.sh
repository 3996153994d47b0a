#!/usr/bin/env bash
# Vendored from the workplace's shared/netlab.sh so tests and benchmarks run on a clean
# checkout; keep in step with it.
# netlab.sh - tiny emulated "WAN" of N hosts built from Linux network namespaces.
#
# usage:
#   netlab.sh up N RATE_MBIT     create hosts 1..N, every access link limited to RATE_MBIT
#                                Mbit/s in both directions (tbf); 0 = unlimited. Recreates
#                                the lab if it already exists.
#   netlab.sh rate I RATE_MBIT   change host I's access link rate (0 = unlimited)
#   netlab.sh exec I CMD [ARG..] run CMD inside host I (I = 1..N, or "hub")
#   netlab.sh addr I             print host I's address (use it in commands run in the lab)
#   netlab.sh status             list hosts, addresses, qdiscs and byte counters
#   netlab.sh down               stop every process left in the lab's namespaces (by PID)
#                                and delete the namespaces
#
# environment:
#   NL_PREFIX  name prefix of the namespaces (default "nl": nl-hub, nl-h1, nl-h2, ...)
#   NL_NET     first three octets of the lab subnet (default 10.213.7). The subnet exists
#              ONLY inside the lab's namespaces: the root namespace gets no interface or
#              route into it, so lab traffic can never leave the machine.
#   NL_MODE    "bridge" (default: one Linux bridge in the hub namespace, hosts are
#              NL_NET.I/24) or "route" (hub namespace routes; host I is A.B.(100+I).2/24
#              with A.B from NL_NET; used automatically when the bridge cannot be created)
#   NL_BURST_MS  tbf bucket depth in ms of line rate (default 10; at least 128 KiB so GSO
#              super-packets pass)
#
# topology:   nl-h1 [eth0]--veth--[p1]\
#             nl-h2 [eth0]--veth--[p2]-- br0 (in nl-hub, unlimited core)
#             ...                      /
# Each host's eth0 egress (upload) and the hub port egress towards it (download) carry a
# tbf qdisc with the given rate, so a host's link is RATE up and RATE down. The core
# (bridge) is not limited. No delay emulation: this kernel has no netem (see peers.md).
#
# example:
#   ./netlab.sh up 5 100 && ./netlab.sh rate 1 1000
#   ./netlab.sh exec 2 iperf3 -s -D -B "$(./netlab.sh addr 2)"
#   ./netlab.sh exec 1 iperf3 -c "$(./netlab.sh addr 2)" -t 5
#   ./netlab.sh down
set -euo pipefail

P="${NL_PREFIX:-nl}"
NET="${NL_NET:-10.213.7}"
MODE="${NL_MODE:-bridge}"
BURST_MS="${NL_BURST_MS:-10}"
HUB="$P-hub"

die() { echo "netlab: $*" >&2; exit 1; }
host_ns() { echo "$P-h$1"; }

# list host indexes that currently exist
hosts() { ip netns list | awk '{print $1}' | sed -n "s/^$P-h\([0-9][0-9]*\)$/\1/p" | sort -n; }

mode_now() { ip -n "$HUB" link show br0 >/dev/null 2>&1 && echo bridge || echo route; }

# route mode: host i lives in its own /24 <A.B>.<100+i>.0 (hub side .1, host .2)
route_net() { echo "${NET%.*}.$((100 + $1))"; }

host_addr() { # host index -> address
  if [ "$(mode_now)" = bridge ]; then echo "$NET.$1"; else echo "$(route_net "$1").2"; fi
}

# tbf on one device: ns dev rate_mbit
set_tbf() {
  local ns="$1" dev="$2" r="$3" burst
  tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
  [ "$r" = 0 ] && return 0
  burst=$(( r * 1000000 / 8 * BURST_MS / 1000 ))
  [ "$burst" -lt 131072 ] && burst=131072
  tc -n "$ns" qdisc add dev "$dev" root tbf rate "${r}mbit" burst "$burst" latency 50ms
}

cmd_down() {
  local ns p
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$P-(hub|h[0-9]+)$" || true); do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
  done
  sleep 0.3
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$P-(hub|h[0-9]+)$" || true); do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$ns"
  done
}

cmd_up() {
  local n="${1:-}" r="${2:-}" i ns
  [[ "$n" =~ ^[0-9]+$ && "$n" -ge 1 && "$n" -le 150 ]] || die "up: N must be 1..150"
  [[ "$r" =~ ^[0-9]+$ ]] || die "up: RATE_MBIT must be an integer (0 = unlimited)"
  cmd_down
  ip netns add "$HUB"
  ip -n "$HUB" link set lo up
  if [ "$MODE" = bridge ]; then
    if ! ip -n "$HUB" link add br0 type bridge 2>/dev/null; then
      echo "netlab: bridge unavailable, falling back to routed hub" >&2; MODE=route
    else
      ip -n "$HUB" link set br0 up
    fi
  fi
  [ "$MODE" = route ] && ip netns exec "$HUB" sysctl -qw net.ipv4.ip_forward=1
  for i in $(seq 1 "$n"); do
    ns=$(host_ns "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$HUB" link add "p$i" type veth peer name eth0 netns "$ns"
    if [ "$MODE" = bridge ]; then
      ip -n "$HUB" link set "p$i" master br0
      ip -n "$ns" addr add "$NET.$i/24" dev eth0
    else
      ip -n "$HUB" addr add "$(route_net "$i").1/24" dev "p$i"
      ip -n "$ns" addr add "$(route_net "$i").2/24" dev eth0
    fi
    ip -n "$HUB" link set "p$i" up
    ip -n "$ns" link set eth0 up
    if [ "$MODE" = route ]; then
      ip -n "$ns" route add default via "$(route_net "$i").1"
    fi
    set_tbf "$ns" eth0 "$r"
    set_tbf "$HUB" "p$i" "$r"
  done
  if [ "$r" = 0 ]; then echo "netlab: $n hosts up ($MODE mode), links unlimited" >&2; else echo "netlab: $n hosts up ($MODE mode), links ${r} Mbit/s each way" >&2; fi
}

cmd_rate() {
  local i="${1:-}" r="${2:-}"
  ip netns list | grep "^$(host_ns "$i")\b" >/dev/null || die "rate: no host $i"
  [[ "$r" =~ ^[0-9]+$ ]] || die "rate: RATE_MBIT must be an integer"
  set_tbf "$(host_ns "$i")" eth0 "$r"
  set_tbf "$HUB" "p$i" "$r"
}

cmd_exec() {
  local i="${1:-}"; shift || true
  [ $# -ge 1 ] || die "exec: need a command"
  if [ "$i" = hub ]; then exec ip netns exec "$HUB" "$@"; fi
  ip netns list | grep "^$(host_ns "$i")\b" >/dev/null || die "exec: no host $i"
  exec ip netns exec "$(host_ns "$i")" "$@"
}

cmd_status() {
  local i
  ip netns list | grep "^$HUB\b" >/dev/null || { echo "netlab: down"; return 0; }
  echo "mode: $(mode_now)"
  for i in $(hosts); do
    printf 'host %s  ns %s  addr %s\n' "$i" "$(host_ns "$i")" "$(host_addr "$i")"
    tc -s -n "$(host_ns "$i")" qdisc show dev eth0 | sed 's/^/   up:   /' | head -3
    tc -s -n "$HUB" qdisc show dev "p$i" | sed 's/^/   down: /' | head -3
  done
}

[ "$(id -u)" = 0 ] || die "needs root (ip netns)"
sub="${1:-}"; shift || true
case "$sub" in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  rate) cmd_rate "$@" ;;
  exec) cmd_exec "$@" ;;
  addr) host_addr "${1:?host index}" ;;
  status) cmd_status ;;
  *) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 1 ;;
esac
