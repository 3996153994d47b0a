"""Real depots for the tests: `lors depot` processes on 127.0.0.1 with
ephemeral ports, started from the workspace's `lors` binary (LORS_BIN, else
target/debug/lors, else target/release/lors)."""

from __future__ import annotations

import os
import pathlib
import queue
import re
import signal
import subprocess
import threading
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def lors_bin() -> str:
    if os.environ.get("LORS_BIN"):
        return os.environ["LORS_BIN"]
    for profile in ("debug", "release"):
        p = ROOT / "target" / profile / "lors"
        if p.exists():
            return str(p)
    pytest.exit("no lors binary: build it with `cargo build -p lors-cli` or set LORS_BIN", 2)


class Depot:
    """A running `lors depot`."""

    def __init__(self, data: pathlib.Path) -> None:
        self.proc = subprocess.Popen(
            [
                lors_bin(),
                "depot",
                "--data",
                str(data),
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--sync",
                "never",
            ],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "RUST_LOG": "warn"},
        )
        lines: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            for line in self.proc.stdout:  # type: ignore[union-attr]
                lines.put(line.rstrip("\n"))

        threading.Thread(target=pump, daemon=True).start()
        self.addr = self.metrics = None
        while True:
            try:
                line = lines.get(timeout=30)
            except queue.Empty:
                self.proc.kill()
                raise RuntimeError("lors depot did not start within 30 s") from None
            if line == "lors depot: ready":
                break
            if line.startswith("lors depot: serving IBP on "):
                self.addr = line.rsplit(" ", 1)[1]
            elif line.startswith("lors depot: metrics on "):
                self.metrics = line.rsplit(" ", 1)[1]
        assert self.addr and self.metrics

    def bytes_out(self) -> int:
        """Bytes this depot has sent by LOAD."""
        text = urllib.request.urlopen(self.metrics, timeout=10).read().decode()
        m = re.search(r"^lors_depot_bytes_out_total (\d+(?:\.\d+)?)", text, re.M)
        return int(float(m.group(1))) if m else 0

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def start_depots(tmp_path):
    """Starts n depots (killed at the end of the test)."""
    made: list[Depot] = []

    def start(n: int) -> list[Depot]:
        ds = [Depot(tmp_path / f"depot{len(made) + i}") for i in range(n)]
        made.extend(ds)
        return ds

    yield start
    for d in made:
        d.kill()


@pytest.fixture
def depots(start_depots) -> list[Depot]:
    return start_depots(3)


@pytest.fixture(autouse=True)
def quiet_settings(monkeypatch, tmp_path):
    """No ~/.xndrc or LORS_* of the machine's user leaks into a test (the
    suite's own knobs, LORS_TEST_*, stay)."""
    for k in list(os.environ):
        if k.startswith("LORS_") and k != "LORS_BIN" and not k.startswith("LORS_TEST_") or k.startswith("LBONE_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def pattern(n: int, seed: int = 7) -> bytes:
    """n bytes that differ at every offset (a misplaced block shows)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()
