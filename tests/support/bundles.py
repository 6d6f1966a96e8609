"""The smallest checkpoint TensorFlow's reader takes, written without TensorFlow: for tests
that need a run folder's checkpoint to exist but must not start TensorFlow (the pure plan).

A tensor bundle (tensorflow/core/util/tensor_bundle) with its header and no tensor:
`<prefix>.index`, a LevelDB-format table (one data block holding the header entry under the
empty key, one index block pointing at it, an empty meta-index block, the 48-byte footer
with the table's magic number), and an empty `<prefix>.data-00000-of-00001`. Written from
the formats' specifications, not with the reader under test.
"""

from __future__ import annotations

import struct
from pathlib import Path

MAGIC = 0xDB4775248B80FB57


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _block(entries: list[tuple[bytes, bytes]]) -> bytes:
    """A block: each entry unshared (a restart point at 0), then its restarts, then the
    trailer (type 0: not compressed, and the masked CRC-32C of the block and its type)."""
    body = b"".join(_varint(0) + _varint(len(k)) + _varint(len(v)) + k + v
                    for k, v in entries)
    body += struct.pack("<I", 0) + struct.pack("<I", 1)
    return body + b"\x00" + struct.pack("<I", _masked(_crc32c(body + b"\x00")))


def write_header_only_bundle(prefix: Path) -> None:
    header = b"\x08\x01"  # BundleHeaderProto: num_shards = 1 (little-endian, version 0)
    data = _block([(b"", header)])
    index = _block([(b"", _varint(0) + _varint(len(data) - 5))])
    meta = _block([])
    table = data + index + meta
    handles = (_varint(len(data) + len(index)) + _varint(len(meta) - 5)
               + _varint(len(data)) + _varint(len(index) - 5))
    table += handles + bytes(40 - len(handles)) + struct.pack("<Q", MAGIC)
    Path(f"{prefix}.index").write_bytes(table)
    Path(f"{prefix}.data-00000-of-00001").write_bytes(b"")
