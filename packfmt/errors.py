"""One exception hierarchy for everything packfmt raises on purpose.

Every error names *where* (the file, and the field or offset inside it), *what was expected*
and *what was found*, so a user can act on the message without reading our code::

    PackfmtError
    ├── FormatError              a dataset on disk breaks spec/ (reader, validate)
    │   ├── UnsupportedVersionError   newer major version, or another format
    │   └── ChecksumError             bytes differ from the manifest's checksum
    ├── WriteError               the writer was asked to write something the spec forbids
    │   ├── TokenRangeError           token id >= vocab_size or < 0 (no silent wrap-around)
    │   └── DatasetExistsError        target exists and overwrite was not asked for
    └── InputError               a source record cannot be converted (converters)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "PackfmtError",
    "FormatError",
    "UnsupportedVersionError",
    "ChecksumError",
    "WriteError",
    "TokenRangeError",
    "DatasetExistsError",
    "InputError",
]


class PackfmtError(Exception):
    """Base class. ``file``/``field``/``expected``/``found`` are kept for programs (``--json``).

    ``cli``: the same message in CLI words (printed by ``packfmt``; see :meth:`cli_message`).
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        file: str | None = None,
        field: str | None = None,
        expected: Any = None,
        found: Any = None,
        cli: str | None = None,
    ) -> None:
        self.file = file
        self.field = field
        self.expected = expected
        self.found = found
        if message is None:
            message = self._compose()
        self.cli = cli
        super().__init__(message)

    def cli_message(self) -> str:
        """The message in the command line's words (``--overwrite``), where it differs from the API's (``overwrite=True``).

        ``str(error)`` speaks the API's words; pass ``cli=`` when a message names options, so each
        front door names the options its user can type.
        """
        return self.cli or str(self)

    def _compose(self) -> str:
        parts = []
        if self.file:
            parts.append(str(self.file))
        if self.field:
            parts.append(str(self.field))
        where = ": ".join(parts) if parts else "packfmt"
        return f"{where}: expected {self.expected}, found {self.found}"

    def to_dict(self) -> dict:
        return {
            "error": type(self).__name__,
            "message": str(self),
            "file": self.file,
            "field": self.field,
            "expected": None if self.expected is None else str(self.expected),
            "found": None if self.found is None else str(self.found),
        }


class FormatError(PackfmtError):
    """The bytes on disk do not follow spec/ (raised by the reader and by validate)."""


class UnsupportedVersionError(FormatError):
    """The manifest announces another format or a major version this reader does not know."""


class ChecksumError(FormatError):
    """A file's checksum differs from the one recorded in its manifest."""


class WriteError(PackfmtError):
    """The writer refused input that would produce an invalid dataset."""


class TokenRangeError(WriteError):
    """A token id is negative or not below the vocabulary size."""


class DatasetExistsError(WriteError):
    """The target path already exists and ``overwrite`` was not requested."""


class InputError(PackfmtError):
    """A source record cannot be converted (bad JSON, missing field, bad image, ...)."""

    def __init__(self, message: str | None = None, *, reason: str = "invalid", line: int | None = None, **kw: Any) -> None:
        self.reason = reason
        self.line = line
        super().__init__(message, **kw)
