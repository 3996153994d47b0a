"""Ctrl-C during a transfer returns promptly and leaves what it says."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time

import lors
from conftest import lors_bin, pattern
from test_safety import held


def run_until_interrupted(script: str, after: float) -> tuple[subprocess.CompletedProcess, float]:
    p = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell starting a job in the background (nohup cmd &, a CI
        # runner's) has it ignore SIGINT, and an ignored SIGINT is never a
        # KeyboardInterrupt: the child gets Python's own handling back.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert p.stdout.readline().strip() == "started"
    time.sleep(after)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err), time.monotonic() - t0


def test_ctrl_c_during_a_large_download_returns_promptly(tmp_path, depots):
    src = tmp_path / "big.dat"
    src.write_bytes(pattern(64 * 1024 * 1024))
    lors.upload(src, tmp_path / "big.xnd", depots=[depots[0].addr], copies=1)
    # The depot hangs (accepts, never answers): without Ctrl-C the download
    # would wait for its 60 s timeout.
    depots[0].signal(signal.SIGSTOP)
    try:
        res, took = run_until_interrupted(
            f"""
            import lors
            print("started", flush=True)
            try:
                lors.download({str(tmp_path / "big.xnd")!r}, {str(tmp_path / "out.dat")!r})
            except KeyboardInterrupt:
                print("interrupted", flush=True)
            """,
            after=1.5,
        )
    finally:
        depots[0].signal(signal.SIGCONT)
    assert "interrupted" in res.stdout, res.stderr
    assert took < 5, f"Ctrl-C took {took:.1f}s"
    # Nothing that looks complete: the output is only the resumable part.
    assert not (tmp_path / "out.dat").exists()
    n = lors.download(tmp_path / "big.xnd", tmp_path / "out.dat")
    assert n == src.stat().st_size
    assert (tmp_path / "out.dat").read_bytes() == src.read_bytes()


def test_ctrl_c_during_an_upload_records_what_it_stored_and_the_same_call_resumes(tmp_path, start_depots):
    ds = start_depots(2)
    src = tmp_path / "big.dat"
    src.write_bytes(pattern(48 * 1024 * 1024))
    out = tmp_path / "big.xnd"
    res, took = run_until_interrupted(
        f"""
        import lors
        print("started", flush=True)
        try:
            # 48 MiB a block at a time at 8 MiB/s: six seconds or more,
            # interrupted after one and a half.
            lors.upload({str(src)!r}, {str(out)!r}, depots={[d.addr for d in ds]!r},
                        copies=2, block_size="1M", threads=1, bwlimit="8M")
        except KeyboardInterrupt as e:
            print("interrupted", " ".join(getattr(e, "__notes__", [])), flush=True)
        """,
        after=1.5,
    )
    assert "interrupted" in res.stdout, res.stderr
    assert took < 10, f"Ctrl-C took {took:.1f}s"
    assert not out.exists()
    partial = tmp_path / "big.xnd.partial"
    assert "big.xnd.partial" in res.stdout and partial.exists(), res.stdout
    x = lors.upload(src, out, depots=[d.addr for d in ds], copies=2, block_size="1M", threads=1)
    assert not partial.exists()
    lors.download(x, tmp_path / "back.dat")
    assert (tmp_path / "back.dat").read_bytes() == src.read_bytes()


def resume_identity(record) -> str:
    """The identity an upload's record carries: which input and settings
    running it again must have to resume from it."""
    m = re.search(r'name="lors_resume"[^>]*>([^<]*)<', lors.ExNode.load(record).to_xml())
    assert m, f"{record} is not a record to resume from"
    return m.group(1)


def named(*xnds) -> int:
    """Allocations the exNodes (or records) name, each once."""
    caps = set()
    for x in xnds:
        caps |= set(re.findall(r"ibp://[^\s<\"]*?/MANAGE", lors.ExNode.load(x).to_xml()))
    return len(caps)


def test_the_same_ctrl_c_leaves_the_same_state_from_the_cli_and_from_python(tmp_path, start_depots):
    ds = start_depots(2)
    addrs = [d.addr for d in ds]
    src = tmp_path / "big.dat"
    src.write_bytes(pattern(32 * 1024 * 1024))
    py_out, cli_out = tmp_path / "py.xnd", tmp_path / "cli.xnd"
    # The same upload from either front end: 32 MiB a block at a time at
    # 8 MiB/s, interrupted after one and a half seconds.
    res, _ = run_until_interrupted(
        f"""
        import lors
        print("started", flush=True)
        try:
            lors.upload({str(src)!r}, {str(py_out)!r}, depots={addrs!r},
                        copies=2, block_size="1M", threads=1, bwlimit="8M")
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        """,
        after=1.5,
    )
    assert "interrupted" in res.stdout, res.stderr
    cli = [lors_bin(), "upload", "--depot", ",".join(addrs), "-c", "2", "-b", "1M", "-t", "1"]
    p = subprocess.Popen(
        [*cli, "--bwlimit", "8M", "-o", str(cli_out), str(src)],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(1.5)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    # The same state: no exNode, a record of the same upload that names
    # every allocation left on the depots.
    records = [tmp_path / "py.xnd.partial", tmp_path / "cli.xnd.partial"]
    assert not py_out.exists() and not cli_out.exists()
    assert all(r.exists() for r in records), (res.stdout, err)
    assert resume_identity(records[0]) == resume_identity(records[1])
    assert held(ds) == named(*records)
    # Either front end resumes what the other left.
    r = subprocess.run([*cli, "-o", str(py_out), str(src)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "resuming the upload" in r.stderr, r.stderr
    lors.upload(src, cli_out, depots=addrs, copies=2, block_size="1M", threads=1)
    assert not any(r.exists() for r in records)
    for out in (py_out, cli_out):
        lors.download(out, tmp_path / "back.dat")
        assert (tmp_path / "back.dat").read_bytes() == src.read_bytes()
    assert held(ds) == named(py_out, cli_out)
