#!/usr/bin/env bash
# Depot loopback benchmark: STORE/LOAD for 1, 16, 64 MiB beside iperf3
# measured in the same run, then small WRITEs with and without fsync.
# Installs iperf3 from Debian's packages if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v iperf3 >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3
fi
cargo bench --locked -p lors-depot --bench loopback
cargo bench --locked -p lors-depot --bench writes
