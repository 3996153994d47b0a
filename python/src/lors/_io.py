"""``lors.open``: an exNode as a binary file object.

Writes are all or nothing, as an object store's put: the ``.xnd`` changes
only when ``close`` has stored every byte. A write that fails, an exception
leaving a ``with`` block (Ctrl-C included), a ``close`` reached while an
exception unwinds (how pandas and pyarrow close their files in ``finally``)
and an object never closed all leave the old file whole (or no file) and
free what they stored.
"""

from __future__ import annotations

import io
import os
import sys
import warnings
from typing import Any, Literal, TypedDict, overload

from . import _lors

#: Bytes the buffered objects of :func:`open` hold by default: reads and
#: writes this large or larger go straight to the exNode (no copy).
DEFAULT_BUFFER_SIZE = 1 << 20


class Settings(TypedDict, total=False):
    """The keywords of new blocks and of transfers, as :func:`lors.upload`
    takes them; unset ones resolve from the ``lors://`` URI, the
    environment, ``~/.xndrc``, then the tools' defaults (3 copies, BLAKE3
    end-to-end checksums)."""

    depots: list[str] | str
    lbone: str
    location: str
    copies: int
    block_size: int | str
    duration: float | str
    timeout: float | str
    checksum: str
    compress: bool
    encrypt: str


def _unwinding(opened_during: BaseException | None) -> bool:
    """An exception is on its way up through the caller (a ``finally``
    block, ``__exit__``), other than the one being handled when the file
    was opened: a file written inside an ``except`` block still saves."""
    exc = sys.exc_info()[1]
    return exc is not None and exc is not opened_during


class _AllOrNothing:
    """What the file objects of :func:`open` share: ``close`` saves,
    ``discard`` frees, and neither happens twice."""

    _opened_during: BaseException | None = None

    def _raw_file(self) -> RawFile:
        raise NotImplementedError

    def discard(self) -> None:
        """Closes without saving: what was written is freed on the depots
        and the ``.xnd`` stays as it was before the open (or absent)."""
        raw = self._raw_file()
        if not raw.closed:
            raw.discard()

    def _abandoned(self) -> bool:
        return self._raw_file().writable() and _unwinding(self._opened_during)

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        if kind is not None and self._raw_file().writable():
            self.discard()
        else:
            self.close()  # type: ignore[attr-defined]

    def __del__(self) -> None:
        try:
            raw = self._raw_file()
            if raw.closed or "_f" not in raw.__dict__:
                return
        except AttributeError:  # half made: the constructor raised
            return
        if raw.writable():
            warnings.warn(
                f"{raw.name}: a file opened for writing was never closed; its writes are discarded "
                "(close it, or use `with`, to save them)",
                RuntimeWarning,
                stacklevel=2,
            )
        self.discard()


class RawFile(_AllOrNothing, io.RawIOBase):
    """An exNode opened unbuffered: ``readinto`` fills the caller's buffer
    straight from the fetched blocks; ``write`` stores a block at a time.

    Sequential reads start a read-ahead (the next blocks are fetched while
    the program reads); a read elsewhere fetches its 1 MiB stretch.
    ``close`` stores what is buffered and saves the ``.xnd``, whole.
    """

    def __init__(self, target: str | os.PathLike[str], mode: str = "rb", **settings: Any) -> None:
        super().__init__()
        self.name = os.fspath(target)
        self.mode = mode
        self._opened_during = sys.exc_info()[1]
        self._f = _lors.File(self.name, mode, **settings)

    def _raw_file(self) -> RawFile:
        return self

    def readinto(self, buffer: Any) -> int:
        return self._f.readinto(buffer)

    def readall(self) -> bytes:
        left = max(self.size - self.tell(), 0)
        out = bytearray(left)
        n = self._f.readinto(out) if left else 0
        del out[n:]
        return bytes(out)

    def write(self, data: Any) -> int:
        return self._f.write(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def truncate(self, size: int | None = None) -> int:
        return self._f.truncate(self.tell() if size is None else size)

    def flush(self) -> None:
        """Stores what is buffered on the depots (the ``.xnd`` is saved by
        ``close``)."""
        if not self.closed and not self._f.closed:
            self._f.flush()

    def close(self) -> None:
        """Stores what is left and saves the ``.xnd``, whole; an error
        doing so is raised, and the old file stays. Reached while an
        exception unwinds, discards instead."""
        if self.closed:
            return
        try:
            if self._abandoned():
                self._f.discard()
            else:
                self._f.close()
        finally:
            super().close()

    def discard(self) -> None:
        if self.closed:
            return
        try:
            self._f.discard()
        finally:
            super().close()

    def readable(self) -> bool:
        return self._f.readable()

    def writable(self) -> bool:
        return self._f.writable()

    def seekable(self) -> bool:
        return True

    @property
    def size(self) -> int:
        """Bytes in the file, with what is buffered."""
        return self._f.size

    def __repr__(self) -> str:
        return f"<lors.RawFile name={self.name!r} mode={self.mode!r}>"


class BufferedReader(io.BufferedReader):
    """``io.BufferedReader`` over a :class:`RawFile`."""

    raw: RawFile


class _Buffered(_AllOrNothing):
    def _raw_file(self) -> RawFile:
        raw: RawFile = getattr(self, "raw")  # noqa: B009 - the io base class's
        return raw

    def close(self) -> None:
        """Writes out the buffer, stores it and saves the ``.xnd``, whole;
        reached while an exception unwinds, discards instead."""
        if self._raw_file().closed:
            return
        if self._abandoned():
            self.discard()
        else:
            super().close()  # type: ignore[misc]


class BufferedWriter(_Buffered, io.BufferedWriter):
    """``io.BufferedWriter`` over a :class:`RawFile`, saved whole by
    ``close``; ``discard`` abandons it."""

    def __init__(self, raw: RawFile, buffer_size: int = DEFAULT_BUFFER_SIZE) -> None:
        super().__init__(raw, buffer_size)
        self._opened_during = raw._opened_during


class BufferedRandom(_Buffered, io.BufferedRandom):
    """``io.BufferedRandom`` over a :class:`RawFile`, saved whole by
    ``close``; ``discard`` abandons it."""

    def __init__(self, raw: RawFile, buffer_size: int = DEFAULT_BUFFER_SIZE) -> None:
        super().__init__(raw, buffer_size)
        self._opened_during = raw._opened_during


ReadMode = Literal["rb", "br"]
WriteMode = Literal["wb", "bw", "ab", "ba", "xb", "bx"]
UpdateMode = Literal["r+b", "rb+", "w+b", "wb+", "a+b", "ab+", "x+b", "xb+"]


@overload
def open(
    target: str | os.PathLike[str],
    mode: str,
    buffering: Literal[0],
    **settings: Any,
) -> RawFile: ...
@overload
def open(
    target: str | os.PathLike[str],
    mode: ReadMode = "rb",
    buffering: int = -1,
    **settings: Any,
) -> BufferedReader: ...
@overload
def open(
    target: str | os.PathLike[str],
    mode: WriteMode,
    buffering: int = -1,
    **settings: Any,
) -> BufferedWriter: ...
@overload
def open(
    target: str | os.PathLike[str],
    mode: UpdateMode,
    buffering: int = -1,
    **settings: Any,
) -> BufferedRandom: ...
@overload
def open(
    target: str | os.PathLike[str],
    mode: str,
    buffering: int = -1,
    **settings: Any,
) -> RawFile | BufferedReader | BufferedWriter | BufferedRandom: ...
def open(  # noqa: A001 - the name users know from the built-in
    target: str | os.PathLike[str],
    mode: str = "rb",
    buffering: int = -1,
    **settings: Any,
) -> RawFile | BufferedReader | BufferedWriter | BufferedRandom:
    """Opens the exNode ``target`` (an ``.xnd`` path or a ``lors:///PATH``
    URI) as a binary file, as the built-in ``open`` does a local one.

    ``mode`` is ``"rb"``, ``"wb"``, ``"ab"``, ``"xb"`` or one of those with
    ``+``. ``buffering=0`` gives the :class:`RawFile` itself; otherwise a
    buffered object over it (``buffering`` bytes, 1 MiB by default).
    ``settings`` (see :class:`Settings`) place new blocks: by default as
    ``lors upload`` does, 3 copies with BLAKE3 end-to-end checksums.

    A file opened for writing is saved by ``close``, whole: until then the
    old ``.xnd`` (or none) stays, and a write that fails or is abandoned
    (an exception out of ``with``, an object never closed) leaves it so.

    >>> with lors.open("frames.xnd", "wb", depots=["d1:6714"], copies=2) as f:
    ...     f.write(array.tobytes())
    >>> with lors.open("frames.xnd") as f:
    ...     f.seek(4096); header = f.read(64)
    """
    if "b" not in mode or "t" in mode:
        raise ValueError(
            f'mode {mode!r}: exNodes open in binary mode ("rb", "wb", "r+b", …); '
            "wrap the file in io.TextIOWrapper for text"
        )
    raw = RawFile(target, mode, **settings)
    if buffering == 0:
        return raw
    size = buffering if buffering > 1 else DEFAULT_BUFFER_SIZE
    try:
        if "+" in mode:
            return BufferedRandom(raw, size)
        if mode.startswith("r") or mode.startswith("br"):
            return BufferedReader(raw, size)
        return BufferedWriter(raw, size)
    except BaseException:
        raw.discard()
        raise
