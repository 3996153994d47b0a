"""Shared pieces of the LoRS benchmark suite: peers, timing, statistics, tables.

Every figure is a wall-clock time of a whole command (start-up included, the
same for every tool), turned into GiB/s. Cases run interleaved, round after
round, so a noisy neighbour slows every tool alike; the tables report medians
and min-max over the rounds, and ratios computed from the medians.
"""

from __future__ import annotations

import os
import shutil
import socket
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GiB = 1 << 30

# Debian packages for every peer the suite runs.
PEER_PACKAGES = {
    "globus-url-copy": "globus-gass-copy-progs",
    "globus-gridftp-server": "globus-gridftp-server-progs",
    "xrootd": "xrootd-server",
    "xrdcp": "xrootd-client",
    "aria2c": "aria2",
    "mktorrent": "mktorrent",
    "nginx": "nginx",
    "iperf3": "iperf3",
    "curl": "curl",
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def stop_all(procs) -> None:
    """Terminates every process, then waits for each (killing one that
    does not end within 10 s)."""
    procs = list(procs)
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def ensure_peers() -> None:
    """Installs whichever peer programs are missing from Debian's packages."""
    missing = sorted({p for c, p in PEER_PACKAGES.items() if shutil.which(c) is None})
    if not missing:
        return
    log(f"installing {' '.join(missing)} from Debian's packages")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env)


def build_lors() -> Path:
    """Builds the release `lors` binary and returns its path; `LORS_BIN`
    names a binary built elsewhere instead (an earlier commit, to compare)."""
    if os.environ.get("LORS_BIN"):
        log(f"using {os.environ['LORS_BIN']}")
        return Path(os.environ["LORS_BIN"])
    log("building lors (release)")
    subprocess.run(
        ["cargo", "build", "--release", "--locked", "--bin", "lors", "-q"],
        cwd=ROOT,
        check=True,
    )
    return ROOT / "target" / "release" / "lors"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(host: str, port: int, timeout: float = 15.0, wrap: list[str] | None = None) -> None:
    """Waits until something accepts on host:port (inside `wrap`, a netns exec prefix)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if wrap:
            probe = "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 1)"
            r = subprocess.run([*wrap, sys.executable, "-c", probe, host, str(port)], capture_output=True)
            if r.returncode == 0:
                return
        else:
            try:
                socket.create_connection((host, port), 1).close()
                return
            except OSError:
                pass
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {host}:{port} after {timeout}s")


def start_depots(lors: Path, d: Path, n: int, size: str, logs: Path) -> tuple[list, list[str]]:
    """Starts `n` fresh depots of `size` each (data under `d`, logs in
    `logs`, no fsync) on loopback: their processes and their addresses,
    once each accepts."""
    procs, addrs = [], []
    for i in range(n):
        port = free_port()
        data = d / f"depot{i}"
        shutil.rmtree(data, ignore_errors=True)
        procs.append(subprocess.Popen(
            [str(lors), "depot", "--listen", f"127.0.0.1:{port}", "--data", str(data),
             "--size", size, "--sync", "never"],
            stdout=open(logs / f"depot{i}.log", "wb"), stderr=subprocess.STDOUT))
        addrs.append(f"127.0.0.1:{port}")
    for a in addrs:
        wait_port("127.0.0.1", int(a.rsplit(":", 1)[1]))
    return procs, addrs


def save_report(text: str, out: str | None) -> None:
    """Writes the Markdown report to `out`, when given."""
    if out:
        Path(out).write_text(text)
        log(f"report written to {out}")


def make_file(path: Path, size: int) -> None:
    """Random (incompressible) bytes, written once and reused."""
    if path.exists() and path.stat().st_size == size:
        return
    log(f"writing {size / GiB:.2f} GiB of random bytes to {path}")
    chunk = 64 << 20
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(chunk, left)
            f.write(os.urandom(n))
            left -= n


@dataclass
class Case:
    """One command measured round after round."""

    name: str
    kind: str  # "ours", "peer" or "limit"
    argv: list[str]
    size: int
    # Runs before each timed run (e.g. removing the previous output); untimed.
    before: list[list[str]] = field(default_factory=list)
    # Runs after each run (e.g. removing its output, so the next case does
    # not start with 2 GiB less free memory); untimed.
    after: list[list[str]] = field(default_factory=list)
    # Returns the measured seconds from the command's own output instead of wall time.
    parse: object = None
    # Checked after the warm-up run: (produced file, expected file).
    verify: tuple[Path, Path] | None = None
    times: list[float] = field(default_factory=list)
    failed: str | None = None

    def run(self, timeout: float) -> float:
        for b in self.before:
            subprocess.run(b, check=False, capture_output=True)
        t0 = time.perf_counter()
        r = subprocess.run(self.argv, capture_output=True, timeout=timeout)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(
                f"{self.name}: exit {r.returncode}: {r.stderr.decode(errors='replace')[-800:]}"
            )
        if self.parse:
            return self.parse(r.stdout)
        return wall

    def clean(self) -> None:
        for a in self.after:
            subprocess.run(a, check=False, capture_output=True)

    def rates(self) -> list[float]:
        return [self.size / t / GiB for t in self.times]


def same_file(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(8 << 20), fb.read(8 << 20)
            if x != y:
                return False
            if not x:
                return True


def measure(cases: list[Case], rounds: int, timeout: float) -> None:
    """One untimed, verified warm-up run per case, then `rounds` interleaved rounds.

    Each round runs the cases in a different order (shuffled, seeded by the
    round number, so a rerun repeats it): a case that always ran right after
    the same neighbour would carry that neighbour's after-effects (a tmpfs
    full of its output, memory it just freed) in every one of its figures.
    Rotating the order is not enough, as it keeps every case's neighbours."""
    for c in cases:
        try:
            log(f"warm-up: {c.name}")
            c.run(timeout)
            if c.verify and not same_file(*c.verify):
                c.failed = f"output differs from {c.verify[1]}"
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            c.failed = str(e).splitlines()[0][:200]
        c.clean()
        if c.failed:
            log(f"  {c.name} FAILED: {c.failed}")
    for r in range(rounds):
        log(f"round {r + 1}/{rounds}")
        order = list(cases)
        random.Random(r).shuffle(order)
        for c in order:
            if c.failed:
                continue
            try:
                c.times.append(c.run(timeout))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                c.failed = str(e).splitlines()[0][:200]
                log(f"  {c.name} FAILED: {c.failed}")
            c.clean()


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def table(title: str, cases: list[Case], reference: dict[str, float]) -> str:
    """A Markdown table: median GiB/s, min-max, and a ratio column per reference."""
    head = ["case", "median GiB/s", "min-max GiB/s", *[f"/ {k}" for k in reference]]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cases:
        if c.failed or not c.times:
            lines.append(f"| {c.name} | failed: {c.failed} |" + " |" * (len(head) - 2))
            continue
        rs = c.rates()
        m = median(rs)
        cols = [c.name, f"{m:.3f}", f"{min(rs):.3f}-{max(rs):.3f}"]
        cols += [f"{m / v:.2f}" if v == v and v > 0 else "-" for v in reference.values()]
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines) + "\n"


def best(cases: list[Case], kind: str) -> tuple[str, float]:
    """The case of `kind` with the highest median rate."""
    ok = [(c.name, median(c.rates())) for c in cases if c.kind == kind and c.times and not c.failed]
    return max(ok, key=lambda x: x[1]) if ok else ("none", float("nan"))


def machine() -> str:
    cpu = next(
        (l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
        "?",
    )
    return f"{os.cpu_count()} cores ({cpu}), kernel {os.uname().release}"
