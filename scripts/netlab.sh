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
#   netlab.sh wan I DELAY_MS [LOSS_PCT] [JITTER_MS]
#                                give host I's link distance: its veth is replaced by a
#                                lors-wan wire (a userspace delay line between two TAP
#                                devices: this kernel has no netem) adding DELAY_MS one way
#                                in each direction, LOSS_PCT random loss each way and up to
#                                JITTER_MS (order kept); the link keeps its rate. The RTT
#                                between two hosts is the sum of their links' two delays.
#   netlab.sh tcp I|all untuned|tuned
#                                "untuned" caps host I's TCP buffers at 64 KiB (tcp_rmem and
#                                tcp_wmem max; no window beyond it), as the untuned hosts of
#                                the "Video IBPster" experiments; "tuned" gives back the
#                                machine's own settings
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
#   NL_MTU     MTU of every host link (default 1500; 9000 cuts a wire's packets six-fold)
#   NL_WAN     the lors-wan binary (default: lors-wan in PATH, else target/release/ or
#              target/debug/ beside this script)
#
# This copy adds `wan` and NL_MTU to the workplace's netlab.sh.
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
MTU="${NL_MTU:-1500}"
WAND="/run/lors-netlab"  # the wires' pid and log files
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
  rm -f "$WAND/$P-wan"*
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
    ip -n "$HUB" link set "p$i" mtu "$MTU" up
    ip -n "$ns" link set eth0 mtu "$MTU" up
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

wan_bin() {
  local here; here="$(cd "$(dirname "$0")/.." && pwd)"
  if [ -n "${NL_WAN:-}" ]; then echo "$NL_WAN"; return; fi
  if command -v lors-wan >/dev/null 2>&1; then command -v lors-wan; return; fi
  for b in "$here/target/release/lors-wan" "$here/target/debug/lors-wan"; do
    [ -x "$b" ] && { echo "$b"; return; }
  done
  die "wan: no lors-wan binary (cargo build --release -p lors-wan, or set NL_WAN)"
}

# the rate of a tbf on ns dev, in Mbit/s (0 when there is none)
rate_of() {
  tc -n "$1" qdisc show dev "$2" 2>/dev/null | sed -n 's/.* rate \([0-9]*\)Mbit.*/\1/p;s/.* rate \([0-9]*\)Gbit.*/\1000/p' | head -1 | grep . || echo 0
}

cmd_wan() {
  local i="${1:-}" d="${2:-}" loss="${3:-0}" jit="${4:-0}" ns r wan log
  ns=$(host_ns "$i")
  ip netns list | grep "^$ns\b" >/dev/null || die "wan: no host $i"
  [[ "$d" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "wan: DELAY_MS must be a number of ms"
  [ "$(mode_now)" = bridge ] || die "wan: needs the bridge mode"
  wan=$(wan_bin)
  mkdir -p "$WAND"
  r=$(rate_of "$ns" eth0)
  # The old link (a veth, or an earlier wire: its process goes with its devices).
  ip -n "$HUB" link del "p$i" 2>/dev/null || true
  ip -n "$ns" link del eth0 2>/dev/null || true
  [ -f "$WAND/$P-wan$i.pid" ] && kill "$(cat "$WAND/$P-wan$i.pid")" 2>/dev/null || true
  log="$WAND/$P-wan$i.log"
  ip netns exec "$HUB" setsid "$wan" --tap "w$i" --tap "p$i" --delay "${d}ms" \
    --loss "$loss" --jitter "${jit}ms" --seed "$i" >"$log" 2>&1 < /dev/null &
  echo $! > "$WAND/$P-wan$i.pid"
  for _ in $(seq 1 50); do grep -q ready "$log" 2>/dev/null && break; sleep 0.1; done
  grep -q ready "$log" || die "wan: lors-wan did not start: $(cat "$log")"
  ip -n "$HUB" link set "w$i" netns "$ns"
  ip -n "$ns" link set "w$i" name eth0
  ip -n "$ns" addr add "$NET.$i/24" dev eth0
  ip -n "$ns" link set eth0 mtu "$MTU" up
  ip -n "$HUB" link set "p$i" master br0
  ip -n "$HUB" link set "p$i" mtu "$MTU" up
  set_tbf "$ns" eth0 "$r"
  set_tbf "$HUB" "p$i" "$r"
  # The new device has a new address: nobody waits for a stale entry.
  local h; for h in $(hosts); do ip -n "$(host_ns "$h")" neigh flush all 2>/dev/null || true; done
  echo "netlab: host $i: ${d} ms each way, loss ${loss} %, jitter ${jit} ms, ${r} Mbit/s" >&2
}

cmd_tcp() {
  local which="${1:-}" how="${2:-}" h rmem wmem
  case "$how" in
    untuned) rmem="4096 65536 65536"; wmem="4096 16384 65536" ;;
    tuned) rmem="$(sysctl -n net.ipv4.tcp_rmem)"; wmem="$(sysctl -n net.ipv4.tcp_wmem)" ;;
    *) die "tcp: untuned or tuned" ;;
  esac
  for h in $(if [ "$which" = all ]; then hosts; else echo "$which"; fi); do
    ip netns list | grep "^$(host_ns "$h")\b" >/dev/null || die "tcp: no host $h"
    ip netns exec "$(host_ns "$h")" sysctl -qw net.ipv4.tcp_rmem="$rmem" net.ipv4.tcp_wmem="$wmem"
  done
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
  wan) cmd_wan "$@" ;;
  tcp) cmd_tcp "$@" ;;
  exec) cmd_exec "$@" ;;
  addr) host_addr "${1:?host index}" ;;
  status) cmd_status ;;
  *) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 1 ;;
esac
