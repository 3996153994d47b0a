"""``lors.open``: an exNode as a binary file object."""

from __future__ import annotations

import io
import os
from typing import Any

from . import _lors

#: Bytes the buffered objects of :func:`open` hold by default: reads and
#: writes this large or larger go straight to the exNode (no copy).
DEFAULT_BUFFER_SIZE = 1 << 20


class RawFile(io.RawIOBase):
    """An exNode opened unbuffered: ``readinto`` fills the caller's buffer
    straight from the fetched blocks; ``write`` stores a block at a time.

    Sequential reads start a read-ahead (the next blocks are fetched while
    the program reads); a read elsewhere fetches its 1 MiB stretch. Closing
    stores what is buffered and saves the ``.xnd``.
    """

    def __init__(self, target: str | os.PathLike[str], mode: str = "rb", **settings: Any) -> None:
        super().__init__()
        self.name = os.fspath(target)
        self.mode = mode
        self._f = _lors.File(self.name, mode, **settings)

    def readinto(self, buffer) -> int:  # type: ignore[override]
        return self._f.readinto(buffer)

    def readall(self) -> bytes:
        left = max(self.size - self.tell(), 0)
        out = bytearray(left)
        n = self._f.readinto(out) if left else 0
        del out[n:]
        return bytes(out)

    def write(self, data) -> int:  # type: ignore[override]
        return self._f.write(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def truncate(self, size: int | None = None) -> int:
        return self._f.truncate(self.tell() if size is None else size)

    def flush(self) -> None:
        if not self.closed and not self._f.closed:
            self._f.flush()

    def close(self) -> None:
        if not self.closed:
            try:
                self._f.close()
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


def open(  # noqa: A001 - the name users know from the built-in
    target: str | os.PathLike[str],
    mode: str = "rb",
    buffering: int = -1,
    **settings: Any,
):
    """Opens the exNode ``target`` (an ``.xnd`` path or a ``lors://`` URI) as
    a binary file, as the built-in ``open`` does a local one.

    ``mode`` is ``"rb"``, ``"wb"``, ``"ab"``, ``"xb"`` or one of those with
    ``+``. ``buffering=0`` gives the :class:`RawFile` itself; otherwise an
    ``io.BufferedReader``, ``io.BufferedWriter`` or ``io.BufferedRandom`` over
    it (``buffering`` bytes, 1 MiB by default). ``settings`` are those of
    :func:`lors.upload` for new blocks (``depots``, ``lbone``, ``copies``,
    ``block_size``, ``duration``, ``timeout``, ``location``).

    >>> with lors.open("frames.xnd", "wb", depots=["d1:6714"], copies=2) as f:
    ...     f.write(array.tobytes())
    >>> with lors.open("frames.xnd") as f:
    ...     f.seek(4096); header = f.read(64)
    """
    if "b" not in mode or "t" in mode:
        raise ValueError(
            f"mode {mode!r}: exNodes open in binary mode (\"rb\", \"wb\", \"r+b\", …); "
            "wrap the file in io.TextIOWrapper for text"
        )
    raw = RawFile(target, mode, **settings)
    if buffering == 0:
        return raw
    size = buffering if buffering > 1 else DEFAULT_BUFFER_SIZE
    try:
        if "+" in mode:
            return io.BufferedRandom(raw, size)
        if mode.startswith("r"):
            return io.BufferedReader(raw, size)
        return io.BufferedWriter(raw, size)
    except BaseException:
        raw.close()
        raise
