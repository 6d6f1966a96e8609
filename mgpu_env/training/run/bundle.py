"""Whether a checkpoint's files are complete and intact, read without TensorFlow.

A TensorFlow checkpoint (a "tensor bundle") is `<prefix>.index`, a table in LevelDB's
format (tensorflow/core/lib/io/table: blocks of prefix-compressed entries, each block
followed by its type byte and a masked CRC-32C, a 48-byte footer ending in the table's magic
number), and `<prefix>.data-<i>-of-<n>`, the tensors' bytes. The index's entries are
protocol buffers (tensorflow/core/protobuf/tensor_bundle.proto): the header (key "") gives
the number of data files, every other entry a tensor's data file, offset, size and CRC-32C.

`check_bundle` reads all of it: the index's blocks against their checksums, every data file
present and long enough for its tensors, and every tensor's bytes against its checksum
(google-crc32c's C code when installed, else up to `PURE_CRC_LIMIT` bytes in Python; larger
bundles are checked byte for byte when TensorFlow restores them). A damaged, cut short,
zeroed or foreign file is named with what is wrong; a complete checkpoint gives None.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_BYTES = 48
BLOCK_TRAILER = 5  # the block type (0: not compressed) and its masked CRC-32C
# The data bytes checked in pure Python when google-crc32c is not installed (~2 MB/s).
PURE_CRC_LIMIT = 4 << 20
_CRC_MASK_DELTA = 0xA282EAD8
_STRING_DTYPES = frozenset({7, 21})  # DT_STRING, DT_VARIANT (types.proto)


class BundleDamage(Exception):
    """What is wrong with a checkpoint's files, said for the user."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shard: int
    offset: int
    size: int
    crc: int | None


def check_bundle(prefix: Path) -> str | None:
    """What is wrong with the checkpoint at `prefix` (its files named), None when its index
    and data are complete and every checksum agrees."""
    try:
        shards, entries = read_index(prefix)
        _check_data(prefix, shards, entries)
    except BundleDamage as damage:
        return str(damage)
    return None


def read_index(prefix: Path) -> tuple[int, list[TensorEntry]]:
    """The number of data files and the tensors `<prefix>.index` lists."""
    path = Path(f"{prefix}.index")
    try:
        table = path.read_bytes()
    except FileNotFoundError:
        raise BundleDamage(f"{path.name} is missing") from None
    except OSError as err:
        raise BundleDamage(f"{path.name} cannot be read ({err.strerror})") from None
    if len(table) < FOOTER_BYTES:
        raise BundleDamage(f"{path.name} is cut short ({len(table)} bytes)")
    if struct.unpack("<Q", table[-8:])[0] != TABLE_MAGIC:
        raise BundleDamage(f"{path.name} is not a checkpoint index (no table magic at its end)")
    footer = table[-FOOTER_BYTES:]
    _meta, at = _handle(footer, 0, path)
    index_block, _ = _handle(footer, at, path)
    shards, entries = 0, []
    for _, value in _block_entries(table, index_block, path):
        for key, entry in _block_entries(table, _handle(value, 0, path)[0], path):
            if key == b"":
                shards = _fields(entry, path).get(1, 1)
            else:
                fields = _fields(entry, path)
                if 7 in fields:  # a sliced tensor's entry holds no bytes of its own
                    continue
                # A string tensor's checksum also covers its lengths' own (TensorFlow's
                # WriteStringTensor): its bytes are checked by the restore.
                crc = None if fields.get(1) in _STRING_DTYPES else fields.get(6)
                entries.append(TensorEntry(key.decode("utf-8", "replace"), fields.get(3, 0),
                                           fields.get(4, 0), fields.get(5, 0), crc))
    if not shards:
        raise BundleDamage(f"{path.name} has no header entry")
    return shards, entries


def _check_data(prefix: Path, shards: int, entries: list[TensorEntry]) -> None:
    files = [Path(f"{prefix}.data-{i:05d}-of-{shards:05d}") for i in range(shards)]
    sizes = []
    for file in files:
        try:
            sizes.append(file.stat().st_size)
        except OSError:
            raise BundleDamage(f"{file.name} is missing") from None
    for entry in entries:
        if entry.shard >= shards or entry.offset + entry.size > sizes[entry.shard]:
            raise BundleDamage(
                f"{files[min(entry.shard, shards - 1)].name} is cut short: it has "
                f"{sizes[min(entry.shard, shards - 1)]} bytes, its index puts {entry.name} at "
                f"bytes {entry.offset} to {entry.offset + entry.size}")
    crc = _crc32c()
    if crc is None and sum(sizes) > PURE_CRC_LIMIT:
        return
    for index, file in enumerate(files):
        data = file.read_bytes()
        for entry in (e for e in entries if e.shard == index and e.crc is not None):
            found = _masked((crc or _pure_crc32c)(data[entry.offset:entry.offset + entry.size]))
            if found != entry.crc:
                raise BundleDamage(f"{file.name} is damaged: the bytes of {entry.name} do not "
                                   "match the checksum its index holds")


def _block_entries(table: bytes, handle: tuple[int, int], path: Path
                   ) -> Iterator[tuple[bytes, bytes]]:
    """The (key, value) entries of the block at `handle`, its checksum checked first."""
    offset, size = handle
    end = offset + size
    if end + BLOCK_TRAILER > len(table) - FOOTER_BYTES + BLOCK_TRAILER or size < 4:
        raise BundleDamage(f"{path.name} is damaged: a block lies outside the file")
    block, kind = table[offset:end], table[end]
    stored = struct.unpack("<I", table[end + 1:end + 5])[0]
    if _masked(_crc_of(block + bytes([kind]))) != stored:
        raise BundleDamage(f"{path.name} is damaged: a block's checksum does not match")
    if kind != 0:
        raise BundleDamage(f"{path.name} holds a compressed block (type {kind}) mgpu "
                           "does not read")
    restarts = struct.unpack("<I", block[-4:])[0]
    limit = len(block) - 4 - 4 * restarts
    key, at = b"", 0
    while at < limit:
        shared, at = _varint(block, at, path)
        fresh, at = _varint(block, at, path)
        length, at = _varint(block, at, path)
        key = key[:shared] + block[at:at + fresh]
        at += fresh
        yield key, block[at:at + length]
        at += length


def _handle(data: bytes, at: int, path: Path) -> tuple[tuple[int, int], int]:
    offset, at = _varint(data, at, path)
    size, at = _varint(data, at, path)
    return (offset, size), at


def _varint(data: bytes, at: int, path: Path) -> tuple[int, int]:
    result = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise BundleDamage(f"{path.name} is damaged: an entry runs past its block")
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, at


def _fields(message: bytes, path: Path) -> dict[int, int]:
    """A protocol buffer's varint and fixed32 fields by number (the others skipped)."""
    fields: dict[int, int] = {}
    at = 0
    while at < len(message):
        tag, at = _varint(message, at, path)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            fields[number], at = _varint(message, at, path)
        elif wire == 5:
            fields[number] = struct.unpack("<I", message[at:at + 4])[0]
            at += 4
        elif wire == 1:
            at += 8
        elif wire == 2:
            length, at = _varint(message, at, path)
            at += length
            fields.setdefault(number, 0)
        else:
            raise BundleDamage(f"{path.name} is damaged: an entry is not a tensor's record")
    return fields


def _masked(crc: int) -> int:
    """LevelDB's and TensorFlow's stored form of a CRC-32C."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def _crc32c() -> Callable[[bytes], int] | None:
    try:
        import google_crc32c
    except ImportError:
        return None
    return lambda data: int(google_crc32c.value(bytes(data)))


def _crc_of(data: bytes) -> int:
    fast = _crc32c()
    return fast(data) if fast is not None else _pure_crc32c(data)


def _table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _table()


def _pure_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
