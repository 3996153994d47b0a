#!/usr/bin/env python3
"""L-Bone load generator: a federation's worth of depots heartbeating while
clients ask for ranked depots, against a real `lors lbone`.

    python3 bench/lbone_load.py                              # 10,000 depots, SQLite, 60 s
    python3 bench/lbone_load.py --baseline /tmp/old/lors     # the same load on another build, side by side
    python3 bench/lbone_load.py --database "$LORS_TEST_PG_URL" --out docs/bench/lbone.md

It registers --depots depots (spread over 200 cities with coordinates),
then for --seconds keeps up, open loop, --regs registrations per second
(the heartbeats of 10,000 depots every 30 s are 333/s) and --queries
ranked queries per second like an upload's (`count=8&hard=1G&duration=1d&
location=city=…&lat=…&lon=…`, a different city and point each time), from
many client addresses (127.0.0.2…). A request is timed from when it was due,
so a server that falls behind shows it in the latency, not in a lower rate
asked. Printed per build: registrations/s and queries/s achieved, query
latency p50/p99/max, errors (a refused, failed or non-200 request, or one
not answered within 10 s), and the L-Bone's CPU (cores used) and peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import build_lors, free_port, log, machine, save_report, wait_port  # noqa: E402

TOKEN = "load-test-token"
CITIES = 200
CLIENT_ADDRS = 64


def registration(i: int) -> bytes:
    c = i % CITIES
    return json.dumps(
        {
            "host": f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}",
            "port": 6714,
            "resources": [
                {
                    "rid": "1",
                    "hard_free": (1 + i % 50) << 30,
                    "hard_total": 100 << 30,
                    "soft_free": 0,
                    "soft_total": 0,
                    "max_duration": 30 * 86400,
                    "types": ["byte_array"],
                }
            ],
            "location": {
                "city": f"City{c}",
                "country": "US",
                "latitude": -60 + (c * 0.6) % 120,
                "longitude": -170 + (c * 1.7) % 340,
            },
            "version": "lors load",
        }
    ).encode()


async def request(addr: tuple[str, int], src: str, raw: bytes, timeout: float) -> int:
    """One HTTP/1.1 request on a connection of its own: the status."""
    async def go() -> int:
        r, w = await asyncio.open_connection(addr[0], addr[1], local_addr=(src, 0))
        try:
            w.write(raw)
            await w.drain()
            head = await r.readline()
            if not head:
                raise ConnectionError("closed without a reply")
            status = int(head.split()[1])
            length = 0
            while True:
                line = await r.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                k, _, v = line.decode().partition(":")
                if k.lower() == "content-length":
                    length = int(v)
            if length:
                await r.readexactly(length)
            return status
        finally:
            w.close()

    return await asyncio.wait_for(go(), timeout)


def post(path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: lbone\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def query(rng: random.Random) -> bytes:
    c = rng.randrange(CITIES)
    lat, lon = rng.uniform(-60, 60), rng.uniform(-170, 170)
    q = f"count=8&hard=1G&duration=1d&location=city%3DCity{c}&lat={lat:.3f}&lon={lon:.3f}"
    return f"GET /api/v1/depots?{q} HTTP/1.1\r\nHost: lbone\r\nConnection: close\r\n\r\n".encode()


class Proc:
    """CPU seconds and peak RSS of a process, from /proc."""

    def __init__(self, pid: int):
        self.pid = pid

    def cpu(self) -> float:
        f = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0


async def paced(rate: float, seconds: float, make, addr, timeout: float, lat: list[float] | None, errs: list[str]):
    """Starts make() requests at `rate` per second for `seconds`, open loop."""
    if rate <= 0:
        return 0
    n = int(rate * seconds)
    t0 = time.perf_counter()
    tasks = []
    sem = asyncio.Semaphore(1024)  # sockets this process holds at most

    async def one(k: int, due: float):
        async with sem:
            src = f"127.0.0.{2 + k % CLIENT_ADDRS}"
            try:
                st = await request(addr, src, make(k), timeout)
                if st != 200:
                    errs.append(f"HTTP {st}")
            except Exception as e:  # noqa: BLE001 - counted and shown
                errs.append(type(e).__name__)
            if lat is not None:
                lat.append(time.perf_counter() - due)

    for k in range(n):
        due = t0 + k / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(k, due)))
    await asyncio.gather(*tasks)
    return n


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


async def load(addr, depots: int, regs: float, queries: float, seconds: float, proc: Proc) -> dict:
    errs_setup: list[str] = []
    # Every depot registered first, 64 at a time.
    sem = asyncio.Semaphore(64)

    async def reg(i: int):
        async with sem:
            try:
                st = await request(addr, f"127.0.0.{2 + i % CLIENT_ADDRS}", post("/api/v1/register", registration(i)), 10)
                if st != 200:
                    errs_setup.append(f"HTTP {st}")
            except Exception as e:  # noqa: BLE001
                errs_setup.append(type(e).__name__)

    t = time.perf_counter()
    await asyncio.gather(*(reg(i) for i in range(depots)))
    setup = time.perf_counter() - t
    if errs_setup:
        raise RuntimeError(f"{len(errs_setup)} registrations failed while setting up: {errs_setup[:5]}")
    log(f"  {depots} depots registered in {setup:.1f} s ({depots / setup:.0f}/s)")
    rng = random.Random(7)
    lat: list[float] = []
    q_errs: list[str] = []
    r_errs: list[str] = []
    cpu0, t0 = proc.cpu(), time.perf_counter()
    nq, nr = await asyncio.gather(
        paced(queries, seconds, lambda k: query(rng), addr, 10, lat, q_errs),
        paced(regs, seconds, lambda k: post("/api/v1/register", registration(k % depots)), addr, 10, None, r_errs),
    )
    wall = time.perf_counter() - t0
    cpu = proc.cpu() - cpu0
    return {
        "setup_regs_per_s": depots / setup,
        "regs_per_s": (nr - len(r_errs)) / wall,
        "queries_per_s": (nq - len(q_errs)) / wall,
        "p50_ms": pct(lat, 50) * 1e3,
        "p99_ms": pct(lat, 99) * 1e3,
        "max_ms": max(lat) * 1e3 if lat else float("nan"),
        "errors": len(q_errs) + len(r_errs),
        "error_kinds": sorted(set(q_errs + r_errs))[:4],
        "cores": cpu / wall,
        "rss_mib": proc.peak_rss_mib(),
    }


def run_build(lors: str, a, work: Path) -> dict:
    port = free_port()
    data = work / f"lbone-{port}"
    data.mkdir()
    argv = [lors, "lbone", "--listen", f"127.0.0.1:{port}", "--no-legacy", "--token", TOKEN,
            "--max-connections-per-client", "1024"]
    if a.database:
        schema = f"load_{port}"
        argv += ["--database", a.database, "--schema", schema]
    else:
        argv += ["--data", str(data)]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port("127.0.0.1", port)
        return asyncio.run(load(("127.0.0.1", port), a.depots, a.regs, a.queries, a.seconds, Proc(p.pid)))
    finally:
        p.terminate()
        p.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depots", type=int, default=10_000)
    ap.add_argument("--regs", type=float, default=333, help="registrations per second (default 333)")
    ap.add_argument("--queries", type=float, default=1000, help="ranked queries per second (default 1000)")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--database", help="PostgreSQL URL [default: SQLite]")
    ap.add_argument("--baseline", help="another lors binary to run the same load against, side by side")
    ap.add_argument("--out", help="also write the Markdown report here")
    a = ap.parse_args()
    builds = [("this build", str(build_lors()))]
    if a.baseline:
        builds.insert(0, ("baseline", a.baseline))
    work = Path(tempfile.mkdtemp(prefix="lors-lbone-load-"))
    results = []
    try:
        for name, lors in builds:
            log(f"{name}: {lors}")
            r = run_build(lors, a, work)
            log(f"  {json.dumps(r)}")
            results.append((name, r))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    store = "PostgreSQL" if a.database else "SQLite"
    lines = [
        "# L-Bone under load",
        "",
        f"{a.depots:,} depots registered ({store}, one instance), then for {a.seconds:.0f} s: "
        f"{a.regs:.0f} registrations/s and {a.queries:.0f} ranked queries/s asked, open loop, "
        f"from {CLIENT_ADDRS} client addresses, one request per connection. Latency from when a "
        "query was due.",
        "",
        "| build | setup regs/s | regs/s | queries/s | p50 ms | p99 ms | max ms | errors | L-Bone cores | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results:
        lines.append(
            f"| {name} | {r['setup_regs_per_s']:.0f} | {r['regs_per_s']:.0f} | {r['queries_per_s']:.0f} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.0f} | {r['errors']} "
            f"{' '.join(r['error_kinds'])} | {r['cores']:.2f} | {r['rss_mib']:.0f} |"
        )
    if len(results) == 2:
        b, t = results[0][1], results[1][1]
        lines += ["", f"p99 {b['p99_ms'] / t['p99_ms']:.1f}x lower, queries/s {t['queries_per_s'] / max(b['queries_per_s'], 1e-9):.1f}x."]
    lines += ["", "Targets: p99 <= 50 ms, 0 errors, RSS <= 300 MiB.", "", machine()]
    report = "\n".join(lines) + "\n"
    print(report)
    save_report(report, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
