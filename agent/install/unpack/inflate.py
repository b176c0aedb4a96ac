"""The raw-deflate decoder and CRC-32 the archive module inflates entries with: ISA-L's
(``isal.isal_zlib``, the optional extra ``fast``) when it is installed, else the standard
library's ``zlib``; the same interface (``decompressobj(-15)``, ``max_length``,
``unconsumed_tail``, ``eof``; ``crc32``).

Inflating is most of an extraction's CPU after the files' creation: ISA-L inflated the cold-large
zip's 40 MB text entry in 68 ms where zlib 1.2.13 took 172 ms, and its 4,000 small entries in
27 ms where zlib took 51 ms (this machine). ``ERRORS`` are what a corrupt stream raises, with
either. ``NAME`` says which is in use (a figure for logs and tests).
"""

from __future__ import annotations

import importlib.util
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, cast


class Decompressor(Protocol):
    @property
    def unconsumed_tail(self) -> bytes: ...

    @property
    def eof(self) -> bool: ...

    def decompress(self, data: bytes, max_length: int = 0, /) -> bytes: ...


Crc32 = Callable[[bytes, int], int]

decompressobj: Callable[[int], Decompressor]
crc32: Crc32
ERRORS: tuple[type[Exception], ...]

try:
    from isal import isal_zlib
except ImportError:  # not installed (the extra ``fast``): the standard library's
    decompressobj, crc32, ERRORS, NAME = zlib.decompressobj, zlib.crc32, (zlib.error,), "zlib"
else:
    decompressobj, crc32 = isal_zlib.decompressobj, isal_zlib.crc32
    ERRORS, NAME = (zlib.error, cast(type[Exception], isal_zlib.error)), "isal"


def root() -> str:
    """The folder to put on a ``python -S`` worker's path so that it finds ``isal`` (its
    site-packages, which ``-S`` leaves out), or "" if it is not installed. Imports nothing."""
    spec = importlib.util.find_spec("isal")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return str(Path(next(iter(spec.submodule_search_locations))).parent)
