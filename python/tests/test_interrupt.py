"""Ctrl-C during a transfer returns promptly and leaves what it says."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import lors
from conftest import pattern


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
