#!/usr/bin/env python3
"""Validates the network lab's wire with distance (`lors-wan`, docs/bench.md
"Distance in the network lab") against what it is set to: ping round trips
at several delays, the loss rate, TCP through a 100 Mbit/s link at 188 ms
beside what its window predicts, and the wire's own CPU use.

    sudo python3 bench/wancheck.py                  # the table on stderr and stdout
    sudo python3 bench/wancheck.py --out docs/bench/wan-validation.md

Every host link is built by scripts/netlab.sh; nothing leaves the lab's
namespaces.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, ensure_peers, machine, save_report  # noqa: E402

NETLAB = str(ROOT / "scripts" / "netlab.sh")


def lab(*args: str, check: bool = True) -> str:
    r = subprocess.run([NETLAB, *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise SystemExit(f"netlab.sh {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def addr(i: int) -> str:
    return lab("addr", str(i)).strip()


def ping(src: int, dst: int, count: int, interval: float) -> tuple[float, float, float]:
    """(min, avg, loss %) of `count` pings, after two that settle ARP."""
    lab("exec", str(src), "ping", "-c", "2", "-W", "2", addr(dst), check=False)
    out = lab("exec", str(src), "ping", "-q", "-c", str(count), "-i", str(interval), addr(dst), check=False)
    loss = float(re.search(r"([\d.]+)% packet loss", out).group(1))
    m = re.search(r"= ([\d.]+)/([\d.]+)/", out)
    return (float(m.group(1)), float(m.group(2)), loss) if m else (float("nan"), float("nan"), loss)


def wire_ticks(i: int) -> int:
    pid = open(f"/run/lors-netlab/nl-wan{i}.pid").read().strip()
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def iperf(client: int, server: int, secs: int, streams: int) -> float:
    """Mbit/s received by `client` from `server` (iperf3 -R)."""
    out = lab("exec", str(client), "iperf3", "-J", "-R", "-c", addr(server), "-t", str(secs), "-P", str(streams))
    return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="also write the Markdown report here")
    a = ap.parse_args()
    ensure_peers()
    subprocess.run(["cargo", "build", "--release", "--locked", "-q", "-p", "lors-wan"], cwd=ROOT, check=True)
    rows = []
    try:
        lab("up", "2", "0")
        for one_way in [0.0, 5.0, 47.0, 94.0, 150.0]:
            lab("wan", "1", str(one_way))
            lo, avg, _ = ping(2, 1, 100, 0.02)
            want = 2 * one_way
            off = f"{(avg - want) / want * 100:+.1f} %" if want else f"+{avg:.3f} ms"
            rows.append((f"ping RTT, {one_way:g} ms each way", f"{want:g} ms", f"min {lo:.2f}, avg {avg:.2f} ms ({off})"))
        lab("wan", "1", "5", "1")
        _, _, loss = ping(2, 1, 3000, 0.003)
        rows.append(("loss 1 % each way, 3000 pings", "1.99 % of round trips", f"{loss:.2f} %"))
        lab("up", "2", "100")
        lab("wan", "1", "94")
        lab("exec", "1", "iperf3", "-s", "-D", "-B", addr(1))
        time.sleep(0.5)
        for streams in [1, 8]:
            t0, w0 = time.time(), wire_ticks(1)
            got = iperf(2, 1, 20, streams)
            cpu = (wire_ticks(1) - w0) / 100 / (time.time() - t0) * 100
            rows.append((f"iperf3, 100 Mbit/s link, 188 ms RTT, 20 s, {streams} stream(s)", "100 Mbit/s (less slow start)", f"{got:.1f} Mbit/s; the wire {cpu:.0f} % of a core"))
        lab("tcp", "all", "untuned")
        got = iperf(2, 1, 10, 1)
        # A 64 KiB receive buffer advertises about half of it as window.
        rows.append(("iperf3, same, TCP buffers 64 KiB (untuned)", f"≈ {32768 * 8 / 0.188 / 1e6:.1f} Mbit/s (32 KiB window / RTT)", f"{got:.2f} Mbit/s"))
    finally:
        lab("down", check=False)
    text = "\n".join(
        [
            f"# lors-wan validation ({time.strftime('%Y-%m-%d')})",
            "",
            f"Machine: {machine()}.",
            "",
            "| check | target | measured |",
            "|---|---|---|",
            *[f"| {c} | {t} | {m} |" for c, t, m in rows],
            "",
        ]
    )
    print(text)
    save_report(text, a.out)


if __name__ == "__main__":
    main()
