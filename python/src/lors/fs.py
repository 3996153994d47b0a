"""``LorsFileSystem``: exNodes as an fsspec filesystem, protocol ``lors``.

A directory of ``.xnd`` files is a directory of files, as ``lors mount``
shows it: ``run42.xnd`` is the file ``run42`` (a path may also name the
``.xnd`` itself), subdirectories are directories. Reads fetch exactly the
byte ranges asked for from the depots (``cat_ranges`` many at once); files
opened for writing store their blocks as ``lors.open`` does.

>>> import fsspec, pandas
>>> fs = fsspec.filesystem("lors", depots=["d1:6714", "d2:6714"], copies=2)
>>> fs.ls("/data/runs")
>>> df = pandas.read_parquet("lors:///data/runs/t.parquet", columns=["energy"])

URLs are ``lors:///ABSOLUTE/PATH``; ``lors://HOST[:PORT]/PATH`` also names
the L-Bone new blocks are placed through, as the command-line tools read it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from fsspec.utils import stringify_path

from . import _lors
from ._io import open as lors_open

SUFFIX = ".xnd"


class LorsFileSystem(AbstractFileSystem):
    """Files stored on IBP depots, named by the ``.xnd`` files of local
    directories.

    Keyword arguments are the settings of new blocks and of every transfer,
    as :func:`lors.upload` takes them: ``depots``, ``lbone``, ``location``,
    ``copies``, ``block_size``, ``duration``, ``timeout``; unset ones come
    from the environment and ``~/.xndrc``.
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
        )
        self.settings = {k: v for k, v in settings.items() if v is not None}
        self.timeout = timeout
        self.concurrency = concurrency
        self._loaded: dict[str, tuple[tuple[int, int], _lors.ExNode]] = {}
        self._lock = threading.Lock()

    # -- paths ---------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path):
        path = stringify_path(path)
        if path.startswith("lors://"):
            rest = path[len("lors://") :]
            if not rest.startswith("/"):
                slash = rest.find("/")
                rest = rest[slash:] if slash >= 0 else "/"
            path = rest
        path = path.split("?", 1)[0]
        if path != "/":
            path = path.rstrip("/")
        return path or "/"

    @staticmethod
    def _get_kwargs_from_urls(path):
        path = stringify_path(path)
        if path.startswith("lors://") and not path.startswith("lors:///"):
            return {"lbone": path[len("lors://") :].split("/", 1)[0]}
        return {}

    def _xnd(self, path: str) -> str:
        """The ``.xnd`` file of an existing file ``path``."""
        p = self._strip_protocol(path)
        if p.endswith(SUFFIX) and os.path.isfile(p):
            return p
        if os.path.isfile(p + SUFFIX):
            return p + SUFFIX
        raise FileNotFoundError(path)

    def _new_xnd(self, path: str) -> str:
        """The ``.xnd`` file a file ``path`` is written to."""
        p = self._strip_protocol(path)
        return p if p.endswith(SUFFIX) else p + SUFFIX

    def exnode(self, path: str) -> _lors.ExNode:
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

    # -- listing -------------------------------------------------------------

    def _file_info(self, name: str, xnd: str) -> dict[str, Any]:
        x = self.exnode(xnd)
        st = os.stat(xnd)
        return {
            "name": name,
            "size": x.size,
            "type": "file",
            "xnd": xnd,
            "mtime": st.st_mtime,
            "ec": x.ec,
            "mappings": len(x.mappings),
        }

    def info(self, path, **kwargs):
        p = self._strip_protocol(path)
        if os.path.isdir(p):
            return {"name": p, "size": 0, "type": "directory"}
        xnd = self._xnd(p)
        name = p[: -len(SUFFIX)] if p.endswith(SUFFIX) else p
        return self._file_info(name, xnd)

    def ls(self, path, detail=True, **kwargs):
        p = self._strip_protocol(path)
        if not os.path.isdir(p):
            out = [self.info(p)]
        else:
            out = []
            with os.scandir(p) as it:
                for e in sorted(it, key=lambda e: e.name):
                    full = os.path.join(p, e.name)
                    if e.is_dir():
                        out.append({"name": full, "size": 0, "type": "directory"})
                    elif e.name.endswith(SUFFIX) and not e.name.startswith(".") and e.is_file():
                        out.append(self._file_info(full[: -len(SUFFIX)], full))
        return out if detail else [o["name"] for o in out]

    def modified(self, path):
        import datetime

        return datetime.datetime.fromtimestamp(os.stat(self._xnd(path)).st_mtime, tz=datetime.timezone.utc)

    def created(self, path):
        return self.modified(path)

    # -- reading -------------------------------------------------------------

    def _span(self, size: int, start: int | None, end: int | None) -> tuple[int, int]:
        start = 0 if start is None else (max(size + start, 0) if start < 0 else start)
        end = size if end is None else (max(size + end, 0) if end < 0 else end)
        return min(start, size), min(end, size)

    def _timeout(self) -> dict[str, Any]:
        return {} if self.timeout is None else {"timeout": self.timeout}

    def cat_file(self, path, start=None, end=None, **kwargs):
        x = self.exnode(path)
        a, b = self._span(x.size, start, end)
        return _lors.read_range(x, a, b, **self._timeout())

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kwargs):
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

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if mode == "rb":
            return LorsFile(
                self,
                path,
                mode,
                block_size=block_size or self.blocksize,
                cache_options=cache_options,
                **kwargs,
            )
        if "r" in mode:
            return lors_open(self._xnd(path), mode, **self.settings)
        target = self._new_xnd(path)
        parent = os.path.dirname(target)
        if parent:
            os.makedirs(parent, exist_ok=True)
        return lors_open(target, mode, **self.settings)

    # -- changing ------------------------------------------------------------

    def rm_file(self, path):
        """Frees the file's allocations on their depots and removes its ``.xnd``."""
        xnd = self._xnd(path)
        x = self.exnode(xnd)
        n = len(x.mappings) + len(x.parity)
        if n:
            _lors.trim(xnd, mappings=list(range(n)), allow_holes=True, **self._timeout())
        os.remove(xnd)
        with self._lock:
            self._loaded.pop(xnd, None)

    def _rm(self, path):
        p = self._strip_protocol(path)
        if os.path.isdir(p):
            os.rmdir(p)
        else:
            self.rm_file(p)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        if self.isfile(path1):
            os.rename(self._xnd(path1), self._new_xnd(path2))
        else:
            os.rename(self._strip_protocol(path1), self._strip_protocol(path2))

    def mkdir(self, path, create_parents=True, **kwargs):
        p = self._strip_protocol(path)
        if create_parents:
            os.makedirs(p, exist_ok=True)
        else:
            os.mkdir(p)

    def makedirs(self, path, exist_ok=False):
        os.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def rmdir(self, path):
        os.rmdir(self._strip_protocol(path))


class LorsFile(AbstractBufferedFile):
    """A file of :class:`LorsFileSystem` opened for reading: each read the
    cache cannot answer is one range download (of what was asked plus
    ``block_size``)."""

    def __init__(self, fs: LorsFileSystem, path, mode="rb", **kwargs):
        self.exnode = fs.exnode(path)
        kwargs.setdefault("cache_type", "readahead")
        super().__init__(fs, path, mode, size=self.exnode.size, **kwargs)

    def _fetch_range(self, start, end):
        return _lors.read_range(self.exnode, start, end, **self.fs._timeout())
