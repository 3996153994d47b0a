#!/usr/bin/env python3
"""Download memory benchmark: the peak resident set of `lors download` for
files of growing size, beside curl and aria2c fetching the same file from
nginx in the same run.

    python3 bench/memory.py                        # 256M, 1G, 4G in /var/tmp/lors-mem
    python3 bench/memory.py --sizes 256M,1G --out docs/bench/memory.md

Target (issue 14): flat in file size and under 128 MiB at default settings.
Each lors case runs for an exNode with the default end-to-end checksums
(every block passes through memory to be verified) and for a raw one (-n,
spliced from the socket into the file), writing to a file and to a pipe
(`-o -`). The figure is the peak RSS (`ru_maxrss` of the finished process);
the files live on disk so the page cache, not the process, holds the data.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    build_lors,
    free_port,
    log,
    machine,
    make_file,
    same_file,
    save_report,
    wait_port,
)

MiB = 1 << 20
TARGET_MIB = 128


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def peak_rss(argv: list[str], report: Path) -> int:
    """Runs argv to completion and returns its peak RSS in bytes.

    Measured by GNU time, not by this script's wait4: Linux counts the pages
    a child had before exec (here, Python's) in its ru_maxrss."""
    r = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(report), *argv],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise RuntimeError(f"{argv[0]}: exit {r.returncode}: {r.stderr.decode(errors='replace')[-500:]}")
    return int(report.read_text().split()[-1]) * 1024


def ensure_peers() -> bool:
    missing = [pkg for cmd, pkg in (("nginx", "nginx"), ("curl", "curl"), ("aria2c", "aria2"))
               if shutil.which(cmd) is None]
    if not Path("/usr/bin/time").exists():
        subprocess.run(["apt-get", "install", "-y", "-qq", "time"], check=True,
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    if missing:
        log(f"installing {' '.join(missing)} from Debian's packages")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        r = subprocess.run(["apt-get", "install", "-y", "-qq", *missing], env=env)
        if r.returncode != 0:
            log("peers not installed: lors figures only")
            return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="256M,1G,4G", help="file sizes (default 256M,1G,4G)")
    ap.add_argument("--dir", default="/var/tmp/lors-mem", help="working directory (on disk)")
    ap.add_argument("--out", help="also write the Markdown report here")
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",") if s]
    d = Path(a.dir)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    d.chmod(0o755)
    peers = ensure_peers()
    lors = build_lors()
    procs: list[subprocess.Popen] = []
    port = free_port()
    procs.append(subprocess.Popen(
        [str(lors), "depot", "--listen", f"127.0.0.1:{port}", "--data", str(d / "depot"),
         "--size", f"{3 * max(sizes) // MiB + 64}M", "--sync", "never"],
        stdout=open(d / "depot.log", "wb"), stderr=subprocess.STDOUT))
    web = free_port()
    if peers:
        (d / "nginx.conf").write_text(
            f"worker_processes 1; daemon off; pid {d}/nginx.pid; error_log {d}/nginx.log;\n"
            f"events {{}} http {{ access_log off; sendfile on;\n"
            f"  server {{ listen 127.0.0.1:{web}; root {d}; }} }}\n")
        procs.append(subprocess.Popen(["nginx", "-c", str(d / "nginx.conf"), "-p", str(d)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
    rows = []
    rss = d / "rss.txt"
    try:
        wait_port("127.0.0.1", port)
        if peers:
            wait_port("127.0.0.1", web)
        depot = f"127.0.0.1:{port}"
        for size in sizes:
            label = f"{size / MiB:.0f} MiB"
            src = d / f"src-{size}.bin"
            make_file(src, size)
            src.chmod(0o644)
            out = d / "out.bin"
            row = {"size": label}
            for kind, extra in (("e2e", []), ("raw", ["-n"])):
                xnd = d / f"{kind}-{size}.xnd"
                subprocess.run([str(lors), "upload", "--quiet", "--force", "--depot", depot, "-c", "1",
                                *extra, "-o", str(xnd), str(src)], check=True)
                log(f"{label} {kind}: download to a file")
                out.unlink(missing_ok=True)
                row[f"{kind} file"] = peak_rss([str(lors), "download", "--quiet", "-o", str(out), str(xnd)], rss)
                if not same_file(out, src):
                    raise RuntimeError(f"{kind} download of {label} differs from the source")
                out.unlink()
                log(f"{label} {kind}: download to a pipe")
                row[f"{kind} pipe"] = peak_rss([str(lors), "download", "--quiet", "-o", "-", str(xnd)], rss)
                subprocess.run([str(lors), "trim", "-d", "--allow-holes", "--depot", depot, str(xnd)],
                               capture_output=True)
            if peers:
                url = f"http://127.0.0.1:{web}/{src.name}"
                row["curl"] = peak_rss(["curl", "-sf", "-o", str(out), url], rss)
                out.unlink()
                row["aria2c"] = peak_rss(["aria2c", "-q", "-x", "4", "-s", "4", "--allow-overwrite=true",
                                          "-d", str(d), "-o", out.name, url], rss)
                out.unlink()
            src.unlink()
            rows.append(row)
            log("  " + ", ".join(f"{k} {v / MiB:.0f} MiB" for k, v in row.items() if k != "size"))
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
    cols = [k for k in rows[0] if k != "size"]
    lines = [
        "## Download peak RSS by file size",
        "",
        f"Machine: {machine()}. lors at default settings (`--memory 96M`); peers fetch the same",
        "file from nginx. MiB of peak resident set (`ru_maxrss`).",
        "",
        "| file | " + " | ".join(f"lors {c}" if c[:3] in ("e2e", "raw") else c for c in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for r in rows:
        lines.append(f"| {r['size']} | " + " | ".join(f"{r[c] / MiB:.0f}" for c in cols) + " |")
    ours = [r[c] for r in rows for c in cols if c[:3] in ("e2e", "raw")]
    growth = max(r["e2e file"] for r in rows) / min(r["e2e file"] for r in rows)
    lines += [
        "",
        f"lors peak over every case: **{max(ours) / MiB:.0f} MiB** (target < {TARGET_MIB} MiB: "
        f"{'met' if max(ours) < TARGET_MIB * MiB else 'MISSED'}); largest / smallest file's "
        f"peak (e2e, to a file) = **{growth:.2f}x** for {rows[-1]['size']} / {rows[0]['size']} of data.",
        "",
    ]
    text = "\n".join(lines)
    print(text, flush=True)
    save_report(text, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
