#!/usr/bin/env python3
"""A random-operation tester in the manner of fsx: the same random
operations (open, close, read, write, truncate, mmap reads and writes,
rename, unlink, fsync) on several descriptors over a few files, applied
to a directory on the mount and to a local directory in lockstep. Every
result (bytes read, errno, size) must be the same in both; at the end, so
must every file.

    fsrand.py MOUNT_DIR LOCAL_DIR [--ops N] [--seed S] [--no-mmap]
              [--files K] [--fds D] [--max-size BYTES]

Prints the operations done by kind and "0 differences", or the first
difference with the last operations before it, and exits 1.
"""

import argparse
import collections
import errno
import mmap
import os
import random
import sys


def attempt(f):
    try:
        return f()
    except OSError as e:
        return "E" + errno.errorcode.get(e.errno, str(e.errno))


class Side:
    """One directory and its descriptors (slot -> (fd, name, writable))."""

    def __init__(self, base):
        self.base = base
        self.fds = {}

    def p(self, name):
        return os.path.join(self.base, name)


def pattern(rng, n):
    return bytes(rng.getrandbits(8) for _ in range(min(n, 64))) * (n // 64 + 1)


def run(args):
    rng = random.Random(args.seed)
    sides = [Side(args.mount), Side(args.local)]
    names = ["f%d" % i for i in range(args.files)]
    done = collections.Counter()
    history = collections.deque(maxlen=12)
    kinds = ["open", "close", "read", "write", "write", "truncate", "ftruncate",
             "rename", "unlink", "fsync", "stat"]
    if args.mmap:
        kinds += ["mapread", "mapwrite"]
    for i in range(args.ops):
        kind = rng.choice(kinds)
        slot = rng.randrange(args.fds)
        name = rng.choice(names)
        other = rng.choice(names)
        off = rng.randrange(args.max_size)
        size = rng.choice([1, 7, 512, 4096, 5000, 65536, 200000])
        size = min(size, args.max_size)
        data = pattern(rng, size)[:size]
        flags = rng.choice([os.O_RDONLY, os.O_RDWR, os.O_RDWR | os.O_CREAT,
                            os.O_WRONLY | os.O_CREAT, os.O_RDWR | os.O_CREAT | os.O_TRUNC,
                            os.O_RDWR | os.O_APPEND | os.O_CREAT])
        trunc_to = rng.choice([0, off, off // 7, args.max_size])

        def one(s):
            held = s.fds.get(slot)
            if kind == "open":
                if held:
                    os.close(held[0])
                    del s.fds[slot]
                fd = attempt(lambda: os.open(s.p(name), flags, 0o644))
                if isinstance(fd, int):
                    s.fds[slot] = (fd, name, flags & os.O_ACCMODE != os.O_RDONLY)
                    return "fd"
                return fd
            if kind in ("rename", "unlink", "truncate", "stat"):
                if kind == "rename":
                    return attempt(lambda: os.rename(s.p(name), s.p(other)))
                if kind == "unlink":
                    return attempt(lambda: os.unlink(s.p(name)))
                if kind == "truncate":
                    return attempt(lambda: os.truncate(s.p(name), trunc_to))
                return attempt(lambda: os.stat(s.p(name)).st_size)
            if not held:
                return "no fd"
            fd, _, writable = held
            if kind == "close":
                del s.fds[slot]
                return attempt(lambda: os.close(fd))
            if kind == "read":
                return attempt(lambda: os.pread(fd, size, off))
            if kind == "write":
                return attempt(lambda: os.pwrite(fd, data, off))
            if kind == "ftruncate":
                return attempt(lambda: os.ftruncate(fd, trunc_to))
            if kind == "fsync":
                return attempt(lambda: os.fsync(fd))
            # mmap: within the file's current size only, as fsx does.
            length = os.fstat(fd).st_size
            if length == 0:
                return "empty"
            # The last byte `fstat` promises must be there, or touching
            # it through a map would be SIGBUS rather than a difference.
            last = attempt(lambda: os.pread(fd, 1, length - 1))
            if last == b"":
                return "size %d but nothing at its end" % length
            a = min(off, length - 1)
            n = min(size, length - a)
            if kind == "mapread":
                m = attempt(lambda: mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ))
                if isinstance(m, str):
                    return m
                try:
                    return m[a:a + n]
                finally:
                    m.close()
            if not writable:
                return "ro"
            m = attempt(lambda: mmap.mmap(fd, length, mmap.MAP_SHARED,
                                          mmap.PROT_READ | mmap.PROT_WRITE))
            if isinstance(m, str):
                return m
            try:
                m[a:a + n] = data[:n]
                m.flush()
            finally:
                m.close()
            return "mapped"

        if args.trace:
            print(i, kind, slot, name, other, off, size, oct(flags), trunc_to, file=sys.stderr, flush=True)
        got = [one(s) for s in sides]
        done[kind] += 1
        history.append((i, kind, slot, name, other, off, size, oct(flags), trunc_to))
        # Appending descriptors write at the end: pwrite on Linux ignores
        # the offset for them, alike on both sides.
        if got[0] != got[1]:
            show = [repr(g)[:120] for g in got]
            if all(isinstance(g, bytes) for g in got):
                at = next((k for k, (x, y) in enumerate(zip(*got)) if x != y), None)
                show = ["%d bytes" % len(g) for g in got]
                show[0] += " (first differing byte at %s)" % at
            print("difference at op %d (%s): mount %s, local %s" % (i, kind, show[0], show[1]))
            sizes = [attempt(lambda: os.fstat(s.fds[slot][0]).st_size) if slot in s.fds else None
                     for s in sides]
            print("  the descriptor's file: %s bytes on the mount, %s here" % tuple(sizes))
            for h in history:
                print("  ", h)
            return 1
    for s in sides:
        for fd, _, _ in s.fds.values():
            os.close(fd)
        s.fds.clear()
    for name in names:
        a = attempt(lambda: open(sides[0].p(name), "rb").read())
        b = attempt(lambda: open(sides[1].p(name), "rb").read())
        if a != b:
            print("difference at the end in %s: %d vs %d bytes" % (name, len(a), len(b)))
            return 1
    print("seed %d: %d operations (%s), 0 differences" % (
        args.seed, args.ops, ", ".join("%s %d" % kv for kv in sorted(done.items()))))
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mount")
    ap.add_argument("local")
    ap.add_argument("--ops", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-mmap", dest="mmap", action="store_false")
    ap.add_argument("--files", type=int, default=3)
    ap.add_argument("--fds", type=int, default=4)
    ap.add_argument("--max-size", type=int, default=1 << 20)
    ap.add_argument("--trace", action="store_true", help="print each operation before it runs")
    sys.exit(run(ap.parse_args()))


if __name__ == "__main__":
    main()
