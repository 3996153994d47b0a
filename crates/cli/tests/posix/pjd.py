"""Cases generated from what pjdfstest's test files assert, one group per
file that runs on Linux ("open/06", "rename/09", ...), written here for
regular files and directories. The differential runner (diff.py) applies
each step to the mount and to a local directory; nothing here says what
the answer must be, only what to ask. Which pjdfstest files are here, and
why the others are not, is in README.md beside this file.

Users: N is nobody (65534), O another user (65533); `("as", U, ...)`
runs a step as U, where U is a uid, or (uid, gid, *groups).
"""

import os

N, O = 65534, 65533
NN, ON, OO = (N, N), (O, N), (O, O)
RW, RO, WO = os.O_RDWR, os.O_RDONLY, os.O_WRONLY
C, X, T = os.O_CREAT, os.O_EXCL, os.O_TRUNC
ACCESS = [RO, WO, RW]
# The modes pjdfstest's permission files walk: the owner, the group and
# the others each denied read, write or search in turn.
MODES = [0o600, 0o060, 0o006, 0o477, 0o747, 0o774, 0o277, 0o727, 0o772,
         0o177, 0o717, 0o771, 0o077, 0o707, 0o770]
WHO = [NN, ON, OO]


def make(kind, n, mode=None, owner=None):
    """Steps that make a regular file or a directory `n`."""
    s = [("create", n, 0o644)] if kind == "regular" else [("mkdir", n, 0o755)]
    if mode is not None:
        s.append(("chmod", n, mode))
    if owner is not None:
        s.append(("chown", n, owner[0], owner[1]))
    return s


def drop(kind, n):
    return [("unlink", n)] if kind == "regular" else [("rmdir", n)]


KINDS = ["regular", "dir"]


def g_open():
    g = {}
    s = []
    for mask, mode in [(0, 0o755), (0, 0o151), (0o77, 0o151), (0o70, 0o345), (0o501, 0o345)]:
        s += [("umask", mask, "create", "f", mode), ("stat", "f", "type,mode"), ("unlink", "f")]
    s += [("chown", ".", N, N), ("as", NN, "create", "f", 0o644), ("stat", "f", "uid,gid"),
          ("unlink", "f"), ("as", (N, O), "create", "f", 0o644), ("stat", "f", "uid,gid"),
          ("unlink", "f"), ("chmod", ".", 0o777), ("as", (O, 65532), "create", "f", 0o644),
          ("stat", "f", "uid,gid"), ("unlink", "f"), ("chown", ".", 0, 0)]
    s += [("mark", ".", "mtime"), ("mark", ".", "ctime"), ("pause",), ("create", "f", 0o644),
          ("moved", ".", "mtime"), ("moved", ".", "ctime"), ("unlink", "f")]
    s += [("create", "f", 0o644), ("mark", ".", "mtime"), ("mark", ".", "ctime"), ("pause",),
          ("open", "f", C | RO), ("moved", ".", "mtime"), ("moved", ".", "ctime"), ("unlink", "f")]
    s += [("put", "f", b"test\n"), ("stat", "f", "size"), ("mark", "f", "mtime"),
          ("mark", "f", "ctime"), ("pause",), ("open", "f", WO | T), ("moved", "f", "mtime"),
          ("moved", "f", "ctime"), ("stat", "f", "size"), ("unlink", "f")]
    g["open/00"] = s
    g["open/01"] = [("mkdir", "d", 0o755), ("create", "d/f", 0o644), ("open", "d/f/t", RO),
                    ("open", "d/f/t", C | WO), ("unlink", "d/f")]
    g["open/02"] = [("longest", "", C | WO, 0o620), ("longest", "x", C | WO, 0o620)]
    g["open/04"] = [("mkdir", "d", 0o755), ("open", "d/n/t", C | WO), ("open", "d/n", RO)]
    g["open/05"] = search("open", ("open", "d/f", RO))
    g["open/06"] = matrix(lambda who, fl: ("as", who, "open", "f", fl))
    g["open/07"] = [("mkdir", "d", 0o755), ("chown", "d", N, N), ("as", NN, "create", "d/f", 0o644),
                    ("as", NN, "putfd", "d/f", WO, b"x"), ("stat", "d/f", "size")]
    for mode in MODES[3:]:
        g["open/07"] += [("chmod", "d/f", mode)] + [("as", w, "open", "d/f", RO | T) for w in WHO]
    g["open/07"] += [("stat", "d/f", "size")]
    g["open/08"] = [("mkdir", "d", 0o755), ("as", NN, "open", "d/f", C | RO, 0o644)]
    g["open/13"] = [("mkdir", "d", 0o755)] + [("open", "d", a | t) for t in (0, T) for a in ACCESS]
    g["open/22"] = [s for k in KINDS for s in make(k, "e") + [("open", "e", C | X | WO)] + drop(k, "e")]
    g["open/23"] = [("create", "f", 0o644), ("open", "f", RO | RW), ("open", "f", WO | RW),
                    ("open", "f", RO | WO | RW)]
    g["open/25"] = [("pwrite", "big", 2 * 1024**3 + 1, b"a"), ("stat", "big", "size"),
                    ("pread", "big", 1, 2 * 1024**3 + 1), ("unlink", "big")]
    g["open/26"] = [s for a in ACCESS for s in [("open", "z", C | a, 0o000),
                                                ("stat", "z", "type,mode"), ("unlink", "z")]]
    return g


def matrix(asker):
    """open/06: every mode against the owner, a group member and another
    user, for a regular file (read, write, both) and a directory (read)."""
    s = [("mkdir", "d0", 0o755), ("chown", "d0", N, N), ("as", NN, "create", "d0/f", 0o644)]
    for mode in MODES:
        s.append(("as", NN, "chmod", "d0/f", mode))
        s += [("as", w, "open", "d0/f", a) for w in WHO for a in ACCESS]
    s += [("as", NN, "unlink", "d0/f"), ("as", NN, "mkdir", "d0/f", 0o755)]
    for mode in MODES:
        s.append(("as", NN, "chmod", "d0/f", mode))
        s += [("as", w, "open", "d0/f", RO) for w in WHO]
    return s + [("as", NN, "rmdir", "d0/f")]


def search(op, step):
    """`step` (on `d/f`, as N) with the N-owned directory `d` searchable
    and not."""
    made = ("as", NN, "mkdir", "d/f", 0o755) if op == "rmdir" else ("as", NN, "create", "d/f", 0o644)
    return [("mkdir", "d", 0o755), ("chown", "d", N, N), made, ("chmod", "d", 0o644),
            ("as", NN) + step, ("chmod", "d", 0o755), ("as", NN) + step, ("stat", "d/f", "type")]


def truncates(name, trunc):
    """What truncate/NN and ftruncate/NN share; `trunc(n, size)` is one."""
    g = {}
    s = [("create", "f", 0o644), trunc("f", 1234567), ("stat", "f", "size"), trunc("f", 567),
         ("stat", "f", "size"), ("unlink", "f"), ("put", "f", bytes(range(256)) * 48),
         trunc("f", 23456), ("stat", "f", "size"), ("cat", "f"), trunc("f", 1),
         ("stat", "f", "size"), ("cat", "f"), ("unlink", "f"),
         ("create", "f", 0o644), ("mark", "f", "ctime"), ("pause",), trunc("f", 123),
         ("moved", "f", "ctime"), ("unlink", "f"), ("create", "f", 0o644), ("mark", "f", "ctime"),
         ("pause",), ("as", N) + trunc("f", 123), ("moved", "f", "ctime"), ("unlink", "f")]
    if name == "ftruncate":
        s += [("ftrunc_new", "z", 0), ("unlink", "z"), ("chmod", ".", 0o777),
              ("as", N, "ftrunc_new", "z", 0), ("unlink", "z")]
    g[name + "/00"] = s
    if name == "truncate":
        # pjdfstest's ftruncate has no 01.
        g[name + "/01"] = [("mkdir", "d", 0o755), ("create", "d/f", 0o644), trunc("d/f/t", 123)]
    g[name + "/02"] = [("longest_then", "", ("truncate", 123), ("size",)),
                       ("longest_then", "x", ("truncate", 123), ("size",))]
    g[name + "/04"] = [("mkdir", "d", 0o755), trunc("d/n/t", 123), trunc("d/n", 123)]
    g[name + "/05"] = search("truncate", trunc("d/f", 1234))
    g[name + "/06"] = [("create", "f", 0o644), ("as", NN) + trunc("f", 123), ("chown", "f", N, N),
                       ("chmod", "f", 0o444), ("as", NN) + trunc("f", 123), ("stat", "f", "size")]
    g[name + "/09"] = [("mkdir", "d", 0o755), trunc("d", 123)]
    g[name + "/13"] = [("create", "f", 0o644), ("ftrunc", "f", RW, -1), ("ftrunc", "f", WO, -999999),
                       ("stat", "f", "size")]
    return g


def g_truncate():
    g = truncates("truncate", lambda n, size: ("truncate", n, size))
    g.update(truncates("ftruncate", lambda n, size: ("ftrunc", n, RW, size)))
    g["ftruncate/00"] += [("create", "r", 0o644), ("mark", "r", "ctime"), ("pause",),
                          ("as", N, "ftrunc", "r", RO, 123), ("moved", "r", "ctime")]
    return g


def sticky(op, kind):
    """unlink/11, rmdir/11, rename/09, rename/10: a sticky directory `s`
    and an entry `s/e` in it, each owned in turn by the user (N) and by
    others, and the user removing or moving `s/e` (or moving `t/m` over
    it, for "rename_to")."""
    s = [("mkdir", "s", 0o755), ("chmod", "s", 0o1777), ("mkdir", "t", 0o755), ("chown", "t", N, N)]
    for dir_owner in (N, 0, O):
        for entry_owner in (N, 0, O):
            s += [("chown", "s", dir_owner, dir_owner)]
            s += make(kind, "s/e", owner=(entry_owner, entry_owner)) + [("imark", "s/e")]
            if op == "rename":
                s += [("as", NN, "rename", "s/e", "t/e"), ("isame", "t/e"),
                      ("as", NN, "rename", "t/e", "s/e"), ("isame", "s/e")]
                s += make(kind, "t/e", owner=NN) + [("as", NN, "rename", "s/e", "t/e"),
                                                    ("isame", "t/e"), ("stat", "t/e", "uid,gid")]
            elif op == "rename_to":
                s += make(kind, "t/m", owner=NN) + [("imark", "t/m"), ("as", NN, "rename", "t/m", "s/e"),
                                                    ("isame", "s/e"), ("stat", "s/e", "uid,gid")]
            else:
                s += [("as", NN, op, "s/e")]
            s += [("stat", "s/e", "type,uid,gid"), ("cleanup", "s/e", "t/e", "t/m")]
    return s


def g_unlink():
    g = {}
    g["unlink/00"] = [("create", "f", 0o644), ("stat", "f", "type"), ("unlink", "f"),
                      ("stat", "f", "type"), ("create", "f", 0o644), ("mark", "f", "ctime"),
                      ("pause",), ("as", N, "unlink", "f"), ("moved", "f", "ctime"), ("unlink", "f"),
                      ("mkdir", "d", 0o755), ("create", "d/f", 0o644), ("mark", "d", "mtime"),
                      ("mark", "d", "ctime"), ("pause",), ("unlink", "d/f"), ("moved", "d", "mtime"),
                      ("moved", "d", "ctime")]
    g["unlink/01"] = [("mkdir", "d", 0o755), ("create", "d/f", 0o644), ("unlink", "d/f/t")]
    g["unlink/02"] = [("longest_then", "", ("unlink",), ("type",)),
                      ("longest_then", "x", ("unlink",), ("type",))]
    g["unlink/04"] = [("mkdir", "d", 0o755), ("unlink", "d/n/t"), ("unlink", "d/n")]
    g["unlink/05"] = search("unlink", ("unlink", "d/f"))
    g["unlink/06"] = [("mkdir", "d", 0o755), ("chown", "d", N, N), ("as", NN, "create", "d/f", 0o644),
                      ("chmod", "d", 0o555), ("as", NN, "unlink", "d/f"), ("chmod", "d", 0o755),
                      ("as", NN, "unlink", "d/f"), ("stat", "d/f", "type")]
    g["unlink/08"] = [("mkdir", "d", 0o755), ("unlink", "d"), ("stat", "d", "type")]
    g["unlink/11"] = sticky("unlink", "regular")
    g["unlink/14"] = [("create", "f", 0o644), ("putfd", "f", WO, b"Hello, World!"),
                      ("open", "f", RO, 0o644, 1), ("unlink", "f"), ("fstat", 1, "nlink,size"),
                      ("read", 1, 100, 0), ("close", 1), ("create", "f", 0o644),
                      ("open", "f", RW, 0o644, 2), ("write", 2, b"Hello,_World!"), ("unlink", "f"),
                      ("read", 2, 100, 0), ("close", 2), ("ls", ".")]
    return g


def g_rename():
    g = {}
    s = [("create", "a", 0o644), ("stat", "a", "type,mode,nlink"), ("imark", "a"), ("rename", "a", "b"),
         ("stat", "a", "type"), ("isame", "b"), ("stat", "b", "type,mode,nlink"), ("unlink", "b"),
         ("mkdir", "a", 0o755), ("stat", "a", "type,mode"), ("imark", "a"), ("rename", "a", "b"),
         ("stat", "a", "type"), ("isame", "b"), ("stat", "b", "type,mode"), ("rmdir", "b")]
    for k in KINDS:
        s += make(k, "a") + [("mark", "a", "ctime"), ("pause",), ("as", N, "rename", "a", "b"),
                             ("moved", "a", "ctime")] + drop(k, "a")
    g["rename/00"] = s
    g["rename/01"] = [("longest_then", "", ("rename_from",), ("type",)),
                      ("longest_then", "x", ("rename_from",), ("type",)),
                      ("create", "f", 0o644), ("rename_to_longest", "f", "x")]
    g["rename/03"] = [("mkdir", "d", 0o755), ("rename", "d/n/t", "m"), ("create", "m", 0o644),
                      ("rename", "m", "d/n/t")]
    g["rename/04"] = two_dirs() + [("chmod", "d", 0o644), ("as", NN, "rename", "d/f", "d/g"),
                                   ("as", NN, "rename", "d/f", "e/g"), ("chmod", "d", 0o755),
                                   ("chmod", "e", 0o644), ("as", NN, "rename", "d/f", "e/g"),
                                   ("chmod", "e", 0o755), ("ls", "d"), ("ls", "e")]
    g["rename/05"] = two_dirs() + [("chmod", "e", 0o555), ("as", NN, "rename", "d/f", "e/g"),
                                   ("chmod", "d", 0o555), ("as", NN, "rename", "d/f", "d/g"),
                                   ("chmod", "d", 0o755), ("chmod", "e", 0o755), ("ls", "d"),
                                   ("ls", "e")]
    g["rename/09"] = sticky("rename", "regular") + sticky("rename", "dir")
    g["rename/10"] = sticky("rename_to", "regular") + sticky("rename_to", "dir")
    g["rename/12"] = [("mkdir", "d", 0o755), ("create", "d/f", 0o644), ("rename", "d/f/t", "d/g"),
                      ("create", "d/g", 0o644), ("rename", "d/g", "d/f/t")]
    g["rename/13"] = [("mkdir", "d", 0o755), ("create", "f", 0o644), ("rename", "d", "f"),
                      ("stat", "d", "type"), ("stat", "f", "type")]
    g["rename/14"] = [("mkdir", "d", 0o755), ("create", "f", 0o644), ("rename", "f", "d"),
                      ("stat", "d", "type"), ("stat", "f", "type")]
    g["rename/18"] = [("mkdir", "d", 0o755), ("mkdir", "d/e", 0o755), ("rename", "d", "d/e/x"),
                      ("rename", "d", "d/x")]
    g["rename/19"] = [("mkdir", "d", 0o755), ("mkdir", "d/e", 0o755), ("rename", "d/e/.", "x"),
                      ("rename", "d/e/..", "x"), ("ls", "d")]
    g["rename/20"] = [("mkdir", "a", 0o755), ("mkdir", "b", 0o755)]
    for k in KINDS:
        g["rename/20"] += make(k, "b/e") + [("rename", "a", "b")] + drop(k, "b/e")
    g["rename/21"] = [("mkdir", "p", 0o777), ("mkdir", "q", 0o777), ("mkdir", "p/d", 0o700),
                      ("as", NN, "rename", "p/d", "p/e"), ("as", NN, "rename", "p/e", "p/d"),
                      ("as", NN, "rename", "p/d", "q/e"), ("ls", "p"), ("ls", "q"),
                      ("create", "p/f", 0o644), ("as", NN, "rename", "p/f", "q/g"), ("ls", "q")]
    g["rename/22"] = [s for k in KINDS for s in make(k, "a") + [
        ("mark", "a", "ctime"), ("pause",), ("rename", "a", "b"), ("mark_from", "b", "a", "ctime"),
        ("moved", "b", "ctime")] + drop(k, "b")]
    g["rename/24"] = [("mkdir", "p", 0o755), ("mkdir", "q", 0o755), ("mkdir", "p/s", 0o755),
                      ("stat", "p", "nlink"), ("stat", "q", "nlink"), ("imark", "p"), ("isame", "p/s/.."),
                      ("rename", "p/s", "q/t"), ("stat", "p", "nlink"), ("stat", "q", "nlink"),
                      ("imark", "q"), ("isame", "q/t/..")]
    return g


def two_dirs():
    """N's directories `d` and `e`, and N's file `d/f` moved between them."""
    return [("mkdir", "d", 0o755), ("chown", "d", N, N), ("mkdir", "e", 0o755), ("chown", "e", N, N),
            ("as", NN, "create", "d/f", 0o644), ("as", NN, "rename", "d/f", "e/g"),
            ("as", NN, "rename", "e/g", "d/f")]


def g_chmod():
    g = {}
    s = []
    for k in KINDS:
        s += make(k, "e") + [("chmod", "e", 0o111), ("stat", "e", "mode")] + drop(k, "e")
        s += make(k, "e") + [("mark", "e", "ctime"), ("pause",), ("chmod", "e", 0o111),
                             ("moved", "e", "ctime")] + drop(k, "e")
        s += make(k, "e") + [("mark", "e", "ctime"), ("pause",), ("as", N, "chmod", "e", 0o111),
                             ("moved", "e", "ctime"), ("stat", "e", "mode")] + drop(k, "e")
    s += [("create", "f", 0o755), ("chown", "f", N, N), ("as", NN, "chmod", "f", 0o2755),
          ("stat", "f", "mode"), ("as", NN, "chmod", "f", 0o755), ("stat", "f", "mode"),
          ("as", (N, O), "chmod", "f", 0o2755), ("stat", "f", "mode"), ("unlink", "f")]
    g["chmod/00"] = s
    g["chmod/01"] = [("mkdir", "d", 0o755), ("create", "d/f", 0o644), ("chmod", "d/f/t", 0o644)]
    g["chmod/02"] = [("longest_then", "", ("chmod", 0o620), ("mode",)),
                     ("longest_then", "x", ("chmod", 0o620), ("mode",))]
    g["chmod/04"] = [("mkdir", "d", 0o755), ("chmod", "d/n/t", 0o644), ("chmod", "d/n", 0o644)]
    g["chmod/05"] = search("chmod", ("chmod", "d/f", 0o642))
    g["chmod/07"] = [("create", "f", 0o644), ("chown", "f", N, N), ("as", O, "chmod", "f", 0o642),
                     ("as", N, "chmod", "f", 0o642), ("stat", "f", "mode"), ("chown", "f", 0, 0),
                     ("as", N, "chmod", "f", 0o641), ("stat", "f", "mode")]
    g["chmod/11"] = []
    for k in KINDS:
        g["chmod/11"] += make(k, "e") + [("chmod", "e", 0o1621), ("stat", "e", "mode")] + drop(k, "e")
        g["chmod/11"] += make(k, "e", 0o640, NN) + [("as", NN, "chmod", "e", 0o1644),
                                                    ("stat", "e", "mode")] + drop(k, "e")
    g["chmod/12"] = []
    for mode in (0o4777, 0o2777, 0o6777):
        g["chmod/12"] += [("create", "f", mode), ("stat", "f", "mode"),
                          ("as", NN, "putfd", "f", RW, b"x"), ("stat", "f", "mode"), ("unlink", "f")]
    return g


def g_chown():
    g = {}
    s = []
    for k in KINDS:
        s += make(k, "e") + [("chown", "e", 123, 456), ("stat", "e", "uid,gid"), ("chown", "e", 0, 0),
                             ("stat", "e", "uid,gid")] + drop(k, "e")
        s += make(k, "e") + [("chown", "e", N, O), ("as", (N, 65532, 65531), "chown", "e", -1, 65532),
                             ("stat", "e", "uid,gid"), ("as", (N, 65532, 65531), "chown", "e", N, 65531),
                             ("stat", "e", "uid,gid")] + drop(k, "e")
        s += make(k, "e") + [("as", NN, "chown", "e", -1, -1), ("stat", "e", "uid,gid")] + drop(k, "e")
        s += make(k, "e") + [("chown", "e", N, O), ("chmod", "e", 0o6555), ("stat", "e", "mode,uid,gid"),
                             ("chown", "e", 65532, 65531), ("stat", "e", "mode,uid,gid"),
                             ("chmod", "e", 0o6555), ("chown", "e", 0, 0),
                             ("stat", "e", "mode,uid,gid")] + drop(k, "e")
        s += make(k, "e") + [("chown", "e", N, O), ("chmod", "e", 0o6555),
                             ("as", (N, O, 65532), "chown", "e", N, 65532), ("stat", "e", "mode,uid,gid"),
                             ("chmod", "e", 0o6555), ("as", (N, O, 65532), "chown", "e", -1, O),
                             ("stat", "e", "mode,uid,gid"), ("chmod", "e", 0o6555),
                             ("as", (N, O, 65532), "chown", "e", -1, -1),
                             ("stat", "e", "mode,uid,gid")] + drop(k, "e")
        s += make(k, "e") + [("mark", "e", "ctime"), ("pause",), ("chown", "e", N, O),
                             ("moved", "e", "ctime"), ("mark", "e", "ctime"), ("pause",),
                             ("as", (N, 65532), "chown", "e", N, 65532), ("stat", "e", "uid,gid"),
                             ("moved", "e", "ctime")] + drop(k, "e")
        s += make(k, "e") + [("mark", "e", "ctime"), ("pause",), ("as", N, "chown", "e", N, -1),
                             ("as", NN, "chown", "e", -1, N), ("as", NN, "chown", "e", N, N),
                             ("moved", "e", "ctime"), ("stat", "e", "uid,gid")] + drop(k, "e")
    g["chown/00"] = s
    g["chown/01"] = [("mkdir", "d", 0o755), ("create", "d/f", 0o644), ("chown", "d/f/t", N, N)]
    g["chown/02"] = [("longest_then", "", ("chown", N, N), ("uid",)),
                     ("longest_then", "x", ("chown", N, N), ("uid",))]
    g["chown/04"] = [("mkdir", "d", 0o755), ("chown", "d/n/t", N, N), ("chown", "d/n", N, N)]
    g["chown/05"] = search("chown", ("chown", "d/f", -1, N))
    g["chown/07"] = [("mkdir", "d", 0o755), ("chown", "d", N, N), ("as", NN, "create", "d/f", 0o644),
                     ("as", O, "chown", "d/f", O, O), ("as", NN, "chown", "d/f", O, O),
                     ("as", NN, "chown", "d/f", N, O), ("stat", "d/f", "uid,gid")]
    return g


D1, D2 = 1900000000 * 10**9, 1950000000 * 10**9


def g_utimensat():
    g = {}
    g["utimensat/00"] = [s for k in KINDS for s in make(k, "e") + [
        ("utimens", "e", D1, D2), ("stat", "e", "atime,mtime")] + drop(k, "e")]
    g["utimensat/01"] = [("create", "f", 0o644), ("mark", "f", "mtime"), ("mark", "f", "atime"),
                         ("pause",), ("utimens", "f", "now", "now"), ("moved", "f", "mtime"),
                         ("moved", "f", "atime")]
    g["utimensat/02"] = [("create", "f", 0o644), ("mark", "f", "mtime"), ("utimens", "f", D1, "omit"),
                         ("stat", "f", "atime"), ("moved", "f", "mtime"), ("utimens", "f", "omit", D2),
                         ("stat", "f", "atime,mtime")]
    g["utimensat/04"] = [("create", "f", 0o644), ("utimens", "f", 10**17, 2 * 10**17),
                         ("stat", "f", "atime,mtime"), ("utimens", "f", 2 * 10**17, 10**17),
                         ("stat", "f", "atime,mtime")]
    g["utimensat/06"] = [("create", "f", 0o644), ("as", N, "utimens", "f", "now", "now"),
                         ("chown", "f", N, N), ("chmod", "f", 0o444),
                         ("as", N, "utimens", "f", "now", "now"), ("utimens", "f", "omit", "omit"),
                         ("chown", "f", 0, 0), ("chmod", "f", 0o666),
                         ("as", N, "utimens", "f", "now", "now")]
    g["utimensat/07"] = [("create", "f", 0o644), ("as", N, "utimens", "f", "omit", D2),
                         ("as", N, "utimens", "f", D1, "omit"), ("as", N, "utimens", "f", D1, D2),
                         ("chmod", "f", 0o666), ("as", N, "utimens", "f", "omit", D2),
                         ("as", N, "utimens", "f", D1, "omit"), ("as", N, "utimens", "f", D1, D2),
                         ("chown", "f", N, N), ("chmod", "f", 0o444), ("as", N, "utimens", "f", D1, D2),
                         ("utimens", "f", D1, D2), ("stat", "f", "atime,mtime")]
    g["utimensat/08"] = [("create", "f", 0o644),
                         ("utimens", "f", 10**17 + 100000000, 2 * 10**17 + 200000000),
                         ("stat", "f", "atime,mtime")]
    g["utimensat/09"] = [("create", "f", 0o644), ("utimens", "f", 2**31 * 10**9, 2**32 * 10**9),
                         ("stat", "f", "atime,mtime")]
    return g


def g_dirs():
    g = {}
    s = []
    for mask, mode in [(0, 0o755), (0, 0o151), (0o77, 0o151), (0o70, 0o345), (0o501, 0o345)]:
        s += [("umask", mask, "mkdir", "d", mode), ("stat", "d", "type,mode"), ("rmdir", "d")]
    s += [("chown", ".", 65535, 65535), ("as", (65535, 65535), "mkdir", "d", 0o755),
          ("stat", "d", "uid,gid"), ("rmdir", "d"), ("as", (65535, N), "mkdir", "d", 0o755),
          ("stat", "d", "uid,gid"), ("rmdir", "d"), ("chmod", ".", 0o777),
          ("as", (N, O), "mkdir", "d", 0o755), ("stat", "d", "uid,gid"), ("rmdir", "d"),
          ("chown", ".", 0, 0), ("mark", ".", "mtime"), ("mark", ".", "ctime"), ("pause",),
          ("mkdir", "d", 0o755), ("moved", ".", "mtime"), ("moved", ".", "ctime")]
    g["mkdir/00"] = s
    g["mkdir/01"] = [("mkdir", "d", 0o755), ("create", "d/f", 0o644), ("mkdir", "d/f/t", 0o755)]
    g["mkdir/02"] = [("longest_then", "", ("mkdir", 0o755), ("type",)),
                     ("longest_then", "x", ("mkdir", 0o755), ("type",))]
    g["mkdir/04"] = [("mkdir", "d", 0o755), ("mkdir", "d/n/t", 0o755)]
    g["mkdir/05"] = search("mkdir", ("mkdir", "d/g", 0o755))
    g["mkdir/06"] = [("mkdir", "d", 0o755), ("chown", "d", N, N), ("chmod", "d", 0o555),
                     ("as", NN, "mkdir", "d/e", 0o755), ("chmod", "d", 0o755),
                     ("as", NN, "mkdir", "d/e", 0o755), ("stat", "d/e", "type,uid")]
    g["mkdir/10"] = [s for k in KINDS for s in make(k, "e") + [("mkdir", "e", 0o755)] + drop(k, "e")]
    g["rmdir/00"] = [("mkdir", "d", 0o755), ("stat", "d", "type"), ("rmdir", "d"), ("stat", "d", "type"),
                     ("mkdir", "d", 0o755), ("mkdir", "d/e", 0o755), ("mark", "d", "mtime"),
                     ("mark", "d", "ctime"), ("pause",), ("rmdir", "d/e"), ("moved", "d", "mtime"),
                     ("moved", "d", "ctime")]
    g["rmdir/01"] = [("mkdir", "d", 0o755), ("create", "d/f", 0o644), ("rmdir", "d/f/t"),
                     ("rmdir", "d/f")]
    g["rmdir/02"] = [("longest_then", "", ("mkdir", 0o755), ("rmdir",)),
                     ("longest_then", "x", ("mkdir", 0o755), ("rmdir",))]
    g["rmdir/04"] = [("mkdir", "d", 0o755), ("rmdir", "d/n/t"), ("rmdir", "d/n")]
    g["rmdir/06"] = [("mkdir", "d", 0o755)]
    for k in KINDS:
        g["rmdir/06"] += make(k, "d/e") + [("rmdir", "d")] + drop(k, "d/e")
    g["rmdir/07"] = search("rmdir", ("rmdir", "d/f"))
    g["rmdir/08"] = [("mkdir", "d", 0o755), ("chown", "d", N, N), ("as", NN, "mkdir", "d/e", 0o755),
                     ("chmod", "d", 0o555), ("as", NN, "rmdir", "d/e"), ("chmod", "d", 0o755),
                     ("as", NN, "rmdir", "d/e"), ("stat", "d/e", "type")]
    g["rmdir/11"] = sticky("rmdir", "dir")
    g["rmdir/12"] = [("mkdir", "d", 0o755), ("mkdir", "d/e", 0o755), ("rmdir", "d/e/."),
                     ("rmdir", "d/e/.."), ("rmdir", "d/e")]
    return g


def g_efault():
    """Every group's EFAULT file: a path the kernel cannot read."""
    calls = ["open", "truncate", "unlink", "rename", "chmod", "chown", "mkdir", "rmdir"]
    return {"efault": [("efault", c) for c in calls] + [("create", "x", 0o644),
                                                          ("efault", "rename_to"), ("stat", "x", "type")]}


def cases():
    g = g_efault()
    for part in (g_open, g_truncate, g_unlink, g_rename, g_chmod, g_chown, g_utimensat, g_dirs):
        g.update(part())
    return g
