#!/usr/bin/env python3
"""A sparse file uploaded as its data extents against the same file stored
densely, on loopback, in one run.

    python3 bench/sparse.py                                # 10 GiB with 100 MiB of data
    python3 bench/sparse.py --size 2G --data 20M --rounds 2 --out docs/bench/sparse.md

The source is a sparse file of --size bytes holding --data bytes of random
data in 1 MiB runs spread evenly over it (the rest holes, as a disk image
or a preallocated detector file has them). `lors upload` finds the runs
(SEEK_DATA/SEEK_HOLE) and stores only them, recording the holes in the
exNode; `lors upload --dense` stores every byte, as the LoRS 0.82 tools
would. Each is timed as a whole command, interleaved round after round,
the allocations freed after each (`lors trim --decrement`). Then the
sparse exNode downloads to a file, checked with `cmp` and `du`.

Two depots (one copy, 10 MiB blocks) keep their data under --dir, on disk
by default: the dense upload writes --size bytes there each round.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    GiB,
    build_lors,
    log,
    machine,
    median,
    save_report,
    start_depots,
    stop_all,
)
from loopback import parse_size  # noqa: E402

MiB = 1 << 20


def make_sparse(path: Path, size: int, data: int) -> None:
    """`size` bytes, `data` of them random in 1 MiB runs spread evenly."""
    runs = max(1, data // MiB)
    with open(path, "wb") as f:
        f.truncate(size)
        step = size // runs
        for i in range(runs):
            f.seek(i * step)
            f.write(os.urandom(min(MiB, size - i * step)))


def du(path: Path) -> int:
    """Bytes the file system holds for `path`, or under it."""
    if path.is_file():
        return path.stat().st_blocks * 512
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}: {r.stderr.decode(errors='replace')[-600:]}")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=10 * GiB)
    ap.add_argument("--data", type=parse_size, default=100 * MiB)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp/lors-sparse")
    ap.add_argument("--out")
    a = ap.parse_args()
    lors = build_lors()
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    logs = d / "logs"
    logs.mkdir(exist_ok=True)
    src = d / "sparse.img"
    make_sparse(src, a.size, a.data)
    src_du = du(src)
    procs, depots = start_depots(lors, d, 2, f"{a.size // MiB + 1024}M", logs)
    dl = ",".join(depots)
    xnd = {m: d / f"{m}.xnd" for m in ("sparse", "dense")}
    flags = {"sparse": [], "dense": ["--dense"]}
    times: dict[str, list[float]] = {m: [] for m in xnd}
    stored: dict[str, int] = {}
    try:
        for r in range(a.rounds):
            order = list(xnd) if r % 2 == 0 else list(reversed(xnd))
            for m in order:
                log(f"round {r + 1}/{a.rounds}: {m} upload")
                times[m].append(timed([str(lors), "upload", "-q", "--force", "--depot", dl, "-c", "1",
                                       *flags[m], "-o", str(xnd[m]), str(src)]))
                stored[m] = du(d / "depot0") + du(d / "depot1")
                timed([str(lors), "trim", "-q", "--depot", dl, "--decrement", "--allow-holes",
                       "-o", str(d / "trimmed.xnd"), str(xnd[m])])
        log("sparse download")
        timed([str(lors), "upload", "-q", "--force", "--depot", dl, "-c", "1", "-o", str(xnd["sparse"]), str(src)])
        back = d / "back.img"
        back.unlink(missing_ok=True)
        down = timed([str(lors), "download", "-q", "-o", str(back), str(xnd["sparse"])])
        same = subprocess.run(["cmp", str(src), str(back)], capture_output=True).returncode == 0
        back_du = du(back)
    finally:
        stop_all(procs)
    ts, td = median(times["sparse"]), median(times["dense"])
    lines = [
        f"## Sparse upload: {a.size / GiB:.2f} GiB holding {a.data / MiB:.0f} MiB of data",
        "",
        f"Machine: {machine()}. Two depots on loopback (one copy, 10 MiB blocks, data on "
        f"{shutil.disk_usage(d).total // GiB} GiB of {'tmpfs' if str(d).startswith('/dev/shm') else 'disk'}); "
        f"{a.rounds} interleaved rounds, medians of whole commands.",
        "",
        "| upload | median s | min-max s | on the depots (du) | / dense time |",
        "|---|---|---|---|---|",
    ]
    for m in xnd:
        t = times[m]
        lines.append(f"| {m} | {median(t):.2f} | {min(t):.2f}-{max(t):.2f} | "
                     f"{stored[m] / MiB:.0f} MiB | {median(t) / td:.4f} |")
    lines += [
        "",
        f"Source on disk (du): {src_du / MiB:.0f} MiB. Sparse download to a file: {down:.2f} s, "
        f"du {back_du / MiB:.0f} MiB, cmp {'equal' if same else 'DIFFERENT'}.",
        "",
        f"Sparse / dense upload time: **{ts / td:.4f}** (target ~0.01).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    save_report(text, a.out)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
