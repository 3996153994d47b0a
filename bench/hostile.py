#!/usr/bin/env python3
"""Hostile-peer benchmark: each attack of THREAT-MODEL.md's list made against
a real `lors depot` or `lors lbone` on loopback, with a legitimate client's
latency measured during the attack beside the same client with no attack,
and the server's memory (RSS now and its peak) and disk use afterwards.

    python3 bench/hostile.py                         # every attack
    python3 bench/hostile.py --only tricklers,idle   # some of them
    python3 bench/hostile.py --out docs/bench/2026-11-25-hostile.md

Every figure is checked against the bound THREAT-MODEL.md states for it;
the table says which held. The attacks use 127.0.0.0/8 source addresses to
be many hosts, and stop by themselves (each runs for a few seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import build_lors, log, machine, save_report  # noqa: E402

MiB = 1 << 20
LORS: Path = Path()

# The bounds THREAT-MODEL.md states ("What an attack costs").
LATENCY_BOUND_S = 2.0  # a legitimate depot round trip (1 MiB in and out) under attack
P99_BOUND_S = 0.050  # a legitimate L-Bone round trip's 99th percentile under the HTTP/2 and body attacks
DEPOT_PEAK_MIB = 512  # buffer_memory (256 MiB) plus the depot's own
LBONE_PEAK_MIB = 256
CLIENT_PEAK_MIB = 128  # lors download's own memory target


class Raw:
    """A line-oriented IBP (or HTTP) socket, optionally from a chosen
    local address so one machine can be many hosts."""

    def __init__(self, addr: tuple[str, int], src: str | None = None, timeout: float = 30):
        self.s = socket.socket()
        self.s.settimeout(timeout)
        if src:
            self.s.bind((src, 0))
        self.s.connect(addr)
        self.buf = b""

    def send(self, b: bytes | str) -> None:
        self.s.sendall(b.encode() if isinstance(b, str) else b)

    def line(self) -> str:
        while b"\n" not in self.buf:
            chunk = self.s.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace") + "\n"

    def exact(self, n: int) -> bytes:
        out = bytearray(self.buf[:n])
        self.buf = self.buf[n:]
        while len(out) < n:
            chunk = self.s.recv(min(4 << 20, n - len(out)))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return bytes(out)

    def request(self, line: str) -> str:
        self.send(line + "\n")
        return self.line()

    def close(self) -> None:
        self.s.close()


def caps(reply: str) -> list[str]:
    """`key typekey` of the read, write and manage capabilities."""
    if not reply.startswith("1 "):
        raise RuntimeError(f"allocate: {reply!r}")
    out = []
    for c in reply.split()[1:]:
        m = re.match(r"ibp://[^/]+/([^/]+)/(\d+)/", c)
        out.append(f"{m.group(1)} {m.group(2)}")
    return out


def memory(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB."""
    f = {}
    for l in open(f"/proc/{pid}/status"):
        k, _, v = l.partition(":")
        if k in ("VmRSS", "VmHWM"):
            f[k] = int(v.split()[0]) / 1024
    return f["VmRSS"], f["VmHWM"]


def disk(path: Path) -> float:
    """MiB of disk the files under `path` take (allocated blocks: a hole
    takes none)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total / MiB


class Server:
    """A depot or L-Bone process on loopback, its stderr kept; run through
    `wrap` (e.g. `nsenter -t PID -m`) if given."""

    def __init__(self, args: list[str], ready_prefix: str, workdir: Path, wrap: list[str] | None = None):
        self.err = open(workdir / "stderr.log", "w+")
        self.p = subprocess.Popen(
            [*(wrap or []), str(LORS), *args], stdout=subprocess.PIPE, stderr=self.err, text=True
        )
        self.addr = None
        for line in self.p.stdout:
            if line.startswith(ready_prefix):
                host, port = line[len(ready_prefix):].strip().rstrip("/").rsplit(":", 1)
                self.addr = (host, int(port))
            if "ready" in line:
                break
        if not self.addr:
            raise RuntimeError(f"{args[0]} did not start")
        threading.Thread(target=self.p.stdout.read, daemon=True).start()

    def memory(self) -> tuple[float, float]:
        return memory(self.p.pid)

    def errors_logged(self) -> int:
        self.err.flush()
        return sum(1 for l in open(self.err.name) if " ERROR " in l)

    def stop(self) -> None:
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def depot(dir: Path, extra: list[str] | None = None) -> Server:
    dir.mkdir(parents=True, exist_ok=True)
    extra = extra or []
    listen = [] if "--listen" in extra else ["--listen", "127.0.0.1:0"]
    args = ["depot", "--data", str(dir), *listen, "--sync", "never", *extra]
    return Server(args, "lors depot: serving IBP on ", dir)


def depot_round_trip(addr) -> float:
    """The legitimate client: ALLOCATE, STORE 1 MiB, LOAD it back, on a fresh
    connection; seconds (inf if refused). Its allocation is released after
    (untimed), so disk figures are the attack's."""
    t0 = time.perf_counter()
    try:
        r = Raw(addr, "127.0.0.1", timeout=60)
        rd, wr, mg = caps(r.request("1 1 1 2 1 3600 1048576 30"))
        data = os.urandom(MiB)
        if r.request(f"1 2 {wr} {MiB} 30") != "1 \n":
            return float("inf")
        r.send(data)
        if r.line() != f"1 {MiB} \n":
            return float("inf")
        if r.request(f"1 8 {rd} 0 {MiB} 30") != f"1 {MiB} \n" or r.exact(MiB) != data:
            return float("inf")
        took = time.perf_counter() - t0
        r.request(f"1 9 {mg} 42 1 10")
        r.close()
    except (OSError, RuntimeError, ConnectionError):
        return float("inf")
    return took


def lbone_round_trip(addr) -> float:
    """The legitimate L-Bone client: GET /healthz and a 5-depot query."""
    t0 = time.perf_counter()
    for path in ("/healthz", "/api/v1/depots?count=5"):
        status, _ = http(addr, "127.0.0.1", f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        if status != 200:
            return float("inf")
    return time.perf_counter() - t0


def http(addr, src: str, req: str | bytes, timeout: float = 30) -> tuple[int, bytes]:
    try:
        r = Raw(addr, src, timeout)
        r.send(req)
        out = bytearray(r.buf)
        while True:
            chunk = r.s.recv(1 << 20)
            if not chunk:
                break
            out += chunk
        r.close()
    except OSError:
        return 0, b""
    head, _, body = bytes(out).partition(b"\r\n\r\n")
    try:
        return int(head.split()[1]), body
    except (IndexError, ValueError):
        return 0, b""


def post(path: str, body: str, token: str | None = None) -> str:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    )


def registration(host: str, city: str = "Brno") -> str:
    return json.dumps({
        "host": host, "port": 6714,
        "resources": [{"rid": "1", "hard_free": 1 << 30, "hard_total": 1 << 30, "soft_free": 0,
                       "soft_total": 0, "max_duration": 86400, "types": ["byte_array"]}],
        "location": {"city": city, "tags": []}, "version": "bench",
    })


@dataclass
class Result:
    name: str
    attack: str
    baseline: list[float] = field(default_factory=list)
    under: list[float] = field(default_factory=list)
    rss: float = 0.0
    peak: float = 0.0
    disk: float = 0.0
    peak_bound: float = DEPOT_PEAK_MIB
    disk_bound: float | None = None
    notes: list[str] = field(default_factory=list)
    held: bool = True

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.held = False
            self.notes.append(f"**bound broken: {what}**")


def measure(res: Result, legit, addr, attack, settle: float = 1.0, tries: int = 5) -> None:
    """Baseline round trips, then the attack in the background and the same
    round trips during it."""
    res.baseline = [legit(addr) for _ in range(tries)]
    stop = threading.Event()
    t = threading.Thread(target=attack, args=(stop,), daemon=True)
    t.start()
    time.sleep(settle)
    res.under = [legit(addr) for _ in range(tries)]
    stop.set()
    t.join(60)


def finish(res: Result, srv: Server, data: Path | None) -> None:
    res.rss, res.peak = srv.memory()
    if data is not None:
        res.disk = disk(data)
    worst = max(res.under) if res.under else 0
    res.check(worst <= LATENCY_BOUND_S, f"legitimate round trip {worst:.2f} s > {LATENCY_BOUND_S} s")
    res.check(res.peak <= res.peak_bound, f"peak {res.peak:.0f} MiB > {res.peak_bound} MiB")
    if res.disk_bound is not None:
        res.check(res.disk <= res.disk_bound, f"disk {res.disk:.1f} MiB > {res.disk_bound} MiB")


# -- the depot's attacks ---------------------------------------------------


def zero_writes(work: Path) -> Result:
    res = Result("zero-write", "200 × (STORE 1000 B, alias for [1000, 5096), zero-length WRITE at its end), then a restart",
                 disk_bound=10)
    srv = depot(work, ["--size", "100M"])
    owners = []

    def attack(stop):
        r = Raw(srv.addr)
        for _ in range(200):
            rd, wr, mg = caps(r.request("1 1 1 2 1 3600 8192 10"))
            r.request(f"1 2 {wr} 1000 10")
            r.send(b"o" * 1000)
            r.line()
            awr = caps(r.request(f"1 14 {mg} 1000 4096 0 10"))[1]
            r.request(f"1 13 {awr} 4096 0 30")
            r.line()
            owners.append((rd, mg))

    measure(res, depot_round_trip, srv.addr, attack, settle=0.2)
    time.sleep(1)
    finish(res, srv, work / "data")
    port = srv.addr[1]
    srv.stop()
    srv = depot(work, ["--size", "100M", "--listen", f"127.0.0.1:{port}"])
    r = Raw(srv.addr)
    intact = sum(1 for rd, _ in owners if r.request(f"1 8 {rd} 0 1000 10") == "1 1000 \n" and r.exact(1000) == b"o" * 1000)
    damaged = len(list((work / "damaged").glob("*"))) if (work / "damaged").exists() else 0
    res.notes.append(f"{intact}/{len(owners)} owners' bytes intact after restart, {damaged} damaged")
    res.check(intact == len(owners) and damaged == 0, "owners' bytes lost")
    srv.stop()
    return res


def tiny_blocks(work: Path) -> Result:
    res = Result("tiny-cksum", "12 × ALLOCATE_CHKSUM SHA-512 of 8 MiB at 1-byte blocks, the finest accepted "
                 "block each with a 1-byte WRITE at its end, 3 GET_CHKSUMs at once", disk_bound=12 * 8 / 16 + 1)
    srv = depot(work, ["--size", "1G"])
    refused = []

    def attack(stop):
        r = Raw(srv.addr)
        made = []
        for _ in range(12):
            refused.append(r.request("1 29 2 1 0 2 1 3600 8388608 30").strip())
            made.append(caps(r.request("1 29 2 2048 0 2 1 3600 8388608 30")))
        for _, wr, _ in made:
            r.request(f"1 13 {wr} {8 * MiB - 1} 1 30")
            r.send(b"!")
            r.line()

        def get(mg):
            c = Raw(srv.addr)
            head = c.request(f"1 31 {mg} 0 30")
            c.exact(int(head.split()[5]))

        ts = [threading.Thread(target=get, args=(m[2],)) for m in made[:3]]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    measure(res, depot_round_trip, srv.addr, attack, settle=0.5)
    finish(res, srv, work / "data")
    res.notes.append(f"1-byte blocks answered {sorted(set(refused))}")
    srv.stop()
    return res


def delete_during_store(work: Path) -> Result:
    res = Result("decr-store", "4 rounds: a 8 MiB checksummed STORE, DECR to zero half-way", disk_bound=0.01)
    srv = depot(work, ["--size", "1G"])

    def attack(stop):
        owner = Raw(srv.addr)
        for _ in range(4):
            _, wr, mg = caps(owner.request("1 29 2 2048 0 2 1 3600 8388608 30"))
            w = Raw(srv.addr)
            w.request(f"1 2 {wr} {8 * MiB} 30")
            w.send(b"d" * (4 * MiB))
            time.sleep(0.1)
            owner.request(f"1 9 {mg} 42 1 10")
            w.send(b"d" * (4 * MiB))
            w.line()
            w.close()

    measure(res, depot_round_trip, srv.addr, attack, settle=0.2)
    time.sleep(0.5)
    finish(res, srv, work / "data")
    leftover = [p for p in (work / "data").rglob("*") if p.is_file() and p.suffix == ".cks"]
    res.check(not leftover, f"{len(leftover)} orphaned digest files")
    srv.stop()
    return res


def checksummed_queue_load(work: Path) -> Result:
    res = Result("cksum-fifo", "a 16 MiB FIFO LOADed with SHA-512 over 1-byte blocks (2 GiB framed)", disk_bound=17)
    srv = depot(work, ["--size", "1G"])

    def attack(stop):
        r = Raw(srv.addr, timeout=300)
        rd, wr, _ = caps(r.request("1 1 1 2 3 3600 16777216 10"))
        r.request(f"1 2 {wr} {16 * MiB} 30")
        r.send(os.urandom(16 * MiB))
        r.line()
        r.request(f"1 24 2 1 {rd} 0 {16 * MiB} 300")
        left = 129 * 16 * MiB
        while left and not stop.is_set():
            left -= len(r.s.recv(min(left, 8 << 20)))

    measure(res, depot_round_trip, srv.addr, attack, settle=2.0)
    finish(res, srv, work / "data")
    srv.stop()
    return res


def tricklers(work: Path) -> Result:
    res = Result("tricklers", "4 hosts × a 64 MiB FIFO STORE and 8 hosts × 16 4 MiB STOREs, 1 byte a second each",
                 disk_bound=2)
    srv = depot(work, ["--size", "2G"])
    conns = []
    r = Raw(srv.addr)
    for h in range(2, 6):
        wr = caps(r.request("1 1 1 2 3 3600 67108864 10"))[1]
        c = Raw(srv.addr, f"127.0.2.{h}")
        c.request(f"1 2 {wr} 67108864 300")
        conns.append(c)
    for h in range(10, 18):
        for _ in range(16):
            wr = caps(r.request("1 1 1 2 1 3600 4194304 10"))[1]
            c = Raw(srv.addr, f"127.0.2.{h}")
            c.request(f"1 2 {wr} 4194304 300")
            conns.append(c)

    def attack(stop):
        while not stop.is_set():
            for c in conns:
                try:
                    c.send(b"x")
                except OSError:
                    pass
            stop.wait(1.0)

    measure(res, depot_round_trip, srv.addr, attack, settle=2.0)
    finish(res, srv, work / "data")
    for c in conns:
        c.close()
    srv.stop()
    return res


def idle_flood(work: Path) -> Result:
    res = Result("idle-flood", "19 hosts × 55 idle connections (the cap is 1024)", disk_bound=2)
    srv = depot(work)
    held = []

    def attack(stop):
        for h in range(2, 21):
            for _ in range(55):
                try:
                    held.append(Raw(srv.addr, f"127.0.3.{h}"))
                except OSError:
                    pass
        stop.wait(30)

    measure(res, depot_round_trip, srv.addr, attack, settle=3.0)
    finish(res, srv, work / "data")
    closed = 0
    for c in held:
        c.s.settimeout(0.01)
        try:
            if c.s.recv(1) == b"":
                closed += 1
        except (socket.timeout, OSError):
            pass
        c.close()
    res.notes.append(f"{closed} of {len(held)} parked connections closed to make room")
    srv.stop()
    return res


def tiny_allocations(work: Path) -> Result:
    res = Result("tiny-allocs", "100,000 one-byte allocations, 20,000 one-byte STOREs, aliases to the limit on 20",
                 disk_bound=20_000 * 8 / 1024 + 64)
    srv = depot(work)
    counts = {}

    def attack(stop):
        r = Raw(srv.addr)
        made = []
        for i in range(100_000):
            reply = r.request("1 1 1 2 1 3600 1 10")
            if not reply.startswith("1 "):
                counts["refused at"] = i
                break
            if i < 20_000:
                made.append(caps(reply))
        for _, wr, _ in made:
            r.request(f"1 2 {wr} 1 10")
            r.send(b"x")
            r.line()
        aliases = 0
        for _, _, mg in made[:20]:
            while r.request(f"1 14 {mg} 0 0 0 10").startswith("1 "):
                aliases += 1
        counts["aliases"] = aliases

    measure(res, depot_round_trip, srv.addr, attack, settle=0.0, tries=3)
    finish(res, srv, work / "data")
    meta = sum(p.stat().st_size for p in work.glob("**/meta.redb")) / MiB
    res.notes.append(f"aliases on 20 allocations: {counts.get('aliases')}; meta.redb {meta:.1f} MiB")
    srv.stop()
    return res


def fresh_checksummed(work: Path) -> Result:
    res = Result("fresh-cksum", "10,000 × GET_CHKSUM, VALIDATE and LOAD 0 0 on a fresh checksummed allocation",
                 disk_bound=0.1)
    srv = depot(work)
    answers = set()

    def attack(stop):
        r = Raw(srv.addr)
        rd, _, mg = caps(r.request("1 29 1 4096 0 2 1 3600 65536 10"))
        for _ in range(3333):
            answers.add(r.request(f"1 31 {mg} 1 10").strip())
            answers.add(r.request(f"1 32 {mg} 0 10").strip())
            answers.add(r.request(f"1 8 {rd} 0 0 10").strip())

    measure(res, depot_round_trip, srv.addr, attack, settle=0.5)
    finish(res, srv, None)
    errors = srv.errors_logged()
    res.notes.append(f"answers {sorted(answers)}; {errors} ERROR lines logged")
    res.check(errors == 0, f"{errors} error lines in the log")
    srv.stop()
    return res


# -- the L-Bone's attacks --------------------------------------------------


class H2:
    """A raw h2c connection from `src`: requests on streams whose receive
    window is `window` (0: the server may send headers, never a body byte),
    request bodies left unfinished when asked. A reader thread answers the
    server's SETTINGS and PINGs and counts what comes back."""

    def __init__(self, addr, src: str, window: int = 0):
        self.s = socket.socket()
        self.s.settimeout(30)
        self.s.bind((src, 0))
        self.s.connect(addr)
        self.lock = threading.Lock()
        self.next = 1
        self.heads = 0
        self.resets = 0
        self.closed = False
        self.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + self.frame(4, 0, 0, struct.pack(">HI", 4, window)))
        threading.Thread(target=self.read, daemon=True).start()

    @staticmethod
    def frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", sid) + payload

    def send(self, b: bytes) -> None:
        with self.lock:
            try:
                self.s.sendall(b)
            except OSError:
                self.closed = True

    def read(self) -> None:
        buf = b""
        try:
            while True:
                while len(buf) < 9:
                    chunk = self.s.recv(1 << 16)
                    if not chunk:
                        raise OSError("closed")
                    buf += chunk
                n = int.from_bytes(buf[:3], "big")
                kind, flags = buf[3], buf[4]
                while len(buf) < 9 + n:
                    chunk = self.s.recv(1 << 16)
                    if not chunk:
                        raise OSError("closed")
                    buf += chunk
                payload, buf = buf[9:9 + n], buf[9 + n:]
                if kind == 4 and not flags & 1:
                    self.send(self.frame(4, 1, 0, b""))
                elif kind == 6 and not flags & 1:
                    self.send(self.frame(6, 1, 0, payload))
                elif kind == 1:
                    self.heads += 1
                elif kind == 3:
                    self.resets += 1
                elif kind == 7:
                    raise OSError("goaway")
        except OSError:
            self.closed = True

    def request(self, method: str, path: str, unfinished: bool = False) -> None:
        def lit(index: int, value: str) -> bytes:
            # Literal without indexing, name from the static table.
            head = bytes([index]) if index < 15 else bytes([15, index - 15])
            return head + bytes([len(value)]) + value.encode()

        block = bytes([0x82 if method == "GET" else 0x83, 0x86]) + lit(4, path) + lit(1, "lbone")
        if unfinished:
            block += lit(28, "100000")
        sid, self.next = self.next, self.next + 2
        self.send(self.frame(1, 0x4 | (0 if unfinished else 0x1), sid, block))
        if unfinished:
            self.send(self.frame(0, 0, sid, b'{"rates":['))

    def close(self) -> None:
        self.closed = True
        self.s.close()


def h2_flood(addrs: list[str], conns: int, streams: int, make, stop, every: float = 1.0, window: int = 0):
    """`conns` h2c connections from each address, each keeping `streams`
    requests (`make(conn, i)`) going: new ones every `every` seconds, as the
    server resets or answers the old. Reconnects what the server closes."""
    pool: list[H2] = []
    try:
        while not stop.is_set():
            pool = [c for c in pool if not c.closed]
            for a in addrs:
                have = sum(1 for c in pool if c.src == a)
                for _ in range(conns - have):
                    try:
                        c = H2(LBONE_ADDR[0], a, window)
                        c.src = a
                        pool.append(c)
                    except OSError:
                        break
            for c in pool:
                for i in range(streams):
                    make(c, i)
            stop.wait(every)
    finally:
        for c in pool:
            c.close()
    return pool


LBONE_ADDR: list = [None]


def measure_lbone(res: Result, srv: Server, attack, settle: float) -> None:
    """measure() and finish() for an L-Bone attack, 40 tries, with the p99
    bound beside the max."""
    measure(res, lbone_round_trip, srv.addr, attack, settle=settle, tries=40)
    finish(res, srv, None)
    legit_tail(res)


def legit_tail(res: Result) -> None:
    """The p99 bound beside the max: 50 ms (THREAT-MODEL.md)."""
    xs = sorted(res.under)
    p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))] if xs else 0
    res.notes.append(f"p99 {p99 * 1000:.0f} ms of {len(xs)}")
    res.check(p99 <= P99_BOUND_S, f"legitimate p99 {p99 * 1000:.0f} ms > {P99_BOUND_S * 1000:.0f} ms")


def populate(srv: Server, token: str, depots: int) -> None:
    log(f"registering {depots} depots")

    def register(lo, hi):
        for i in range(lo, hi):
            http(srv.addr, "127.0.0.1", post("/api/v1/register", registration(f"d{i}.example.org", "Brno" * 60), token))

    ts = [threading.Thread(target=register, args=(k * depots // 8, (k + 1) * depots // 8)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def h2_stalled(work: Path, depots: int) -> Result:
    res = Result("lbone-h2-stall", f"h2c streams that never open their window, 8 addresses × 8 connections × 16 "
                 f"streams, listings of {depots:,} depots and histories, renewed every second", peak_bound=LBONE_PEAK_MIB)
    srv, token = lbone(work)
    populate(srv, token, depots)
    LBONE_ADDR[0] = srv.addr
    seen = []

    def attack(stop):
        def make(c, i):
            c.request("GET", "/api/v1/depots?all=1" if i % 2 == 0 else "/api/v1/history")
        seen.extend(h2_flood([f"127.0.30.{a}" for a in range(1, 9)], 8, 16, make, stop))

    measure_lbone(res, srv, attack, 6.0)
    res.notes.append(f"{sum(c.heads for c in seen)} answers headed, {sum(c.resets for c in seen)} streams reset")
    srv.stop()
    return res


def slow_bodies(work: Path) -> Result:
    res = Result("lbone-slow-body", "request bodies never finished: h2c 32 connections × 64 POST streams from one "
                 "address, then HTTP/1.1 32 connections from each of eight", peak_bound=LBONE_PEAK_MIB)
    srv, _ = lbone(work)
    LBONE_ADDR[0] = srv.addr
    held = []

    def attack(stop):
        h2 = threading.Thread(target=h2_flood, args=(["127.0.31.1"], 32, 64,
                                                     lambda c, i: c.request("POST", "/api/v1/rates", unfinished=True),
                                                     stop, 5.0, 65535), daemon=True)
        h2.start()
        while not stop.is_set():
            for a in range(1, 9):
                while sum(1 for r in held if r[0] == a) < 32 and not stop.is_set():
                    try:
                        r = Raw(srv.addr, f"127.0.32.{a}", timeout=30)
                        r.send("POST /api/v1/rates HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
                        held.append((a, r))
                    except OSError:
                        break
            stop.wait(1.0)
            # The server gives up on each after its body deadline; open again.
            for item in list(held):
                try:
                    item[1].s.setblocking(False)
                    if item[1].s.recv(1, socket.MSG_PEEK) == b"":
                        raise OSError
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                finally:
                    try:
                        item[1].s.setblocking(True)
                    except OSError:
                        pass
                held.remove(item)
                item[1].close()
        h2.join(10)

    measure_lbone(res, srv, attack, 3.0)
    for _, r in held:
        r.close()
    srv.stop()
    return res


def history_flood(work: Path) -> Result:
    res = Result("lbone-history", "1,024 /api/v1/history at once from one address (h2c, 32 connections × 32 "
                 "streams), renewed every 0.2 s", peak_bound=LBONE_PEAK_MIB)
    srv, _ = lbone(work)
    LBONE_ADDR[0] = srv.addr
    seen = []

    def attack(stop):
        seen.extend(h2_flood(["127.0.33.1"], 32, 32, lambda c, i: c.request("GET", "/api/v1/history"),
                             stop, 0.2, 1 << 20))

    measure_lbone(res, srv, attack, 2.0)
    res.notes.append(f"{sum(c.heads for c in seen)} answers headed (429 beyond the address's 32 in flight)")
    srv.stop()
    return res


# -- a depot's full disk ---------------------------------------------------


def disk_full(work: Path) -> Result:
    res = Result("disk-full", "a resource on a 32 MiB tmpfs configured as 1 GiB, filled through IBP, then "
                 "from outside to the last block; the space freed again", peak_bound=DEPOT_PEAK_MIB)
    mnt = work / "small"
    mnt.mkdir()
    holder = subprocess.Popen(["unshare", "-m", "sh", "-c",
                               f"mount -t tmpfs -o size=32m tmpfs {mnt} || exit 77; echo mounted; exec sleep 900"],
                              stdout=subprocess.PIPE, text=True)
    if holder.stdout.readline().strip() != "mounted":
        holder.wait()
        res.notes.append("skipped: no private tmpfs here (needs unshare -m as root)")
        return res
    inside = Path(f"/proc/{holder.pid}/root") / str(mnt).lstrip("/")
    cfg = work / "depot.toml"
    cfg.write_text(f'listen = "127.0.0.1:0"\nsync = "always"\n[[resource]]\nrid = "1"\npath = "{mnt}/r1"\n'
                   f'size = "1GiB"\n[[resource]]\nrid = "2"\npath = "{work}/r2"\nsize = "1GiB"\n')
    srv = Server(["depot", "--config", str(cfg)], "lors depot: serving IBP on ", work,
                 wrap=["nsenter", "-t", str(holder.pid), "-m"])
    said = {}

    def alloc(r: Raw, rid: int, size: int = MiB) -> str:
        return r.request(f"1 1 {rid} 2 1 3600 {size} 30")

    def fill(name: str) -> None:
        with open(inside / name, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 16))
                    f.flush()
            except OSError:
                pass

    def attack(stop):
        r = Raw(srv.addr, "127.0.40.1", timeout=60)
        n = 0
        held = []
        while True:
            reply = alloc(r, 1)
            if not reply.startswith("1 "):
                said["ibp fill"] = f"{n} MiB, then {reply.strip()}"
                break
            _, wr, mg = caps(reply)
            held.append(mg)
            r.request(f"1 2 {wr} {MiB} 30")
            r.send(os.urandom(MiB))
            if r.line() != f"1 {MiB} \n":
                said["store refused"] = "after a promise"
                break
            n += 1
        fill("fill1")
        said["allocate on the full disk"] = alloc(r, 1, 4096).strip()
        # Deletions on the full disk, then what they freed taken too.
        decrs = [r.request(f"1 9 {mg} 42 1 10").strip() for mg in held]
        said["DECRs on the full disk"] = f"{sum(d == '1' for d in decrs)} of {len(decrs)} ok"
        fill("fill2")
        said["after the second fill"] = alloc(r, 1, 4096).strip()
        filled.set()
        stop.wait(10)
        r.close()

    filled = threading.Event()
    res.baseline = [depot_round_trip_rid0(srv.addr) for _ in range(5)]
    stop = threading.Event()
    t = threading.Thread(target=attack, args=(stop,), daemon=True)
    t.start()
    filled.wait(120)
    res.under = [depot_round_trip_rid0(srv.addr) for _ in range(5)]
    (inside / "fill1").unlink()
    (inside / "fill2").unlink()
    t0 = time.perf_counter()
    r = Raw(srv.addr, "127.0.0.1")
    while not alloc(r, 1).startswith("1 ") and time.perf_counter() - t0 < 10:
        time.sleep(0.01)
    back = time.perf_counter() - t0
    r.close()
    stop.set()
    t.join(30)
    finish(res, srv, None)
    res.notes.append("; ".join(f"{k}: {v}" for k, v in said.items()))
    res.notes.append(f"ALLOCATE on the freed disk after {back * 1000:.0f} ms")
    res.check(back <= 1.0, f"ALLOCATE back after {back:.2f} s > 1 s")
    res.check(said.get("allocate on the full disk", "").startswith("-19"), "the full disk answered no-space")
    srv.stop()
    holder.kill()
    holder.wait()
    return res


def depot_round_trip_rid0(addr) -> float:
    """depot_round_trip, letting the depot choose the resource."""
    t0 = time.perf_counter()
    try:
        r = Raw(addr, "127.0.0.1", timeout=60)
        rd, wr, mg = caps(r.request("1 1 0 2 1 3600 1048576 30"))
        if r.request(f"1 2 {wr} {MiB} 30") != "1 \n":
            return float("inf")
        r.send(os.urandom(MiB))
        if r.line() != f"1 {MiB} \n":
            return float("inf")
        took = time.perf_counter() - t0
        r.request(f"1 9 {mg} 42 1 10")
        r.close()
    except (OSError, RuntimeError, ConnectionError):
        return float("inf")
    return took


def lbone(work: Path) -> tuple[Server, str]:
    token = "bench-token-0123456789"
    srv = Server(["lbone", "--data", str(work), "--listen", "127.0.0.1:0", "--no-legacy", "--token", token],
                 "lors lbone: dashboard http://", work)
    http(srv.addr, "127.0.0.1", post("/api/v1/register", registration("bench.example.org"), token))
    return srv, token


def rates_flood(work: Path) -> Result:
    res = Result("lbone-rates", "217 POSTs of 1,024 made-up 300-character depot names in 30 s, from one network",
                 peak_bound=LBONE_PEAK_MIB, disk_bound=2)
    srv, _ = lbone(work)
    statuses = {}
    body = lambda i: json.dumps({"rates": [{"depot": f"{'x' * 280}{i}-{k}:1", "bytes_per_sec": 1e6} for k in range(1024)]})
    base_disk = disk(work)

    def attack(stop):
        for i in range(217):
            s, _ = http(srv.addr, "127.0.4.1", post("/api/v1/rates", body(i)))
            statuses[s] = statuses.get(s, 0) + 1
            time.sleep(30 / 217)

    measure(res, lbone_round_trip, srv.addr, attack, settle=5.0)
    finish(res, srv, work)
    res.disk -= base_disk
    res.notes.append(f"answers {dict(sorted(statuses.items()))}")
    srv.stop()
    return res


def lbone_idle(work: Path) -> Result:
    res = Result("lbone-idle", "300 idle connections from one host, 256 more from eight", peak_bound=LBONE_PEAK_MIB)
    srv, _ = lbone(work)
    held = []

    def attack(stop):
        for i in range(300):
            try:
                held.append(Raw(srv.addr, "127.0.9.1"))
            except OSError:
                pass
        for h in range(2, 10):
            for _ in range(32):
                try:
                    held.append(Raw(srv.addr, f"127.0.10.{h}"))
                except OSError:
                    pass
        stop.wait(30)

    measure(res, lbone_round_trip, srv.addr, attack, settle=2.0)
    finish(res, srv, None)
    for c in held:
        c.close()
    srv.stop()
    return res


def lbone_listings(work: Path, depots: int) -> Result:
    res = Result("lbone-list", f"96 concurrent ?all=1 listings of {depots:,} depots, each a different query",
                 peak_bound=LBONE_PEAK_MIB)
    srv, token = lbone(work)
    log(f"registering {depots} depots")

    def register(lo, hi):
        for i in range(lo, hi):
            http(srv.addr, "127.0.0.1", post("/api/v1/register", registration(f"d{i}.example.org", "Brno" * 60), token))

    ts = [threading.Thread(target=register, args=(k * depots // 8, (k + 1) * depots // 8)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    _, one = http(srv.addr, "127.0.0.1", "GET /api/v1/depots?all=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    before = srv.memory()
    sizes = []

    def attack(stop):
        def get(i):
            _, b = http(srv.addr, f"127.0.{11 + i % 2}.{i % 8 + 1}",
                        f"GET /api/v1/depots?all=1&count={100000 + i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout=60)
            sizes.append(len(b))

        ts = [threading.Thread(target=get, args=(i,)) for i in range(96)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    measure(res, lbone_round_trip, srv.addr, attack, settle=0.5)
    finish(res, srv, None)
    res.notes.append(f"listing {len(one) / MiB:.1f} MiB; {sum(1 for s in sizes if s == len(one))}/96 answered whole; "
                     f"before the attack {before[0]:.0f} MiB (peak {before[1]:.0f})")
    srv.stop()
    return res


def hostile_exnode(work: Path) -> Result:
    res = Result("exnode", "lors download of a 551-byte exNode claiming 2^63 bytes, and one claiming 1 TiB",
                 peak_bound=CLIENT_PEAK_MIB)
    srv = depot(work / "d")
    src = work / "src"
    src.write_bytes(os.urandom(MiB))
    xnd = work / "f.xnd"
    subprocess.run([str(LORS), "upload", "--depot", f"{srv.addr[0]}:{srv.addr[1]}", "-c", "1", "-n", "-o", str(xnd), str(src)],
                   check=True, capture_output=True)
    text = xnd.read_text()
    peaks, times, said = [], [], []
    for claim in (2**63 - 1, 1 << 40):
        bad = re.sub(r'(name="(?:logical_length|alloc_length)"[^>]*>)\s*\d+', lambda m: f"{m.group(1)}{claim}", text)
        hostile = work / f"hostile-{claim}.xnd"
        hostile.write_text(bad)
        t0 = time.perf_counter()
        r = subprocess.run(["/usr/bin/time", "-f", "%M", str(LORS), "download", "-o", "-", str(hostile)],
                           capture_output=True, timeout=900)
        times.append(time.perf_counter() - t0)
        err = r.stderr.decode(errors="replace").strip().splitlines()
        peaks.append(int(err[-1]) / 1024)
        error = next((l for l in reversed(err) if l.startswith("lors: error")), "?")
        said.append(f"{claim:.3g} B: " + (error[:140] if r.returncode else f"exit 0, {len(r.stdout)} bytes"))
    res.baseline, res.under = [0.0], times
    res.rss = res.peak = max(peaks)
    res.notes.append("; ".join(said))
    res.check(res.peak <= res.peak_bound, f"client peak {res.peak:.0f} MiB")
    res.check(max(times) <= LATENCY_BOUND_S * 5, f"took {max(times):.1f} s")
    srv.stop()
    return res


ATTACKS = {
    "zero-write": zero_writes,
    "tiny-cksum": tiny_blocks,
    "decr-store": delete_during_store,
    "cksum-fifo": checksummed_queue_load,
    "tricklers": tricklers,
    "idle": idle_flood,
    "tiny-allocs": tiny_allocations,
    "fresh-cksum": fresh_checksummed,
    "lbone-rates": rates_flood,
    "lbone-idle": lbone_idle,
    "lbone-list": None,  # needs the depot count
    "lbone-h2-stall": None,  # needs the depot count
    "lbone-slow-body": slow_bodies,
    "lbone-history": history_flood,
    "disk-full": disk_full,
    "exnode": hostile_exnode,
}


def fmt_ms(xs: list[float]) -> str:
    if not xs:
        return "–"
    if any(x == float("inf") for x in xs):
        return f"refused {sum(1 for x in xs if x == float('inf'))}/{len(xs)}"
    ms = lambda x: f"{x * 1000:.1f}" if x < 0.01 else f"{x * 1000:.0f}"
    return f"{ms(statistics.median(xs))} ({ms(max(xs))})"


def report(results: list[Result], args) -> str:
    out = [
        "# Hostile peers: what each attack costs the server and everyone else",
        "",
        f"`python3 bench/hostile.py{' --only ' + args.only if args.only else ''}` on {machine()}, "
        f"{time.strftime('%Y-%m-%d')}, release build. A legitimate client's round trip (depot: ALLOCATE, "
        "STORE 1 MiB, LOAD it; L-Bone: `/healthz` and a 5-depot query) on a fresh connection, in ms, "
        "median (max) of five, with no attack and during it; the server's resident memory after the attack "
        "and its peak; its disk use (data files, or the database). Bounds: THREAT-MODEL.md.",
        "",
        "| attack | what | round trip, no attack | during the attack | RSS / peak MiB | disk MiB | bounds | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        out.append(
            f"| {r.name} | {r.attack} | {fmt_ms(r.baseline)} | {fmt_ms(r.under)} | {r.rss:.0f} / {r.peak:.0f} | "
            f"{r.disk:.1f} | {'held' if r.held else 'BROKEN'} | {'; '.join(r.notes)} |"
        )
    return "\n".join(out) + "\n"


def main() -> None:
    global LORS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated attacks: " + ",".join(ATTACKS))
    ap.add_argument("--depots", type=int, default=10_000, help="depots in the L-Bone for the listing attack")
    ap.add_argument("--out", help="write the Markdown report here")
    args = ap.parse_args()
    LORS = build_lors()
    names = args.only.split(",") if args.only else list(ATTACKS)
    results = []
    for name in names:
        if name not in ATTACKS:
            sys.exit(f"unknown attack {name}: one of {','.join(ATTACKS)}")
        log(f"== {name}")
        with tempfile.TemporaryDirectory(prefix="lors-hostile-", dir="/var/tmp") as d:
            fn = ATTACKS[name]
            if name == "lbone-list":
                r = lbone_listings(Path(d), args.depots)
            elif name == "lbone-h2-stall":
                r = h2_stalled(Path(d), args.depots)
            else:
                r = fn(Path(d))
            results.append(r)
            log(f"   {fmt_ms(r.baseline)} -> {fmt_ms(r.under)} ms, {r.rss:.0f}/{r.peak:.0f} MiB, "
                f"{r.disk:.1f} MiB disk, {'held' if r.held else 'BROKEN'} {'; '.join(r.notes)}")
    text = report(results, args)
    print(text)
    save_report(text, args.out)
    if not all(r.held for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
