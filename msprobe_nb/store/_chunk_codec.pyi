"""Types of the optional C extension ``_chunk_codec`` (store/_chunk_codec.c)."""
from typing import Any

ABI: int

def bind(compress: int, bound: int, default_block: int) -> None:
    """bitshuffle's ``bshuf_compress_lz4``, ``bshuf_compress_lz4_bound`` and ``bshuf_default_block_size``, by
    address."""

def encode(buffer: Any, elem_size: int) -> bytes:
    """A whole chunk as HDF5's bitshuffle + LZ4 filter stores it, with fletcher32's checksum after it."""

def fletcher32(buffer: Any) -> int:
    """HDF5's fletcher32 checksum of the bytes."""
