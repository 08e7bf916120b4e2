"""packfmt: a specified on-disk format for tokenized LLM/VLM training data, offline packing,
and a zero-copy PyTorch reader.

    >>> import packfmt
    >>> store = packfmt.open("data/my_dataset")          # doctest: +SKIP
    >>> store.document(0)                                # zero-copy numpy view  # doctest: +SKIP
"""

from .errors import (
    ChecksumError,
    DatasetExistsError,
    FormatError,
    InputError,
    PackfmtError,
    TokenRangeError,
    UnsupportedVersionError,
    WriteError,
)
from .version import __version__

#: Public names imported on first use (PEP 562), so that ``import packfmt.cli`` installs the CLI's
#: signal handlers before numpy loads: a Ctrl-C in the first instant exits 130 quietly too.
_LAZY = {
    "open": ("opening", "open_dataset"), "open_dataset": ("opening", "open_dataset"), "Store": ("reader", "Store"),
    "ImageStore": ("reader", "ImageStore"), "PackIndex": ("index", "PackIndex"),
    "DatasetWriter": ("writer", "DatasetWriter"), "ImageRecord": ("writer", "ImageRecord"),
    "FORMAT_VERSION_STR": ("format", "FORMAT_VERSION_STR"), "copy_dataset": ("copying", "copy_dataset"),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'packfmt' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value  # later lookups skip this function
    return value


__all__ = [
    "open",
    "open_dataset",
    "Store",
    "ImageStore",
    "PackIndex",
    "DatasetWriter",
    "ImageRecord",
    "PackfmtError",
    "FormatError",
    "UnsupportedVersionError",
    "ChecksumError",
    "WriteError",
    "TokenRangeError",
    "DatasetExistsError",
    "InputError",
    "FORMAT_VERSION_STR",
    "copy_dataset",
    "__version__",
]
