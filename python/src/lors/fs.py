"""``LorsFileSystem``: exNodes as an fsspec filesystem, protocol ``lors``.

A directory of ``.xnd`` files is a directory of files, as ``lors mount``
shows it: ``run42.xnd`` is the file ``run42`` (a path may also name the
``.xnd`` itself), subdirectories are directories, other files are not
listed. Reads fetch exactly the byte ranges asked for from the depots
(``cat_ranges`` many at once); writes are all or nothing (see
:func:`lors.open`); ``cp`` copies depot to depot; ``rm`` frees what it
removes; ``mv`` renames ``.xnd`` files.

>>> import fsspec, pandas
>>> fs = fsspec.filesystem("lors", depots=["d1:6714", "d2:6714"], copies=2)
>>> fs.ls("/data/runs")
>>> df = pandas.read_parquet("lors:///data/runs/t.parquet", columns=["energy"])

URLs are ``lors:///ABSOLUTE/PATH`` (three slashes); ``lors://HOST[:PORT]/PATH``
also names the L-Bone new blocks are placed through. ``?``, ``*`` and
``[...]`` are glob characters, as in local paths.
"""

from __future__ import annotations

import datetime
import errno
import io
import os
import posixpath
import sys
import threading
import warnings
from typing import Any

from fsspec.callbacks import DEFAULT_CALLBACK
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from fsspec.utils import isfilelike, stringify_path

from . import _lors
from ._io import BufferedWriter, RawFile
from ._io import open as lors_open
from .errors import ExNodeError

SUFFIX = ".xnd"


def _not_found(path: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, "no such file or directory (no .xnd of that name)", path)


class LorsFileSystem(AbstractFileSystem):
    """Files stored on IBP depots, named by the ``.xnd`` files of local
    directories.

    Keyword arguments are the settings of new blocks and of every transfer,
    as :func:`lors.upload` takes them: ``depots``, ``lbone``, ``location``,
    ``copies``, ``block_size``, ``duration``, ``timeout``, ``checksum``,
    ``compress``, ``encrypt``; unset ones come from the environment,
    ``~/.xndrc``, then the tools' defaults (3 copies, BLAKE3 checksums).
    ``root`` confines every path to one directory tree: a path outside it,
    by ``..`` or by a link, is refused with ``PermissionError``.
    """

    protocol = ("lors",)
    root_marker = "/"
    #: Bytes a buffered read fetches beyond what is asked: small, so a
    #: column read from a Parquet file fetches little more than the column.
    blocksize = 1 << 20

    def __init__(
        self,
        *,
        depots: list[str] | str | None = None,
        lbone: str | None = None,
        location: str | None = None,
        copies: int | None = None,
        block_size: int | str | None = None,
        duration: float | str | None = None,
        timeout: float | str | None = None,
        checksum: str | None = None,
        compress: bool | None = None,
        encrypt: str | None = None,
        root: str | os.PathLike[str] | None = None,
        concurrency: int = 32,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        settings = dict(
            depots=depots,
            lbone=lbone,
            location=location,
            copies=copies,
            block_size=block_size,
            duration=duration,
            timeout=timeout,
            checksum=checksum,
            compress=compress,
            encrypt=encrypt,
        )
        self.settings: dict[str, Any] = {k: v for k, v in settings.items() if v is not None}
        self.timeout = timeout
        self.concurrency = concurrency
        self.root = None if root is None else posixpath.normpath(os.path.abspath(os.fspath(root)))
        self._real_root = None if self.root is None else os.path.realpath(self.root)
        self._loaded: dict[str, tuple[tuple[int, int], _lors.ExNode]] = {}
        self._lock = threading.Lock()

    # -- paths ---------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        """A local absolute path, ``..`` resolved: ``lors:///a/b`` and
        ``lors://HOST/a/b`` are ``/a/b``; a relative path is taken from the
        working directory."""
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        if path.startswith("lors://"):
            rest = path[len("lors://") :]
            if not rest.startswith("/"):
                slash = rest.find("/")
                if slash < 0:
                    raise ValueError(
                        f"{path!r} names no file: write lors:///PATH (three slashes) for /PATH, "
                        "or lors://HOST/PATH to place new blocks through the L-Bone at HOST"
                    )
                rest = rest[slash:]
            path = rest
        if not path:
            return cls.root_marker
        return posixpath.normpath(os.path.abspath(path)) or cls.root_marker

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        path = stringify_path(path)
        if path.startswith("lors://") and not path.startswith("lors:///"):
            host = path[len("lors://") :].split("/", 1)[0]
            if host:
                return {"lbone": host}
        return {}

    def _path(self, path: Any) -> str:
        """``path`` as a local path, inside ``root`` when one is set."""
        p = self._strip_protocol(path)
        if self.root is None:
            return p
        inside = p == self.root or p.startswith(self.root.rstrip("/") + "/")
        real = os.path.realpath(p)
        assert self._real_root is not None
        if not inside or not (real == self._real_root or real.startswith(self._real_root.rstrip("/") + "/")):
            raise PermissionError(errno.EACCES, f"outside this filesystem's root {self.root}", path)
        return p

    def _xnd(self, path: Any) -> str:
        """The ``.xnd`` file of an existing file ``path``."""
        p = self._path(path)
        if p.endswith(SUFFIX) and os.path.isfile(p):
            return p
        if os.path.isfile(p + SUFFIX):
            return p + SUFFIX
        raise _not_found(stringify_path(path))

    def _new_xnd(self, path: Any) -> str:
        """The ``.xnd`` file a file ``path`` is written to."""
        p = self._path(path)
        if os.path.isdir(p):
            raise IsADirectoryError(errno.EISDIR, "a directory, not a file", p)
        return p if p.endswith(SUFFIX) else p + SUFFIX

    @staticmethod
    def _name(xnd: str) -> str:
        return xnd[: -len(SUFFIX)]

    def exnode(self, path: Any) -> _lors.ExNode:
        """The exNode of the file ``path`` (reloaded when its ``.xnd`` changed)."""
        xnd = self._xnd(path)
        st = os.stat(xnd)
        key = (st.st_mtime_ns, st.st_size)
        with self._lock:
            hit = self._loaded.get(xnd)
        if hit is not None and hit[0] == key:
            return hit[1]
        x = _lors.ExNode.load(xnd)
        with self._lock:
            self._loaded[xnd] = (key, x)
        return x

    def _forget(self, xnd: str) -> None:
        with self._lock:
            self._loaded.pop(xnd, None)

    # -- listing -------------------------------------------------------------

    def _file_info(self, xnd: str) -> dict[str, Any]:
        st = os.stat(xnd)
        info: dict[str, Any] = {
            "name": self._name(xnd),
            "type": "file",
            "xnd": xnd,
            "mtime": st.st_mtime,
            "created": st.st_ctime,
        }
        try:
            x = self.exnode(xnd)
        except ExNodeError as e:
            # Listed, never skipped: a reader of the directory meets the
            # error instead of silently fewer files.
            warnings.warn(f"{xnd}: not a readable exNode: {e}", RuntimeWarning, stacklevel=3)
            info.update(size=None, error=str(e))
            return info
        info.update(size=x.size, ec=x.ec, mappings=len(x.mappings))
        return info

    def info(self, path: Any, **kwargs: Any) -> dict[str, Any]:
        p = self._path(path)
        if os.path.isdir(p):
            return {"name": p, "size": 0, "type": "directory"}
        return self._file_info(self._xnd(p))

    def ls(self, path: Any, detail: bool = True, **kwargs: Any) -> list[Any]:
        p = self._path(path)
        if not os.path.isdir(p):
            out = [self.info(p)]
        else:
            out = []
            with os.scandir(p) as it:
                for e in sorted(it, key=lambda e: e.name):
                    full = posixpath.join(p, e.name)
                    if e.is_dir():
                        if self.root is None or self._inside(full):
                            out.append({"name": full, "size": 0, "type": "directory"})
                    elif e.name.endswith(SUFFIX) and not e.name.startswith(".") and e.is_file():
                        if self.root is None or self._inside(full):
                            out.append(self._file_info(full))
        return out if detail else [o["name"] for o in out]

    def _inside(self, p: str) -> bool:
        try:
            self._path(p)
        except PermissionError:
            return False
        return True

    def modified(self, path: Any) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(os.stat(self._xnd(path)).st_mtime, tz=datetime.timezone.utc)

    def created(self, path: Any) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(os.stat(self._xnd(path)).st_ctime, tz=datetime.timezone.utc)

    # -- reading -------------------------------------------------------------

    def _span(self, size: int, start: int | None, end: int | None) -> tuple[int, int]:
        start = 0 if start is None else (max(size + start, 0) if start < 0 else start)
        end = size if end is None else (max(size + end, 0) if end < 0 else end)
        return min(start, size), min(end, size)

    def _timeout(self) -> dict[str, Any]:
        return {} if self.timeout is None else {"timeout": self.timeout}

    def cat_file(self, path: Any, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        x = self.exnode(path)
        a, b = self._span(x.size, start, end)
        return _lors.read_range(x, a, b, **self._timeout())

    def cat_ranges(
        self,
        paths: Any,
        starts: Any,
        ends: Any,
        max_gap: int | None = None,
        on_error: str = "return",
        **kwargs: Any,
    ) -> list[Any]:
        if isinstance(paths, str):
            paths = [paths] * len(starts)
        if isinstance(starts, int):
            starts = [starts] * len(paths)
        if isinstance(ends, int) or ends is None:
            ends = [ends] * len(paths)
        if not len(paths) == len(starts) == len(ends):
            raise ValueError("paths, starts and ends must be as long as each other")
        out: list[Any] = [None] * len(paths)
        by_path: dict[str, list[int]] = {}
        for i, p in enumerate(paths):
            by_path.setdefault(p, []).append(i)
        for p, idx in by_path.items():
            try:
                x = self.exnode(p)
                spans = [self._span(x.size, starts[i], ends[i]) for i in idx]
                got = _lors.read_ranges(x, spans, concurrency=self.concurrency, **self._timeout())
                for i, b in zip(idx, got):
                    out[i] = b
            except Exception as e:
                if on_error == "raise":
                    raise
                for i in idx:
                    out[i] = e
        return out

    def get_file(self, rpath: Any, lpath: Any, callback: Any = DEFAULT_CALLBACK, outfile: Any = None, **kwargs: Any) -> None:
        """Downloads the file to ``lpath`` with ``lors.download`` (every
        depot at once, resumable, the file appearing only when whole)."""
        if isfilelike(lpath) or outfile is not None:
            return super().get_file(rpath, lpath, callback=callback, outfile=outfile, **kwargs)
        if self.isdir(rpath):
            os.makedirs(lpath, exist_ok=True)
            return None
        x = self.exnode(rpath)
        callback.set_size(x.size)
        lpath = os.fspath(lpath)
        parent = os.path.dirname(lpath)
        if parent:
            os.makedirs(parent, exist_ok=True)
        if x.size == 0:
            open(lpath, "wb").close()  # noqa: SIM115 - an empty file, made whole at once
        else:
            _lors.download(x, lpath, progress=lambda done, total: callback.absolute_update(done), **self._timeout())
        callback.absolute_update(x.size)
        return None

    # -- writing -------------------------------------------------------------

    def _open(
        self,
        path: Any,
        mode: str = "rb",
        block_size: Any = None,
        autocommit: bool = True,
        cache_options: Any = None,
        **kwargs: Any,
    ) -> Any:
        if mode == "rb":
            return LorsFile(self, path, mode, block_size=block_size or self.blocksize, cache_options=cache_options, **kwargs)
        if "r" in mode:
            f = lors_open(self._xnd(path), mode, **self.settings)
        else:
            target = self._new_xnd(path)
            parent = os.path.dirname(target)
            if parent:
                os.makedirs(parent, exist_ok=True)
            f = lors_open(target, mode, **self.settings)
            self._forget(target)
        return f if autocommit else PendingFile(f)

    # -- changing ------------------------------------------------------------

    def rm_file(self, path: Any) -> None:
        """Frees the file's allocations on their depots and removes its
        ``.xnd`` (an empty directory, with ``rmdir``)."""
        p = self._path(path)
        if os.path.isdir(p):
            os.rmdir(p)
            return
        xnd = self._xnd(p)
        _lors.remove(xnd, **self._timeout())
        self._forget(xnd)

    def _rm(self, path: Any) -> None:
        self.rm_file(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        """Removes files (freeing what they name) and, with ``recursive``,
        directories: a directory goes once its exNodes have, and stays if
        it holds other files (they are not this filesystem's)."""
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        for p in sorted(paths, key=len, reverse=True):
            if os.path.isdir(p):
                if not recursive:
                    raise IsADirectoryError(errno.EISDIR, "a directory: remove it with recursive=True", p)
                try:
                    os.rmdir(p)
                except OSError as e:
                    if e.errno != errno.ENOTEMPTY:
                        raise
            else:
                self.rm_file(p)

    def cp_file(self, path1: Any, path2: Any, **kwargs: Any) -> None:
        """Copies a file depot to depot (no byte through this machine); a
        directory is made at ``path2``."""
        if self.isdir(path1):
            self.makedirs(path2, exist_ok=True)
            return
        src = self._xnd(path1)
        dst = self._new_xnd(path2)
        parent = os.path.dirname(dst)
        if parent:
            os.makedirs(parent, exist_ok=True)
        placement = {k: v for k, v in self.settings.items() if k in ("depots", "lbone", "location", "duration", "timeout")}
        _lors.copy(src, dst, force=True, **placement)
        self._forget(dst)

    def mv(self, path1: Any, path2: Any, recursive: bool = False, maxdepth: int | None = None, **kwargs: Any) -> None:
        """Renames files (their ``.xnd``) and, with ``recursive``, the
        exNodes of directory trees; nothing on the depots changes."""
        if isinstance(path1, list) or isinstance(path2, list):
            return super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)
        src = self._path(path1)
        if not os.path.isdir(src):
            xnd = self._xnd(src)
            dst = self._path(path2)
            if os.path.isdir(dst):
                dst = posixpath.join(dst, posixpath.basename(self._name(xnd)))
            new = self._new_xnd(dst)
            if not os.path.isdir(os.path.dirname(new)):
                raise _not_found(os.path.dirname(new))
            self._rename(xnd, new)
            return None
        if not recursive:
            raise IsADirectoryError(errno.EISDIR, "a directory: move it with recursive=True", src)
        dst = self._path(path2)
        if os.path.isdir(dst):
            dst = posixpath.join(dst, posixpath.basename(src))
        for info in self.find(src, withdirs=True, detail=True, maxdepth=maxdepth).values():
            rel = posixpath.relpath(info["name"], src)
            to = posixpath.join(dst, rel)
            if info["type"] == "directory":
                os.makedirs(to, exist_ok=True)
            else:
                os.makedirs(posixpath.dirname(to), exist_ok=True)
                self._rename(info["xnd"], to + SUFFIX)
        os.makedirs(dst, exist_ok=True)
        for d, _, _ in sorted(os.walk(src), key=lambda w: len(w[0]), reverse=True):
            try:
                os.rmdir(d)
            except OSError:
                pass
        return None

    def _rename(self, xnd: str, new: str) -> None:
        """Renames the exNode ``xnd`` to ``new``. An exNode already there is
        removed first as ``rm`` removes it (its data freed): renamed over,
        its allocations would stay on the depots with nothing naming them.
        A link there is only unlinked (what it leads to stays)."""
        if os.path.islink(new):
            os.remove(new)
        elif os.path.exists(new):
            if os.path.samefile(xnd, new):
                return
            if os.path.isdir(new):
                raise IsADirectoryError(errno.EISDIR, "a directory is in the way", new)
            _lors.remove(new, **self._timeout())
        self._forget(new)
        os.rename(xnd, new)
        self._forget(xnd)

    def mkdir(self, path: Any, create_parents: bool = True, **kwargs: Any) -> None:
        p = self._path(path)
        if create_parents:
            os.makedirs(p, exist_ok=True)
        else:
            os.mkdir(p)

    def makedirs(self, path: Any, exist_ok: bool = False) -> None:
        os.makedirs(self._path(path), exist_ok=exist_ok)

    def rmdir(self, path: Any) -> None:
        os.rmdir(self._path(path))


class PendingFile(io.RawIOBase):
    """A file written inside an fsspec transaction: ``close`` stores its
    data on the depots, ``commit`` (at the end of the transaction) saves
    its ``.xnd``, ``discard`` frees what it stored."""

    def __init__(self, f: RawFile | BufferedWriter | Any) -> None:
        super().__init__()
        self._f = f
        self.name = getattr(f, "name", None) or getattr(getattr(f, "raw", None), "name", None)

    def write(self, data: Any) -> int:
        return self._f.write(data)

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._f.tell()

    def close(self) -> None:
        if self.closed:
            return
        if sys.exc_info()[1] is not None:
            self.discard()
            return
        self._f.flush()
        getattr(self._f, "raw", self._f).flush()
        super().close()

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        if kind is not None:
            self.discard()
        else:
            self.close()

    def commit(self) -> None:
        """Saves the ``.xnd``: the file appears whole."""
        self._f.close()

    def discard(self) -> None:
        """Frees what was stored; no file appears."""
        self._f.discard()
        super().close()


class LorsFile(AbstractBufferedFile):
    """A file of :class:`LorsFileSystem` opened for reading: each read the
    cache cannot answer is one range download (of what was asked plus
    ``block_size``)."""

    def __init__(self, fs: LorsFileSystem, path: Any, mode: str = "rb", **kwargs: Any) -> None:
        self.exnode = fs.exnode(path)
        kwargs.setdefault("cache_type", "readahead")
        super().__init__(fs, path, mode, size=self.exnode.size, **kwargs)

    def _fetch_range(self, start: int, end: int) -> bytes:
        return _lors.read_range(self.exnode, start, end, **self.fs._timeout())
