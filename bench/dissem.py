#!/usr/bin/env python3
"""Dissemination benchmark ("DDMG: A Data Dissemination Mechanism for Grid Environments"): one file from a client to N sites in
the network lab, every host's link at R Mbit/s both ways. Needs root.

    python3 bench/dissem.py                          # N = 2,4,8; 48 MiB; 100 Mbit/s
    python3 bench/dissem.py --ns 4 --size 96M --out docs/bench/dissem.md

For each N, interleaved round after round, the wall time of:
  * `lors disseminate FILE --to <N depots>` (the sites relay to each other);
  * `lors disseminate --unicast` (the client sends the whole file to each);
  * BitTorrent with aria2c: a seeder on the client host, a leecher on each
    site host, a small tracker (bench/tracker.py); the time until the last
    leecher has the whole file.
Against the ideal S/R (the file once through one link). Targets:
dissemination <= 1.25 x S/R for every N; unicast ~ N x S/R.

Then heterogeneous sites (--slow-n sites, site 1 at R/10): every other site
within 1.25 x S/R, the slow one within 1.1 x its own S/(R/10), from the
per-site times `lors disseminate --json` reports.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, build_lors, ensure_peers, log, machine, make_file, median, save_report, stop_all, wait_port  # noqa: E402
from lab import DEPOT_PORT, netlab, ns  # noqa: E402

TRACKER_PORT = 6969


class Lab:
    """Sites on hosts 1..n (a depot each), the client on host n+1."""

    def __init__(self, lors: Path, d: Path, n: int, rate: int):
        self.n, self.client, self.d, self.procs = n, n + 1, d, []
        netlab("up", str(n + 1), str(rate))
        self.addr = {i: netlab("addr", str(i)) for i in range(1, n + 2)}
        for i in range(1, n + 1):
            dd = d / f"depot-{i}"
            shutil.rmtree(dd, ignore_errors=True)
            self.procs.append(subprocess.Popen(
                [*ns(i), str(lors), "depot", "--listen", f"{self.addr[i]}:{DEPOT_PORT}", "--data", str(dd),
                 "--size", "16G", "--sync", "never"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for i in range(1, n + 1):
            wait_port(self.addr[i], DEPOT_PORT, wrap=ns(self.client))
        self.procs.append(subprocess.Popen(
            [*ns(self.client), sys.executable, str(ROOT / "bench" / "tracker.py"), self.addr[self.client],
             str(TRACKER_PORT)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_port(self.addr[self.client], TRACKER_PORT, wrap=ns(self.client))

    def sites(self) -> str:
        return ",".join(f"{self.addr[i]}:{DEPOT_PORT}" for i in range(1, self.n + 1))

    def stop(self) -> None:
        stop_all(self.procs)
        netlab("down")


def disseminate(lab: Lab, lors: Path, src: Path, extra: list[str]) -> tuple[float, dict]:
    out = lab.d / "out.xnd"
    if out.exists():
        # The last round's replicas: freed, so the sites never fill, and its
        # exNode gone, which disseminate would not overwrite.
        sites = [a for site in lab.sites().split(",") for a in ("--depot", site)]
        subprocess.run([*ns(lab.client), str(lors), "trim", "--quiet", "--decrement", "--allow-holes", *sites,
                        str(out)], capture_output=True, timeout=600)
        out.unlink()
    t0 = time.monotonic()
    r = subprocess.run([*ns(lab.client), str(lors), "disseminate", str(src), "--to", lab.sites(), "-o", str(out),
                        "--json", *extra], capture_output=True, check=True, timeout=1800)
    took = time.monotonic() - t0
    summary = json.loads(r.stdout.decode().strip().splitlines()[-1])
    return took, summary


def bittorrent(lab: Lab, src: Path) -> float:
    """aria2c: seeder on the client, a leecher per site; seconds until the
    last leecher completes (each keeps seeding until then)."""
    work = lab.d / "bt"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    torrent = work / "f.torrent"
    announce = f"http://{lab.addr[lab.client]}:{TRACKER_PORT}/announce"
    subprocess.run(["mktorrent", "-a", announce, "-l", "18", "-o", str(torrent), str(src)], check=True,
                   stdout=subprocess.DEVNULL)
    common = ["aria2c", "--seed-ratio=0.0", "--enable-dht=false", "--enable-dht6=false", "--bt-enable-lpd=false",
              "--enable-peer-exchange=true", "--file-allocation=none", "--bt-tracker-interval=1",
              "--bt-max-peers=0", "--console-log-level=error", "--summary-interval=0", "-q",
              "--bt-request-peer-speed-limit=100M", "--max-overall-upload-limit=0"]
    seed = subprocess.Popen([*ns(lab.client), *common, f"--dir={src.parent}", "--bt-seed-unverified=true",
                             "--check-integrity=false", str(torrent)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)  # announced before the leechers ask
    hook = work / "hook.sh"
    hook.write_text("#!/bin/sh\ndate +%s.%N > \"$(dirname \"$3\")/done\"\n")
    hook.chmod(0o755)
    dirs = [work / f"site-{i}" for i in range(1, lab.n + 1)]
    t0 = time.time()
    leechers = []
    for i, dd in enumerate(dirs, start=1):
        dd.mkdir()
        leechers.append(subprocess.Popen([*ns(i), *common, f"--dir={dd}", f"--on-bt-download-complete={hook}",
                                          str(torrent)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        deadline = time.time() + 1800
        while not all((dd / "done").exists() for dd in dirs):
            if time.time() > deadline:
                raise RuntimeError("BitTorrent did not finish in 30 minutes")
            time.sleep(0.05)
        last = max(float((dd / "done").read_text()) for dd in dirs)
    finally:
        # SIGKILL: on SIGTERM aria2c says goodbye to the tracker and its
        # peers first, which can take minutes.
        for p in [*leechers, seed]:
            p.kill()
        for p in [*leechers, seed]:
            p.wait()
    for dd in dirs:
        got = dd / src.name
        if got.stat().st_size != src.stat().st_size:
            raise RuntimeError(f"BitTorrent left {got} incomplete")
    return last - t0


def sweep(lors: Path, d: Path, src: Path, ns_list: list[int], rate: int, rounds: int, ideal: float) -> str:
    lines = [f"### {src.stat().st_size >> 20} MiB to N sites, every link {rate} Mbit/s (S/R = {ideal:.2f} s)", "",
             "| N | disseminate s (x S/R) | unicast s (x S/R) | aria2c BitTorrent s (x S/R) | disseminate / BitTorrent "
             "| source sent / S |",
             "|---|---|---|---|---|---|"]
    for n in ns_list:
        lab = Lab(lors, d, n, rate)
        times: dict[str, list[float]] = {"dis": [], "uni": [], "bt": []}
        egress = []
        try:
            log(f"N = {n}: warm-up")
            disseminate(lab, lors, src, [])
            for r in range(rounds):
                log(f"N = {n}: round {r + 1}/{rounds}")
                t, s = disseminate(lab, lors, src, [])
                times["dis"].append(t)
                egress.append(s["source_bytes"] / src.stat().st_size)
                times["uni"].append(disseminate(lab, lors, src, ["--unicast"])[0])
                times["bt"].append(bittorrent(lab, src))
        finally:
            lab.stop()
        m = {k: median(v) for k, v in times.items()}
        cell = lambda k: f"{m[k]:.2f} ({m[k] / ideal:.2f}; {min(times[k]):.2f}-{max(times[k]):.2f})"  # noqa: E731
        lines.append(f"| {n} | {cell('dis')} | {cell('uni')} | {cell('bt')} | {m['dis'] / m['bt']:.2f} "
                     f"| {median(egress):.2f} |")
    return "\n".join(lines) + "\n"


def heterogeneous(lors: Path, d: Path, src: Path, n: int, rate: int, rounds: int, ideal: float) -> str:
    lab = Lab(lors, d, n, rate)
    netlab("rate", "1", str(rate // 10))
    rows = []
    try:
        for r in range(rounds):
            log(f"heterogeneous: round {r + 1}/{rounds}")
            t, s = disseminate(lab, lors, src, [])
            per = [x["seconds"] for x in s["sites"]]
            rows.append((t, per[0], max(per[1:]), s["source_bytes"] / src.stat().st_size))
    finally:
        lab.stop()
    lines = [f"### {n} sites, site 1 at {rate // 10} Mbit/s, the others at {rate} Mbit/s", "",
             "| round | slow site s (x its S/(R/10)) | slowest other site s (x S/R) | whole run s | source sent / S |",
             "|---|---|---|---|---|"]
    for i, (t, slow, fast, eg) in enumerate(rows, start=1):
        lines.append(f"| {i} | {slow:.2f} ({slow / (10 * ideal):.2f}) | {fast:.2f} ({fast / ideal:.2f}) | {t:.2f} "
                     f"| {eg:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ns", default="2,4,8", help="numbers of sites (default 2,4,8)")
    ap.add_argument("--size", default="48M", help="file size (default 48M)")
    ap.add_argument("--rate", type=int, default=100, help="link rate in Mbit/s (default 100)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (default 3)")
    ap.add_argument("--slow-n", type=int, default=4, help="sites in the heterogeneous run (0: skip)")
    ap.add_argument("--dir", default="/dev/shm/lors-dissem", help="working directory")
    ap.add_argument("--out", help="also write the Markdown report here")
    a = ap.parse_args()
    ensure_peers()
    lors = build_lors()
    d = Path(a.dir)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    size = int(float(a.size.rstrip("Mm")) * (1 << 20))
    src = d / "src" / "data.bin"
    src.parent.mkdir()
    make_file(src, size)
    ideal = size * 8 / (a.rate * 1e6)
    t0 = time.time()
    report = [f"# Dissemination: one file to N sites ({time.strftime('%Y-%m-%d')})", "", machine(), "",
              f"Command: `python3 bench/dissem.py --ns {a.ns} --size {a.size} --rate {a.rate} --rounds {a.rounds} "
              f"--slow-n {a.slow_n}`. Wall times of whole commands, median (x S/R; min-max) over the rounds.", ""]
    report.append(sweep(lors, d, src, [int(x) for x in a.ns.split(",")], a.rate, a.rounds, ideal))
    if a.slow_n:
        report.append(heterogeneous(lors, d, src, a.slow_n, a.rate, a.rounds, ideal))
    report.append(f"done in {time.time() - t0:.0f} s")
    text = "\n".join(report)
    print(text)
    save_report(text, a.out)


if __name__ == "__main__":
    main()
