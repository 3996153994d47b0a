"""LoRS from Python: files on IBP depots.

A file stored with LoRS is a set of time-limited allocations on IBP depots,
striped and replicated (or erasure-coded); its exNode (an ``.xnd`` file)
names them. This package uploads and downloads such files, opens them as
binary file objects, and serves them to pandas, xarray, Dask and Zarr
through fsspec (``lors://``).

>>> import lors
>>> x = lors.upload("run42.dat", "run42.xnd", depots=["d1:6714", "d2:6714"], copies=2)
>>> x.size, len(x.mappings)
>>> lors.download("run42.xnd", "copy.dat")
>>> with lors.open("run42.xnd") as f:
...     f.seek(1 << 20); block = f.read(4096)

Settings resolve as the command-line tools resolve them: keyword argument >
``lors://`` URI query > environment (``LORS_COPIES``, ``LBONE_SERVER``, …) >
``~/.xndrc`` > default.
"""

from ._io import RawFile, open
from ._lors import (
    ExNode,
    Mapping,
    __version__,
    augment,
    download,
    read_range,
    read_ranges,
    refresh,
    trim,
    upload,
)
from .errors import DepotError, ExNodeError, LorsError, NoDepotsError, UnreadableError

try:  # the entry point does this for an installed package; also from a source tree
    import fsspec as _fsspec

    _fsspec.register_implementation("lors", "lors.fs.LorsFileSystem", clobber=False)
except (ImportError, ValueError):
    pass

__all__ = [
    "ExNode",
    "Mapping",
    "RawFile",
    "open",
    "upload",
    "download",
    "augment",
    "trim",
    "refresh",
    "read_range",
    "read_ranges",
    "LorsError",
    "DepotError",
    "UnreadableError",
    "NoDepotsError",
    "ExNodeError",
    "__version__",
]
