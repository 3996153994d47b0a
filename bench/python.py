#!/usr/bin/env python3
"""The Python package against the tool and a peer, on loopback, in one run.

    python3 bench/python.py                      # 1 GiB, 5 rounds, in /dev/shm/lors-py
    python3 bench/python.py --size 256M --rounds 3 --out docs/bench/python.md

* `readinto` of the whole file through `lors.open` (8 MiB at a time into
  one reused buffer, as NumPy code reads) against `lors download` to
  tmpfs (target: at least 0.9x), and against fsspec-xrootd reading the same
  file from an XRootD server (`xrootd` from Debian's packages, the Python
  client and fsspec-xrootd from PyPI) the same way;
* `cat_ranges` of 1,000 random 64 KiB ranges through the fsspec filesystem
  (32 in flight) against the same ranges read one after another
  (`cat_file` in a loop), for the file uploaded with the default e2e
  checksums (BLAKE3 per 1 MiB: a range reads its whole 1 MiB), with 64 KiB
  e2e blocks, and with none; and fsspec-xrootd's `cat_ranges` of them.

The Python cases time themselves from `open` to the last byte (the
interpreter's start-up is not the transfer's); `lors download` is the
whole command. The depots (4, one copy, 10 MiB blocks) serve from tmpfs.
The package is installed into target/py-venv (`pip install ./python`).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    ROOT,
    Case,
    GiB,
    build_lors,
    ensure_peers,
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
    wait_port,
)
from loopback import parse_size  # noqa: E402

VENV = ROOT / "target" / "py-venv"
PY = VENV / "bin" / "python"

READ = """
import sys, time
{imports}
t0 = time.perf_counter()
{open}
buf = bytearray(8 << 20)
n = 0
while (k := f.readinto(buf)):
    n += k
f.close()
assert n == {size}, n
print(time.perf_counter() - t0)
"""

RANGES = """
import json, sys, time
import fsspec
{imports}
starts = json.load(open({starts!r}))
t0 = time.perf_counter()
{setup}
{read}
assert all(len(b) == 65536 for b in got)
print(time.perf_counter() - t0)
"""


def venv(with_xrootd: bool) -> bool:
    """The package (and, when asked, fsspec-xrootd) in target/py-venv;
    whether fsspec-xrootd could be installed."""
    if not PY.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    log("installing the lors package (pip install ./python)")
    subprocess.run([str(PY), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(ROOT / "python")],
                   check=True)
    if not with_xrootd:
        return False
    r = subprocess.run([str(PY), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "fsspec-xrootd", "xrootd"], capture_output=True)
    if r.returncode != 0:
        log("fsspec-xrootd could not be installed: the XRootD cases are left out")
    return r.returncode == 0


def seconds(out: bytes) -> float:
    return float(out.decode().strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G", help="file size (default 1G)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    ap.add_argument("--dir", default="/dev/shm/lors-py", help="working directory on tmpfs")
    ap.add_argument("--no-xrootd", action="store_true", help="leave out the XRootD peer")
    ap.add_argument("--out", help="also write the Markdown report here")
    a = ap.parse_args()
    size = parse_size(a.size)
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o755)
    lors = build_lors()
    xrootd = not a.no_xrootd
    if xrootd:
        ensure_peers()
    xrootd = venv(xrootd) and shutil.which("xrootd") is not None
    src = d / "src.bin"
    make_file(src, size)
    src.chmod(0o644)
    logs = d / "logs"
    logs.mkdir(exist_ok=True)
    logs.chmod(0o777)  # xrootd, dropped to nobody, writes its log here
    procs, depots = start_depots(lors, d, 4, f"{size * 3 // 4 // (1 << 20) + 256}M", logs)
    xport = free_port()
    if xrootd:
        (d / "xrootd.cfg").write_text(f"all.export {d}\nxrd.port {xport}\n")
        procs.append(subprocess.Popen(
            ["xrootd", "-c", str(d / "xrootd.cfg"), "-l", str(logs / "xrootd.log"), "-R", "nobody"],
            stdout=open(logs / "xrootd.out", "wb"), stderr=subprocess.STDOUT))
    module = subprocess.run([str(PY), "-c", "import lors._lors as m; print(m.__file__)"],
                            check=True, capture_output=True, text=True).stdout.strip()
    report = [
        f"## The Python package, {size / GiB:.2f} GiB on four depots on loopback",
        "",
        f"Machine: {machine()}. {a.rounds} interleaved rounds after a verified warm-up.",
        f"The installed extension module is {os.path.getsize(module) / 1e6:.1f} MB.",
        "",
    ]
    try:
        if xrootd:
            wait_port("127.0.0.1", xport)
        xnd = d / "src.xnd"
        subprocess.run([str(lors), "upload", "--quiet", "--force", "--depot", ",".join(depots), "-c", "1",
                        "-o", str(xnd), str(src)], check=True)
        out = d / "out.bin"
        rm_out = [["rm", "-f", str(out), f"{out}.lors-part", f"{out}.lors-resume"]]
        root = f"root://127.0.0.1:{xport}/{src}"
        reads = [
            Case("lors download to tmpfs", "ours", [str(lors), "download", "--quiet", "-o", str(out), str(xnd)],
                 size, before=rm_out, after=rm_out, verify=(out, src)),
            Case("lors.open readinto", "ours",
                 [str(PY), "-c", READ.format(imports="import lors", open=f"f = lors.open({str(xnd)!r}, buffering=0)", size=size)],
                 size, parse=seconds),
        ]
        if xrootd:
            reads.append(Case("fsspec-xrootd readinto", "peer",
                              [str(PY), "-c", READ.format(imports="import fsspec", open=f"f = fsspec.open({root!r}, 'rb', block_size=8 << 20).open()", size=size)],
                              size, parse=seconds))
        measure(reads, a.rounds, timeout=900)
        base = median(reads[0].rates())
        report.append(table("whole-file reads", reads, {"lors download": base}))
        report.append(f"readinto through lors.open / lors download = **{median(reads[1].rates()) / base:.2f}x** "
                      "(target at least 0.9x).\n")
        print("\n".join(report[-2:]), flush=True)

        rng = random.Random(7)
        starts = [rng.randrange(0, size - 65536) for _ in range(1000)]
        (d / "starts.json").write_text(str(starts))
        ranged = []
        # A range is read in whole e2e blocks (their checksums are over the
        # block): with the default 1 MiB ones each 64 KiB range costs 1 MiB.
        e2e = {"BLAKE3 per 1 MiB (default)": [], "BLAKE3 per 64 KiB (-E 64K)": ["-E", "64K"],
               "no e2e (-n)": ["-n"]}
        for label, flags in e2e.items():
            x = xnd if not flags else d / f"src{''.join(flags)}.xnd"
            if flags:
                subprocess.run([str(lors), "upload", "--quiet", "--force", "--depot", ",".join(depots), "-c", "1",
                                *flags, "-o", str(x), str(src)], check=True)
            setup = f"fs = fsspec.filesystem('lors'); p = {str(x)!r}"
            for how, read in (("cat_ranges, 32 at once", "got = fs.cat_ranges([p] * len(starts), starts, [s + 65536 for s in starts])"),
                              ("cat_file one after another", "got = [fs.cat_file(p, s, s + 65536) for s in starts]")):
                ranged.append(Case(f"lors {how}, {label}", "ours",
                                   [str(PY), "-c", RANGES.format(starts=str(d / "starts.json"), imports="import lors.fs", setup=setup, read=read)],
                                   1000 * 65536, parse=seconds))
        if xrootd:
            xsetup = f"fs = fsspec.filesystem('root', hostid='127.0.0.1:{xport}'); p = {str(src)!r}"
            ranged.append(Case("fsspec-xrootd cat_ranges", "peer",
                               [str(PY), "-c", RANGES.format(starts=str(d / "starts.json"), imports="import fsspec_xrootd", setup=xsetup,
                                                              read="got = fs.cat_ranges([p] * len(starts), starts, [s + 65536 for s in starts])")],
                               1000 * 65536, parse=seconds))
        measure(ranged, a.rounds, timeout=900)
        report.append(table("1,000 random 64 KiB ranges", ranged, {"one after another": median(ranged[1].rates())}))
        lines = []
        for i, label in enumerate(e2e):
            conc, seq = median(ranged[2 * i].times), median(ranged[2 * i + 1].times)
            lines.append(f"{label}: cat_ranges {conc * 1000:.0f} ms, one after another {seq * 1000:.0f} ms "
                         f"(**{seq / conc:.1f}x**)")
        if xrootd:
            lines.append(f"fsspec-xrootd cat_ranges: {median(ranged[-1].times) * 1000:.0f} ms")
        report.append("\n".join(f"* {x}" for x in lines) + "\n")
        print("\n".join(report[-2:]), flush=True)
    finally:
        stop_all(procs)
    save_report("\n".join(report), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
