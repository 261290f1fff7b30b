"""Open an untrusted GGUF file: validate its header with bounded reads, then memory-map it.

A GGUF file (little-endian) is::

    magic "GGUF" | version u32 (2 or 3) | tensor_count u64 | kv_count u64
    kv_count x (key: string, value_type u32, value)      strings are u64 length + UTF-8 bytes;
                                                         arrays are item_type u32 + count u64 + items
    tensor_count x (name: string, n_dims u32, dims u64 x n_dims (ggml order, fastest first),
                    ggml_type u32, offset u64 (relative to the data section))
    padding to `general.alignment` (default 32) | data section

`open_gguf` walks all of it through a plain file handle, checking every count and length against the
bytes that are left in the file and against the caller's limits BEFORE reading it, so a truncated or
crafted file never makes it allocate more than the file holds (nor more than `max_metadata_bytes`
for metadata). It then checks each tensor's type, byte size (type x shape), alignment and extent, and
that no two tensors overlap. Only a file that passes is handed to `gguf.GGUFReader`, which maps it
(`numpy.memmap`): tensor bytes are not read until used.

Shapes are given in torch order (row-major: the ggml dims reversed), with ComfyUI-GGUF's
``comfy.gguf.orig_shape.<name>`` metadata applied where a writer reshaped a tensor to fit ggml.
Every problem raises `h3director.errors.InvalidInputError` with one line naming the file and what is wrong.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from h3director.errors import InvalidInputError, missing_package

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 16
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME_BYTES = 1 << 16
MAX_ARRAY_NESTING = 4
DEFAULT_MAX_METADATA_BYTES = 256 << 20  # tokenizer vocabularies are a few MB; 256 MiB is absurd already
DEFAULT_MAX_TENSORS = 1 << 20
ORIG_SHAPE_PREFIX = "comfy.gguf.orig_shape."

# GGUF value types: code -> (name, struct format of one scalar, bytes); STRING=8 and ARRAY=9 are special.
_SCALARS: dict[int, tuple[str, str, int]] = {
    0: ("UINT8", "<B", 1), 1: ("INT8", "<b", 1), 2: ("UINT16", "<H", 2), 3: ("INT16", "<h", 2),
    4: ("UINT32", "<I", 4), 5: ("INT32", "<i", 4), 6: ("FLOAT32", "<f", 4), 7: ("BOOL", "<?", 1),
    10: ("UINT64", "<Q", 8), 11: ("INT64", "<q", 8), 12: ("FLOAT64", "<d", 8),
}
_NUMPY_OF = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
             12: "<f8"}
_STRING, _ARRAY = 8, 9
_INT_TYPES = {0, 1, 2, 3, 4, 5, 10, 11}


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor of an open GGUF file.

    `shape`: torch order (row-major; the reversed ggml dims, or ``comfy.gguf.orig_shape.*`` when the
    file carries it). `qtype`: ``gguf.GGMLQuantizationType``. `nbytes`: bytes in the file (type x shape).
    `raw`: a read-only uint8 view of those bytes in the memory map (no copy; pages are read on use).
    `offset`: absolute byte offset in the file. `ggml_shape`: the dims as stored (fastest first).
    """

    name: str
    shape: tuple[int, ...]
    qtype: Any
    nbytes: int
    raw: np.ndarray = field(repr=False, compare=False)
    offset: int = 0
    ggml_shape: tuple[int, ...] = ()

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


class GGUFFile:
    """A validated, memory-mapped GGUF file. Use as a context manager or call `close()`.

    `path`, `version`, `architecture` (``general.architecture``, "" when absent), `metadata` (key ->
    plain Python value: int, float, bool, str, or a list of those), `tensors` (name -> `GGUFTensorInfo`,
    in file order), `alignment`, `data_offset` (absolute start of the data section), `file_bytes`.
    """

    def __init__(self, path: Path, header: _Header, reader: Any) -> None:
        self.path = path
        self.version = header.version
        self.metadata = header.metadata
        self.architecture = str(header.metadata.get("general.architecture", "") or "")
        self.alignment = header.alignment
        self.data_offset = header.data_offset
        self.file_bytes = header.file_bytes
        self._reader = reader
        data = reader.data
        self.tensors: dict[str, GGUFTensorInfo] = {}
        for t in header.tensors:
            start = header.data_offset + t.offset
            self.tensors[t.name] = GGUFTensorInfo(
                name=t.name, shape=t.shape, qtype=t.qtype, nbytes=t.nbytes, raw=data[start:start + t.nbytes],
                offset=start, ggml_shape=t.ggml_dims)

    def close(self) -> None:
        """Drop the memory map (views handed out keep it alive until they are released)."""
        self.tensors = {}
        self._reader = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, architecture={self.architecture!r}, tensors={len(self.tensors)})"


@dataclass(frozen=True)
class _TensorHeader:
    name: str
    ggml_dims: tuple[int, ...]
    shape: tuple[int, ...]
    qtype: Any
    offset: int
    nbytes: int


@dataclass(frozen=True)
class _Header:
    version: int
    metadata: dict[str, Any]
    tensors: list[_TensorHeader]
    alignment: int
    data_offset: int
    file_bytes: int


class _Cursor:
    """Reads from a file handle, refusing any read that runs past the end of the file."""

    def __init__(self, handle: BinaryIO, size: int, where: str) -> None:
        self.handle, self.size, self.where, self.pos = handle, size, where, 0
        self.metadata_limit = 0

    def fail(self, problem: str) -> InvalidInputError:
        return InvalidInputError(f"{self.where!r}: {problem}")

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.left():
            raise self.fail(f"truncated: {what} needs {n} bytes at offset {self.pos}, only {self.left()} left")

    def read(self, n: int, what: str) -> bytes:
        self.need(n, what)
        data = self.handle.read(n)
        if len(data) != n:
            raise self.fail(f"truncated: {what} at offset {self.pos} (file changed while reading?)")
        self.pos += n
        return data

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.pos += n
        self.handle.seek(self.pos)

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.read(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.read(8, what))[0]

    def string(self, what: str, limit: int) -> str:
        n = self.u64(f"length of {what}")
        if n > limit:
            raise self.fail(f"{what} is {n} bytes long, more than the limit of {limit}")
        raw = self.read(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def open_gguf(path: str | os.PathLike, *, max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
              max_tensors: int = DEFAULT_MAX_TENSORS) -> GGUFFile:
    """Validate the GGUF file at `path` and return it memory-mapped.

    `max_metadata_bytes`: bound on the key/value section (bytes in the file); `max_tensors`: bound on the
    tensor count. Raises `InvalidInputError` (one line naming the file and the problem) for a missing or
    truncated file, bad magic, an unsupported version or byte order, counts, lengths or offsets beyond the
    file or the limits, unknown value or quantisation types, a tensor whose byte size does not match its
    type and shape, a zero dimension, misaligned or overlapping tensors, duplicate names, or a malformed
    ``orig_shape`` entry. Every length and count is checked against the bytes left in the file (or the limits)
    before it is read; metadata arrays become Python lists, which take several times their bytes in the file
    (bounded by `max_metadata_bytes`).
    """
    path = Path(path)
    header = read_header(path, max_metadata_bytes=max_metadata_bytes, max_tensors=max_tensors)
    try:
        from gguf import GGUFReader
    except ImportError as exc:  # pragma: no cover - gguf is a declared extra
        raise InvalidInputError(missing_package("reading GGUF files", "the 'gguf' package", "gguf")) from exc
    try:
        reader = GGUFReader(path, "r")
    except (ValueError, KeyError, IndexError, OSError) as exc:  # validated above; kept as a second line of defence
        raise InvalidInputError(f"{str(path)!r}: gguf could not read the file ({exc})") from None
    _cross_check(path, header, reader)
    return GGUFFile(path, header, reader)


def read_header(path: str | os.PathLike, *, max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
                max_tensors: int = DEFAULT_MAX_TENSORS) -> _Header:
    """Parse and check the header and tensor table of `path` (no memory map); see `open_gguf`."""
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError as exc:  # pragma: no cover - gguf is a declared extra
        raise InvalidInputError(missing_package("reading GGUF files", "the 'gguf' package", "gguf")) from exc

    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise InvalidInputError(f"{where!r} is not a file")
    size = path.stat().st_size
    with open(path, "rb") as handle:
        cur = _Cursor(handle, size, where)
        cur.metadata_limit = max_metadata_bytes
        if size < 24:
            raise cur.fail(f"not a GGUF file: {size} bytes, the fixed header alone is 24")
        magic = cur.read(4, "magic")
        if magic != GGUF_MAGIC:
            raise cur.fail(f"not a GGUF file: magic {magic!r}, expected {GGUF_MAGIC!r}")
        version = cur.u32("version")
        if version not in SUPPORTED_VERSIONS:
            swapped = struct.unpack(">I", struct.pack("<I", version))[0]
            if swapped in SUPPORTED_VERSIONS:
                raise cur.fail(f"big-endian GGUF (version {swapped}) is not supported")
            raise cur.fail(f"GGUF version {version} is not supported (expected one of {SUPPORTED_VERSIONS})")
        tensor_count = cur.u64("tensor count")
        kv_count = cur.u64("metadata count")
        if tensor_count > max_tensors:
            raise cur.fail(f"{tensor_count} tensors, more than the limit of {max_tensors}")
        # Every tensor entry takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes,
        # every key/value at least 8 (key length) + 4 (type) + 1 byte.
        if tensor_count * 24 + kv_count * 13 > cur.left():
            raise cur.fail(f"header claims {tensor_count} tensors and {kv_count} metadata entries, more than the "
                           f"{size} bytes of the file can hold")

        metadata: dict[str, Any] = {}
        kv_start = cur.pos
        for index in range(kv_count):
            key = cur.string(f"metadata key #{index}", MAX_NAME_BYTES)
            if key in metadata:
                raise cur.fail(f"metadata key {key!r} appears twice")
            vtype = cur.u32(f"type of metadata {key!r}")
            metadata[key] = _read_value(cur, vtype, key, kv_start + max_metadata_bytes, 0)
            if cur.pos - kv_start > max_metadata_bytes:
                raise cur.fail(f"metadata exceeds the limit of {max_metadata_bytes} bytes (at key {key!r})")

        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or isinstance(alignment, bool) or not 0 < alignment <= MAX_ALIGNMENT \
                or alignment & (alignment - 1):
            raise cur.fail(f"general.alignment must be a power of two up to {MAX_ALIGNMENT}, got {alignment!r}")

        raw_tensors: list[tuple[str, tuple[int, ...], int, int]] = []
        names: set[str] = set()
        for index in range(tensor_count):
            name = cur.string(f"name of tensor #{index}", MAX_NAME_BYTES)
            if name in names:
                raise cur.fail(f"tensor {name!r} appears twice")
            names.add(name)
            n_dims = cur.u32(f"rank of tensor {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise cur.fail(f"tensor {name!r} has {n_dims} dimensions, expected 1 to {MAX_DIMS}")
            dims = tuple(cur.u64(f"dimensions of tensor {name!r}") for _ in range(n_dims))
            type_code = cur.u32(f"type of tensor {name!r}")
            offset = cur.u64(f"offset of tensor {name!r}")
            raw_tensors.append((name, dims, type_code, offset))
        header_end = cur.pos

    data_offset = -(-header_end // alignment) * alignment
    data_bytes = size - data_offset
    tensors: list[_TensorHeader] = []
    spans: list[tuple[int, int, str]] = []
    for name, dims, type_code, offset in raw_tensors:
        try:
            qtype = GGMLQuantizationType(type_code)
            block_values, block_bytes = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise InvalidInputError(f"{where!r}: tensor {name!r} has unknown quantisation type {type_code}") from None
        if 0 in dims:   # an empty tensor is no weight, and a zero would leave its other dims unbounded
            raise InvalidInputError(f"{where!r}: tensor {name!r} has a zero dimension (ggml dims {list(dims)})")
        n_elements = math.prod(dims)   # then every dim <= n_elements, which the byte-size check bounds
        if dims[0] % block_values:
            raise InvalidInputError(f"{where!r}: tensor {name!r} ({qtype.name}, ggml dims {list(dims)}) has rows of "
                                    f"{dims[0]} values, not a multiple of the {block_values}-value block")
        nbytes = n_elements // block_values * block_bytes
        if nbytes > max(data_bytes, 0):
            raise InvalidInputError(f"{where!r}: tensor {name!r} ({qtype.name} {list(reversed(dims))}) needs {nbytes} "
                                    f"bytes, more than the {max(data_bytes, 0)}-byte data section")
        if offset % alignment:
            raise InvalidInputError(f"{where!r}: tensor {name!r} offset {offset} is not a multiple of the "
                                    f"alignment {alignment}")
        if offset + nbytes > data_bytes:
            raise InvalidInputError(f"{where!r}: tensor {name!r} ({qtype.name} {list(reversed(dims))}, {nbytes} bytes "
                                    f"at data offset {offset}) runs past the end of the file ({data_bytes}-byte data "
                                    "section; truncated?)")
        shape = _torch_shape(where, name, dims, metadata)
        tensors.append(_TensorHeader(name, dims, shape, qtype, offset, nbytes))
        if nbytes:
            spans.append((offset, offset + nbytes, name))
    spans.sort()
    for (_, end_a, name_a), (begin_b, _, name_b) in zip(spans, spans[1:], strict=False):
        if begin_b < end_a:
            raise InvalidInputError(f"{where!r}: tensors {name_a!r} and {name_b!r} overlap in the data section")
    return _Header(version, metadata, tensors, int(alignment), data_offset, size)


def _read_value(cur: _Cursor, vtype: int, key: str, limit_pos: int, depth: int) -> Any:
    """One metadata value of type `vtype`; never reads past `limit_pos` (the metadata budget) or the file."""
    budget = max(limit_pos - cur.pos, 0)
    if vtype in _SCALARS:
        _, fmt, n = _SCALARS[vtype]
        value = struct.unpack(fmt, cur.read(n, f"value of {key!r}"))[0]
        return bool(value) if vtype == 7 else value
    if vtype == _STRING:
        n = cur.u64(f"length of {key!r}")
        if n > budget:
            raise cur.fail(f"metadata {key!r} is a string of {n} bytes, past the metadata limit of "
                           f"{cur.metadata_limit} bytes")
        cur.need(n, f"value of {key!r}")
        raw = cur.read(n, f"value of {key!r}")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise cur.fail(f"metadata {key!r} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    if vtype != _ARRAY:
        raise cur.fail(f"metadata {key!r} has unknown value type {vtype}")
    if depth >= MAX_ARRAY_NESTING:
        raise cur.fail(f"metadata {key!r} nests arrays more than {MAX_ARRAY_NESTING} deep")
    item_type = cur.u32(f"item type of {key!r}")
    count = cur.u64(f"length of {key!r}")
    if item_type in _SCALARS:
        n = count * _SCALARS[item_type][2]
        if n > budget:
            raise cur.fail(f"metadata {key!r} is an array of {count} items ({n} bytes), past the metadata limit of "
                           f"{cur.metadata_limit} bytes")
        data = cur.read(n, f"value of {key!r}")
        values = np.frombuffer(data, dtype=_NUMPY_OF[item_type]).tolist()
        return values
    if item_type not in (_STRING, _ARRAY):
        raise cur.fail(f"metadata {key!r} is an array of unknown value type {item_type}")
    min_item = 8 if item_type == _STRING else 12
    if count * min_item > min(budget, cur.left()):
        raise cur.fail(f"metadata {key!r} claims {count} items, more than the file (or the metadata limit) can hold")
    return [_read_value(cur, item_type, key, limit_pos, depth + 1) for _ in range(count)]


def _torch_shape(where: str, name: str, dims: tuple[int, ...], metadata: dict[str, Any]) -> tuple[int, ...]:
    """Reversed ggml dims, or the ``comfy.gguf.orig_shape.<name>`` shape when present (same element count)."""
    shape = tuple(reversed(dims))
    orig = metadata.get(ORIG_SHAPE_PREFIX + name)
    if orig is None:
        return shape
    if not (isinstance(orig, list) and orig and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                    for d in orig)):
        raise InvalidInputError(f"{where!r}: {ORIG_SHAPE_PREFIX}{name} must be a list of non-negative ints, "
                                f"got {orig!r:.80}")
    if math.prod(orig) != math.prod(shape):
        raise InvalidInputError(f"{where!r}: {ORIG_SHAPE_PREFIX}{name} {orig} has {math.prod(orig)} elements but the "
                                f"tensor {list(shape)} has {math.prod(shape)}")
    return tuple(orig)


def _cross_check(path: Path, header: _Header, reader: Any) -> None:
    """gguf's own parse must agree with ours (names, types, absolute offsets)."""
    if len(reader.tensors) != len(header.tensors) or int(reader.data_offset) != header.data_offset:
        raise InvalidInputError(f"{str(path)!r}: gguf reads {len(reader.tensors)} tensors at data offset "
                                f"{reader.data_offset}, the validator {len(header.tensors)} at {header.data_offset}")
    for ours, theirs in zip(header.tensors, reader.tensors, strict=True):
        if (theirs.name != ours.name or int(theirs.data_offset) != header.data_offset + ours.offset
                or int(theirs.tensor_type) != int(ours.qtype)):
            raise InvalidInputError(f"{str(path)!r}: gguf and the validator disagree about tensor {ours.name!r}")


__all__ = ["GGUFFile", "GGUFTensorInfo", "open_gguf"]
