#!/usr/bin/env python3
"""A differential POSIX suite: every case runs in a directory on the mount
and in a local directory, and each step's result (a value, an errno, stat
fields, whether a time moved) must be the same in both.

The cases follow what pjdfstest's groups assert for regular files and
directories (open, create, ftruncate, truncate, unlink, rename, chmod,
chown, utimensat, mkdir, rmdir), written here. Steps run as root unless
they name a user (`-u UID`), as pjdfstest's do; those need root.

    diff.py MOUNT_DIR LOCAL_DIR [--only GROUP] [-v]

Prints a line per group ("open: 31 steps, 0 differ"), the differing steps,
and the totals; exits 1 if any step differs.
"""

import ctypes
import errno
import os
import stat
import sys
import time

import pjd

NOBODY = 65534
ROOT = os.geteuid() == 0


def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))


def fields(st, which):
    out = []
    for f in which.split(","):
        if f == "type":
            m = st.st_mode
            out.append("dir" if stat.S_ISDIR(m) else "regular" if stat.S_ISREG(m) else "other")
        elif f == "mode":
            out.append(oct(stat.S_IMODE(st.st_mode)))
        elif f == "size":
            out.append(str(st.st_size))
        elif f == "nlink":
            out.append(str(st.st_nlink))
        elif f == "uid":
            out.append(str(st.st_uid))
        elif f == "gid":
            out.append(str(st.st_gid))
        elif f in ("mtime", "atime", "ctime"):
            out.append(str(getattr(st, "st_" + f + "_ns")))
        else:
            raise ValueError(f)
    return ",".join(out)


class Runner:
    """Runs steps under one base directory; remembers times to compare."""

    def __init__(self, base):
        self.base = base
        self.fds = {}
        self.marks = {}
        self.ino = None

    def p(self, name):
        return os.path.join(self.base, name)

    def step(self, op, *a):
        try:
            return getattr(self, "op_" + op)(*a)
        except OSError as e:
            return err(e)

    # Each op returns what is compared: "0" for success, else a value.
    def op_create(self, n, mode, flags=0):
        fd = os.open(self.p(n), os.O_CREAT | os.O_WRONLY | flags, mode)
        os.close(fd)
        return "0"

    def op_open(self, n, flags, mode=0o644, slot=None):
        fd = os.open(self.p(n), flags, mode)
        if slot is None:
            os.close(fd)
        else:
            self.fds[slot] = fd
        return "0"

    def op_close(self, slot):
        os.close(self.fds.pop(slot))
        return "0"

    def op_write(self, slot, data, off=None):
        fd = self.fds[slot]
        n = os.write(fd, data) if off is None else os.pwrite(fd, data, off)
        return str(n)

    def op_read(self, slot, n, off):
        return repr(os.pread(self.fds[slot], n, off))

    def op_fstat(self, slot, which):
        return fields(os.fstat(self.fds[slot]), which)

    def op_ftruncate(self, slot, size):
        os.ftruncate(self.fds[slot], size)
        return "0"

    def op_fchmod(self, slot, mode):
        os.fchmod(self.fds[slot], mode)
        return "0"

    def op_futimens(self, slot, ns):
        os.utime(self.fds[slot], ns=ns)
        return "0"

    def op_truncate(self, n, size):
        os.truncate(self.p(n), size)
        return "0"

    def op_stat(self, n, which):
        return fields(os.lstat(self.p(n)), which)

    def op_cat(self, n):
        with open(self.p(n), "rb") as f:
            return repr(f.read())

    def op_put(self, n, data):
        with open(self.p(n), "wb") as f:
            f.write(data)
        return "0"

    def op_unlink(self, n):
        os.unlink(self.p(n))
        return "0"

    def op_rename(self, a, b):
        os.rename(self.p(a), self.p(b))
        return "0"

    def op_mkdir(self, n, mode):
        os.mkdir(self.p(n), mode)
        return "0"

    def op_rmdir(self, n):
        os.rmdir(self.p(n))
        return "0"

    def op_chmod(self, n, mode):
        os.chmod(self.p(n), mode)
        return "0"

    def op_chown(self, n, uid, gid):
        os.chown(self.p(n), uid, gid)
        return "0"

    def op_utime(self, n, ns):
        os.utime(self.p(n), ns=ns)
        return "0"

    def op_utime_now(self, n):
        os.utime(self.p(n))
        return "0"

    def op_ls(self, n):
        return " ".join(sorted(os.listdir(self.p(n))))

    def op_mark(self, n, field):
        """Remembers a time of `n`, for `moved`."""
        self.marks[(n, field)] = getattr(os.lstat(self.p(n)), "st_" + field + "_ns")
        return "0"

    def op_mark_from(self, n, old, field):
        """The time remembered of `old` is now that of `n` (it was renamed)."""
        self.marks[(n, field)] = self.marks[(old, field)]
        return "0"

    def op_rename_to_longest(self, n, suffix):
        """Renames `n` to the longest name and back: `n` must exist."""
        m = self.longest(suffix)
        got = [self.step("rename", n, m), self.step("rename", m, n)]
        return " ".join(got)

    def op_moved(self, n, field):
        """Whether the time of `n` changed since `mark` (after a pause)."""
        now = getattr(os.lstat(self.p(n)), "st_" + field + "_ns")
        return "moved" if now != self.marks[(n, field)] else "same"

    def op_as(self, who, op, *a):
        """The step `op` run by user `who` (a forked process): a uid, whose
        group is its own number, or (uid, gid, *more groups)."""
        uid, gid, *more = who if isinstance(who, tuple) else (who, who)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                os.setgroups([gid] + more)
                os.setgid(gid)
                os.setuid(uid)
                out = self.step(op, *a)
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                out = "child: %r" % (e,)
            os.write(w, out.encode())
            os._exit(0)
        os.close(w)
        out = b""
        while True:
            b = os.read(r, 4096)
            if not b:
                break
            out += b
        os.close(r)
        os.waitpid(pid, 0)
        return out.decode()

    def op_umask(self, mask, op, *a):
        old = os.umask(mask)
        try:
            return self.step(op, *a)
        finally:
            os.umask(old)

    def op_imark(self, n):
        """Remembers which file `n` is, for `isame`."""
        self.ino = os.lstat(self.p(n)).st_ino
        return "0"

    def op_isame(self, n):
        return "same" if os.lstat(self.p(n)).st_ino == self.ino else "another"

    def op_putfd(self, n, flags, data):
        """Opens `n`, writes `data` and says the descriptor's mode and size."""
        fd = os.open(self.p(n), flags)
        try:
            os.write(fd, data)
            return fields(os.fstat(fd), "mode,size")
        finally:
            os.close(fd)

    def op_pwrite(self, n, off, data):
        fd = os.open(self.p(n), os.O_CREAT | os.O_WRONLY, 0o755)
        try:
            return str(os.pwrite(fd, data, off))
        finally:
            os.close(fd)

    def op_pread(self, n, count, off):
        fd = os.open(self.p(n), os.O_RDONLY)
        try:
            return repr(os.pread(fd, count, off))
        finally:
            os.close(fd)

    def op_ftrunc(self, n, flags, size):
        fd = os.open(self.p(n), flags)
        try:
            os.ftruncate(fd, size)
            return "0"
        finally:
            os.close(fd)

    def op_ftrunc_new(self, n, mode):
        """Creates `n` with `mode` (0 denies everything) and truncates it
        through the descriptor that made it."""
        fd = os.open(self.p(n), os.O_CREAT | os.O_RDWR, mode)
        try:
            os.ftruncate(fd, 0)
            return "0"
        finally:
            os.close(fd)

    def op_utimens(self, n, at, mt):
        """utimensat(2) with "now" and "omit" as well as nanoseconds."""
        ts = (Timespec * 2)(timespec(at), timespec(mt))
        if LIBC.utimensat(AT_FDCWD, os.fsencode(self.p(n)), ts, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        return "0"

    def op_efault(self, call):
        """`call` with a null path: EFAULT before any file system sees it."""
        null = ctypes.c_char_p(None)
        args = {
            "open": (null, 0), "truncate": (null, ctypes.c_long(1)), "unlink": (null,),
            "rename": (null, os.fsencode(self.p("x"))), "chmod": (null, 0o644),
            "rename_to": (os.fsencode(self.p("x")), null),
            "chown": (null, 0, 0), "mkdir": (null, 0o755), "rmdir": (null,),
        }[call]
        if getattr(LIBC, call.removesuffix("_to"))(*args) == -1:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        return "0"

    def longest(self, suffix):
        """A name as long as this file system allows, then `suffix`."""
        return "L" * os.pathconf(self.base, "PC_NAME_MAX") + suffix

    def op_longest(self, suffix, flags, mode):
        n = self.longest(suffix)
        got = [self.step("open", n, flags, mode), self.step("stat", n, "type,mode")]
        return " ".join(got + [self.step("unlink", n)])

    def op_longest_then(self, suffix, action, check):
        """pjdfstest's `*/02` files: `action` on a name of the longest
        length, then on one a byte longer; `check` says what to look at."""
        n = self.longest(suffix)
        op, *args = action
        if op == "mkdir":
            got = [self.step("mkdir", n, *args)]
        else:
            got = [self.step("create", n, 0o644)]
            if op == "rename_from":
                got += [self.step("rename", n, "short"), self.step("rename", "short", n)]
            else:
                got.append(self.step(op, n, *args))
        got.append(self.step("rmdir", n) if check[0] == "rmdir" else self.step("stat", n, check[0]))
        return " ".join(got + [self.step("cleanup", n)])

    def op_cleanup(self, *names):
        """Removes what is left under these names; says what it found."""
        found = []
        for n in names:
            try:
                kind = fields(os.lstat(self.p(n)), "type")
            except FileNotFoundError:
                found.append("-")
                continue
            (os.rmdir if kind == "dir" else os.unlink)(self.p(n))
            found.append(kind)
        return ",".join(found)

    def op_pause(self):
        # Times are compared as changed or not: a step that should change
        # one must come after the clock has moved.
        time.sleep(0.02)
        return "0"


LIBC = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def timespec(t):
    if t == "now":
        return Timespec(0, UTIME_NOW)
    if t == "omit":
        return Timespec(0, UTIME_OMIT)
    return Timespec(t // 10**9, t % 10**9)


RW, RO, WO = os.O_RDWR, os.O_RDONLY, os.O_WRONLY
C, X, T, A = os.O_CREAT, os.O_EXCL, os.O_TRUNC, os.O_APPEND
T1 = [1_000_000_000_000_000_000, 1_100_000_000_123_456_789]


def cases():
    """Groups of steps, each a tuple (op, args...)."""
    g = {}
    g["open"] = [
        ("create", "f", 0o640), ("stat", "f", "type,mode,size,nlink"),
        ("open", "f", C | X | WO), ("open", "nx", RO), ("open", "f/x", RO),
        ("open", "nx/x", C | WO), ("open", "n" * 256, C | WO), ("open", "d0", RO),
        ("mkdir", "d0", 0o755), ("open", "d0", WO), ("open", "d0", RW),
        ("open", "ro", C | RO, 0o600), ("stat", "ro", "type,mode,size"),
        ("put", "t", b"0123456789"), ("mark", "t", "mtime"), ("pause",),
        ("open", "t", WO | T), ("stat", "t", "size"), ("moved", "t", "mtime"),
        ("put", "t", b"abc"), ("mark", "t", "mtime"), ("pause",),
        ("open", "t", RO), ("moved", "t", "mtime"),
        ("open", "t", RW | A, 0o644, 1), ("write", 1, b"de"), ("close", 1), ("cat", "t"),
        ("mark", ".", "mtime"), ("pause",), ("create", "new", 0o600), ("moved", ".", "mtime"),
        ("chmod", "t", 0o600), ("as", NOBODY, "open", "t", RO), ("as", NOBODY, "open", "t", WO),
        ("chmod", "t", 0o644), ("as", NOBODY, "open", "t", RO), ("as", NOBODY, "open", "t", WO),
        ("chmod", "t", 0o646), ("as", NOBODY, "open", "t", WO),
        ("chmod", "d0", 0o755), ("as", NOBODY, "create", "d0/u", 0o644),
        ("chmod", "d0", 0o777), ("as", NOBODY, "create", "d0/u", 0o644),
        ("stat", "d0/u", "type,mode,uid,gid"),
        ("as", NOBODY, "open", "d0/u", C | X | WO),
    ]
    g["create"] = [
        ("create", "m1", 0o755), ("stat", "m1", "mode"), ("create", "m2", 0o4755),
        ("stat", "m2", "mode"), ("create", "m3", 0o000), ("stat", "m3", "mode,size"),
        ("open", "m4", C | RW, 0o640, 1), ("write", 1, b"x" * 5000), ("fstat", 1, "mode,size"),
        ("close", 1), ("stat", "m4", "mode,size,nlink"),
        ("mkdir", "cd", 0o755), ("mark", "cd", "mtime"), ("pause",),
        ("create", "cd/a", 0o644), ("moved", "cd", "mtime"), ("ls", "cd"),
    ]
    g["ftruncate"] = [
        ("open", "f", C | RW, 0o644, 1), ("write", 1, b"hello world"),
        ("ftruncate", 1, 5), ("fstat", 1, "size"), ("read", 1, 100, 0),
        ("ftruncate", 1, 12345), ("fstat", 1, "size"), ("read", 1, 10, 12340),
        ("read", 1, 10, 2), ("ftruncate", 1, -1), ("fstat", 1, "size"),
        ("mark", "f", "mtime"), ("pause",), ("ftruncate", 1, 3), ("moved", "f", "mtime"),
        ("close", 1), ("stat", "f", "size"), ("cat", "f"),
        ("open", "f", RO, 0o644, 2), ("ftruncate", 2, 1), ("close", 2),
        ("chmod", "f", 0o444), ("open", "f", RW, 0o644, 3), ("ftruncate", 3, 2),
        ("fstat", 3, "size"), ("close", 3),
    ]
    g["truncate"] = [
        ("put", "f", b"0123456789"), ("truncate", "f", 4), ("cat", "f"),
        ("truncate", "f", 8), ("cat", "f"), ("truncate", "f", -1),
        ("truncate", "nx", 1), ("truncate", "f/x", 1),
        ("mkdir", "d", 0o755), ("truncate", "d", 1),
        ("chmod", "f", 0o644), ("as", NOBODY, "truncate", "f", 1), ("stat", "f", "size"),
        ("chmod", "f", 0o666), ("as", NOBODY, "truncate", "f", 1), ("stat", "f", "size"),
        ("mark", "f", "mtime"), ("pause",), ("truncate", "f", 100), ("moved", "f", "mtime"),
        ("mark", "f", "mtime"), ("pause",), ("truncate", "f", 100), ("moved", "f", "mtime"),
    ]
    g["unlink"] = [
        ("put", "f", b"abc"), ("unlink", "f"), ("stat", "f", "type"), ("unlink", "f"),
        ("mkdir", "d", 0o755), ("unlink", "d"), ("unlink", "nx/f"),
        ("put", "g", b"x"), ("unlink", "g/x"),
        ("put", "d/f", b"x"), ("mark", "d", "mtime"), ("pause",), ("unlink", "d/f"),
        ("moved", "d", "mtime"), ("ls", "d"),
        ("put", "d/h", b"x"), ("chmod", "d", 0o755), ("as", NOBODY, "unlink", "d/h"),
        ("chmod", "d", 0o777), ("as", NOBODY, "unlink", "d/h"), ("ls", "d"),
        ("put", "d/s", b"x"), ("chmod", "d", 0o1777), ("as", NOBODY, "unlink", "d/s"),
        ("ls", "d"),
        ("open", "k", C | RW, 0o644, 1), ("write", 1, b"kept"), ("unlink", "k"),
        ("read", 1, 10, 0), ("write", 1, b"!"), ("fstat", 1, "size,nlink"), ("close", 1),
        ("ls", "."),
    ]
    g["rename"] = [
        ("put", "a", b"one"), ("rename", "a", "b"), ("stat", "a", "type"), ("cat", "b"),
        ("put", "c", b"two"), ("rename", "b", "c"), ("cat", "c"), ("ls", "."),
        ("mkdir", "d", 0o755), ("put", "d/f", b"in d"), ("rename", "d", "e"),
        ("cat", "e/f"), ("stat", "d", "type"),
        ("mkdir", "empty", 0o755), ("rename", "e", "empty"), ("cat", "empty/f"),
        ("mkdir", "full", 0o755), ("put", "full/g", b"g"), ("rename", "empty", "full"),
        ("rename", "c", "full"), ("rename", "full", "c"), ("rename", "full", "full/sub"),
        ("rename", "nx", "y"), ("rename", "c", "nx/y"),
        ("mkdir", "p", 0o755), ("mark", "p", "mtime"), ("mark", "full", "mtime"), ("pause",),
        ("rename", "full/g", "p/g"), ("moved", "p", "mtime"), ("moved", "full", "mtime"),
        ("cat", "p/g"), ("ls", "p"), ("ls", "full"),
        ("chmod", "p", 0o755), ("as", NOBODY, "rename", "p/g", "p/h"),
        ("mkdir", "x", 0o755), ("mkdir", "x/y", 0o755), ("mkdir", "x/y/z", 0o755),
        ("put", "x/y/z/f", b"deep"), ("rename", "x", "w"), ("cat", "w/y/z/f"),
        ("rename", "w/y", "top"), ("cat", "top/z/f"), ("ls", "w"),
        ("open", "o", C | RW, 0o644, 1), ("write", 1, b"open"), ("rename", "o", "o2"),
        ("write", 1, b" still"), ("close", 1), ("cat", "o2"), ("stat", "o", "type"),
        ("put", "r", b"reader's"), ("open", "r", RO, 0o644, 2), ("put", "r2", b"other"),
        ("rename", "r2", "r"), ("read", 2, 100, 0), ("close", 2), ("cat", "r"),
    ]
    g["chmod"] = [
        ("put", "f", b"x"), ("chmod", "f", 0o600), ("stat", "f", "mode"),
        ("chmod", "f", 0o4755), ("stat", "f", "mode"), ("chmod", "nx", 0o644),
        ("mkdir", "d", 0o755), ("chmod", "d", 0o700), ("stat", "d", "mode"),
        ("as", NOBODY, "chmod", "f", 0o777), ("stat", "f", "mode"),
        ("mark", "f", "mtime"), ("pause",), ("chmod", "f", 0o644), ("moved", "f", "mtime"),
        ("open", "g", C | RW, 0o644, 1), ("fchmod", 1, 0o640), ("fstat", 1, "mode"),
        ("write", 1, b"y"), ("close", 1), ("stat", "g", "mode,size"),
    ]
    g["chown"] = [
        ("put", "f", b"x"), ("chown", "f", NOBODY, NOBODY), ("stat", "f", "uid,gid"),
        ("chown", "f", -1, 0), ("stat", "f", "uid,gid"), ("chown", "nx", 0, 0),
        ("as", NOBODY, "chown", "f", 0, 0), ("stat", "f", "uid,gid"),
        ("mkdir", "d", 0o755), ("chown", "d", NOBODY, NOBODY), ("stat", "d", "uid,gid"),
        ("chmod", "f", 0o644), ("stat", "f", "mode,uid,gid"), ("cat", "f"),
    ]
    g["utimensat"] = [
        ("put", "f", b"x"), ("utime", "f", (T1[0], T1[1])), ("stat", "f", "mtime,atime"),
        ("utime_now", "f"), ("utime", "nx", (T1[0], T1[1])),
        ("mkdir", "d", 0o755), ("utime", "d", (T1[0], T1[1])), ("stat", "d", "mtime,atime"),
        ("chmod", "f", 0o644), ("as", NOBODY, "utime", "f", (T1[0], T1[0])),
        ("as", NOBODY, "utime_now", "f"), ("stat", "f", "type"),
        ("open", "g", C | RW, 0o644, 1), ("write", 1, b"data"), ("futimens", 1, (T1[0], T1[1])),
        ("close", 1), ("stat", "g", "mtime,atime,size"),
        ("open", "g", RW, 0o644, 2), ("futimens", 2, (T1[0], T1[0])), ("write", 2, b"more"),
        ("close", 2), ("mark", "g", "mtime"), ("stat", "g", "size"),
    ]
    g["mkdir"] = [
        ("mkdir", "d", 0o755), ("stat", "d", "type,mode,nlink"), ("mkdir", "d", 0o755),
        ("mkdir", "nx/d", 0o755), ("put", "f", b"x"), ("mkdir", "f", 0o755),
        ("mkdir", "f/d", 0o755), ("mkdir", "n" * 256, 0o755), ("mkdir", "d2", 0o711),
        ("stat", "d2", "mode"), ("mkdir", "d/s", 0o755), ("stat", "d", "nlink"),
        ("mark", "d", "mtime"), ("pause",), ("mkdir", "d/t", 0o755), ("moved", "d", "mtime"),
        ("chmod", "d", 0o755), ("as", NOBODY, "mkdir", "d/u", 0o755),
        ("chmod", "d", 0o777), ("as", NOBODY, "mkdir", "d/u", 0o755),
        ("stat", "d/u", "type,mode,uid,gid"), ("ls", "d"),
    ]
    g["rmdir"] = [
        ("mkdir", "d", 0o755), ("rmdir", "d"), ("stat", "d", "type"), ("rmdir", "d"),
        ("mkdir", "e", 0o755), ("put", "e/f", b"x"), ("rmdir", "e"), ("rmdir", "e/f"),
        ("unlink", "e/f"), ("mkdir", "e/s", 0o755), ("mark", "e", "mtime"), ("pause",),
        ("rmdir", "e/s"), ("moved", "e", "mtime"), ("rmdir", "e"),
        ("mkdir", "g", 0o755), ("mkdir", "g/h", 0o755), ("chmod", "g", 0o755),
        ("as", NOBODY, "rmdir", "g/h"), ("rmdir", "nx/d"),
        ("open", "k", C | RW, 0o644, 1), ("mkdir", "q", 0o755), ("rename", "k", "q/k"),
        ("unlink", "q/k"), ("rmdir", "q"), ("write", 1, b"gone"), ("close", 1),
    ]
    g.update(pjd.cases())
    return g


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    verbose = "-v" in sys.argv
    only = None
    if "--only" in sys.argv:
        only = sys.argv[sys.argv.index("--only") + 1]
        args.remove(only)
    mount, local = args[0], args[1]
    # As pjdfstest does: modes asked for are modes given, unless a step
    # sets a mask.
    os.umask(0)
    total = differ = skipped = 0
    for name, steps in cases().items():
        if only and name != only and not name.startswith(only + "/"):
            continue
        dirs = []
        for base in (mount, local):
            d = os.path.join(base, "case-" + name.replace("/", "-"))
            os.mkdir(d)
            os.chmod(d, 0o777)
            dirs.append(d)
        runners = [Runner(d) for d in dirs]
        bad = 0
        for i, s in enumerate(steps):
            if s[0] == "as" and not ROOT:
                skipped += 1
                continue
            got = [r.step(*s) for r in runners]
            total += 1
            if got[0] != got[1]:
                bad += 1
                print("  %s #%d %r: mount %s, local %s" % (name, i, s[:4], got[0], got[1]))
            elif verbose:
                print("  %s #%d %r: %s" % (name, i, s[:4], got[0]))
        differ += bad
        print("%s: %d steps, %d differ" % (name, len(steps), bad))
    print("total: %d steps compared, %d differ, %d skipped (not root)" % (total, differ, skipped))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
