#!/usr/bin/env python3
"""Seed 002's characterization with `lors bench`, on loopback and across a
rate-limited netlab link; writes each sweep's runs, fits, HTML report and
plots under OUT, and a summary in Markdown. Needs root for the lab.

    python3 bench/characterize.py --out docs/bench/2026-11-23-characterization
    python3 bench/characterize.py --only loopback --reps 3

Scenarios (each a `lors bench sweep`):
  cp        plain cp between local files ("Simulations of Distributed Systems in a Computing Centre" scenario 1)
  gridftp   globus-url-copy through a GridFTP server on 127.0.0.1 (scenario 2)
  loopback  lors download from a depot on 127.0.0.1
  lab       lors download from a depot host behind a --rate Mbit/s link,
            run on a client host (scenario 3's network, emulated)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, build_lors, ensure_peers, log, wait_port  # noqa: E402

NETLAB = ROOT / "scripts" / "netlab.sh"
ENV = dict(os.environ, NL_PREFIX="lorsc", NL_NET="10.213.11")
# Five values or more per variable: the seed's own models have 4 parameters.
LOCAL = {"sizes": "1M,2M,4M,16M,64M", "parallel": "1,2,4,6,8", "streams": "1,2,4"}
LAB = {"sizes": "256K,512K,1M,4M,16M", "parallel": "1,2,4,6,8", "streams": "1,2,4"}


def netlab(*args: str) -> str:
    return subprocess.run([str(NETLAB), *args], env=ENV, check=True, capture_output=True, text=True).stdout.strip()


def run(argv: list[str]) -> str:
    log("$ " + " ".join(argv))
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def sweep(lors: Path, out: Path, args: list[str], grid: dict, reps: int, wrap: list[str] | None = None) -> list[str]:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [str(lors), "bench", "sweep", "-o", str(out), *args, "--sizes", grid["sizes"],
           "--parallel", grid["parallel"], "--streams", grid["streams"], "-r", str(reps), "-q"]
    run([*(wrap or []), *cmd])
    run([str(lors), "bench", "report", str(out)])
    shutil.rmtree(out / "scratch", ignore_errors=True)
    return cmd


def lab_sweep(lors: Path, out: Path, reps: int, rate: int) -> list[str]:
    netlab("up", "2", str(rate))
    netlab("rate", "2", "0")
    a1 = netlab("addr", "1")
    work = Path("/tmp/lors-characterize")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    depot = subprocess.Popen(["ip", "netns", "exec", "lorsc-h1", str(lors), "depot", "--listen", f"{a1}:6714",
                              "--data", str(work / "depot"), "--size", "4G", "--sync", "never"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wrap = ["ip", "netns", "exec", "lorsc-h2"]
        wait_port(a1, 6714, wrap=wrap)
        return sweep(lors, out, ["--depot", f"{a1}:6714"], LAB, reps, wrap)
    finally:
        depot.terminate()
        depot.wait(10)
        netlab("down")


def table(out: Path) -> tuple[str, dict]:
    """The best model per variable from the fits.json `lors bench fit` wrote."""
    fits = json.loads((out / "fits.json").read_text())
    best = {}
    for r in fits["table"]:
        if r["curves"] == r["of"] and r["var"] not in best:
            best[r["var"]] = r
    return "; ".join(f"{v}: {r['model']} (mean R² {r['mean_r2']:.3f} over {r['of']})" for v, r in best.items()), fits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "target" / "characterize")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rate", type=int, default=100, help="lab link rate, Mbit/s")
    ap.add_argument("--only", default="cp,gridftp,loopback,lab")
    a = ap.parse_args()
    ensure_peers()
    lors = build_lors()
    a.out.mkdir(parents=True, exist_ok=True)
    os.chmod(a.out, 0o755)
    commands = {}
    for name in a.only.split(","):
        out = a.out / name
        if name == "lab":
            commands[name] = lab_sweep(lors, out, a.reps, a.rate)
        else:
            # cp has no streams to vary.
            grid = dict(LOCAL, streams="1") if name == "cp" else LOCAL
            commands[name] = sweep(lors, out, ["--scenario", name], grid, a.reps)
    lines = ["| scenario | total throughput, mean over configurations (MiB/s) | best model per variable |",
             "|---|---:|---|"]
    for name in commands:
        out = a.out / name
        run([str(lors), "bench", "fit", str(out)])
        summary, fits = table(out)
        lines.append(f"| {name} | {fits['mean_total'] / (1 << 20):.1f} | {summary} |")
    (a.out / "summary.md").write_text("\n".join(lines) + "\n\nCommands:\n\n" + "\n".join(
        f"    {' '.join(c)}" for c in commands.values()) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
