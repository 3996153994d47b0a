"""The exceptions of lors.

Every error of a LoRS operation is a :class:`LorsError`, an ``OSError``
(file objects raise what ``io`` callers expect), with what a program needs
to decide: the IBP status a depot answered (``status``, ``status_name``),
the depot (``depot``, ``"host:port"``) and the bytes of the file
(``range``, ``(start, end)``), each ``None`` when it does not apply.

Local file errors stay Python's own (``FileNotFoundError``, …); bad
arguments raise ``ValueError``; Ctrl-C raises ``KeyboardInterrupt`` once
the operation has wound down.
"""

from __future__ import annotations


class LorsError(OSError):
    """An operation on depots failed."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        status_name: str | None = None,
        depot: str | None = None,
        range: tuple[int, int] | None = None,  # noqa: A002 - the attribute's name
        errno: int | None = None,
        filename: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        #: The IBP status code a depot answered (e.g. -3), if one did.
        self.status = status
        #: Its name (e.g. ``"IBP_E_CAP_NOT_FOUND"``), if known.
        self.status_name = status_name
        #: The depot (``"host:port"``) the failure was on, if one was.
        self.depot = depot
        #: The bytes of the file concerned, ``(start, end)``.
        self.range = range
        #: The ``errno`` a program would see for it (``EIO``, ``ENOSPC``, …).
        self.errno = errno
        #: The ``.xnd`` (or local file) concerned.
        self.filename = filename

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):  # keeps the keywords through pickling (Dask workers)
        return (
            _rebuild,
            (
                type(self),
                self.message,
                self.status,
                self.status_name,
                self.depot,
                self.range,
                self.errno,
                self.filename,
            ),
        )


def _rebuild(cls, message, status, status_name, depot, range, errno, filename=None):  # noqa: A002
    return cls(
        message, status=status, status_name=status_name, depot=depot, range=range, errno=errno, filename=filename
    )


class DepotError(LorsError):
    """A depot refused a request or failed while serving it."""


class UnreadableError(LorsError):
    """Bytes of the file could not be read from any copy (or, erasure-coded,
    rebuilt from their stripe): ``range`` says which."""


class NoDepotsError(LorsError):
    """No depot (or not enough distinct ones) to place the data on."""


class ExNodeError(LorsError):
    """The ``.xnd`` file is not an exNode this package can read."""


__all__ = ["LorsError", "DepotError", "UnreadableError", "NoDepotsError", "ExNodeError"]
