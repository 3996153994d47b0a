#!/usr/bin/env python3
"""xio benchmark: what an application reading a file on depots gets, through
libxio and through a `lors mount` (FUSE), next to `lors download` in bulk
and, on loopback, the ceiling of FUSE itself (crates/fuse/examples/
ceiling.rs: a file served from memory); and a constant-rate player (the
MPlayer problem of "IBP Deployment Tests and Integration with DiDaS
Project" §7). Needs root (the FUSE mount and the network lab).

    python3 bench/xio.py                                  # everything, defaults
    python3 bench/xio.py --only read --size 512M          # loopback + lab reads
    python3 bench/xio.py --only stream --out docs/bench/xio.md

Sequential reads (`--only read`), on loopback (one depot on 127.0.0.1) and in
the network lab (--lab-k depot hosts behind links of --lab-rate Mbit/s, the
client on a link of the same rate): `bench/xio_read` (C, through libxio)
reads the whole file with 4 KiB, 64 KiB and 1 MiB read() calls, from the
`lors://` exNode and from the file in a `lors mount`; beside them `lors
download` to a file and to a pipe. Every case runs interleaved in one run;
the table gives each case against `lors download` to a file. Target: 4 KiB
reads >= 0.8 x bulk.

Streaming (`--only stream`): 4 depot hosts and the client behind 20 Mbit/s
links; a player reading at 15 Mbit/s with a 2 MiB start-up buffer, fed by
`lors download --start-buffer -o - | player`, by libxio, and by the mount.
Reports start-up delay and stalls (the player finding its buffer empty).
Target: no stall after the start-up buffer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, Case, GiB, log, machine, make_file, measure, median, save_report, stop_all, wait_port  # noqa: E402
from lab import DEPOT_PORT, netlab, ns  # noqa: E402


def build(lors: Path | None) -> tuple[Path, Path]:
    """The release `lors` (or LORS_BIN) and the `xio_read` helper linked to
    the release libxio.so."""
    log("building lors and libxio (release)")
    subprocess.run(["cargo", "build", "--release", "--locked", "-q", "-p", "lors-cli", "-p", "lors-xio-ffi"],
                   cwd=ROOT, check=True)
    subprocess.run(["cargo", "build", "--release", "--locked", "-q", "-p", "lors-fuse", "--example", "ceiling"],
                   cwd=ROOT, check=True)
    rel = ROOT / "target" / "release"
    exe = rel / "xio_read"
    subprocess.run(["gcc", "-O2", "-Wall", "-o", str(exe), str(ROOT / "bench" / "xio_read.c"),
                    f"-I{rel / 'include'}", f"-L{rel}", f"-Wl,-rpath,{rel}", "-lxio"], check=True)
    return (lors or rel / "lors"), exe


def seconds_from_json(out: bytes) -> float:
    return json.loads(out.decode().strip().splitlines()[-1])["seconds"]


READS = [("4 KiB", 4096), ("64 KiB", 65536), ("1 MiB", 1 << 20)]


def read_cases(wrap: list[str], lors: Path, exe: Path, xnd: Path, mnt_script, out: Path,
               size: int) -> list[Case]:
    """`mnt_script(read_size, flags)` is the argv that mounts (with extra
    `lors mount` flags), reads with xio_read and unmounts (a mount lives in
    the namespace its process made)."""
    rm = ["rm", "-f", str(out)]
    cases = [
        Case("lors download -o FILE (bulk)", "bulk", [*wrap, str(lors), "download", "-q", "-o", str(out), str(xnd)],
             size, before=[rm], after=[rm]),
        Case("lors download -o - (stream)", "ours",
             [*wrap, "sh", "-c", f"{lors} download -q -o - {xnd} > /dev/null"], size),
    ]
    for name, n in READS:
        cases.append(Case(f"libxio, {name} reads", "ours", [*wrap, str(exe), f"lors:///{xnd}", str(n)], size,
                          parse=seconds_from_json))
    for name, n in READS:
        cases.append(Case(f"lors mount, {name} reads", "ours", mnt_script(n), size, parse=seconds_from_json))
    # Beside them, the mount answering from memory (as before replies were
    # spliced): what splicing gains.
    cases.append(Case("lors mount --copy-reads, 4 KiB reads", "ours", mnt_script(4096, "--copy-reads"), size,
                      parse=seconds_from_json))
    return cases


def table(title: str, cases: list[Case]) -> str:
    bulk = next(c for c in cases if c.kind == "bulk")
    ref = median(bulk.rates()) if bulk.times else float("nan")
    lines = [title, "", "| case | median MiB/s | min-max MiB/s | / bulk download |", "|---|---|---|---|"]
    for c in cases:
        if c.failed or not c.times:
            lines.append(f"| {c.name} | failed: {c.failed} | | |")
            continue
        rs = [r * 1024 for r in c.rates()]
        lines.append(f"| {c.name} | {median(rs):.1f} | {min(rs):.1f}-{max(rs):.1f} | {median(c.rates()) / ref:.2f} |")
    return "\n".join(lines) + "\n"


def mount_script(wrap: list[str], lors: Path, exe: Path, xnds: Path, mnt: Path, depot: str, name: str):
    def argv(n: int, flags: str = "") -> list[str]:
        script = (f"{lors} mount {flags} --depot {depot} {xnds} {mnt} > /dev/null & "
                  f"until mountpoint -q {mnt}; do sleep 0.02; done; "
                  f"{exe} {mnt}/{name} {n}; r=$?; umount {mnt}; wait; exit $r")
        return [*wrap, "sh", "-c", script]
    return argv


def loopback_reads(lors: Path, exe: Path, d: Path, size: int, rounds: int) -> str:
    work = d / "loop"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    (work / "x").mkdir(parents=True)
    (work / "m").mkdir()
    src = d / "src.bin"
    make_file(src, size)
    port = 16790
    depot = subprocess.Popen([str(lors), "depot", "--listen", f"127.0.0.1:{port}", "--data", str(work / "depot"),
                              "--size", "16G", "--sync", "never"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        wait_port("127.0.0.1", port)
        addr = f"127.0.0.1:{port}"
        xnd = work / "x" / "f.xnd"
        subprocess.run([str(lors), "upload", "-q", "-n", "-c", "1", "--depot", addr, "-o", str(xnd), str(src)],
                       check=True)
        cases = read_cases([], lors, exe, xnd, mount_script([], lors, exe, work / "x", work / "m", addr, "f"),
                           work / "out.bin", size)
        ceiling = ROOT / "target" / "release" / "examples" / "ceiling"
        m = work / "m"
        cases.append(Case("FUSE ceiling: a file served from memory, 4 KiB reads", "limit",
                          ["sh", "-c", f"{ceiling} {m} {size} & until mountpoint -q {m}; do sleep 0.02; done; "
                                       f"{exe} {m}/file 4096; r=$?; umount {m}; wait; exit $r"],
                          size, parse=seconds_from_json))
        measure(cases, rounds, timeout=600)
    finally:
        depot.terminate()
        depot.wait()
    return table(f"### Loopback: one depot on 127.0.0.1, {size >> 20} MiB, tmpfs", cases)


class Lab:
    """Depot hosts 1..k and a client host k+1, every link at `rate` Mbit/s."""

    def __init__(self, lors: Path, d: Path, k: int, rate: int):
        self.k, self.client, self.procs = k, k + 1, []
        netlab("up", str(k + 1), str(rate))
        self.addr = {i: netlab("addr", str(i)) for i in range(1, k + 2)}
        for i in range(1, k + 1):
            dd = d / f"depot-{i}"
            subprocess.run(["rm", "-rf", str(dd)], check=True)
            self.procs.append(subprocess.Popen(
                [*ns(i), str(lors), "depot", "--listen", f"{self.addr[i]}:{DEPOT_PORT}", "--data", str(dd),
                 "--size", "8G", "--sync", "never"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for i in range(1, k + 1):
            wait_port(self.addr[i], DEPOT_PORT, wrap=ns(self.client))

    def depots(self) -> list[str]:
        return [f"{self.addr[i]}:{DEPOT_PORT}" for i in range(1, self.k + 1)]

    def place(self, lors: Path, src: Path, xnd: Path, copies: int) -> None:
        args = [str(lors), "upload", "-q", "--force", "-n", "-c", str(copies), "-o", str(xnd)]
        for dep in self.depots():
            args += ["--depot", dep]
        log(f"placing {src.stat().st_size >> 20} MiB on {self.k} depots, {copies} copies")
        subprocess.run([*ns(self.client), *args, str(src)], check=True)

    def stop(self) -> None:
        stop_all(self.procs)
        netlab("down")


def lab_with_file(lors: Path, d: Path, name: str, k: int, rate: int, size: int,
                  copies: int) -> tuple[Lab, Path, Path]:
    """A lab of k depot hosts at `rate` and a file of `size` random bytes
    placed on them; returns the lab, its work directory (exNodes in x/, a
    mount point m/) and the exNode."""
    work = d / name
    subprocess.run(["rm", "-rf", str(work)], check=True)
    (work / "x").mkdir(parents=True)
    (work / "m").mkdir()
    src = d / f"{name}-src.bin"
    make_file(src, size)
    lab = Lab(lors, work, k, rate)
    xnd = work / "x" / "f.xnd"
    try:
        lab.place(lors, src, xnd, copies)
    except BaseException:
        lab.stop()
        raise
    return lab, work, xnd


def lab_reads(lors: Path, exe: Path, d: Path, k: int, rate: int, size: int, rounds: int) -> str:
    lab, work, xnd = lab_with_file(lors, d, "lab", k, rate, size, min(2, k))
    try:
        wrap = ns(lab.client)
        cases = read_cases(wrap, lors, exe, xnd,
                           mount_script(wrap, lors, exe, work / "x", work / "m", lab.depots()[0], "f"),
                           work / "out.bin", size)
        measure(cases, rounds, timeout=900)
    finally:
        lab.stop()
    return table(f"### Network lab: {k} depot hosts and the client at {rate} Mbit/s each, {size >> 20} MiB, "
                 f"{min(2, k)} copies", cases)


def streaming(lors: Path, exe: Path, d: Path, size: int, rounds: int) -> str:
    k, rate, play = 4, 20, 15_000_000 / 8
    buffer = 2 << 20
    lab, work, xnd = lab_with_file(lors, d, "stream", k, rate, size, 2)
    results: dict[str, list[dict]] = {}
    try:
        wrap = ns(lab.client)
        player = f"{exe} {{src}} 65536 {play:.0f} {{buf}}"
        modes = {
            "lors download --start-buffer 2M -o - | player":
                f"{lors} download -q --start-buffer {buffer} -o - {xnd} | "
                + player.format(src="-", buf=256 << 10),
            "libxio (lors://), player buffer 2 MiB": player.format(src=f"lors:///{xnd}", buf=buffer),
            "lors mount, player buffer 2 MiB":
                f"{lors} mount --depot {lab.depots()[0]} {work / 'x'} {work / 'm'} > /dev/null & "
                f"until mountpoint -q {work / 'm'}; do sleep 0.02; done; "
                + player.format(src=f"{work / 'm'}/f", buf=buffer)
                + f"; r=$?; umount {work / 'm'}; wait; exit $r",
        }
        for r in range(rounds):
            for name, script in modes.items():
                log(f"round {r + 1}/{rounds}: {name}")
                out = subprocess.run([*wrap, "sh", "-c", script], capture_output=True, timeout=600)
                if out.returncode != 0:
                    results.setdefault(name, []).append({"failed": out.stderr.decode()[-300:]})
                    continue
                results.setdefault(name, []).append(json.loads(out.stdout.decode().strip().splitlines()[-1]))
    finally:
        lab.stop()
    lines = [f"### Streaming: a player at 15 Mbit/s, {k} depot hosts and the client at {rate} Mbit/s, "
             f"{size >> 20} MiB ({size / play:.1f} s of playback), 2 copies", "",
             "| feed | start-up s (per round) | stalls (per round) | stalled s (per round) | first stall s into playback |",
             "|---|---|---|---|---|"]
    for name, rs in results.items():
        ok = [x for x in rs if "failed" not in x]
        if len(ok) < len(rs):
            lines.append(f"| {name} | failed: {next(x['failed'] for x in rs if 'failed' in x)} | | | |")
            continue
        fmt = lambda key, f: ", ".join(f.format(x[key]) for x in ok)  # noqa: E731
        first_stall = lambda x: f"{x['first_stall']:.1f}" if x["first_stall"] >= 0 else "-"  # noqa: E731
        lines.append(f"| {name} | {fmt('startup', '{:.2f}')} | {fmt('stalls', '{}')} | "
                     f"{fmt('stall_seconds', '{:.2f}')} | "
                     f"{', '.join(first_stall(x) for x in ok)} |")
    ideal = buffer / (rate * 1e6 / 8)
    lines += ["", f"Ideal start-up: the 2 MiB buffer at the link's {rate} Mbit/s = {ideal:.2f} s.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["read", "stream"], help="one part only")
    ap.add_argument("--size", default="512M", help="loopback file size (default 512M)")
    ap.add_argument("--lab-size", default="96M", help="lab file size (default 96M)")
    ap.add_argument("--lab-k", type=int, default=2, help="depot hosts in the lab read test (default 2)")
    ap.add_argument("--lab-rate", type=int, default=100, help="lab link rate in Mbit/s (default 100)")
    ap.add_argument("--stream-size", default="24M", help="streamed file size (default 24M)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (default 3)")
    ap.add_argument("--dir", default="/dev/shm/lors-xio", help="working directory on tmpfs")
    ap.add_argument("--out", help="also write the Markdown report here")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("xio.py needs root (FUSE mounts and network namespaces)")
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    env_bin = os.environ.get("LORS_BIN")
    lors, exe = build(Path(env_bin) if env_bin else None)
    size = lambda s: int(float(s[:-1]) * {"K": 1 << 10, "M": 1 << 20, "G": GiB}[s[-1].upper()])  # noqa: E731
    report = ["## xio: reading files on depots as an application does", "",
              f"Machine: {machine()}. {a.rounds} interleaved rounds after a warm-up; rates are size / time "
              "(libxio and mount cases: the reader's own time from open to EOF; downloads: the whole "
              "command).", ""]
    if a.only in (None, "read"):
        for text in (loopback_reads(lors, exe, d, size(a.size), a.rounds),
                     lab_reads(lors, exe, d, a.lab_k, a.lab_rate, size(a.lab_size), a.rounds)):
            report.append(text)
            print(text, flush=True)
    if a.only in (None, "stream"):
        text = streaming(lors, exe, d, size(a.stream_size), a.rounds)
        report.append(text)
        print(text, flush=True)
    save_report("\n".join(report), a.out)
    return 0


if __name__ == "__main__":
    started = time.time()
    rc = main()
    log(f"done in {time.time() - started:.0f} s")
    sys.exit(rc)
