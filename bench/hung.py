#!/usr/bin/env python3
"""Hung-depot benchmark: every command that talks to depots, run on four
local depots with all of them healthy and with one of them stopped
(SIGSTOP: it accepts connections and never answers, as a hung process or a
path that drops everything does), side by side.

    python3 bench/hung.py                              # 200 MiB, 2 copies, 5 rounds
    python3 bench/hung.py --size 64M --rounds 3 --out docs/bench/hung.md

A download is stopped part way (at a different moment each round, from
before the first byte to the last pieces); the other commands meet the
depot already stopped. For each command the table gives the median wall
time healthy and hung, their ratio, and whether every hung run ended within
the bound the docs promise: twice the healthy time plus the stall time (2 s;
the write commands ask the depot for its version from half of it on, so the
answer is in by then; 7 s for disseminate, which also gives copies to the
dropped site 5 s to end), plus half a second for starting the process —
never the 60 s network timeout (-T).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import build_lors, free_port, log, machine, make_file, median, save_report, stop_all, wait_port  # noqa: E402

STALL = {"disseminate": 7.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="200M", help="file size (default 200M)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per command (default 5)")
    ap.add_argument("--out", help="also write the Markdown report here")
    a = ap.parse_args()
    size = int(a.size[:-1]) << {"K": 10, "M": 20, "G": 30}[a.size[-1]] if a.size[-1] in "KMG" else int(a.size)
    lors = build_lors()
    work = Path(tempfile.mkdtemp(prefix="lors-hung-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    procs = []
    try:
        ports = [free_port() for _ in range(4)]
        for i, p in enumerate(ports):
            (work / f"d{i}").mkdir()
            procs.append(subprocess.Popen(
                [str(lors), "depot", "--listen", f"127.0.0.1:{p}", "--data", str(work / f"d{i}"),
                 "--size", str(max(16 * size, 1 << 30)), "--sync", "never"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for p in ports:
            wait_port("127.0.0.1", p)
        depots = [f"127.0.0.1:{p}" for p in ports]
        hung = procs[2]
        all4 = ",".join(depots)
        src = work / "src.bin"
        make_file(src, size)
        two = work / "two.xnd"
        one = work / "one.xnd"
        run = lambda *args: subprocess.run([str(lors), *args], check=True, capture_output=True)  # noqa: E731
        run("upload", "-q", "-c", "2", "--depot", all4, "-o", str(two), str(src))
        run("upload", "-q", "-c", "1", "--depot", f"{depots[0]},{depots[1]}", "-o", str(one), str(src))
        out = work / "out.bin"

        def cases(r: int) -> list[tuple[str, list[str]]]:
            o = lambda n: str(work / f"{n}{r}.xnd")  # noqa: E731
            return [
                ("download to a file", ["download", "-q", "-o", str(out), str(two)]),
                ("download to stdout", ["download", "-q", "-o", "-", str(two)]),
                ("upload", ["upload", "-q", "-c", "2", "--depot", all4, "-o", o("up"), str(src)]),
                ("augment", ["augment", "-q", "-c", "1", "--depot", all4, "-o", o("aug"), str(one)]),
                ("route", ["route", "-q", "-c", "1", "--keep-old", "--depot", f"{depots[2]},{depots[3]}",
                           "-o", o("route"), str(one)]),
                ("disseminate", ["disseminate", "-q", "--to", all4, "-o", o("dis"), str(src)]),
                ("stat", ["stat", str(two)]),
                ("ls", ["ls", str(two)]),
                ("verify", ["verify", "-q", str(two)]),
                ("refresh", ["refresh", "--by", "1h", str(two)]),
            ]

        def timed(args: list[str], stop_after: float | None) -> float:
            t0 = time.monotonic()
            p = subprocess.Popen([str(lors), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if stop_after is not None:
                time.sleep(stop_after)
                hung.send_signal(signal.SIGSTOP)
            p.wait(timeout=300)
            took = time.monotonic() - t0
            hung.send_signal(signal.SIGCONT)
            # What the command made is freed, so the depots never fill.
            # (An augment's output names the input's blocks too, among the
            # new ones on the same depots: it stays; there is room.)
            if args[0] in ("upload", "route", "disseminate"):
                made = Path(args[args.index("-o") + 1])
                if made.exists():
                    flags = [f for d in depots for f in ("--depot", d)]
                    keep = one if args[0] == "route" else None
                    if keep is None:
                        subprocess.run([str(lors), "trim", "-q", "--decrement", "--allow-holes", *flags,
                                        "-o", str(work / "trimmed.xnd"), str(made)], capture_output=True)
                    else:
                        # A route's output names the input's blocks too: only its new ones go.
                        subprocess.run([str(lors), "trim", "-q", "--decrement", "--allow-holes",
                                        "--depot", depots[2], "--depot", depots[3], "-o", str(work / "trimmed.xnd"),
                                        str(made)], capture_output=True)
                    made.unlink()
                    (work / "trimmed.xnd").unlink(missing_ok=True)
            return took

        names = [n for n, _ in cases(0)]
        healthy: dict[str, list[float]] = {n: [] for n in names}
        stopped: dict[str, list[float]] = {n: [] for n in names}
        for r in range(a.rounds):
            log(f"round {r + 1}/{a.rounds}")
            for name, args in cases(r):
                healthy[name].append(timed(args, None))
            for name, args in cases(a.rounds + r):
                # A download is stopped part way; the others meet it stopped.
                at = healthy[name][-1] * r / max(1, a.rounds) if name.startswith("download") else 0.0
                stopped[name].append(timed(args, at))
        rows = []
        ok_all = True
        for n in names:
            h, s = median(healthy[n]), median(stopped[n])
            # Plus half a second for starting the process and its checks.
            bound = 2 * max(healthy[n]) + STALL.get(n, 2.0) + 0.5
            ok = max(stopped[n]) <= bound
            ok_all &= ok
            rows.append(f"| {n} | {h:.2f} | {s:.2f} (max {max(stopped[n]):.2f}) | {s / h:.1f}x | "
                        f"{bound:.1f} | {'held' if ok else 'EXCEEDED'} |")
        report = [
            f"# One of four depots hung ({time.strftime('%Y-%m-%d')})",
            "",
            machine(),
            "",
            f"Command: `python3 bench/hung.py --size {a.size} --rounds {a.rounds}`. A {size >> 20} MiB file, "
            "2 copies on 4 local depots (tmpfs); one depot stopped with SIGSTOP. Median wall time of whole "
            "commands over the rounds (seconds); -T is 60 s.",
            "",
            "| command | healthy s | one depot hung s | ratio | bound s | every hung run within it |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
        ]
        print("\n".join(report))
        save_report("\n".join(report), a.out)
        return 0 if ok_all else 1
    finally:
        for p in procs:
            p.send_signal(signal.SIGCONT)
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
