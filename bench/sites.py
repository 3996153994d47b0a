#!/usr/bin/env python3
"""Moving a data set between two sites (the Data Reservoir pattern) in the
network lab (scripts/netlab.sh, needs root):

    site A = hosts 1-4, site B = hosts 5-8, each a depot behind a link of R;
    the client = host 9, on a link of R/10.

    python3 bench/sites.py                         # 256 MiB, R = 200 Mbit/s, 3 rounds
    python3 bench/sites.py --size 512M --rate 100 --out docs/bench/sites.md

A striped file (one copy, 8 MiB blocks, even over A's four depots) moves
to B, measured in the same lab:
  * `lors route --depot B1..B4` from the client: every A depot sends to a
    B depot (IBP SEND, depot to depot), the client only steers. Ideal:
    S / (4R), the four links' sum; target within 1.15x of it.
  * GridFTP third-party: `globus-url-copy -p 4 ftp://A1/… ftp://B1/…` from
    the client between two globus-gridftp-servers (the file whole on A1):
    the data flows server to server, over one site link each. Ideal: S / R.
  * `lors download` to the client and `lors upload` from it to B: every
    byte crosses the client's slow link twice. Ideal: 2 S / (R/10); run
    once (it is twenty times the others).
Each move is checked: the moved file downloads byte-identical.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import GiB, build_lors, ensure_peers, log, machine, make_file, median, save_report, same_file, stop_all, wait_port  # noqa: E402,E501
from lab import DEPOT_PORT, netlab, ns  # noqa: E402
from loopback import parse_size  # noqa: E402

FTP_PORT = 2811
A, B, CLIENT = [1, 2, 3, 4], [5, 6, 7, 8], 9


class Sites:
    def __init__(self, lors: Path, d: Path, rate: int):
        self.lors, self.d, self.rate = lors, d, rate
        netlab("up", str(CLIENT), str(rate))
        netlab("rate", str(CLIENT), str(max(1, rate // 10)))
        self.addr = {i: netlab("addr", str(i)) for i in range(1, CLIENT + 1)}
        self.procs: list[subprocess.Popen] = []
        logs = d / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        logs.chmod(0o777)
        for i in A + B:
            dd = d / f"depot-{i}"
            shutil.rmtree(dd, ignore_errors=True)
            self.spawn(f"depot-{i}", [*ns(i), str(lors), "depot", "--listen", f"{self.addr[i]}:{DEPOT_PORT}",
                                      "--data", str(dd), "--size", "4G", "--sync", "never"])
        for i in (A[0], B[0]):
            self.spawn(f"gridftp-{i}", [*ns(i), "globus-gridftp-server", "-aa", "-anonymous-user", "nobody",
                                        "-p", str(FTP_PORT), "-data-interface", self.addr[i], "-d", "error",
                                        "-l", str(logs / f"gridftp-{i}.log")])
        wrap = ns(CLIENT)
        for i in A + B:
            wait_port(self.addr[i], DEPOT_PORT, wrap=wrap)
        for i in (A[0], B[0]):
            wait_port(self.addr[i], FTP_PORT, wrap=wrap)

    def spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.d / "logs" / f"{name}.out", "wb")
        self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT))

    def depots(self, site: list[int]) -> str:
        return ",".join(f"{self.addr[i]}:{DEPOT_PORT}" for i in site)

    def lors_at(self, host: int, *args: str) -> list[str]:
        return [*ns(host), str(self.lors), *args]

    def stop(self) -> None:
        stop_all(self.procs)
        netlab("down")


def run(argv: list[str], what: str) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True)
    if r.returncode != 0:
        raise RuntimeError(f"{what}: exit {r.returncode}: {r.stderr.decode(errors='replace')[-600:]}")
    return time.perf_counter() - t0


def runs_layout(s: Sites, lors: Path, d: Path, src: Path, striped: Path) -> Path:
    """The file laid out in runs: A1 holds its first quarter, A2 the next…
    (as a file written depot by depot, or remade by a keeper, may be).
    Made from one upload per A depot, each block taken from the quarter's
    depot; the other copies are left to their lease."""
    blocks = re.findall(r"<exnode:mapping>.*?</exnode:mapping>", striped.read_text(), re.S)
    per = -(-len(blocks) // len(A))
    whole = {}
    for h in A:
        one = d / f"on-{h}.xnd"
        run(s.lors_at(CLIENT, "upload", "-q", "--force", "-n", "-c", "1", "-b", "8M", "--depot",
                      f"{s.addr[h]}:{DEPOT_PORT}", "-o", str(one), str(src)), "place")
        whole[h] = re.findall(r"<exnode:mapping>.*?</exnode:mapping>", one.read_text(), re.S)
    picked = [whole[A[min(i // per, len(A) - 1)]][i] for i in range(len(blocks))]
    text = striped.read_text()
    head, tail = text[: text.index("<exnode:mapping>")], text[text.rindex("</exnode:mapping>") + 17:]
    out = d / "runs.xnd"
    out.write_text(head + "\n  ".join(picked) + tail)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=256 << 20)
    ap.add_argument("--rate", type=int, default=200, help="site links, Mbit/s (the client gets a tenth)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/dev/shm/lors-sites")
    ap.add_argument("--baseline", help="an earlier lors binary whose route runs beside this build's")
    ap.add_argument("--out")
    a = ap.parse_args()
    ensure_peers()
    lors = build_lors()
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o777)
    src = d / "src.bin"
    make_file(src, a.size)
    src.chmod(0o644)
    moved = d / "moved"
    moved.mkdir(exist_ok=True)
    moved.chmod(0o777)
    s = Sites(lors, d, a.rate)
    R = a.rate * 1e6 / 8
    xnd, out = d / "src.xnd", d / "moved.xnd"
    client_path = float("nan")
    per_depot: list[int] = []
    ok = True
    # name -> (label, argv of the move, ideal seconds); each route's output checked once.
    cases: dict[str, tuple[str, list[str], float]] = {}
    times: dict[str, list[float]] = {}
    try:
        # From the client with its link opened for the while: over four
        # equal links the upload's least-busy placement stripes the file
        # evenly (from a host of site A, its own depot would take most).
        log(f"placing {a.size >> 20} MiB on site A (one copy, 8 MiB blocks)")
        netlab("rate", str(CLIENT), "0")
        run(s.lors_at(CLIENT, "upload", "-q", "--force", "-n", "-c", "1", "-b", "8M", "--depot", s.depots(A),
                      "-o", str(xnd), str(src)), "place")
        text = xnd.read_text()
        per_depot = [text.count(f"<exnode:read>ibp://{s.addr[h]}:{DEPOT_PORT}/") for h in A]
        log(f"blocks per depot of site A: {per_depot}")
        runs = runs_layout(s, lors, d, src, xnd)
        netlab("rate", str(CLIENT), str(max(1, a.rate // 10)))
        builds = [("", lors)] + ([(" (baseline build)", Path(a.baseline))] if a.baseline else [])
        for tag, binary in builds:
            for layout, f in (("striped", xnd), ("in runs", runs)):
                argv = [*ns(CLIENT), str(binary), "route", "-q", "--keep-old", "--depot", s.depots(B),
                        "-o", str(out), str(f)]
                cases[f"route {layout}{tag}"] = (f"`lors route` A → B, file {layout}{tag}", argv, a.size / (4 * R))
        dst = moved / "src.bin"
        cases["gridftp"] = ("GridFTP third-party, `globus-url-copy -p 4`",
                            [*ns(CLIENT), "globus-url-copy", "-p", "4", "-tcp-bs", "4M",
                             f"ftp://{s.addr[A[0]]}:{FTP_PORT}{src}", f"ftp://{s.addr[B[0]]}:{FTP_PORT}{dst}"],
                            a.size / R)
        times = {c: [] for c in cases}
        back = d / "back.bin"
        for r in range(a.rounds):
            log(f"round {r + 1}/{a.rounds}")
            order = list(cases) if r % 2 == 0 else list(reversed(cases))
            for c in order:
                dst.unlink(missing_ok=True)
                times[c].append(run(cases[c][1], c))
                if c == "gridftp":
                    if r == 0:
                        ok &= same_file(dst, src)
                    dst.unlink(missing_ok=True)
                    continue
                # (--keep-old: the output names B's copies only; A's stay.)
                if r == 0:
                    run(s.lors_at(B[0], "download", "-q", "-o", str(back), str(out)), "check")
                    ok &= same_file(back, src)
                    back.unlink()
                run(s.lors_at(CLIENT, "trim", "-q", "--decrement", "--allow-holes", "--depot", s.depots(B),
                              "-o", str(d / "after.xnd"), str(out)), "free B")
        log("download + upload through the client (once)")
        via, up = d / "via.bin", d / "up.xnd"
        t0 = time.perf_counter()
        run(s.lors_at(CLIENT, "download", "-q", "-o", str(via), str(xnd)), "download")
        run(s.lors_at(CLIENT, "upload", "-q", "--force", "-n", "-c", "1", "-b", "8M", "--depot", s.depots(B),
                      "-o", str(up), str(via)), "upload")
        client_path = time.perf_counter() - t0
        ok &= same_file(via, src)
        via.unlink()
    finally:
        s.stop()
    lines = [
        f"## Moving {a.size / GiB:.2f} GiB from site A to site B",
        "",
        f"Machine: {machine()}. Network lab: four depot hosts per site, each on a link of "
        f"{a.rate} Mbit/s; the client on {max(1, a.rate // 10)} Mbit/s. {a.rounds} interleaved rounds "
        "(the client path once); whole commands, from the client. The file's 8 MiB blocks per depot "
        f"of site A: {per_depot} (striped as uploaded), or a quarter of the file on each in turn "
        "(in runs).",
        "",
        "| move | median s | min-max s | ideal s | / ideal |",
        "|---|---|---|---|---|",
    ]
    for c, (label, _, ideal) in cases.items():
        t = times[c]
        lines.append(f"| {label} | {median(t):.2f} | {min(t):.2f}-{max(t):.2f} | {ideal:.2f} | "
                     f"{median(t) / ideal:.2f} |")
    ideal_client = 2 * a.size / (R / 10)
    lines.append(f"| `lors download` + `lors upload` through the client | {client_path:.2f} | – | "
                 f"{ideal_client:.2f} | {client_path / ideal_client:.2f} |")
    route = median(times["route striped"])
    lines += [
        "",
        f"`lors route` / S/(4R): **{route / cases['route striped'][2]:.2f}** striped, "
        f"**{median(times['route in runs']) / cases['route in runs'][2]:.2f}** in runs (target ≤ 1.15); "
        f"GridFTP third-party / route: {median(times['gridftp']) / route:.1f}×; "
        f"through the client / route: {client_path / route:.0f}×. "
        f"Every moved copy checked: {'byte-identical' if ok else 'DIFFERENT'}.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    save_report(text, a.out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
