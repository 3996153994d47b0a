"""upload, download, ExNode, augment/trim/refresh, errors: against real depots."""

from __future__ import annotations

import pytest

import lors
from conftest import pattern
from test_interrupt import named
from test_safety import held


def addrs(ds):
    return [d.addr for d in ds]


def test_upload_and_download_round_trip_with_progress(tmp_path, depots):
    src = tmp_path / "run42.dat"
    src.write_bytes(pattern(5 * 1024 * 1024 + 123))
    seen = []
    x = lors.upload(
        src,
        tmp_path / "run42.xnd",
        depots=addrs(depots),
        copies=2,
        block_size="1M",
        progress=lambda done, total: seen.append((done, total)),
    )
    assert x.size == src.stat().st_size
    assert x.filename == "run42.dat"
    assert len(x.mappings) == 6 * 2
    assert all(m.depot in addrs(depots) for m in x.mappings)
    assert (tmp_path / "run42.xnd").exists() and x.path == tmp_path / "run42.xnd"
    assert seen and seen[-1][0] >= x.size

    n = lors.download(tmp_path / "run42.xnd", tmp_path / "back.dat")
    assert n == x.size
    assert (tmp_path / "back.dat").read_bytes() == src.read_bytes()
    # An ExNode object does as well as its file, and a range is a range.
    lors.download(x, tmp_path / "part.dat", offset=1000, length=2_000_000)
    assert (tmp_path / "part.dat").read_bytes() == src.read_bytes()[1000:2_001_000]

    st = x.stat()
    assert st["size"] == x.size and st["copies"] == 2 and st["live"] == 12
    assert st["unreadable"] == [] and st["dead"] == []
    again = lors.ExNode.load(tmp_path / "run42.xnd")
    assert again.to_xml() == x.to_xml()


def test_an_erasure_coded_upload_reads_back_with_a_depot_gone(tmp_path, start_depots):
    ds = start_depots(5)
    src = tmp_path / "frames.dat"
    src.write_bytes(pattern(3 * 1024 * 1024 + 5))
    x = lors.upload(src, tmp_path / "f.xnd", depots=addrs(ds), ec="3+2", block_size="256K")
    assert x.ec == "3+2" and x.parity
    ds[0].kill()
    lors.download(x, tmp_path / "back.dat", timeout=10)
    assert (tmp_path / "back.dat").read_bytes() == src.read_bytes()
    st = x.stat(timeout=5)
    assert st["margin"] is not None and st["margin"] >= 1


def test_settings_come_from_keywords_then_the_environment_then_xndrc(tmp_path, depots, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".xndrc").write_text("".join(f"DEPOT {d.addr}\n" for d in depots) + "COPIES 3\n")
    src = tmp_path / "a.dat"
    src.write_bytes(pattern(300_000))
    # ~/.xndrc: its depots, 3 copies.
    assert len(lors.upload(src, block_size="128K").mappings) == 3 * 3
    monkeypatch.setenv("LORS_COPIES", "2")
    assert len(lors.upload(src, block_size="128K").mappings) == 3 * 2
    # The keyword beats the environment.
    assert len(lors.upload(src, block_size="128K", copies=1).mappings) == 3


def test_an_existing_exnode_is_not_overwritten_without_force(tmp_path, depots):
    src = tmp_path / "a.dat"
    src.write_bytes(b"x" * 1000)
    out = tmp_path / "a.xnd"
    lors.upload(src, out, depots=addrs(depots), copies=1)
    with pytest.raises(FileExistsError, match="force=True"):
        lors.upload(src, out, depots=addrs(depots), copies=1)
    lors.upload(src, out, depots=addrs(depots), copies=1, force=True)
    # Replaced, the old exNode's allocations were released: the depots hold
    # what the new one names, nothing more.
    assert held(depots) == named(out)


def test_augment_trim_and_refresh_change_the_exnode_in_place(tmp_path, depots):
    src = tmp_path / "a.dat"
    src.write_bytes(pattern(600_000))
    out = tmp_path / "a.xnd"
    lors.upload(src, out, depots=addrs(depots[:1]), copies=1, block_size="256K")
    x = lors.augment(out, 1, depots=addrs(depots[1:]))
    assert len(x.mappings) == 6 and len(lors.ExNode.load(out).mappings) == 6
    with pytest.raises(lors.LorsError, match="last replica"):
        lors.trim(out, depots=addrs(depots))
    x = lors.trim(out, depots=[depots[0].addr])
    assert {m.depot for m in x.mappings} <= set(addrs(depots[1:]))
    assert len(lors.ExNode.load(out).mappings) == 3
    res = lors.refresh(out, "2h")
    assert [e for (_, _, e) in res] == [None] * 3
    assert all(7000 < secs <= 7200 for (_, secs, _) in res)
    lors.download(out, tmp_path / "b.dat")
    assert (tmp_path / "b.dat").read_bytes() == src.read_bytes()


def test_errors_carry_the_ibp_status_the_depot_and_the_bytes(tmp_path, depots):
    src = tmp_path / "a.dat"
    src.write_bytes(pattern(400_000))
    out = tmp_path / "a.xnd"
    x = lors.upload(src, out, depots=[depots[0].addr], copies=1, block_size="128K")
    # Freed on the depot (the file trimmed in place), kept in the object:
    # its capabilities now name nothing. (Into another file, the input
    # would keep what it names.)
    lors.trim(out, mappings=list(range(len(x.mappings))), allow_holes=True)
    with pytest.raises(lors.UnreadableError) as e:
        lors.download(x, tmp_path / "b.dat", timeout=10)
    err = e.value
    assert isinstance(err, lors.LorsError) and isinstance(err, OSError)
    assert err.status is not None and err.status < 0
    assert err.status_name and err.status_name.startswith("IBP_")
    assert err.depot == depots[0].addr
    assert err.range is not None and err.range[0] == 0 and err.range[1] <= x.size

    with pytest.raises(lors.NoDepotsError, match="depots="):
        lors.upload(src, tmp_path / "c.xnd")
    with pytest.raises(ValueError, match="ec="):
        lors.upload(src, tmp_path / "c.xnd", depots=addrs(depots), ec="banana")
    with pytest.raises(FileNotFoundError):
        lors.ExNode.load(tmp_path / "missing.xnd")
    (tmp_path / "bad.xnd").write_text("<exnode")
    with pytest.raises(lors.ExNodeError):
        lors.ExNode.load(tmp_path / "bad.xnd")


def test_a_sparse_file_stores_its_data_and_comes_back_sparse(tmp_path, depots):
    src = tmp_path / "disk.img"
    with open(src, "wb") as f:
        f.truncate(32 * 1024 * 1024)
        f.seek(8 * 1024 * 1024)
        f.write(pattern(1024 * 1024))
    x = lors.upload(src, tmp_path / "disk.xnd", depots=addrs(depots), copies=1)
    if x.stat(probe=False)["holes"] == 0:
        pytest.skip("this file system does not keep holes")
    assert x.size == 32 * 1024 * 1024
    assert x.stat(probe=False)["holes"] >= 28 * 1024 * 1024
    assert sum(m.length for m in x.mappings) < 2 * 1024 * 1024
    back = tmp_path / "back.img"
    assert lors.download(x, back) == x.size
    assert back.read_bytes() == src.read_bytes()
    assert back.stat().st_blocks * 512 < 4 * 1024 * 1024
    with lors.open(tmp_path / "disk.xnd", "rb") as f:
        f.seek(20 * 1024 * 1024)
        assert f.read(4096) == bytes(4096)
    dense = lors.upload(src, tmp_path / "dense.xnd", depots=addrs(depots), copies=1, dense=True)
    assert dense.stat(probe=False)["holes"] == 0
    assert sum(m.length for m in dense.mappings) == x.size
