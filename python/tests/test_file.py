"""lors.open: file objects over exNodes."""

from __future__ import annotations

import io
import random
import signal
import threading
import time

import numpy as np
import pytest

import lors
from conftest import pattern


def test_random_seeks_read_what_the_source_holds(tmp_path, depots):
    data = pattern(7 * 1024 * 1024 + 17)
    src = tmp_path / "a.dat"
    src.write_bytes(data)
    lors.upload(src, tmp_path / "a.xnd", depots=[d.addr for d in depots], copies=2, block_size="1M")
    rng = random.Random(42)
    with lors.open(tmp_path / "a.xnd") as f:
        assert isinstance(f, io.BufferedReader)
        assert f.raw.size == len(data)
        for _ in range(200):
            at = rng.randrange(0, len(data) + 10)
            n = rng.choice([1, 17, 4096, 65536, 1 << 20, 3 << 20])
            f.seek(at)
            assert f.read(n) == data[at : at + n]
            assert f.tell() == min(at + n, len(data))
        f.seek(-100, io.SEEK_END)
        assert f.read() == data[-100:]
    # readinto fills the caller's buffer itself: a NumPy array, a memoryview.
    with lors.open(tmp_path / "a.xnd", buffering=0) as raw:
        arr = np.empty(3 << 20, dtype=np.uint8)
        raw.seek(12345)
        assert raw.readinto(arr) == arr.nbytes
        assert arr.tobytes() == data[12345 : 12345 + arr.nbytes]
        view = memoryview(bytearray(1000))
        raw.seek(len(data) - 10)
        assert raw.readinto(view) == 10
        assert raw.readall() == b""
        with pytest.raises(BufferError):
            raw.readinto(b"read-only")


def test_a_numpy_array_written_through_open_reads_back(tmp_path, depots):
    a = np.arange(3_000_000, dtype=np.float64).reshape(1000, 3000)
    with lors.open(tmp_path / "arr.xnd", "wb", depots=[d.addr for d in depots], copies=2) as f:
        np.save(f, a)
    x = lors.ExNode.load(tmp_path / "arr.xnd")
    assert x.size > a.nbytes
    assert min(x.stat(probe=False)["copies"], 2) == 2
    with lors.open(tmp_path / "arr.xnd") as f:
        b = np.load(f)
    assert np.array_equal(a, b)
    # r+b: an overwrite in place, read back.
    with lors.open(tmp_path / "arr.xnd", "r+b", depots=[d.addr for d in depots]) as f:
        f.seek(x.size - 8)
        f.write(b"\x00" * 8)
    with lors.open(tmp_path / "arr.xnd") as f:
        f.seek(x.size - 8)
        assert f.read() == b"\x00" * 8
        f.seek(0)
        assert f.read(6) == b"\x93NUMPY"


def test_a_depot_killed_during_a_read_fails_over_to_the_other_copy(tmp_path, depots):
    data = pattern(24 * 1024 * 1024, seed=3)
    src = tmp_path / "a.dat"
    src.write_bytes(data)
    x = lors.upload(src, tmp_path / "a.xnd", depots=[d.addr for d in depots[:2]], copies=2, block_size="1M")
    got = bytearray()
    with lors.open(tmp_path / "a.xnd", timeout=10) as f:
        got += f.read(4 << 20)
        depots[0].kill()
        while chunk := f.read(1 << 20):
            got += chunk
    assert bytes(got) == data
    assert x.stat(timeout=5)["live"] == len(x.mappings) // 2


def test_a_write_to_a_closed_file_or_in_text_mode_is_refused(tmp_path, depots):
    with pytest.raises(ValueError, match="binary"):
        lors.open(tmp_path / "t.xnd", "w")
    f = lors.open(tmp_path / "t.xnd", "wb", depots=[depots[0].addr], copies=1)
    f.write(b"hello")
    f.close()
    with pytest.raises(ValueError):
        f.write(b"again")
    with pytest.raises(FileNotFoundError):
        lors.open(tmp_path / "missing.xnd")
    with lors.open(tmp_path / "t.xnd") as r:
        assert r.read() == b"hello"


def test_reads_from_threads_run_at_once(tmp_path, depots):
    """The GIL is released during transfers: a stalled read in one thread does
    not stop the interpreter."""
    data = pattern(2 * 1024 * 1024)
    src = tmp_path / "a.dat"
    src.write_bytes(data)
    lors.upload(src, tmp_path / "a.xnd", depots=[depots[0].addr], copies=1, block_size="1M")
    depots[0].signal(signal.SIGSTOP)
    done = threading.Event()

    def read():
        try:
            with lors.open(tmp_path / "a.xnd", timeout=3) as f:
                f.read()
        except OSError:
            pass
        done.set()

    t = threading.Thread(target=read)
    t.start()
    ticks = 0
    t0 = time.monotonic()
    while not done.is_set() and time.monotonic() - t0 < 30:
        ticks += 1
        time.sleep(0.01)
    depots[0].signal(signal.SIGCONT)
    t.join()
    assert ticks > 50, "the main thread ran while the read waited"
