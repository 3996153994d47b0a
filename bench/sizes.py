#!/usr/bin/env python3
"""One file at a time, 1 MiB to 1 GiB: `lors download` against GridFTP's
`globus-url-copy` on loopback, side by side, per file size.

    python3 bench/sizes.py                          # 1M..1G, 5 rounds, in /dev/shm/lors-sizes
    python3 bench/sizes.py --sizes 1M,64M --rounds 9 --out docs/bench/sizes.md

What a user meets: the file is uploaded with `lors upload`'s defaults
(10 MiB blocks, every 1 MiB e2e block checksummed with BLAKE3) and fetched
with `lors download`'s defaults, which verify every block. Like for like,
that is set against `globus-url-copy -verify-checksum` (MD5 of the source
and the copy, compared); the same file uploaded raw (`-n`, nothing
verified) is set against GridFTP's plain copy, with its defaults and tuned
(`-p 4 -tcp-bs 4M`), the better of the two being the reference. Every server
reads from and every client writes to tmpfs. Each size's cases run once
untimed (outputs compared with the source), then interleaved for --rounds
rounds; sizes up to 16 MiB, whose times are a few milliseconds, run three
times as many rounds. Times are the whole command's wall time, start-up
included.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    Case,
    best,
    build_lors,
    ensure_peers,
    free_port,
    log,
    machine,
    make_file,
    measure,
    median,
    save_report,
    stop_all,
    table,
    wait_port,
)
from loopback import parse_size  # noqa: E402


def human(n: int) -> str:
    for unit, s in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= s and n % s == 0:
            return f"{n // s} {unit}iB"
    return f"{n} B"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1M,4M,16M,64M,256M,1G", help="file sizes (default 1M..1G)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per size (default 5)")
    ap.add_argument("--dir", default="/dev/shm/lors-sizes", help="working directory on tmpfs")
    ap.add_argument("--baseline", help="another lors binary (an earlier commit) whose downloads of the same "
                    "exNodes run beside, for an A/B")
    ap.add_argument("--out", help="also write the Markdown report here")
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",") if s]
    d = Path(a.dir)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    d.chmod(0o777)  # the GridFTP server runs as nobody
    ensure_peers()
    lors = build_lors()
    depot_port, ftp_port = free_port(), free_port()
    logs = d / "logs"
    logs.mkdir()
    stored = 2 * sum(sizes) + sum(sizes) // 64
    procs = [
        subprocess.Popen(
            [str(lors), "depot", "--listen", f"127.0.0.1:{depot_port}", "--data", str(d / "depot"),
             "--size", f"{stored // (1 << 20) + 64}M", "--sync", "never"],
            stdout=open(logs / "depot.log", "wb"), stderr=subprocess.STDOUT),
        # GridFTP refuses anonymous root: serve as nobody.
        subprocess.Popen(
            ["globus-gridftp-server", "-aa", "-anonymous-user", "nobody", "-p", str(ftp_port),
             "-d", "error", "-l", str(logs / "gridftp.log")],
            stdout=open(logs / "gridftp.out", "wb"), stderr=subprocess.STDOUT),
    ]
    depot = f"127.0.0.1:{depot_port}"
    report = [
        "## One file, 1 MiB to 1 GiB: lors download against GridFTP on loopback",
        "",
        f"Machine: {machine()}. tmpfs to tmpfs; a verified warm-up, then {a.rounds} interleaved "
        "rounds per size (3x that up to 16 MiB); rates are size / wall time of the whole command.",
        "",
    ]
    summary = [
        "| size | lors defaults (verified) | GridFTP `-verify-checksum` | ratio "
        "| lors raw (`upload -n`) | best plain GridFTP | ratio | lors defaults / plain GridFTP |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ab: list[str] = []
    try:
        for p in (depot_port, ftp_port):
            wait_port("127.0.0.1", p)
        for size in sizes:
            name = human(size)
            src = d / f"src-{size}.bin"
            make_file(src, size)
            src.chmod(0o644)
            out = d / "out.bin"
            rm = ["rm", "-f", str(out)]
            xnds = {}
            for kind, extra in (("checksummed", []), ("raw", ["-n"])):
                xnds[kind] = d / f"src-{size}-{kind}.xnd"
                subprocess.run([str(lors), "upload", "-q", "--force", "--depot", depot, "-c", "1", *extra,
                                "-o", str(xnds[kind]), str(src)], check=True)
            url = f"ftp://127.0.0.1:{ftp_port}{src}"

            def down(label: str, kind: str, xnd: Path, binary: Path = lors) -> Case:
                return Case(label, kind, [str(binary), "download", "-q", "-o", str(out), str(xnd)], size,
                            before=[rm], after=[rm], verify=(out, src))

            cases = [
                down("lors download (defaults; upload defaults)", "ours", xnds["checksummed"]),
                down("lors download (raw blocks, upload -n)", "ours-raw", xnds["raw"]),
                Case("GridFTP globus-url-copy -verify-checksum", "peer-verified",
                     ["globus-url-copy", "-verify-checksum", url, f"file://{out}"], size,
                     before=[rm], after=[rm], verify=(out, src)),
                Case("GridFTP globus-url-copy", "peer", ["globus-url-copy", url, f"file://{out}"], size,
                     before=[rm], after=[rm], verify=(out, src)),
                Case("GridFTP globus-url-copy -p 4 -tcp-bs 4M", "peer",
                     ["globus-url-copy", "-p", "4", "-tcp-bs", "4M", url, f"file://{out}"], size,
                     before=[rm], after=[rm], verify=(out, src)),
            ]
            if a.baseline:
                cases += [
                    down("baseline: lors download (defaults; upload defaults)", "baseline",
                         xnds["checksummed"], Path(a.baseline)),
                    down("baseline: lors download (raw blocks, upload -n)", "baseline-raw", xnds["raw"],
                         Path(a.baseline)),
                ]
            rounds = a.rounds * 3 if size <= 16 << 20 else a.rounds
            measure(cases, rounds, timeout=600)
            peer_name, peer = best(cases, "peer")
            _, checked = best(cases, "peer-verified")
            ours = median(cases[0].rates()) if cases[0].times else float("nan")
            raw = median(cases[1].rates()) if cases[1].times else float("nan")
            report.append(table(name, cases, {"GridFTP verified": checked, "best plain GridFTP": peer}))
            how = peer_name.removeprefix("GridFTP globus-url-copy").strip() or "defaults"
            summary.append(
                f"| {name} | {ours:.3f} GiB/s | {checked:.3f} GiB/s | **{ours / checked:.2f}x** "
                f"| {raw:.3f} GiB/s | {peer:.3f} GiB/s ({how}) | **{raw / peer:.2f}x** | {ours / peer:.2f}x |")
            if a.baseline:
                was, was_raw = (median(c.rates()) if c.times else float("nan") for c in cases[-2:])
                ab.append(f"| {name} | {was:.3f} → {ours:.3f} GiB/s | **{ours / was:.2f}x** "
                          f"| {was_raw:.3f} → {raw:.3f} GiB/s | **{raw / was_raw:.2f}x** |")
            print(report[-1], flush=True)
            print(f"{name}: verified {ours / checked:.2f}x GridFTP -verify-checksum; "
                  f"raw {raw / peer:.2f}x plain GridFTP; defaults {ours / peer:.2f}x plain GridFTP", flush=True)
            for x in xnds.values():
                subprocess.run([str(lors), "trim", "-q", "--depot", depot, "--decrement", "--allow-holes",
                                str(x)], check=False, capture_output=True)
            src.unlink()
    finally:
        stop_all(procs)
    tail = ["### Summary", "", *summary, ""]
    if a.baseline:
        tail += [f"### This build against {a.baseline}, side by side", "",
                 "| size | defaults (verified) | ratio | raw blocks | ratio |", "|---|---|---|---|---|", *ab, ""]
    report += tail
    print("\n".join(tail), flush=True)
    save_report("\n".join(report), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
