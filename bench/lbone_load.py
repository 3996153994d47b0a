#!/usr/bin/env python3
"""L-Bone under load: a federation's worth of depots heartbeating while
clients ask for ranked depots, against real `lors lbone` instances.

    python3 bench/lbone_load.py                              # 10,000 depots, SQLite, 60 s
    python3 bench/lbone_load.py --baseline /tmp/old/lors     # the same load on another build, side by side
    python3 bench/lbone_load.py --database "$LORS_TEST_PG_URL" --instances 3 --out docs/bench/lbone.md

The load comes from `lbone-load` (crates/bench/src/bin/lbone-load.rs,
built here): it registers --depots depots (200 cities with coordinates),
then for --seconds keeps up, open loop, --regs registrations per second
(the heartbeats of 10,000 depots every 30 s are 333/s) and --queries ranked
queries per second like an upload's, from 64 client addresses
(127.0.0.2…), each a keep-alive client, spread over the instances. A
request is timed from when it was due, so a server that falls behind shows
it in the latency, not in a lower rate asked. Printed per build:
registrations/s and queries/s achieved, query latency p50/p99/max, errors
(a refused, failed or non-200 request, or one not answered within 10 s),
and the L-Bones' CPU (cores used, all instances) and peak RSS (the largest
instance's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, build_lors, free_port, log, machine, save_report, wait_port  # noqa: E402

TOKEN = "load-test-token"


class Proc:
    """CPU seconds and peak RSS of a process, from /proc."""

    def __init__(self, pid: int):
        self.pid = pid

    def cpu(self) -> float:
        f = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0


def build_load() -> Path:
    log("building lbone-load (release)")
    subprocess.run(
        ["cargo", "build", "--release", "--locked", "-p", "lors-bench", "--bin", "lbone-load", "-q"],
        cwd=ROOT,
        check=True,
    )
    return ROOT / "target" / "release" / "lbone-load"


def run_build(lors: str, load: Path, a, work: Path, tag: str) -> dict:
    procs, urls = [], []
    schema = f"load_{tag}_{os.getpid()}"
    try:
        for i in range(a.instances):
            port = free_port()
            argv = [lors, "lbone", "--listen", f"127.0.0.1:{port}", "--no-legacy", "--token", TOKEN,
                    "--max-connections-per-client", "1024"]
            if a.database:
                argv += ["--database", a.database, "--schema", schema]
            else:
                data = work / f"lbone-{tag}-{port}"
                data.mkdir()
                argv += ["--data", str(data)]
            procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_port("127.0.0.1", port)
            urls.append(f"http://127.0.0.1:{port}")
        gen = subprocess.Popen(
            [str(load), "--lbone", ",".join(urls), "--token", TOKEN, "--depots", str(a.depots),
             "--regs", str(a.regs), "--queries", str(a.queries), "--seconds", str(a.seconds)],
            stdout=subprocess.PIPE, text=True,
        )
        assert gen.stdout is not None
        watched = [Proc(p.pid) for p in procs]
        cpu0 = t0 = None
        result = None
        for line in gen.stdout:
            if line.strip() == "load":
                cpu0, t0 = sum(p.cpu() for p in watched), time.perf_counter()
                log(f"  {a.depots} depots registered; load for {a.seconds:.0f} s")
            elif line.startswith("{"):
                result = json.loads(line)
        if gen.wait() != 0 or result is None or cpu0 is None:
            raise RuntimeError(f"lbone-load failed (exit {gen.returncode})")
        wall = time.perf_counter() - t0
        result["cores"] = (sum(p.cpu() for p in watched) - cpu0) / wall
        result["rss_mib"] = max(p.peak_rss_mib() for p in watched)
        return result
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depots", type=int, default=10_000)
    ap.add_argument("--regs", type=float, default=333, help="registrations per second (default 333)")
    ap.add_argument("--queries", type=float, default=1000, help="ranked queries per second (default 1000)")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--database", help="PostgreSQL URL [default: SQLite]")
    ap.add_argument("--instances", type=int, default=1, help="L-Bone instances (more than one needs --database)")
    ap.add_argument("--baseline", help="another lors binary to run the same load against, side by side")
    ap.add_argument("--out", help="also write the Markdown report here")
    a = ap.parse_args()
    if a.instances > 1 and not a.database:
        ap.error("several instances share one PostgreSQL: give --database")
    builds = [("this build", str(build_lors()))]
    if a.baseline:
        builds.insert(0, ("baseline", a.baseline))
    load = build_load()
    work = Path(tempfile.mkdtemp(prefix="lors-lbone-load-"))
    results = []
    try:
        for k, (name, lors) in enumerate(builds):
            log(f"{name}: {lors}")
            r = run_build(lors, load, a, work, str(k))
            log(f"  {json.dumps(r)}")
            results.append((name, r))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    store = "PostgreSQL" if a.database else "SQLite"
    inst = "one instance" if a.instances == 1 else f"{a.instances} instances"
    lines = [
        "# L-Bone under load",
        "",
        f"{a.depots:,} depots registered ({store}, {inst}), then for {a.seconds:.0f} s: "
        f"{a.regs:.0f} registrations/s and {a.queries:.0f} ranked queries/s asked, open loop, "
        "from 64 client addresses with keep-alive clients (`lbone-load`). Latency from when a "
        "query was due.",
        "",
        "| build | setup regs/s | regs/s | queries/s | p50 ms | p99 ms | max ms | errors | L-Bone cores | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results:
        kinds = "; ".join(r["error_kinds"])
        lines.append(
            f"| {name} | {r['setup_regs_per_s']:.0f} | {r['regs_per_s']:.0f} | {r['queries_per_s']:.0f} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.0f} | {r['errors']}"
            f"{' (' + kinds + ')' if kinds else ''} | {r['cores']:.2f} | {r['rss_mib']:.0f} |"
        )
    if len(results) == 2:
        b, t = results[0][1], results[1][1]
        lines += ["", f"This build against the baseline: p99 {t['p99_ms'] / b['p99_ms']:.2f}x, queries/s "
                  f"{t['queries_per_s'] / max(b['queries_per_s'], 1e-9):.2f}x, CPU "
                  f"{t['cores'] / max(b['cores'], 1e-9):.2f}x, peak RSS {t['rss_mib'] / max(b['rss_mib'], 1e-9):.2f}x."]
    lines += ["", "Targets: p99 <= 50 ms, 0 errors, RSS <= 300 MiB.", "", machine()]
    report = "\n".join(lines) + "\n"
    print(report)
    save_report(report, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
