#!/usr/bin/env python3
"""A video player's reading pattern, for stream benchmarks: reads standard
input into a bounded cache, starts "playing" once the first second of video
is cached, then consumes RATE bits per second. Whenever the bytes due are
not there, playback stalls until a start-up buffer's worth is cached again
(as mplayer's -cache does). Prints one JSON line:

    {"startup_s": .., "stalls": .., "stalled_s": .., "bytes": .., "seconds": ..}

    lors download -q -o - video.xnd | python3 bench/player.py --rate 15
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

TICK = 0.01  # the player's consumption step, seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=15.0, help="video rate, Mbit/s (default 15)")
    ap.add_argument("--start", type=float, default=1.0, help="seconds of video cached before playing (default 1)")
    ap.add_argument("--cache", type=float, default=4.0, help="seconds of video the cache holds (default 4)")
    a = ap.parse_args()
    rate = a.rate * 1e6 / 8  # bytes per second
    start, cap = a.start * rate, a.cache * rate
    t0 = time.monotonic()
    lock = threading.Condition()
    st = {"cached": 0.0, "eof": False, "total": 0}

    def reader() -> None:
        inp = sys.stdin.buffer.raw
        while True:
            with lock:
                while st["cached"] >= cap:
                    lock.wait()
            chunk = inp.read(256 << 10)
            with lock:
                if not chunk:
                    st["eof"] = True
                    lock.notify_all()
                    return
                st["cached"] += len(chunk)
                st["total"] += len(chunk)
                lock.notify_all()

    threading.Thread(target=reader, daemon=True).start()

    def buffer(need: float) -> None:
        with lock:
            while st["cached"] < need and not st["eof"]:
                lock.wait(0.05)

    buffer(start)
    startup = time.monotonic() - t0
    stalls, stalled, played = 0, 0.0, 0.0
    last = time.monotonic()
    while True:
        time.sleep(TICK)
        now = time.monotonic()
        due = rate * (now - last)
        last = now
        with lock:
            take = min(due, st["cached"])
            st["cached"] -= take
            played += take
            lock.notify_all()
            done = st["eof"] and st["cached"] <= 0
            short = take < due and not st["eof"]
        if done:
            break
        if short:
            stalls += 1
            s0 = time.monotonic()
            buffer(start)
            stalled += time.monotonic() - s0
            last = time.monotonic()
    print(json.dumps({"startup_s": round(startup, 3), "stalls": stalls, "stalled_s": round(stalled, 3),
                      "bytes": st["total"], "seconds": round(time.monotonic() - t0, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
