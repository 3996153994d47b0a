"""An object replaced by ``fs.put`` and interrupted (Ctrl-C) at random
points: each time the listing shows the old object whole or the new one
whole, never a part, and the depots hold exactly what the listed exNodes
name. Size and count: LORS_TEST_PUT_MIB (64), LORS_TEST_INTERRUPTS (3),
LORS_TEST_SEED (random, printed)."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import lors
from conftest import pattern
from lors.fs import LorsFileSystem
from test_objects import named
from test_safety import held


def sha(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_random(path, mib: int, seed: int) -> None:
    chunk = pattern(1 << 20, seed=seed)
    with open(path, "wb") as f:
        for i in range(mib):
            f.write(bytes([i & 0xFF]) + chunk[1:])


def test_a_put_interrupted_anywhere_leaves_the_old_object_or_the_new_one_whole(tmp_path, start_depots):
    mib = int(os.environ.get("LORS_TEST_PUT_MIB", "64"))
    rounds = int(os.environ.get("LORS_TEST_INTERRUPTS", "3"))
    seed = int(os.environ.get("LORS_TEST_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    ds = start_depots(3)
    addrs = [d.addr for d in ds]
    old, new = tmp_path / "old.bin", tmp_path / "new.bin"
    write_random(old, mib, 1)
    write_random(new, mib, 2)
    want_old, want_new = sha(old), sha(new)
    fs = LorsFileSystem(depots=addrs, copies=1, skip_instance_cache=True)
    target = f"{tmp_path}/data/object"
    t0 = time.monotonic()
    fs.put(str(old), target)
    took = time.monotonic() - t0
    print(f"seed {seed}: {mib} MiB put in {took:.1f}s")
    outcomes = []
    for i in range(rounds):
        # The first put's time is about what the next takes: a point in it.
        at = rng.uniform(0.05, 1.0) * took
        p = subprocess.Popen(
            [
                sys.executable,
                "-c",
                textwrap.dedent(
                    f"""
                    import sys
                    from lors.fs import LorsFileSystem
                    fs = LorsFileSystem(depots={addrs!r}, copies=1)
                    print("started", flush=True)
                    try:
                        fs.put({str(new)!r}, {target!r})
                        print("finished", flush=True)
                    except KeyboardInterrupt:
                        print("interrupted", flush=True)
                    """
                ),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        assert p.stdout.readline().strip() == "started"
        time.sleep(at)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
        assert "finished" in out or "interrupted" in out, err
        fs.invalidate_cache()
        listed = fs.ls(f"{tmp_path}/data")
        assert [e["name"] for e in listed] == [target]
        assert listed[0]["size"] == mib << 20
        fs.get(target, str(tmp_path / "back.bin"))
        got = sha(tmp_path / "back.bin")
        (tmp_path / "back.bin").unlink()
        assert got in (want_old, want_new), f"round {i}: a partial object at {at:.2f}s"
        kind = "old" if got == want_old else "new"
        assert held(ds) == named(target + ".xnd"), f"round {i} ({kind}): depots hold what no exNode names"
        outcomes.append(f"{at / took:.0%}:{out.split()[-1]}:{kind}")
        # Back to the old object for the next round.
        if kind == "new":
            fs.put(str(old), target)
    print("rounds:", ", ".join(outcomes))
