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
from .format import FORMAT_VERSION_STR
from .reader import ImageStore, PackIndex, Store, open_dataset
from .version import __version__
from .writer import DatasetWriter, ImageRecord

open = open_dataset  # noqa: A001  (``packfmt.open(path)`` is the documented entry point)

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
    "__version__",
]
