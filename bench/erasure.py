#!/usr/bin/env python3
"""Erasure codes against copies, on loopback: the same file uploaded as 3
copies and as a 6+3 erasure code onto the same nine depots, and downloaded
back, in the same run; and the 6+3 file read with three of its depots gone.

    python3 bench/erasure.py                     # 1 GiB, 5 rounds, in /dev/shm/lors-ec
    python3 bench/erasure.py --size 256M --rounds 3 --out docs/bench/erasure.md

Targets (issue 43): the erasure-coded upload and download at least 0.9x the
speed of the 3-copy ones, and half the bytes stored (and sent over the
network: the client sends the first copy, the depots the other two). Every
depot serves from tmpfs; the client writes to tmpfs. The encode and decode
speed of the code itself is `cargo bench -p lors-exnode --bench erasure`.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    Case,
    GiB,
    build_lors,
    free_port,
    log,
    machine,
    make_file,
    measure,
    median,
    save_report,
    start_depots,
    stop_all,
    table,
)
from loopback import parse_size  # noqa: E402


def stored(xnd: Path) -> int:
    """Bytes the exNode's allocations hold (mappings and parity blocks)."""
    text = xnd.read_text()
    return sum(int(v) for v in re.findall(r'name="alloc_length" type="integer">(\d+)<', text))


def without(xnd: Path, gone: list[str], dead: str, out: Path) -> None:
    """The exNode with every block on the depots `gone` moved to an address
    nobody listens on: those depots lost."""
    text = xnd.read_text()
    for g in gone:
        text = text.replace(f"ibp://{g}/", f"ibp://{dead}/")
    out.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G", help="file size (default 1G)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    ap.add_argument("--dir", default="/dev/shm/lors-ec", help="working directory on tmpfs")
    ap.add_argument("--out", help="also write the Markdown report here")
    a = ap.parse_args()
    size = parse_size(a.size)
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    lors = build_lors()
    src = d / "src.bin"
    make_file(src, size)
    logs = d / "logs"
    logs.mkdir(exist_ok=True)
    procs, depots = start_depots(lors, d, 9, f"{size * 2 // (1 << 20) + 256}M", logs)
    report = [
        f"## Erasure code 6+3 against 3 copies, {size / GiB:.2f} GiB, nine depots on loopback",
        "",
        f"Machine: {machine()}. {a.rounds} interleaved rounds after a verified warm-up;",
        "rates are size / wall time of the whole command; 10 MiB blocks, BLAKE3 e2e checksums.",
        "",
    ]
    try:
        dl = ",".join(depots)
        modes = {"3 copies": ["-c", "3"], "ec 6+3": ["--ec", "6+3"]}
        sources = {}
        for name, flags in modes.items():
            xnd = d / f"src-{name.replace(' ', '')}.xnd"
            log(f"uploading the download source as {name}")
            subprocess.run([str(lors), "upload", "--quiet", "--force", "--depot", dl, *flags,
                            "-o", str(xnd), str(src)], check=True)
            sources[name] = xnd
        dead = f"127.0.0.1:{free_port()}"
        degraded = d / "src-ec-3lost.xnd"
        without(sources["ec 6+3"], depots[:3], dead, degraded)
        out = d / "out.bin"
        rm_out = [["rm", "-f", str(out)]]
        down = [
            Case(f"download, {name}", "ours",
                 [str(lors), "download", "--quiet", "-o", str(out), str(x)],
                 size, before=rm_out, after=rm_out, verify=(out, src))
            for name, x in [*sources.items(), ("ec 6+3, 3 depots lost", degraded)]
        ]
        up = []
        for name, flags in modes.items():
            xnd = d / f"up-{name.replace(' ', '')}.xnd"
            free = [[str(lors), "trim", "--quiet", "--decrement", "--allow-holes", "--depot", dl, str(xnd)],
                    ["rm", "-f", str(xnd)]]
            up.append(Case(f"upload, {name}", "ours",
                           [str(lors), "upload", "--quiet", "--depot", dl, *flags, "-o", str(xnd), str(src)],
                           size, before=[["rm", "-f", str(xnd)]], after=free))
        for title, cs in (("download", down), ("upload", up)):
            measure(cs, a.rounds, timeout=900)
            copies = median(cs[0].rates())
            report.append(table(title, cs, {"3 copies": copies}))
            ec = median(cs[1].rates())
            report.append(f"{title}: 6+3 / 3 copies = **{ec / copies:.2f}x** (target at least 0.9x).\n")
            print("\n".join(report[-2:]), flush=True)
        s3, sec = stored(sources["3 copies"]), stored(sources["ec 6+3"])
        report.append(
            f"Stored on the depots: 3 copies {s3 / GiB:.2f} GiB, 6+3 {sec / GiB:.2f} GiB: "
            f"**{s3 / sec:.2f}x** less with the code (target 2x). Sent by the client: "
            f"{size / GiB:.2f} GiB for copies (the depots send the other two, depot to depot), "
            f"{sec / GiB:.2f} GiB for the code; over the network in all: {s3 / GiB:.2f} against "
            f"{sec / GiB:.2f} GiB.\n"
        )
        print(report[-1], flush=True)
    finally:
        stop_all(procs)
    save_report("\n".join(report), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
