"""crc32, the checksum of a dump's commit rows and tail rows and of the tensor hashes: zlib-ng's where installed.

zlib-ng (a core dependency) computes the same CRC-32 as the standard library's ``zlib.crc32``, with the CPU's
carry-less multiply: a recorded step sums every row it writes to a tail (a few hundred KB a step on a real
model), and the hash task sums whole tensors, where the standard library's table loop took several times
longer. Without zlib-ng the standard library's serves, with equal results (tests/test_checksums.py).
"""
from __future__ import annotations

try:
    from zlib_ng.zlib_ng import crc32
    BACKEND = "zlib-ng"
except ImportError:  # installed without its dependencies: the same checksum, more slowly
    from zlib import crc32
    BACKEND = "zlib"

__all__ = ["BACKEND", "crc32"]
