"""Every Python example of docs/python.md, run as written, in order, in one
namespace: against nine real depots (``"d1:6714"`` … ``"d9:6714"`` and
``nine_depots`` stand for them), with ``/data`` and ``/scratch`` scratch
directories of the test and the example files (``run42.dat``, ``sky.dat``,
``/data/runs/run42.xnd``) made first."""

from __future__ import annotations

import pathlib
import re

import pytest

import lors
from conftest import ROOT, pattern

DOC = ROOT / "docs" / "python.md"


def examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_the_docs_have_examples():
    assert len(examples()) >= 10


def test_every_example_of_docs_python_md_runs_as_written(tmp_path, start_depots, monkeypatch):
    pytest.importorskip("zarr")
    ds = start_depots(9)
    addrs = [d.addr for d in ds]
    monkeypatch.chdir(tmp_path)
    for d in ("runs", "sky"):
        (tmp_path / "data" / d).mkdir(parents=True)
    (tmp_path / "scratch").mkdir()
    (tmp_path / "run42.dat").write_bytes(pattern(32 << 20))
    (tmp_path / "sky.dat").write_bytes(pattern(6 << 20, seed=5))
    lors.upload("run42.dat", tmp_path / "data" / "runs" / "run42.xnd", depots=addrs[:3], copies=2)
    namespace: dict[str, object] = {"nine_depots": addrs, "__name__": "docs"}
    for i, code in enumerate(examples()):
        for n in range(9, 0, -1):
            code = code.replace(f'"d{n}:6714"', repr(addrs[n - 1]))
        code = re.sub(r"(?<![\w.])/(data|scratch)/", lambda m: f"{tmp_path}/{m.group(1)}/", code)
        try:
            exec(compile(code, f"{DOC.name} example {i + 1}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"docs/python.md example {i + 1} failed:\n{code}") from e
    assert pathlib.Path(tmp_path / "scratch" / "run42.dat").read_bytes() == (tmp_path / "run42.dat").read_bytes()
