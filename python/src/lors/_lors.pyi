"""Type stubs of the native module ``lors._lors`` (built from crates/py)."""

import os
import pathlib
from collections.abc import Callable, Sequence
from typing import Any, Literal, final

from typing_extensions import Buffer

__version__: str

Path = str | os.PathLike[str]
Size = int | str
Seconds = float | str
Progress = Callable[[int, int | None], object]
ExNodeArg = ExNode | Path

@final
class Mapping:
    """One block of the file in one allocation on one depot."""

    @property
    def offset(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def depot(self) -> str | None: ...
    @property
    def alloc_length(self) -> int: ...
    @property
    def stripe(self) -> int | None: ...
    @property
    def index(self) -> int | None: ...
    @property
    def parity(self) -> bool: ...
    @property
    def readable(self) -> bool: ...
    @property
    def writable(self) -> bool: ...
    @property
    def manageable(self) -> bool: ...

@final
class ExNode:
    """A file on depots: where its blocks are, under which capabilities."""

    @staticmethod
    def load(path: Path) -> ExNode: ...
    @staticmethod
    def from_xml(text: bytes) -> ExNode: ...
    def to_xml(self) -> str: ...
    def save(self, path: Path) -> None: ...
    @property
    def size(self) -> int: ...
    @property
    def filename(self) -> str | None: ...
    @property
    def path(self) -> pathlib.Path | None: ...
    @property
    def ec(self) -> str | None: ...
    @property
    def mappings(self) -> list[Mapping]: ...
    @property
    def parity(self) -> list[Mapping]: ...
    def stat(self, probe: bool = True, timeout: Seconds | None = None) -> dict[str, Any]: ...
    def __len__(self) -> int: ...

@final
class File:
    """An exNode opened as a raw file (``lors.open`` wraps it)."""

    def __new__(
        cls,
        target: str,
        mode: str = "rb",
        *,
        depots: Sequence[str] | str | None = None,
        lbone: str | None = None,
        location: str | None = None,
        copies: int | None = None,
        block_size: Size | None = None,
        duration: Seconds | None = None,
        timeout: Seconds | None = None,
        checksum: Literal["blake3", "md5", "md5-rfc1321", "none"] | None = None,
        compress: bool = False,
        encrypt: Literal["aes", "chacha"] | None = None,
    ) -> File: ...
    def readinto(self, buffer: Buffer) -> int: ...
    def write(self, data: Buffer) -> int: ...
    def seek(self, offset: int, whence: int = 0) -> int: ...
    def tell(self) -> int: ...
    def flush(self) -> None: ...
    def truncate(self, size: int) -> int: ...
    def close(self) -> None: ...
    def discard(self) -> None: ...
    @property
    def size(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def readable(self) -> bool: ...
    def writable(self) -> bool: ...

def upload(
    path: Path,
    output: Path | None = None,
    *,
    depots: Sequence[str] | str | None = None,
    lbone: str | None = None,
    location: str | None = None,
    copies: int | None = None,
    ec: str | None = None,
    block_size: Size | None = None,
    duration: Seconds | None = None,
    threads: int | None = None,
    timeout: Seconds | None = None,
    checksum: Literal["blake3", "md5", "md5-rfc1321", "none"] | None = None,
    compress: bool = False,
    encrypt: Literal["aes", "chacha"] | None = None,
    force: bool = False,
    dense: bool = False,
    bwlimit: Size | None = None,
    progress: Progress | None = None,
) -> ExNode: ...
def download(
    exnode: ExNodeArg,
    path: Path,
    *,
    offset: int = 0,
    length: int | None = None,
    connections: int | None = None,
    timeout: Seconds | None = None,
    bwlimit: Size | None = None,
    progress: Progress | None = None,
) -> int: ...
def read_range(exnode: ExNodeArg, start: int, end: int, *, timeout: Seconds | None = None) -> bytes: ...
def read_ranges(
    exnode: ExNodeArg,
    ranges: Sequence[tuple[int, int]],
    *,
    concurrency: int = 32,
    timeout: Seconds | None = None,
) -> list[bytes]: ...
def augment(
    exnode: ExNodeArg,
    copies: int = 1,
    *,
    output: Path | None = None,
    depots: Sequence[str] | str | None = None,
    lbone: str | None = None,
    location: str | None = None,
    duration: Seconds | None = None,
    timeout: Seconds | None = None,
    progress: Progress | None = None,
) -> ExNode: ...
def trim(
    exnode: ExNodeArg,
    *,
    depots: Sequence[str] | str | None = None,
    mappings: Sequence[int] | None = None,
    release: bool = True,
    allow_holes: bool = False,
    output: Path | None = None,
    timeout: Seconds | None = None,
) -> ExNode: ...
def refresh(
    exnode: ExNodeArg,
    duration: Seconds | None = None,
    *,
    timeout: Seconds | None = None,
) -> list[tuple[int, int | None, str | None]]: ...
def remove(path: Path, *, force: bool = False, timeout: Seconds | None = None) -> int: ...
def copy(
    src: ExNodeArg,
    dst: Path,
    *,
    depots: Sequence[str] | str | None = None,
    lbone: str | None = None,
    location: str | None = None,
    duration: Seconds | None = None,
    timeout: Seconds | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> ExNode: ...
