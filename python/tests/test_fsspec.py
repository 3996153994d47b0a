"""LorsFileSystem: fsspec, pandas and pyarrow over exNodes."""

from __future__ import annotations

import random

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lors
from lors.fs import LorsFileSystem
from conftest import pattern


@pytest.fixture
def fs(depots):
    return fsspec.filesystem("lors", depots=[d.addr for d in depots], copies=1, block_size="1M")


def test_the_lors_protocol_is_registered_and_lists_like_the_mount(tmp_path, fs, depots):
    assert isinstance(fs, LorsFileSystem)
    (tmp_path / "runs").mkdir()
    src = tmp_path / "a.dat"
    data = pattern(1_500_000)
    src.write_bytes(data)
    lors.upload(src, tmp_path / "runs" / "a.xnd", depots=[d.addr for d in depots], copies=1)
    (tmp_path / "runs" / "sub").mkdir()
    (tmp_path / "runs" / "notes.txt").write_text("not an exNode")

    names = fs.ls(f"lors://{tmp_path}/runs", detail=False)
    assert names == [f"{tmp_path}/runs/a", f"{tmp_path}/runs/sub"]
    info = fs.info(f"lors://{tmp_path}/runs/a")
    assert info["type"] == "file" and info["size"] == len(data)
    assert fs.info(f"{tmp_path}/runs/a.xnd")["size"] == len(data)
    assert fs.isdir(f"{tmp_path}/runs/sub")
    assert not fs.exists(f"{tmp_path}/runs/missing")

    with fsspec.open(f"lors://{tmp_path}/runs/a.xnd", "rb") as f:
        f.seek(1_000_000)
        assert f.read(1000) == data[1_000_000:1_001_000]
    assert fs.cat_file(f"{tmp_path}/runs/a", start=10, end=20) == data[10:20]
    assert fs.cat_file(f"{tmp_path}/runs/a", start=-5) == data[-5:]

    rng = random.Random(1)
    starts = [rng.randrange(0, len(data) - 70_000) for _ in range(100)]
    got = fs.cat_ranges([f"{tmp_path}/runs/a"] * 100, starts, [s + 65536 for s in starts])
    assert got == [data[s : s + 65536] for s in starts]


def test_a_file_written_through_fsspec_reads_back_and_rm_frees_it(tmp_path, fs):
    path = f"lors://{tmp_path}/out/new.bin"
    payload = pattern(3_000_000, seed=9)
    with fs.open(path, "wb") as f:
        f.write(payload)
    assert (tmp_path / "out" / "new.bin.xnd").exists()
    assert fs.cat(path) == payload
    fs.rm(path)
    assert not (tmp_path / "out" / "new.bin.xnd").exists()


def test_parquet_column_projection_fetches_a_fraction_of_the_file(tmp_path, depots, fs):
    rng = np.random.default_rng(0)
    n = 1_000_000
    table = pa.table({f"c{i}": rng.random(n) for i in range(10)})
    local = tmp_path / "t.parquet"
    pq.write_table(table, local, compression="none", row_group_size=250_000)
    x = lors.upload(local, tmp_path / "t.parquet.xnd", depots=[d.addr for d in depots], copies=1)
    before = sum(d.bytes_out() for d in depots)

    df = pd.read_parquet(f"lors://{tmp_path}/t.parquet.xnd", columns=["c3"], storage_options=fs.storage_options)

    fetched = sum(d.bytes_out() for d in depots) - before
    assert df["c3"].to_numpy().tolist() == table.column("c3").to_numpy().tolist()
    # One column of ten: the bytes read from the depots are a fraction of
    # the file (the column, the footer, and a block of read-ahead per read).
    assert fetched < 0.3 * x.size, f"fetched {fetched} of {x.size} bytes"

    whole = pq.read_table(f"{tmp_path}/t.parquet.xnd", filesystem=fs)
    assert whole.equals(table)
