from collections.abc import Iterable
from typing import Literal

from typing_extensions import Buffer

from fastdata.io_native._errors import CodecUnavailableError as CodecUnavailableError
from fastdata.io_native._errors import DecodeError as DecodeError

MAGIC: bytes
FORMAT_VERSION: int
HEADER_BYTES: int
ENTRY_BYTES: int
PAYLOAD_ALIGNMENT: int
MAX_FIELDS: int
MAX_NAME_BYTES: int
MAX_NDIM: int
MAX_RECORD_BYTES: int
MAX_FIELD_BYTES: int
MAX_BATCH_FIELDS: int
#: int64 columns per row of decode_batch: name_index, kind, dtype, codec, ndim,
#: payload_offset, payload_bytes, raw_bytes, shape[0..7].
ROW_WIDTH: int
MAX_ALIGNMENT: int
KIND_BYTES: int
KIND_STR: int
KIND_SCALAR: int
KIND_ARRAY: int
CODEC_NONE: int
CODEC_ZSTD: int
DTYPE_NAMES: tuple[str, ...]

class AlignedBuffer:
    @property
    def address(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def alignment(self) -> int: ...
    @property
    def exports(self) -> int: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

def aligned_empty(nbytes: int, alignment: int = 4096) -> AlignedBuffer: ...
def decode_batch(
    buffers: Iterable[Buffer], verify: bool = False
) -> tuple[tuple[str, ...], bytes, bytes]:
    """Validate N records; return (names, starts, rows).

    names: distinct field names in first-seen order; starts: N + 1 native int64, the rows
    of record i are rows[starts[i]:starts[i+1]]; rows: ROW_WIDTH native int64 per field.
    Raises DecodeError(message, index, offset) for the first malformed record.
    """

def gather(buffers: Iterable[Buffer], field: str, out: Buffer, verify: bool = False) -> int:
    """Copy field of every record back to back into out (GIL released); return bytes written.

    Raises DecodeError (malformed record or zstd payload), KeyError (a record lacks the
    field), ValueError (out too small or overlapping an input), CodecUnavailableError
    (a zstd field and libzstd did not load).
    """

def crc32c(
    data: Buffer,
    value: int = 0,
    method: Literal["auto", "hardware", "table"] = "auto",
    out: Buffer | None = None,
) -> int:
    """Extend value over data; with out, also copy data into out's first bytes (one pass).

    Raises ValueError (bad method or value, out too small or overlapping data) and
    TypeError (data or out not a suitable buffer).
    """

def load_zstd(soname: str = "libzstd.so.1") -> str: ...
