#!/usr/bin/env python3
"""Network-lab benchmark: k depot hosts, each behind a link of R Mbit/s, and one
client host whose own link is unlimited (scripts/netlab.sh: network namespaces,
tbf-limited veth links). Needs root.

    python3 bench/lab.py                       # k = 1,2,4,8 at 100 Mbit/s, 3 rounds
    python3 bench/lab.py --ks 2,4 --rate 200 --out docs/bench/lab.md
    python3 bench/lab.py --ks 4 --baseline /tmp/old/lors   # an earlier build's download beside

For every k it measures, in the same lab and interleaved round after round:
  * iperf3 single-link TCP goodput G (depot host 1 -> client, one stream);
  * `lors download` (defaults, and each hand-picked `-a` connection count) of a
    file of k x --per-link bytes stored as 2 copies (1 when k = 1);
  * aria2c with the k hosts' nginx as mirrors, and `xrdcp --sources k` over
    a metalink of the k hosts' xrootd.
Then, with k = --fault-k: one depot slowed to R/10 (time against the ideal
for the capacity left, beside aria2c and xrdcp) and one depot killed
mid-download (must complete, byte-identical). With --ec: a 6+3 erasure-coded
file on 9 depots, downloaded with every link at R and with one at R/10.

    python3 bench/lab.py --ks '' --fault-k 0 --ec --rounds 3   # the erasure-code runs alone
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    ROOT,
    Case,
    GiB,
    best,
    build_lors,
    ensure_peers,
    log,
    machine,
    make_file,
    measure,
    median,
    same_file,
    save_report,
    stop_all,
    wait_port,
)

NETLAB = ROOT / "scripts" / "netlab.sh"
ENV = dict(os.environ, NL_PREFIX="lorsb", NL_NET="10.213.9")
DEPOT_PORT, HTTP_PORT, XRD_PORT, IPERF_PORT = 6714, 8080, 1094, 5201


def netlab(*args: str) -> str:
    return subprocess.run(
        [str(NETLAB), *args], env=ENV, check=True, capture_output=True, text=True
    ).stdout.strip()


def ns(i: int) -> list[str]:
    return ["ip", "netns", "exec", f"lorsb-h{i}"]


def mib(s: str) -> int:
    return int(float(s.rstrip("Mm")) * (1 << 20))


class Lab:
    """k depot hosts (1..k) running a LoRS depot, nginx and xrootd; client is host k+1."""

    def __init__(self, lors: Path, d: Path, k: int, rate: int):
        self.k, self.rate, self.d, self.lors = k, rate, d, lors
        self.client = k + 1
        netlab("up", str(k + 1), str(rate))
        netlab("rate", str(self.client), "0")
        self.addr = {i: netlab("addr", str(i)) for i in range(1, k + 2)}
        self.procs: dict[str, subprocess.Popen] = {}
        logs = d / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        logs.chmod(0o777)
        www = d / "www"
        for i in range(1, k + 1):
            a = self.addr[i]
            dd = d / f"depot-{i}"
            shutil.rmtree(dd, ignore_errors=True)
            self.spawn(f"depot-{i}", [*ns(i), str(lors), "depot", "--listen", f"{a}:{DEPOT_PORT}",
                                      "--data", str(dd), "--size", "8G", "--sync", "never"])
            conf = d / f"nginx-{i}.conf"
            conf.write_text(
                f"""worker_processes 1; daemon off; pid {d}/nginx-{i}.pid; error_log {logs}/nginx-{i}.log;
events {{ worker_connections 256; }}
http {{ access_log off; sendfile on; tcp_nopush on;
  server {{ listen {a}:{HTTP_PORT}; root {www}; }} }}
"""
            )
            self.spawn(f"nginx-{i}", [*ns(i), "nginx", "-c", str(conf), "-p", str(d)])
            xc = d / f"xrootd-{i}.cfg"
            xc.write_text(f"all.export {www}\nxrd.port {XRD_PORT}\n")
            self.spawn(f"xrootd-{i}", [*ns(i), "xrootd", "-c", str(xc), "-l", f"{logs}/xrootd-{i}.log",
                                       "-R", "nobody", "-n", f"lab{i}"])
        self.spawn("iperf3", [*ns(1), "iperf3", "-s", "-p", str(IPERF_PORT)])
        wrap = ns(self.client)
        for i in range(1, k + 1):
            for p in (DEPOT_PORT, HTTP_PORT, XRD_PORT):
                wait_port(self.addr[i], p, wrap=wrap)
        wait_port(self.addr[1], IPERF_PORT, wrap=wrap)

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


def iperf_seconds(size: int):
    def parse(out: bytes) -> float:
        bps = json.loads(out)["end"]["sum_received"]["bits_per_second"]
        return size / (bps / 8)

    return parse


def place(lab: Lab, src: Path, xnd: Path) -> None:
    """Uploads `src` from the client: 2 copies (1 when there is one depot)."""
    copies = str(min(2, lab.k))
    args = [str(lab.lors), "upload", "--quiet", "--force", "-n", "-c", copies, "-o", str(xnd), str(src)]
    for dep in lab.depots():
        args[2:2] = ["--depot", dep]
    log(f"placing {src.stat().st_size >> 20} MiB on {lab.k} depots, {copies} copies")
    subprocess.run(lab.at_client(args), check=True)


def meta4(lab: Lab, src: Path, www: Path) -> Path:
    """A metalink naming every host's xrootd copy, for `xrdcp --sources k`."""
    urls = "\n".join(
        f'    <url location="h{i}" priority="1">root://{lab.addr[i]}:{XRD_PORT}/{www}/{src.name}</url>'
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


# An earlier lors binary (--baseline): its download runs beside this
# build's, against the same depots, in the same rounds.
BASELINE: Path | None = None


def download_cases(lab: Lab, src: Path, xnd: Path, www: Path, size: int,
                   threads: list[int]) -> list[Case]:
    out = lab.d / "out.bin"
    rm = ["rm", "-f", str(out)]
    mirrors = [f"http://{lab.addr[i]}:{HTTP_PORT}/{src.name}" for i in range(1, lab.k + 1)]
    lors = str(lab.lors)
    baseline = [
        Case("lors download (defaults), baseline build", "baseline",
             lab.at_client([str(BASELINE), "download", "--quiet", "-o", str(out), str(xnd)]), size,
             before=[rm], verify=(out, src)),
    ] if BASELINE else []
    return baseline + [
        Case("lors download (defaults)", "ours",
             lab.at_client([lors, "download", "--quiet", "-o", str(out), str(xnd)]), size,
             before=[rm], verify=(out, src)),
        *[
            Case(f"lors download -a {t}", "ours-tuned",
                 lab.at_client([lors, "download", "--quiet", "-a", str(t), "-o", str(out), str(xnd)]),
                 size, before=[rm])
            for t in threads
        ],
        Case(f"aria2c, {lab.k} mirrors", "peer",
             lab.at_client(["aria2c", "-q", "-x", "2", "-s", str(2 * lab.k), "-k", "4M",
                            "--file-allocation=none", "--allow-overwrite=true",
                            "-d", str(lab.d), "-o", "out.bin", *mirrors]),
             size, before=[rm], verify=(out, src)),
        Case(f"xrdcp --sources {lab.k}", "peer",
             lab.at_client(["xrdcp", "-s", "-f", "--sources", str(lab.k), str(meta4(lab, src, www)),
                            str(out)]),
             size, before=[rm], verify=(out, src)),
    ]


def link_goodput(lab: Lab, per_link: int) -> Case:
    """iperf3, one stream, depot host 1 -> client: the single-link TCP goodput."""
    return Case("iperf3, one link, one stream", "limit",
                lab.at_client(["iperf3", "-c", lab.addr[1], "-p", str(IPERF_PORT), "-R", "-t", "5",
                               "-J"]), per_link, parse=iperf_seconds(per_link))


def setup(lors: Path, d: Path, k: int, rate: int, per_link: int) -> tuple[Lab, Path, Path, Path, int]:
    """The test file (k x per_link random bytes), the lab, and the file placed on its depots."""
    size = k * per_link
    www = d / "www"
    src = www / f"src-{k}.bin"
    make_file(src, size)
    src.chmod(0o644)
    lab = Lab(lors, d, k, rate)
    xnd = d / f"src-{k}.xnd"
    try:
        place(lab, src, xnd)
    except BaseException:
        lab.stop()
        raise
    return lab, www, src, xnd, size


def scaling(lors: Path, d: Path, k: int, rate: int, per_link: int, rounds: int,
            threads: list[int]) -> tuple[str, dict]:
    lab, www, src, xnd, size = setup(lors, d, k, rate, per_link)
    try:
        g = link_goodput(lab, per_link)
        cases = [g, *download_cases(lab, src, xnd, www, size, threads)]
        measure(cases, rounds, timeout=900)
    finally:
        lab.stop()
    goodput = median(g.rates())
    ideal = k * goodput
    lines = [f"### k = {k} depots at {rate} Mbit/s, {size >> 20} MiB", "",
             "| case | median MiB/s | min-max MiB/s | / (k x iperf3 link) |", "|---|---|---|---|"]
    for c in cases:
        if c.failed or not c.times:
            lines.append(f"| {c.name} | failed: {c.failed} | | |")
            continue
        rs = [r * 1024 for r in c.rates()]
        ref = goodput * 1024 if c.kind == "limit" else ideal * 1024
        m = median(rs)
        lines.append(f"| {c.name} | {m:.2f} | {min(rs):.2f}-{max(rs):.2f} | {m / ref:.3f} |")
    ours = next(median(c.rates()) for c in cases if c.kind == "ours")
    old = next((median(c.rates()) for c in cases if c.kind == "baseline" and c.times), None)
    tuned = max((median(c.rates()) for c in cases if c.kind == "ours-tuned" and c.times), default=0)
    peer_name, peer = best(cases, "peer")
    summary = {"k": k, "ours_vs_ideal": ours / ideal, "peer": peer_name, "peer_vs_ideal": peer / ideal,
               "defaults_vs_best_tuned": ours / tuned if tuned else float("nan")}
    lines += ["", f"lors defaults: **{ours / ideal:.3f}** x k x link goodput; best peer {peer_name} "
                  f"{peer / ideal:.3f}; defaults / best `-a` = **{summary['defaults_vs_best_tuned']:.2f}**"
                  + (f"; this build / the baseline build = **{ours / old:.2f}**" if old else "") + ".", ""]
    return "\n".join(lines), summary


def faults(lors: Path, d: Path, k: int, rate: int, per_link: int, rounds: int) -> str:
    lab, www, src, xnd, size = setup(lors, d, k, rate, per_link)
    lines = []
    try:
        g = link_goodput(lab, per_link)
        measure([g], 1, timeout=60)
        goodput = median(g.rates()) * GiB
        slow = max(1, rate // 10)
        netlab("rate", "1", str(slow))
        # The ideal: every byte/s the k links still offer, the slowed one included.
        ideal = size / ((k - 1) * goodput + goodput * slow / rate)
        cases = download_cases(lab, src, xnd, www, size, [])
        measure(cases, rounds, timeout=900)
        lines += [f"### k = {k}, depot 1 slowed to {slow} Mbit/s, {size >> 20} MiB", "",
                  f"Ideal for the capacity left: {ideal:.2f} s (link goodput {goodput / (1 << 20):.2f} MiB/s).",
                  "", "| case | median s | min-max s | / ideal |", "|---|---|---|---|"]
        for c in cases:
            if c.failed or not c.times:
                lines.append(f"| {c.name} | failed: {c.failed} | | |")
                continue
            m = median(c.times)
            lines.append(f"| {c.name} | {m:.2f} | {min(c.times):.2f}-{max(c.times):.2f} | {m / ideal:.3f} |")
        netlab("rate", "1", str(rate))
        # A depot killed a third of the way through.
        out = d / "out.bin"
        out.unlink(missing_ok=True)
        expect = size / (k * goodput)
        victim = lab.procs["depot-1"]
        killer = threading.Timer(expect / 3, victim.kill)
        t0 = time.perf_counter()
        killer.start()
        r = subprocess.run(lab.at_client([str(lors), "download", "--quiet", "-T", "5s", "-o", str(out),
                                          str(xnd)]), capture_output=True)
        took = time.perf_counter() - t0
        killer.cancel()
        ok = r.returncode == 0 and same_file(out, src)
        lines += ["", f"Depot 1 killed after {expect / 3:.1f} s: download exit {r.returncode}, "
                      f"{took:.2f} s, output {'identical' if ok else 'DIFFERENT'} "
                      f"(no fault: {expect:.2f} s ideal).", ""]
    finally:
        lab.stop()
    return "\n".join(lines)


def erasure(lors: Path, d: Path, rate: int, per_link: int, rounds: int) -> str:
    """A 6+3 erasure-coded file on 9 depot hosts at R: its download with
    every link at R, then with depot 1 at R/10, against the ideal for the
    capacity left — the slow depot not waited for (issue 43: within 1.1x)."""
    k = 9
    size = 6 * per_link
    www = d / "www"
    src = www / "src-ec.bin"
    make_file(src, size)
    lab = Lab(lors, d, k, rate)
    xnd = d / "src-ec.xnd"
    lines = []
    try:
        # Stored as they are, as the other lab runs store theirs (-n).
        args = [str(lors), "upload", "--quiet", "--force", "-n", "--ec", "6+3", "-o", str(xnd), str(src)]
        for dep in lab.depots():
            args[2:2] = ["--depot", dep]
        log(f"placing {size >> 20} MiB on {k} depots as 6+3")
        subprocess.run(lab.at_client(args), check=True)
        g = link_goodput(lab, per_link)
        measure([g], 1, timeout=60)
        goodput = median(g.rates()) * GiB
        out = d / "out-ec.bin"
        rm = [["rm", "-f", str(out)]]

        def case(name: str) -> Case:
            return Case(name, "ours", lab.at_client([str(lors), "download", "--quiet", "-o", str(out),
                                                     str(xnd)]), size, before=rm, after=rm,
                        verify=(out, src))

        whole = case("lors download, 6+3, every link at R")
        measure([whole], rounds, timeout=900)
        slow = max(1, rate // 10)
        netlab("rate", "1", str(slow))
        slowed = case(f"lors download, 6+3, depot 1 at {slow} Mbit/s")
        measure([slowed], rounds, timeout=900)
        netlab("rate", "1", str(rate))
        # Every link at R: the data blocks spread over the 9 links. One at
        # R/10: the k blocks of each stripe from the other 8 (and what the
        # slow one adds), none waited for.
        ideal_whole = size / (k * goodput)
        ideal_slow = size / ((k - 1) * goodput + goodput * slow / rate)
        lines += [f"### Erasure code 6+3 on 9 depots at {rate} Mbit/s, {size >> 20} MiB", "",
                  f"Link goodput {goodput / (1 << 20):.2f} MiB/s (iperf3).", "",
                  "| case | median s | min-max s | ideal s | / ideal |", "|---|---|---|---|---|"]
        for c, ideal in ((whole, ideal_whole), (slowed, ideal_slow)):
            if c.failed or not c.times:
                lines.append(f"| {c.name} | failed: {c.failed} | | | |")
                continue
            m = median(c.times)
            lines.append(f"| {c.name} | {m:.2f} | {min(c.times):.2f}-{max(c.times):.2f} | "
                         f"{ideal:.2f} | {m / ideal:.3f} |")
        lines.append("")
    finally:
        lab.stop()
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", default="1,2,4,8", help="depot counts (default 1,2,4,8)")
    ap.add_argument("--rate", type=int, default=100, help="link rate R in Mbit/s (default 100)")
    ap.add_argument("--per-link", default="96M", help="bytes per depot link (file = k x this; default 96M)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (default 3)")
    ap.add_argument("--threads", default="1,2,4,8", help="hand-picked -a values (default 1,2,4,8)")
    ap.add_argument("--fault-k", type=int, default=4, help="depots in the fault runs (0 skips; default 4)")
    ap.add_argument("--ec", action="store_true",
                    help="also a 6+3 erasure-coded file on 9 depots, one of them slowed to R/10")
    ap.add_argument("--dir", default="/dev/shm/lors-lab", help="working directory on tmpfs")
    ap.add_argument("--out", help="also write the Markdown report here")
    ap.add_argument("--baseline", help="an earlier lors binary whose download runs beside this build's")
    a = ap.parse_args()
    global BASELINE
    BASELINE = Path(a.baseline) if a.baseline else None
    if os.geteuid() != 0:
        sys.exit("lab.py needs root (network namespaces)")
    d = Path(a.dir)
    (d / "www").mkdir(parents=True, exist_ok=True)
    d.chmod(0o777)
    (d / "www").chmod(0o777)
    ensure_peers()
    lors = build_lors()
    per_link = mib(a.per_link)
    threads = [int(t) for t in a.threads.split(",") if t]
    report = [f"## Network lab, links of {a.rate} Mbit/s", "",
              f"Machine: {machine()}. {a.rounds} interleaved rounds after a verified warm-up; "
              "rates are size / wall time of the whole command, run on the client host.", ""]
    summaries = []
    for k in [int(x) for x in a.ks.split(",") if x]:
        text, s = scaling(lors, d, k, a.rate, per_link, a.rounds, threads)
        summaries.append(s)
        report.append(text)
        print(text, flush=True)
    if a.fault_k:
        text = faults(lors, d, a.fault_k, a.rate, per_link, a.rounds)
        report.append(text)
        print(text, flush=True)
    if a.ec:
        text = erasure(lors, d, a.rate, per_link, a.rounds)
        report.append(text)
        print(text, flush=True)
    if summaries:
        report += ["### Summary", "", "| k | lors / ideal | best peer / ideal | defaults / best -a |",
                   "|---|---|---|---|"]
        report += [f"| {s['k']} | {s['ours_vs_ideal']:.3f} | {s['peer_vs_ideal']:.3f} ({s['peer']}) | "
                   f"{s['defaults_vs_best_tuned']:.2f} |" for s in summaries]
        print("\n".join(report[-len(summaries) - 3:]), flush=True)
    save_report("\n".join(report) + "\n", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
