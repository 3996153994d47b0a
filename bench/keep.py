#!/usr/bin/env python3
"""Keeper scale benchmark: `lors keep` over many exNodes on four local depots.

    python3 bench/keep.py                        # 10,000 exNodes, 100,000 allocations
    python3 bench/keep.py --exnodes 1000 --out docs/bench/keep.md

The exNodes are made directly over IBP (ALLOCATE + STORE from this script,
four connections at once), so setting up 100,000 allocations takes seconds,
not an upload process per file: each exNode has --blocks blocks of
--block-size bytes, each block on --copies depots, round-robin over the four.

Then, each timed as a whole process (wall time and peak RSS from wait4):

* `lors stat --expiring 1h DIR`: the baseline. It probes every allocation
  (MANAGE PROBE), as a keeper cycle must, and changes nothing.
* `lors keep --once`, nothing due (10-day leases, a day's margin): a cycle of
  probes alone. The targets: a
  cycle over 100,000 allocations in under 60 s, keeper RSS under 200 MiB.
* `lors keep --once --margin 20d`: every lease (10 days) is due, so the cycle also
  extends all of them (MANAGE CHNG) and rewrites every exNode.
* `lors keep --every E --scrub-rate R` as a service for a while: the bytes
  its cycles read back, against R x the time they ran (the budget); the
  target is within 10 %.
"""

from __future__ import annotations

import argparse
import json
import os
import resource  # noqa: F401  (wait4's rusage)
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import build_lors, free_port, log, machine, save_report, stop_all, wait_port  # noqa: E402

MiB = 1 << 20


def size_arg(s: str) -> int:
    units = {"K": 10, "M": 20, "G": 30}
    return int(s[:-1]) << units[s[-1]] if s[-1] in units else int(s)


class Ibp:
    """One connection to a depot, speaking the few IBP lines needed here."""

    def __init__(self, port: int):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.f = self.s.makefile("rb")

    def line(self) -> str:
        return self.f.readline().decode()

    def allocate_many(self, n: int, size: int, data: bytes) -> list[list[str]]:
        """n allocations of `size` bytes, each holding `data`: their
        (read, write, manage) capabilities. Requests go out in batches, the
        depot answering them in order."""
        caps = []
        batch = 256
        for start in range(0, n, batch):
            k = min(batch, n - start)
            self.s.sendall(b"".join(b"1 1 0 2 1 864000 %d 30\n" % size for _ in range(k)))
            got = []
            for _ in range(k):
                r = self.line().split()
                if r[0] != "1":
                    raise RuntimeError(f"ALLOCATE refused: {r}")
                got.append(r[1:4])
            # STORE with the data right behind each header: a depot takes it.
            out = []
            for c in got:
                key, typekey = c[1].split("#", 1)[1].split("/")[0:2]
                rid = c[1].split("/")[3].split("#")[0]
                out.append(b"1 2 %s#%s %s %d 30\n" % (rid.encode(), key.encode(), typekey.encode(), len(data)) + data)
            self.s.sendall(b"".join(out))
            for _ in range(k):
                go, done = self.line(), self.line()
                if go.split()[0] != "1" or done.split()[0] != "1":
                    raise RuntimeError(f"STORE refused: {go!r} {done!r}")
            caps.extend(got)
        return caps


def exnode_xml(name: str, blocks: list[list[list[str]]], block: int) -> str:
    out = [
        '<?xml version="1.0"?>',
        '<exnode xmlns:exnode="http://loci.cs.utk.edu/exnode">',
        f'  <exnode:metadata name="filename" type="string">{name}</exnode:metadata>',
        f'  <exnode:metadata name="lors_copies" type="integer">{len(blocks[0])}</exnode:metadata>',
    ]
    for b, replicas in enumerate(blocks):
        for r, w, m in replicas:
            out += [
                "  <exnode:mapping>",
                f'    <exnode:metadata name="alloc_length" type="integer">{block}</exnode:metadata>',
                '    <exnode:metadata name="alloc_offset" type="integer">0</exnode:metadata>',
                '    <exnode:metadata name="e2e_blocksize" type="integer">0</exnode:metadata>',
                f'    <exnode:metadata name="exnode_offset" type="integer">{b * block}</exnode:metadata>',
                f'    <exnode:metadata name="logical_length" type="integer">{block}</exnode:metadata>',
                f"    <exnode:read>{r}</exnode:read>",
                f"    <exnode:write>{w}</exnode:write>",
                f"    <exnode:manage>{m}</exnode:manage>",
                "  </exnode:mapping>",
            ]
    out.append("</exnode>\n")
    return "\n".join(out)


def populate(ports: list[int], xdir: Path, exnodes: int, blocks: int, copies: int, block: int) -> int:
    """Makes the exNodes; returns how many allocations they name."""
    total = exnodes * blocks * copies
    per = [0] * len(ports)
    # Replica c of global block g goes to depot (g + c) % 4.
    for g in range(exnodes * blocks):
        for c in range(copies):
            per[(g + c) % len(ports)] += 1
    data = os.urandom(block)
    caps: list[list[list[str]]] = [[] for _ in ports]
    errors = []

    def fill(d: int) -> None:
        try:
            caps[d] = Ibp(ports[d]).allocate_many(per[d], block, data)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=fill, args=(d,)) for d in range(len(ports))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    log(f"{total} allocations made in {time.perf_counter() - t0:.1f} s")
    taken = [0] * len(ports)
    xdir.mkdir(parents=True, exist_ok=True)
    for n in range(exnodes):
        bl = []
        for b in range(blocks):
            g = n * blocks + b
            reps = []
            for c in range(copies):
                d = (g + c) % len(ports)
                reps.append(caps[d][taken[d]])
                taken[d] += 1
            bl.append(reps)
        sub = xdir / f"{n // 1000:03d}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{n:05d}.xnd").write_text(exnode_xml(f"f{n:05d}", bl, block))
    return total


def depot_bytes_out(mports: list[int]) -> int:
    """Bytes the depots have sent by LOAD, from their metrics."""
    total = 0
    for p in mports:
        with socket.create_connection(("127.0.0.1", p), 5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            body = b""
            while chunk := s.recv(65536):
                body += chunk
        for line in body.decode().splitlines():
            if line.startswith("lors_depot_bytes_out_total "):
                total += int(line.split()[1])
    return total


def run(argv: list[str], timeout: float) -> tuple[float, int, int, str, str]:
    """Runs argv: (wall seconds, peak RSS in KiB, exit code, stdout, stderr)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = [], []
    readers = [
        threading.Thread(target=lambda: out.append(p.stdout.read())),
        threading.Thread(target=lambda: err.append(p.stderr.read())),
    ]
    for r in readers:
        r.start()
    deadline = time.time() + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.time() > deadline:
            p.kill()
            pid, status, ru = os.wait4(p.pid, 0)
            break
        time.sleep(0.01)
    wall = time.perf_counter() - t0
    for r in readers:
        r.join()
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_maxrss, p.returncode, out[0].decode(errors="replace"), err[0].decode(errors="replace")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exnodes", type=int, default=10_000)
    ap.add_argument("--blocks", type=int, default=5, help="blocks per exNode (default 5)")
    ap.add_argument("--copies", type=int, default=2, help="replicas per block (default 2)")
    ap.add_argument("--block-size", default="4K", help="bytes per block (default 4K)")
    ap.add_argument("--scrub-rate", default="2M", help="scrub rate to hold (default 2M per second)")
    ap.add_argument("--scrub-for", type=float, default=60.0, help="seconds the scrubbing keeper runs (default 60)")
    ap.add_argument("--out", help="also write the Markdown report here")
    a = ap.parse_args()
    block, rate = size_arg(a.block_size), size_arg(a.scrub_rate)
    lors = str(build_lors())
    work = Path(tempfile.mkdtemp(prefix="lors-keep-bench-"))
    procs = []
    try:
        ports = [free_port() for _ in range(4)]
        mports = [free_port() for _ in range(4)]
        for i, p in enumerate(ports):
            procs.append(
                subprocess.Popen(
                    [lors, "depot", "--listen", f"127.0.0.1:{p}", "--data", str(work / f"d{i}"),
                     "--size", "16G", "--sync", "never", "--metrics-listen", f"127.0.0.1:{mports[i]}"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for p in ports:
            wait_port("127.0.0.1", p)
        xdir = work / "x"
        allocs = populate(ports, xdir, a.exnodes, a.blocks, a.copies, block)
        depots = ",".join(f"127.0.0.1:{p}" for p in ports)
        rows = []

        def case(name: str, argv: list[str], ok_codes=(0,)) -> tuple[float, int, str]:
            log(f"running: {name}")
            wall, rss, code, out, err = run(argv, 1800)
            if code not in ok_codes:
                raise RuntimeError(f"{name}: exit {code}: {err[-800:]}")
            rows.append((name, wall, rss))
            log(f"  {wall:.1f} s, {rss / 1024:.0f} MiB peak RSS")
            return wall, rss, out

        base, _, _ = case("lors stat --expiring 1h (baseline: probes every allocation)",
                          [lors, "stat", "--expiring", "1h", str(xdir)])
        probe, probe_rss, _ = case("lors keep --once (probes; nothing due)",
                                   [lors, "keep", "--once", "-q", "--depot", depots, str(xdir)])
        refresh, refresh_rss, _ = case("lors keep --once --margin 20d (every lease extended, every exNode rewritten)",
                                       [lors, "keep", "--once", "-q", "--margin", "20d", "--lease", "15d",
                                        "--depot", depots, str(xdir)])

        # The scrub as a service: cycles every `every` seconds, each reading
        # back rate x every bytes. The rate held is measured between the
        # ends of the first and the last whole cycle, twice: from the
        # keeper's own count, and from the bytes the depots sent (LOAD).
        every = max(2, int(probe * 1.5) + 1)
        state = work / "scrub.json"
        log(f"running: lors keep --every {every}s --scrub-rate {a.scrub_rate} for {a.scrub_for:.0f} s")
        t0 = time.perf_counter()
        p = subprocess.Popen(
            [lors, "keep", "--json", "--every", f"{every}s", "--scrub-rate", a.scrub_rate, "--state", str(state),
             "--depot", depots, str(xdir)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        cycles: list[tuple[float, int, int]] = []
        stop = threading.Timer(a.scrub_for, p.terminate)
        stop.start()
        for line in p.stdout:
            ev = json.loads(line)
            if ev.get("event") == "cycle":
                cycles.append((time.perf_counter() - t0, ev["totals"]["scrubbed_bytes"], depot_bytes_out(mports)))
        p.wait()
        stop.cancel()
        ran = time.perf_counter() - t0
        if len(cycles) < 3:
            raise RuntimeError(f"only {len(cycles)} scrub cycles in {ran:.0f} s: raise --scrub-for")
        span = cycles[-1][0] - cycles[0][0]
        scrubbed = sum(b for _, b, _ in cycles[1:])
        sent = cycles[-1][2] - cycles[0][2]
        held = scrubbed / span / rate
        held_depots = sent / span / rate

        per_alloc_us = probe / allocs * 1e6
        lines = [
            "# Keeper scale",
            "",
            f"{a.exnodes:,} exNodes, {a.blocks} blocks of {block} bytes x {a.copies} copies: "
            f"{allocs:,} allocations on 4 local depots. Each command is one process over all of them; "
            "wall time and peak RSS (wait4).",
            "",
            "| command | wall s | peak RSS MiB | vs baseline |",
            "|---|---:|---:|---:|",
        ]
        for name, wall, rss in rows:
            lines.append(f"| {name} | {wall:.1f} | {rss / 1024:.0f} | {wall / base:.2f}x |")
        lines += [
            "",
            f"* A probe cycle: {probe:.1f} s for {allocs:,} allocations ({per_alloc_us:.0f} us each), "
            f"{probe_rss / 1024:.0f} MiB peak RSS. Target: < 60 s and < 200 MiB: "
            f"**{'met' if probe < 60 and probe_rss < 200 * 1024 else 'NOT met'}**.",
            f"* A cycle that extends every lease: {refresh:.1f} s, {refresh_rss / 1024:.0f} MiB.",
            f"* Scrub at {a.scrub_rate}/s, --every {every}s, {len(cycles)} whole cycles in {ran:.0f} s. "
            f"Between the ends of the first and the last ({span:.1f} s): {scrubbed / MiB:.1f} MiB read back "
            f"by the keeper's count, {held * 100:.1f} % of the rate; the depots sent {sent / MiB:.1f} MiB, "
            f"{held_depots * 100:.1f} %. Target: within 10 %: "
            f"**{'met' if abs(held - 1) <= 0.10 and abs(held_depots - 1) <= 0.10 else 'NOT met'}**.",
            "",
            machine(),
        ]
        report = "\n".join(lines) + "\n"
        print(report)
        save_report(report, a.out)
        return 0
    finally:
        stop_all(procs)
        if not os.environ.get("KEEP_WORK"):
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"kept {work}")


if __name__ == "__main__":
    sys.exit(main())
