"""The errors both decoder backends raise."""

from __future__ import annotations

__all__ = ["CodecUnavailableError", "DecodeError"]


class DecodeError(ValueError):
    """Malformed record bytes.

    Attributes:
        message: What is wrong, as docs/record-format.md words it.
        index: Position of the offending record in the batch (0 for a single record).
        offset: Byte offset inside that record where validation failed.
    """

    def __init__(self, message: str, index: int = 0, offset: int = 0) -> None:
        super().__init__(message, index, offset)
        self.message = message
        self.index = index
        self.offset = offset

    def __str__(self) -> str:
        return f"record {self.index}, byte {self.offset}: {self.message}"


class CodecUnavailableError(RuntimeError):
    """The native backend cannot decompress a codec because its library did not load.

    ``fastdata.record`` catches it and gathers that field with the pure backend.
    """
