#!/usr/bin/env python3
"""Loopback benchmark: one LoRS depot against GridFTP, XRootD, nginx+curl and
aria2c on the same file, the same machine, in the same run, with the physical
limits (iperf3 single stream, tmpfs write) measured beside them.

    python3 bench/loopback.py                 # 2 GiB, 5 rounds, in /dev/shm/lors-bench
    python3 bench/loopback.py --size 512M --rounds 3 --out docs/bench/loopback.md
    python3 bench/loopback.py --baseline /tmp/old/lors   # and an earlier build, side by side

Every server serves from and every client writes to tmpfs (/dev/shm), so the
disk is out of the picture. Each case runs once untimed (its output is
compared with the source), then the cases run interleaved for --rounds rounds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    Case,
    GiB,
    best,
    build_lors,
    ensure_peers,
    free_port,
    log,
    machine,
    make_file,
    measure,
    save_report,
    median,
    table,
    wait_port,
)


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


class Servers:
    """The depot and the peer servers, all on ephemeral loopback ports."""

    def __init__(self, lors: Path, d: Path, size: int, baseline: Path | None = None):
        self.procs: list[subprocess.Popen] = []
        self.d = d
        names = ("depot", "gridftp", "xrootd", "nginx", "iperf3") + (("depot-base",) if baseline else ())
        self.ports = {k: free_port() for k in names}
        logs = d / "logs"
        logs.mkdir(exist_ok=True)
        logs.chmod(0o777)  # xrootd, dropped to nobody, writes its log here
        depot_dir = d / "depot"
        shutil.rmtree(depot_dir, ignore_errors=True)
        self.spawn(
            [str(lors), "depot", "--listen", f"127.0.0.1:{self.ports['depot']}",
             "--data", str(depot_dir), "--size", f"{3 * size // (1 << 20) + 64}M", "--sync", "never"],
            logs / "depot.log",
        )
        if baseline:
            # The earlier build's own depot: a before/after compares both ends.
            base_dir = d / "depot-base"
            shutil.rmtree(base_dir, ignore_errors=True)
            self.spawn(
                [str(baseline), "depot", "--listen", f"127.0.0.1:{self.ports['depot-base']}",
                 "--data", str(base_dir), "--size", f"{3 * size // (1 << 20) + 64}M", "--sync", "never"],
                logs / "depot-base.log",
            )
        # GridFTP refuses anonymous root: serve as nobody from a world-writable dir.
        self.spawn(
            ["globus-gridftp-server", "-aa", "-anonymous-user", "nobody", "-p",
             str(self.ports["gridftp"]), "-d", "error", "-l", str(logs / "gridftp.log")],
            logs / "gridftp.out",
        )
        xcfg = d / "xrootd.cfg"
        xcfg.write_text(f"all.export {d}\nxrd.port {self.ports['xrootd']}\n")
        self.spawn(["xrootd", "-c", str(xcfg), "-l", str(logs / "xrootd.log"), "-R", "nobody"],
                   logs / "xrootd.out")
        ncfg = d / "nginx.conf"
        ncfg.write_text(
            f"""worker_processes 2; daemon off; pid {d}/nginx.pid; error_log {logs}/nginx.log;
events {{ worker_connections 256; }}
http {{ access_log off; sendfile on; tcp_nopush on; client_max_body_size 0;
  client_body_temp_path {d}/nginx-tmp;
  server {{ listen 127.0.0.1:{self.ports['nginx']}; root {d};
    location / {{ dav_methods PUT; create_full_put_path on; }} }} }}
"""
        )
        (d / "nginx-tmp").mkdir(exist_ok=True)
        self.spawn(["nginx", "-c", str(ncfg), "-p", str(d)], logs / "nginx.out")
        self.spawn(["iperf3", "-s", "-p", str(self.ports["iperf3"])], logs / "iperf3.out")
        try:
            for p in self.ports.values():
                wait_port("127.0.0.1", p)
        except RuntimeError:
            self.stop()
            raise

    def spawn(self, argv: list[str], out: Path) -> None:
        self.procs.append(
            subprocess.Popen(argv, stdout=open(out, "wb"), stderr=subprocess.STDOUT)
        )

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


# Connections lors download opens to one depot (AUTO_CONNECTIONS).
WRITERS = 8


def iperf3_seconds(size: int):
    def parse(out: bytes) -> float:
        bps = json.loads(out)["end"]["sum_received"]["bits_per_second"]
        return size / (bps / 8)

    return parse


def baseline_cases(base: Path, s: Servers, d: Path, size: int) -> tuple[list[Case], list[Case]]:
    """The earlier build's download and upload with defaults, against its own depot."""
    src, out, rm = d / "src.bin", d / "out.bin", ["rm", "-f", str(d / "out.bin")]
    depot = f"127.0.0.1:{s.ports['depot-base']}"
    up_xnd = d / "up-base.xnd"
    trim_help = subprocess.run([str(base), "trim", "--help"], capture_output=True, text=True).stdout
    decrement = "--decrement" if "--decrement" in trim_help else "-d"
    free = [str(base), "trim", "--depot", depot, decrement, "--allow-holes", str(up_xnd)]
    down = [Case("lors download (defaults), baseline build", "baseline",
                 [str(base), "download", "--quiet", "-o", str(out), str(d / "src-base.xnd")], size,
                 before=[rm], after=[rm], verify=(out, src))]
    up = [Case("lors upload (defaults), baseline build", "baseline",
               [str(base), "upload", "--quiet", "--force", "--depot", depot, "-c", "1", "-n",
                "-o", str(up_xnd), str(src)], size, before=[free], after=[free])]
    return down, up


def cases(lors: Path, s: Servers, d: Path, size: int, threads: list[int]) -> tuple[list[Case], list[Case]]:
    src = d / "src.bin"
    out = d / "out.bin"
    rm = ["rm", "-f", str(out)]
    depot = f"127.0.0.1:{s.ports['depot']}"
    xnd = d / "src.xnd"
    iperf_secs = max(2, min(10, size // (1 << 30) * 2))
    per = max(1, size // (4 << 20) // WRITERS)
    limits = [
        Case("iperf3 single stream (loopback TCP)", "limit",
             ["iperf3", "-c", "127.0.0.1", "-p", str(s.ports["iperf3"]), "-t", str(iperf_secs), "-J"],
             size, parse=iperf3_seconds(size)),
        # As many writers as lors has connections (8 to one depot), each an
        # eighth of the file: one dd alone varies 0.55-1.59 GiB/s here and
        # is not what eight writers reach.
        Case(f"tmpfs write ({WRITERS} dd writers, 4 MiB blocks)", "limit",
             ["sh", "-c", " ".join(
                 f"dd if=/dev/zero of={out} bs=4M seek={i * per} count={per} conv=notrunc status=none &"
                 for i in range(WRITERS)) + " wait"],
             size, before=[rm], after=[rm]),
    ]
    quiet = ["--quiet"]
    down = [
        Case("lors download (defaults)", "ours",
             [str(lors), "download", *quiet, "-o", str(out), str(xnd)], size, before=[rm], after=[rm],
             verify=(out, src)),
        *[
            Case(f"lors download -a {t}", "ours-tuned",
                 [str(lors), "download", *quiet, "-a", str(t), "-o", str(out), str(xnd)], size,
                 before=[rm], after=[rm])
            for t in threads
        ],
        Case("GridFTP globus-url-copy -p 4 -tcp-bs 4M", "peer",
             ["globus-url-copy", "-p", "4", "-tcp-bs", "4M",
              f"ftp://127.0.0.1:{s.ports['gridftp']}{src}", f"file://{out}"], size, before=[rm], after=[rm],
             verify=(out, src)),
        Case("XRootD xrdcp", "peer",
             ["xrdcp", "-s", "-f", f"root://127.0.0.1:{s.ports['xrootd']}/{src}", str(out)], size,
             before=[rm], after=[rm], verify=(out, src)),
        Case("nginx + curl", "peer",
             ["curl", "-s", "-o", str(out), f"http://127.0.0.1:{s.ports['nginx']}/src.bin"], size,
             before=[rm], after=[rm], verify=(out, src)),
        Case("aria2c -x 4 -s 4", "peer",
             ["aria2c", "-q", "-x", "4", "-s", "4", "--file-allocation=none", "--allow-overwrite=true",
              "-d", str(d), "-o", "out.bin", f"http://127.0.0.1:{s.ports['nginx']}/src.bin"], size,
             before=[rm], after=[rm], verify=(out, src)),
    ]
    up_xnd = d / "up.xnd"
    # Each upload frees its allocations afterwards (and, in case that failed,
    # the previous one's before), so the depot never fills.
    # `trim -d` became `--decrement`; LORS_BIN may name a binary from before.
    trim_help = subprocess.run([str(lors), "trim", "--help"], capture_output=True, text=True).stdout
    decrement = "--decrement" if "--decrement" in trim_help else "-d"
    free = [str(lors), "trim", "--depot", depot, decrement, "--allow-holes", str(up_xnd)]
    up_base = [str(lors), "upload", *quiet, "--force", "--depot", depot, "-c", "1", "-n", "-o", str(up_xnd)]
    up = [
        Case("lors upload (defaults)", "ours", [*up_base, str(src)], size, before=[free], after=[free]),
        *[
            Case(f"lors upload -t {t}", "ours-tuned", [*up_base[:-2], "-t", str(t), *up_base[-2:], str(src)],
                 size, before=[free], after=[free])
            for t in threads
        ],
        Case("GridFTP globus-url-copy -p 4 -tcp-bs 4M", "peer",
             ["globus-url-copy", "-p", "4", "-tcp-bs", "4M", f"file://{src}",
              f"ftp://127.0.0.1:{s.ports['gridftp']}{d}/up-gridftp.bin"], size,
             before=[["rm", "-f", str(d / "up-gridftp.bin")]],
                 after=[["rm", "-f", str(d / "up-gridftp.bin")]]),
        Case("XRootD xrdcp", "peer",
             ["xrdcp", "-s", "-f", str(src), f"root://127.0.0.1:{s.ports['xrootd']}/{d}/up-xrootd.bin"],
             size, before=[["rm", "-f", str(d / "up-xrootd.bin")]],
                 after=[["rm", "-f", str(d / "up-xrootd.bin")]]),
        Case("nginx (WebDAV PUT) + curl -T", "peer",
             ["curl", "-s", "-f", "-T", str(src), f"http://127.0.0.1:{s.ports['nginx']}/up-nginx.bin"],
             size, before=[["rm", "-f", str(d / "up-nginx.bin")]],
                 after=[["rm", "-f", str(d / "up-nginx.bin")]]),
    ]
    return limits + down, limits + up


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2G", help="file size (default 2G)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    ap.add_argument("--dir", default="/dev/shm/lors-bench", help="working directory on tmpfs")
    ap.add_argument("--threads", default="1,2,4,8",
                    help="hand-picked thread counts run beside the defaults (default 1,2,4,8)")
    ap.add_argument("--only", choices=["download", "upload"], help="run one direction only")
    ap.add_argument("--out", help="also write the Markdown report here")
    ap.add_argument("--baseline", help="an earlier lors binary, run with its own depot beside this build")
    a = ap.parse_args()
    base = Path(a.baseline) if a.baseline else None
    size = parse_size(a.size)
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o777)  # the peer servers run as nobody
    ensure_peers()
    lors = build_lors()
    src = d / "src.bin"
    make_file(src, size)
    src.chmod(0o644)
    s = Servers(lors, d, size, base)
    report = [
        f"## Loopback, {size / GiB:.2f} GiB, one server, tmpfs to tmpfs",
        "",
        f"Machine: {machine()}. {a.rounds} interleaved rounds after a verified warm-up;",
        "rates are size / wall time of the whole command.",
        "",
    ]
    try:
        depot = f"127.0.0.1:{s.ports['depot']}"
        log("uploading the download source with lors")
        subprocess.run([str(lors), "upload", "--quiet", "--force", "--depot", depot, "-c", "1", "-n",
                        "-o", str(d / "src.xnd"), str(src)], check=True)
        if base:
            log("uploading the download source with the baseline build")
            subprocess.run([str(base), "upload", "--quiet", "--force", "--depot",
                            f"127.0.0.1:{s.ports['depot-base']}", "-c", "1", "-n",
                            "-o", str(d / "src-base.xnd"), str(src)], check=True)
        threads = [int(t) for t in a.threads.split(",") if t]
        down, up = cases(lors, s, d, size, threads)
        if base:
            bdown, bup = baseline_cases(base, s, d, size)
            down, up = down + bdown, up + bup
        for name, cs in (("download", down), ("upload", up)):
            if a.only and a.only != name:
                continue
            measure(cs, a.rounds, timeout=600)
            peer_name, peer = best(cs, "peer")
            lim = [median(c.rates()) for c in cs if c.kind == "limit" and c.times]
            limit = min(lim) if lim else float("nan")
            ours = next((median(c.rates()) for c in cs if c.name.startswith("lors") and c.kind == "ours"
                         and c.times), float("nan"))
            tuned = max((median(c.rates()) for c in cs if c.kind == "ours-tuned" and c.times),
                        default=float("nan"))
            report.append(table(f"{name}", cs, {"best peer": peer, "min(limits)": limit}))
            report.append(
                f"{name}: lors defaults {ours:.3f} GiB/s = **{ours / peer:.2f}x** the best peer "
                f"({peer_name}, {peer:.3f}) and **{ours / limit:.2f}x** the smaller physical "
                f"limit ({limit:.3f}); defaults / best hand-picked thread count = "
                f"**{ours / tuned:.2f}**.\n"
            )
            old = next((median(c.rates()) for c in cs if c.kind == "baseline" and c.times), None)
            if old:
                report.append(f"{name}: this build / the baseline build (defaults, each with its own "
                              f"depot) = **{ours / old:.2f}x**.\n")
            print("\n".join(report[-3:] if old else report[-2:]), flush=True)
    finally:
        s.stop()
    save_report("\n".join(report), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
