#!/usr/bin/env python3
"""At distance: the trans-Atlantic experiments of "Video IBPster" redone in the
network lab, with round trips and loss from the lab's wire (`lors-wan`, see
docs/bench.md "Distance in the network lab"). Needs root.

    sudo python3 bench/wan.py --quick            # (b) untuned, 384 MiB, one round: about 2 minutes
    sudo python3 bench/wan.py --out docs/bench/wan.md    # every experiment
    sudo python3 bench/wan.py --exp b --tcp tuned --loss 0.1,1 --rounds 3
    sudo python3 bench/wan.py --exp "" --stream 10      # (f): 15 Mbit/s video, stalls

The experiments (depot hosts 1..k, the client host k+1):
  (a) one depot at 100 Mbit/s, 188 ms RTT; client at 1 Gbit/s
  (b) three depots at 100 Mbit/s, 188 ms RTT each; client at 1 Gbit/s
  (c) three depots at 100 Mbit/s with RTT 14, 30 and 45 ms; client at 1 Gbit/s
  (d) one depot on a 1 Gbit/s LAN (no wire: it cannot add distance at 1 Gbit/s on
      two cores without becoming the bottleneck, and the LAN has none)
and beside them (e) upload and augment at 188 ms (`--sending`), (f) a 15 Mbit/s
stream from eight depots at 188 ms into a player (`--stream RUNS`), (g)
`lors disseminate` to four sites at 30-188 ms (`--dissem ROUNDS`) and (h) 100
files of 1 MiB against one of 100 MiB, up and down at 188 ms (`--files ROUNDS`).
each with TCP "untuned" (buffers capped at 64 KiB on every host, as the paper's
hosts) and "tuned" (the machine's own autotuning). Every depot host serves the
same file through a LoRS depot (a full replica each), nginx, xrootd and a
GridFTP server; the client runs, interleaved round after round:
  * iperf3 from depot host 1, one stream (the one-link TCP limit);
  * `lors download` with its defaults, and with each `-a` of the sweep;
  * aria2c with every host as a mirror, `xrdcp --sources k`, and
    `globus-url-copy -p N` from host 1 (GridFTP reads one server).
The headline of each experiment is lors' default download over the sum of the
depot links' nominal rates; `--quick` ends with `lors defaults: R x links`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    ROOT,
    Case,
    build_lors,
    ensure_peers,
    log,
    machine,
    make_file,
    measure,
    median,
    save_report,
    stop_all,
    wait_port,
)

from lab import iperf_seconds  # noqa: E402

NETLAB = ROOT / "scripts" / "netlab.sh"
ENV = dict(os.environ, NL_PREFIX="lorsw", NL_NET="10.213.11")
DEPOT_PORT, HTTP_PORT, XRD_PORT, FTP_PORT, IPERF_PORT = 6714, 8080, 1094, 2811, 5201


def netlab(*args: str) -> str:
    r = subprocess.run([str(NETLAB), *args], env=ENV, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"netlab.sh {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout.strip()


def ns(i: int) -> list[str]:
    return ["ip", "netns", "exec", f"lorsw-h{i}"]


@dataclass
class Topology:
    """Depot links (Mbit/s, one-way delay in ms) and the client's link."""

    name: str
    links: list[tuple[int, float]]
    client_rate: int = 1000

    def rtts(self) -> str:
        return ", ".join(f"{2 * d:g}" for _, d in self.links)

    def capacity(self) -> float:
        """The sum of the depot links, Mbit/s (the client's link is wider)."""
        return min(sum(r for r, _ in self.links), self.client_rate)


EXPERIMENTS = {
    "a": Topology("(a) one depot, 100 Mbit/s, 188 ms", [(100, 94.0)]),
    "b": Topology("(b) three depots, 100 Mbit/s, 188 ms", [(100, 94.0)] * 3),
    "c": Topology("(c) three depots, 100 Mbit/s, 14/30/45 ms", [(100, 7.0), (100, 15.0), (100, 22.5)]),
    "d": Topology("(d) one depot, 1 Gbit/s LAN", [(1000, 0.0)]),
}

# The paper's Table/figures: best throughput and the threads it took.
PAPER = {
    "a": "89 Mbit/s with 25 threads",
    "b": "103 Mbit/s with 150 threads",
    "c": "184 Mbit/s with 275 threads",
    "d": "749 Mbit/s with 15 threads",
}


class WanLab:
    """Depot hosts 1..k, each serving the same file four ways; the client is k+1."""

    def __init__(self, lors: Path, d: Path, topo: Topology, src: Path, loss: float = 0.0, place: bool = True,
                 copies: int | None = None):
        self.topo, self.d, self.lors, self.src = topo, d, lors, src
        self.k = len(topo.links)
        self.client = self.k + 1
        self.procs: dict[str, subprocess.Popen] = {}
        netlab("up", str(self.k + 1), "0")
        self.addr = {i: netlab("addr", str(i)) for i in range(1, self.k + 2)}
        logs = d / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        logs.chmod(0o777)
        www = src.parent
        for i in range(1, self.k + 1):
            a = self.addr[i]
            dd = d / f"depot-{i}"
            shutil.rmtree(dd, ignore_errors=True)
            self.spawn(f"depot-{i}", [*ns(i), str(lors), "depot", "--listen", f"{a}:{DEPOT_PORT}",
                                      "--data", str(dd), "--size", "8G", "--sync", "never"])
            conf = d / f"nginx-{i}.conf"
            conf.write_text(
                f"""worker_processes 1; daemon off; pid {d}/nginx-{i}.pid; error_log {logs}/nginx-{i}.log;
events {{ worker_connections 1024; }}
http {{ access_log off; sendfile on; tcp_nopush on;
  server {{ listen {a}:{HTTP_PORT}; root {www}; }} }}
"""
            )
            self.spawn(f"nginx-{i}", [*ns(i), "nginx", "-c", str(conf), "-p", str(d)])
            xc = d / f"xrootd-{i}.cfg"
            xc.write_text(f"all.export {www}\nxrd.port {XRD_PORT}\n")
            self.spawn(f"xrootd-{i}", [*ns(i), "xrootd", "-c", str(xc), "-l", f"{logs}/xrootd-{i}.log",
                                       "-R", "nobody", "-n", f"wan{i}"])
            self.spawn(f"gridftp-{i}", [*ns(i), "globus-gridftp-server", "-aa", "-anonymous-user", "nobody",
                                        "-p", str(FTP_PORT), "-data-interface", a, "-d", "error",
                                        "-l", str(logs / f"gridftp-{i}.log")])
        self.spawn("iperf3", [*ns(1), "iperf3", "-s", "-p", str(IPERF_PORT)])
        wrap = ns(self.client)
        for i in range(1, self.k + 1):
            for p in (DEPOT_PORT, HTTP_PORT, XRD_PORT, FTP_PORT):
                wait_port(self.addr[i], p, wrap=wrap)
        wait_port(self.addr[1], IPERF_PORT, wrap=wrap)
        # A full replica on every depot, placed before the distance is set.
        self.xnd = d / f"{src.stem}.xnd"
        if place:
            c = copies or self.k
            args = [str(lors), "upload", "--quiet", "--force", "-n", "-c", str(c), "-o", str(self.xnd), str(src)]
            for dep in self.depots():
                args[2:2] = ["--depot", dep]
            if copies == 1:
                args[2:2] = ["-b", "2M"]  # striped in 2 MB blocks, as the paper's video
            log(f"placing {src.stat().st_size >> 20} MiB on {self.k} depots, {c} copies")
            subprocess.run(self.at_client(args), check=True)
        self.distance(loss)

    def distance(self, loss: float) -> None:
        """Rates, then the wire's delay and loss on every depot link."""
        for i, (rate, delay) in enumerate(self.topo.links, 1):
            netlab("rate", str(i), str(rate))
            if delay or loss:
                netlab("wan", str(i), f"{delay:g}", f"{loss:g}")
        netlab("rate", str(self.client), str(self.topo.client_rate))
        # Neighbours resolved before any timed run: across a real WAN a router
        # answers ARP, not the far host, so its round trip is no part of one.
        for i in range(1, self.k + 1):
            subprocess.run(self.at_client(["ping", "-c", "2", "-W", "2", self.addr[i]]), capture_output=True)

    def tcp(self, how: str) -> None:
        netlab("tcp", "all", how)

    def spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.d / "logs" / f"{name}.out", "wb")
        self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def depots(self) -> list[str]:
        return [f"{self.addr[i]}:{DEPOT_PORT}" for i in range(1, self.k + 1)]

    def at_client(self, argv: list[str]) -> list[str]:
        return [*ns(self.client), *argv]

    def stop(self) -> None:
        stop_all(self.procs.values())
        netlab("down")


def meta4(lab: WanLab) -> Path:
    """A metalink naming every host's xrootd copy, for `xrdcp --sources k`."""
    src = lab.src
    urls = "\n".join(
        f'    <url location="h{i}" priority="1">root://{lab.addr[i]}:{XRD_PORT}/{src}</url>'
        for i in range(1, lab.k + 1)
    )
    m = lab.d / f"{src.name}.meta4"
    m.write_text(
        f"""<?xml version="1.0" encoding="UTF-8"?>
<metalink xmlns="urn:ietf:params:xml:ns:metalink">
  <file name="{src.name}">
    <size>{src.stat().st_size}</size>
{urls}
  </file>
</metalink>
"""
    )
    return m


def cases(lab: WanLab, threads: list[int], peers: bool, baseline: Path | None) -> list[Case]:
    """Every case of one experiment, on the file placed in `lab`."""
    src, size = lab.src, lab.src.stat().st_size
    out = lab.d / "out.bin"
    rm = [["rm", "-f", str(out)]]
    lors = [str(lab.lors), "download", "--quiet", "-o", str(out)]
    got = (out, src)
    cs = [
        Case("iperf3, one link, one stream", "limit",
             lab.at_client(["iperf3", "-c", lab.addr[1], "-p", str(IPERF_PORT), "-R", "-t", "10", "-J"]),
             size // lab.k, parse=iperf_seconds(size // lab.k)),
        Case("lors download (defaults)", "ours", lab.at_client([*lors, str(lab.xnd)]), size,
             before=rm, after=rm, verify=got),
    ]
    if baseline:
        cs.append(Case("lors download (defaults), baseline build", "baseline",
                       lab.at_client([str(baseline), *lors[1:], str(lab.xnd)]), size,
                       before=rm, after=rm, verify=got))
    cs += [Case(f"lors download -a {t}", "sweep", lab.at_client([*lors, "-a", str(t), str(lab.xnd)]), size,
                before=rm, after=rm) for t in threads]
    if not peers:
        return cs
    mirrors = [f"http://{lab.addr[i]}:{HTTP_PORT}/{src.name}" for i in range(1, lab.k + 1)]
    per = 16  # aria2c's most connections per server
    cs += [
        Case(f"aria2c, {lab.k} mirrors, {per} connections each", "peer",
             lab.at_client(["aria2c", "-q", "-x", str(per), "-s", str(per * lab.k), "-k", "1M",
                            "--file-allocation=none", "--allow-overwrite=true",
                            "-d", str(lab.d), "-o", out.name, *mirrors]),
             size, before=rm, after=rm, verify=got),
        Case(f"xrdcp --sources {lab.k} --streams 15", "peer",
             lab.at_client(["xrdcp", "-s", "-f", "--sources", str(lab.k), "--streams", "15",
                            str(meta4(lab)), str(out)]),
             size, before=rm, after=rm, verify=got),
        Case("globus-url-copy -p 16 (host 1)", "peer",
             lab.at_client(["globus-url-copy", "-p", "16", "-fast",
                            f"ftp://{lab.addr[1]}:{FTP_PORT}{src}", f"file://{out}"]),
             size, before=rm, after=rm, verify=got),
    ]
    return cs


def emit(texts: list[str], lines: list[str]) -> None:
    """One table of the report: printed as it is done, kept for the file."""
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    texts.append(text)


def mbit(c: Case) -> list[float]:
    return [c.size * 8 / t / 1e6 for t in c.times]


def report(topo: Topology, key: str, tcp: str, loss: float, cs: list[Case]) -> tuple[str, float]:
    cap = topo.capacity()
    title = f"### {topo.name}, TCP {tcp}" + (f", loss {loss:g} % each way" if loss else "")
    lines = [title, "",
             f"Depot RTTs {topo.rtts()} ms; the links sum to {cap:g} Mbit/s; "
             f"the paper: {PAPER[key]}.", "",
             "| case | median Mbit/s | min-max | / links |", "|---|---|---|---|"]
    for c in cs:
        if c.failed or not c.times:
            lines.append(f"| {c.name} | failed: {c.failed} | | |")
            continue
        rs = mbit(c)
        ref = topo.links[0][0] if c.kind == "limit" else cap
        lines.append(f"| {c.name} | {median(rs):.1f} | {min(rs):.1f}-{max(rs):.1f} | {median(rs) / ref:.3f} |")
    ours = next((median(mbit(c)) / cap for c in cs if c.kind == "ours" and c.times), float("nan"))
    lines += ["", f"lors defaults: **{ours:.3f}** x links", ""]
    return "\n".join(lines), ours


def experiment(lors: Path, d: Path, key: str, tcps: list[str], loss: float, per_link: int, rounds: int,
               threads: list[int], peers: bool, baseline: Path | None) -> tuple[list[str], list[float]]:
    topo = EXPERIMENTS[key]
    www = d / "www"
    src = www / f"wan-{key}.bin"
    make_file(src, per_link * len(topo.links))
    src.chmod(0o644)
    lab = WanLab(lors, d, topo, src, loss)
    texts, ratios = [], []
    try:
        for tcp in tcps:
            lab.tcp(tcp)
            cs = cases(lab, threads, peers, baseline)
            # A tool at a tenth of the links is cut off and said to be slower.
            at_links = src.stat().st_size * 8 / (topo.capacity() * 1e6)
            measure(cs, rounds, timeout=max(120.0, 10 * at_links))
            text, r = report(topo, key, tcp, loss, cs)
            print(text, flush=True)
            texts.append(text)
            ratios.append(r)
    finally:
        lab.stop()
    return texts, ratios


# Upload and augment at distance: depot host 1 188 ms from the client, depot
# host 2 beside the client (so 188 ms from host 1 too), the client host 3.
SENDING = Topology("(e) upload to a depot 188 ms away; augment from it to one 188 ms from it",
                   [(100, 94.0), (100, 0.0)])


def sending(lors: Path, d: Path, tcps: list[str], per_link: int, rounds: int) -> list[str]:
    """`lors upload` to host 1 beside GridFTP's and iperf3's upload, and
    `lors augment` from host 1 to host 2 (depot to depot), each against the
    100 Mbit/s link."""
    src = d / "www" / "wan-up.bin"
    make_file(src, per_link)
    src.chmod(0o644)
    lab = WanLab(lors, d, SENDING, src, place=False)
    texts = []
    up, base, aug = d / "up.xnd", d / "base.xnd", d / "aug.xnd"
    h1, h2 = lab.depots()
    lors_ = str(lors)
    try:
        for tcp in tcps:
            lab.tcp(tcp)
            log(f"placing the file to augment on host 1 ({tcp})")
            subprocess.run(lab.at_client([lors_, "upload", "-q", "-n", "--force", "-c", "1", "--depot", h1,
                                          "-o", str(base), str(src)]), check=True)
            cs = [
                Case("iperf3 to host 1, one stream", "limit",
                     lab.at_client(["iperf3", "-c", lab.addr[1], "-p", str(IPERF_PORT), "-t", "10", "-J"]),
                     per_link, parse=iperf_seconds(per_link)),
                # As many streams as a download's connections (94) and an
                # upload's blocks in flight (72) at 188 ms: what that many
                # untuned TCP connections get from this path.
                *[Case(f"iperf3 to host 1, {n} streams", "limit",
                       lab.at_client(["iperf3", "-c", lab.addr[1], "-p", str(IPERF_PORT), "-t", "10", "-P", str(n),
                                      "-J"]),
                       per_link, parse=iperf_seconds(per_link)) for n in (94, 72)],
                Case("lors upload -c 1, to host 1", "ours",
                     lab.at_client([lors_, "upload", "-q", "-n", "--force", "-c", "1", "--depot", h1,
                                    "-o", str(up), str(src)]), per_link,
                     after=[lab.at_client([lors_, "rm", "-q", str(up)])]),
                Case("lors augment -c 1, host 1 to host 2", "ours",
                     lab.at_client([lors_, "augment", "-q", "-c", "1", "--depot", h2, str(aug)]), per_link,
                     before=[["cp", str(base), str(aug)]]),
                Case("globus-url-copy -p 16, to host 1", "peer",
                     lab.at_client(["globus-url-copy", "-p", "16", "-fast", f"file://{src}",
                                    f"ftp://{lab.addr[1]}:{FTP_PORT}{d}/www/up-gridftp.bin"]), per_link,
                     after=[["rm", "-f", str(d / "www" / "up-gridftp.bin")]]),
            ]
            measure(cs, rounds, timeout=max(120.0, 10 * per_link * 8 / 100e6))
            lines = [f"### {SENDING.name}, TCP {tcp}", "", "| case | median Mbit/s | min-max | / link |",
                     "|---|---|---|---|"]
            for c in cs:
                if c.failed or not c.times:
                    lines.append(f"| {c.name} | failed: {c.failed} | | |")
                    continue
                rs = mbit(c)
                lines.append(f"| {c.name} | {median(rs):.1f} | {min(rs):.1f}-{max(rs):.1f} | {median(rs) / 100:.3f} |")
            emit(texts, lines)
    finally:
        lab.stop()
    return texts


# Many small files against one large one, as GridFTP's pipelining (-pp) is
# measured: per-file round trips are what distance costs them.
FILES = Topology("(h) 100 files of 1 MiB against one of 100 MiB, one depot 188 ms away", [(100, 94.0)])


def files(lors: Path, d: Path, tcps: list[str], count: int, rounds: int) -> list[str]:
    """`lors upload` and `lors download` of COUNT files of 1 MiB side by side
    against one file of COUNT MiB, beside `globus-url-copy` with and
    without pipelining (-pp), to and from a depot 188 ms away."""
    www = d / "www"
    many, one = www / "many", www / "one.bin"
    many.mkdir(exist_ok=True)
    many.chmod(0o755)
    names = [many / f"f{i:03}" for i in range(count)]
    for f in names:
        if not f.exists() or f.stat().st_size != 1 << 20:
            f.write_bytes(os.urandom(1 << 20))
        f.chmod(0o644)
    make_file(one, count << 20)
    one.chmod(0o644)
    lab = WanLab(lors, d, FILES, one, place=False)
    h1 = lab.depots()[0]
    l_ = str(lors)
    ftp = f"ftp://{lab.addr[1]}:{FTP_PORT}"
    placed_one, placed_many = d / "placed-one.xnd", d / "placed-many"
    up_one, up_many = d / "up-one.xnd", d / "up-many"
    out_one, out_many = d / "out-one.bin", d / "out-many"
    size = count << 20

    def fresh(p: Path) -> list[list[str]]:
        return [["rm", "-rf", str(p)], ["mkdir", "-m", "777", str(p)]]

    texts = []
    try:
        for tcp in tcps:
            lab.tcp(tcp)
            log(f"placing the files to download on host 1 ({tcp})")
            for c in fresh(placed_many):
                subprocess.run(c, check=True)
            up = [l_, "upload", "-q", "-n", "--force", "-c", "1", "--depot", h1]
            subprocess.run(lab.at_client([*up, "-o", str(placed_one), str(one)]), check=True)
            subprocess.run(lab.at_client([*up, "-o", f"{placed_many}/", *map(str, names)]), check=True)
            xnds = sorted(str(p) for p in placed_many.glob("*.xnd"))
            cs = [
                Case(f"lors upload, one file of {count} MiB", "ours",
                     lab.at_client([*up, "-o", str(up_one), str(one)]), size,
                     after=[lab.at_client([l_, "rm", "-q", str(up_one)])]),
                Case(f"lors upload, {count} files of 1 MiB", "ours",
                     lab.at_client([*up, "-o", f"{up_many}/", *map(str, names)]), size,
                     before=fresh(up_many),
                     after=[["sh", "-c", f"ip netns exec {ns(lab.client)[3]} {l_} rm -q {up_many}/*.xnd"]]),
                Case(f"lors download, one file of {count} MiB", "ours",
                     lab.at_client([l_, "download", "-q", "-o", str(out_one), str(placed_one)]), size,
                     verify=(out_one, one), after=[["rm", "-f", str(out_one)]]),
                Case(f"lors download, {count} files of 1 MiB", "ours",
                     lab.at_client([l_, "download", "-q", "-o", f"{out_many}/", *xnds]), size,
                     before=fresh(out_many), verify=(out_many / names[-1].name, names[-1])),
                Case(f"globus-url-copy -p 16, one file of {count} MiB, up", "peer",
                     lab.at_client(["globus-url-copy", "-p", "16", "-fast", f"file://{one}",
                                    f"{ftp}{www}/gu-one.bin"]), size,
                     after=[["rm", "-f", str(www / "gu-one.bin")]]),
                Case(f"globus-url-copy -pp -cc 16, {count} files of 1 MiB, up", "peer",
                     lab.at_client(["globus-url-copy", "-pp", "-cc", "16", "-fast", "-cd", f"file://{many}/",
                                    f"{ftp}{www}/gu-many/"]), size,
                     after=[["rm", "-rf", str(www / "gu-many")]]),
                Case(f"globus-url-copy -p 16, one file of {count} MiB, down", "peer",
                     lab.at_client(["globus-url-copy", "-p", "16", "-fast", f"{ftp}{one}",
                                    f"file://{d}/gd-one.bin"]), size,
                     after=[["rm", "-f", str(d / "gd-one.bin")]]),
                Case(f"globus-url-copy -pp -cc 16, {count} files of 1 MiB, down", "peer",
                     lab.at_client(["globus-url-copy", "-pp", "-cc", "16", "-fast", "-cd", f"{ftp}{many}/",
                                    f"file://{d}/gd-many/"]), size,
                     after=[["rm", "-rf", str(d / "gd-many")]]),
            ]
            measure(cs, rounds, timeout=max(120.0, 10 * size * 8 / 100e6))
            lines = [f"### {FILES.name}, TCP {tcp}", "", f"{rounds} round(s) after the warm-up.", "",
                     "| case | median s | min-max | Mbit/s | many / one |", "|---|---|---|---|---|"]
            for i, c in enumerate(cs):
                if c.failed or not c.times:
                    lines.append(f"| {c.name} | failed: {c.failed} | | | |")
                    continue
                t = median(c.times)
                pair = cs[i - 1] if i % 2 else None
                ratio = f"{t / median(pair.times):.2f}" if pair and pair.times and not pair.failed else ""
                lines.append(f"| {c.name} | {t:.1f} | {min(c.times):.1f}-{max(c.times):.1f} | "
                             f"{size * 8 / t / 1e6:.1f} | {ratio} |")
            emit(texts, lines)
    finally:
        lab.stop()
    return texts


# The paper's video: 15 Mbit/s, striped over depots 188 ms away.
STREAM = Topology("(f) a 15 Mbit/s stream from eight depots 188 ms away", [(100, 94.0)] * 8)
PLAYER = Path(__file__).resolve().parent / "player.py"


def stream(lors: Path, d: Path, tcps: list[str], mib: int, runs: int) -> list[str]:
    """`lors download -o -` into a player reading at 15 Mbit/s (bench/player.py),
    the file striped in 2 MB blocks over eight depots 188 ms away: start-up
    time (until a second of video is cached) and stalls after it, per run."""
    src = d / "www" / "wan-stream.bin"
    make_file(src, mib << 20)
    lab = WanLab(lors, d, STREAM, src, copies=1)
    texts = []
    try:
        for tcp in tcps:
            lab.tcp(tcp)
            rows = []
            for i in range(runs + 1):
                pipe = (f"{lors} download -q -o - {lab.xnd} | "
                        f"{sys.executable} {PLAYER} --rate 15 --start 1 --cache 4")
                r = subprocess.run(lab.at_client(["bash", "-o", "pipefail", "-c", pipe]),
                                   capture_output=True, text=True, timeout=600)
                if r.returncode != 0 or not r.stdout.strip():
                    log(f"stream run {i} failed: {r.stderr.strip()[-300:]}")
                    if i:
                        rows.append(None)
                    continue
                got = json.loads(r.stdout.strip().splitlines()[-1])
                if got["bytes"] != src.stat().st_size:
                    got["stalls"] = f"short: {got['bytes']} bytes"
                if i:  # the first run warms up
                    rows.append(got)
            ok = [g for g in rows if g]
            lines = [f"### {STREAM.name}, TCP {tcp}", "",
                     f"{mib} MiB ({mib * 8 * 1.048576 / 15:.0f} s of video) per run, {runs} runs after a warm-up; "
                     "start-up: until the first second of video is cached; a stall: the bytes due not there.", "",
                     "| run | start-up s | stalls | stalled s |", "|---|---|---|---|"]
            for n, g in enumerate(rows, 1):
                lines.append(f"| {n} | failed | | |" if g is None else
                             f"| {n} | {g['startup_s']:.2f} | {g['stalls']} | {g['stalled_s']:.2f} |")
            if ok:
                ups = [g["startup_s"] for g in ok]
                stalls = sum(g["stalls"] for g in ok if isinstance(g["stalls"], int))
                lines += ["", f"start-up median {median(ups):.2f} s (max {max(ups):.2f}); "
                          f"stalls in all runs: **{stalls}**; failed runs: {len(rows) - len(ok)}"]
            emit(texts, lines)
    finally:
        lab.stop()
    return texts


# DDMG's dissemination at distance: four sites 30 to 188 ms from the client
# (between two sites, the sum of their delays), every link 100 Mbit/s.
DISSEM = Topology("(g) dissemination to four sites at 30, 60, 120 and 188 ms",
                  [(100, 15.0), (100, 30.0), (100, 60.0), (100, 94.0)], client_rate=100)


def dissem(lors: Path, d: Path, tcps: list[str], mib: int, rounds: int) -> list[str]:
    """`lors disseminate` of one file to four sites at mixed round trips,
    against S/R of the slowest site's link (the file once through it)."""
    src = d / "www" / "wan-dissem.bin"
    make_file(src, mib << 20)
    lab = WanLab(lors, d, DISSEM, src, place=False)
    ideal = src.stat().st_size * 8 / 100e6
    sites = ",".join(lab.depots())
    out = d / "dissem.xnd"
    texts = []
    try:
        for tcp in tcps:
            lab.tcp(tcp)
            rows = []
            for i in range(rounds + 1):
                if out.exists():
                    # The last round's replicas freed, so the sites never fill.
                    subprocess.run(lab.at_client([str(lors), "rm", "-q", str(out)]), capture_output=True,
                                   timeout=600)
                t0 = time.monotonic()
                r = subprocess.run(lab.at_client([str(lors), "disseminate", str(src), "--to", sites, "-o",
                                                  str(out), "--json"]), capture_output=True, text=True,
                                   timeout=max(600.0, 20 * ideal))
                took = time.monotonic() - t0
                if r.returncode != 0:
                    log(f"disseminate failed: {r.stderr.strip()[-300:]}")
                    if i:
                        rows.append(None)
                    continue
                summary = json.loads(r.stdout.strip().splitlines()[-1])
                if i:  # the first round warms up
                    rows.append((took, [x["seconds"] for x in summary["sites"]],
                                 summary["source_bytes"] / src.stat().st_size))
            lines = [f"### {DISSEM.name}, TCP {tcp}", "",
                     f"{mib} MiB; S/R of a 100 Mbit/s link {ideal:.2f} s; each site's time as "
                     "`lors disseminate --json` reports it, in the order of their round trips.", "",
                     "| round | whole run s (x S/R) | sites s | source sent / S |", "|---|---|---|---|"]
            for n, row in enumerate(rows, 1):
                if row is None:
                    lines.append(f"| {n} | failed | | |")
                    continue
                took, per, sent = row
                lines.append(f"| {n} | {took:.2f} ({took / ideal:.2f}) | {', '.join(f'{x:.1f}' for x in per)} "
                             f"| {sent:.2f} |")
            ok = [row[0] for row in rows if row]
            if ok:
                lines += ["", f"median **{median(ok) / ideal:.2f} x S/R** (min {min(ok) / ideal:.2f}, "
                          f"max {max(ok) / ideal:.2f})"]
            emit(texts, lines)
    finally:
        lab.stop()
    return texts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="(b) untuned, one round, no sweep, no peers: the headline in minutes")
    ap.add_argument("--exp", default="a,b,c,d", help="experiments (default a,b,c,d)")
    ap.add_argument("--tcp", default="untuned,tuned", help="untuned, tuned or both (default both)")
    ap.add_argument("--loss", default="0", help="loss rates in %% each way, one run per rate (default 0)")
    ap.add_argument("--per-link", type=int, default=128, help="MiB per depot link (default 128)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (default 3)")
    ap.add_argument("--threads", default="1,4,16,64", help="the -a sweep (default 1,4,16,64)")
    ap.add_argument("--no-peers", action="store_true", help="only lors and iperf3")
    ap.add_argument("--sending", action="store_true",
                    help="also upload (beside GridFTP) and augment (depot to depot) at 188 ms")
    ap.add_argument("--stream", type=int, metavar="RUNS", default=0,
                    help="also RUNS streams at 15 Mbit/s from eight depots at 188 ms (the acceptance: 10)")
    ap.add_argument("--stream-mib", type=int, default=48, help="MiB per stream run (default 48)")
    ap.add_argument("--dissem", type=int, metavar="ROUNDS", default=0,
                    help="also disseminate to four sites at 30-188 ms, ROUNDS rounds")
    ap.add_argument("--dissem-mib", type=int, default=128, help="MiB disseminated (default 128)")
    ap.add_argument("--files", type=int, metavar="ROUNDS", default=0,
                    help="also 100 files of 1 MiB against one of 100 MiB, up and down at 188 ms, ROUNDS rounds")
    ap.add_argument("--files-count", type=int, default=100, help="files of 1 MiB (default 100)")
    ap.add_argument("--baseline", help="an earlier lors binary whose default download runs beside")
    ap.add_argument("--dir", default="/dev/shm/lors-wan", help="working directory on tmpfs")
    ap.add_argument("--out", help="also write the Markdown report here")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("wan.py needs root (network namespaces)")
    if a.quick:
        a.exp, a.tcp, a.rounds, a.threads, a.loss = "b", "untuned", 1, "", "0"
        a.no_peers = True
    d = Path(a.dir)
    (d / "www").mkdir(parents=True, exist_ok=True)
    for p in (d, d / "www"):
        p.chmod(0o777)
    ensure_peers()
    subprocess.run(["cargo", "build", "--release", "--locked", "-q", "-p", "lors-wan"], cwd=ROOT, check=True)
    lors = build_lors()
    threads = [int(t) for t in a.threads.split(",") if t]
    out = [f"## At distance (`bench/wan.py`), {time.strftime('%Y-%m-%d')}", "",
           f"Machine: {machine()}. {a.rounds} interleaved round(s) after a verified warm-up; "
           "rates are size / wall time of the whole command, run on the client host.", ""]
    headline = []
    for key in [k for k in a.exp.split(",") if k]:
        for loss in [float(x) for x in a.loss.split(",")]:
            if loss and key == "d":
                continue
            texts, ratios = experiment(lors, d, key, a.tcp.split(","), loss, a.per_link << 20, a.rounds,
                                       threads, not a.no_peers, Path(a.baseline) if a.baseline else None)
            out += texts
            headline += [(key, tcp, loss, r) for tcp, r in zip(a.tcp.split(","), ratios)]
    if a.sending:
        out += sending(lors, d, a.tcp.split(","), a.per_link << 20, a.rounds)
    if a.stream:
        out += stream(lors, d, a.tcp.split(","), a.stream_mib, a.stream)
    if a.files:
        out += files(lors, d, a.tcp.split(","), a.files_count, a.files)
    if a.dissem:
        out += dissem(lors, d, a.tcp.split(","), a.dissem_mib, a.dissem)
    if headline:
        out += ["### Summary", "", "| experiment | TCP | loss % | lors defaults / links |", "|---|---|---|---|"]
        out += [f"| {k} | {t} | {l:g} | {r:.3f} |" for k, t, l, r in headline]
    save_report("\n".join(out) + "\n", a.out)
    if a.quick:
        print(f"lors defaults: {headline[0][3]:.2f} x links")
    return 0


if __name__ == "__main__":
    sys.exit(main())
