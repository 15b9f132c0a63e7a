"""The one error class both decoder backends raise."""

from __future__ import annotations

__all__ = ["DecodeError"]


class DecodeError(ValueError):
    """Malformed record bytes.

    Attributes:
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
