"""What is in a dataset, in numbers and pictures: ``packfmt inspect``.

``summarize(dataset)`` returns a plain dict (JSON-ready) with the counts, the document length
distribution, images, loss mask, the build report and, for each pack index, its packing
efficiency next to what naive padding would cost on the same data. ``packfmt.plot`` draws it;
``render.format_pack`` shows one pack's segments (and decoded text when a tokenizer is at hand).

The numbers are ``packfmt.summary`` (a store's) and ``packfmt.collection.inspect`` (a collection's
members table and mixtures); the text is ``packfmt.render``. This module is the front: it opens
the dataset and picks the one that fits.
"""

from __future__ import annotations

import os
from pathlib import Path

from .dataset import Dataset
from .render import format_store
from .summary import DEFAULT_BATCH, summarize_store

__all__ = ["summarize", "format_summary", "load_decoder", "tokenizer_mismatch", "plot_summary", "batch_grids"]


def summarize(store: Dataset | str | os.PathLike, *, progress: bool = False, batch_size: int = DEFAULT_BATCH) -> dict:
    """Everything ``packfmt inspect`` prints, as a JSON-ready dict.

    Args:
        store: an open ``Store`` or ``Collection``, or a dataset path (a collection's summary has
            ``"kind": "collection"`` and a ``members`` table; see ``packfmt.collection.inspect``).
        progress: tqdm bars on stderr for scans that take more than about a second.
        batch_size: rows per batch of the pad-to-longest baseline.
    """
    from .opening import as_dataset

    store = as_dataset(store)
    if hasattr(store, "members"):  # a collection's summary also has a members table
        from .collection.inspect import summarize_collection

        return summarize_collection(store, progress=progress, batch_size=batch_size)
    return summarize_store(store, progress=progress, batch_size=batch_size)


def format_summary(s: dict) -> str:
    """Human-readable report of ``summarize``'s dict, in the glossary's words."""
    if s.get("kind") == "collection":
        from .collection.inspect import format_collection

        return format_collection(s)
    return format_store(s)


def load_decoder(path: str | os.PathLike):
    """A ``decode(ids) -> str`` callable for a local tokenizer directory or ``tokenizer.json`` (offline)."""
    p = Path(path)
    file = p if p.is_file() else p / "tokenizer.json"
    if file.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(file))
        return lambda ids: tok.decode([int(i) for i in ids], skip_special_tokens=False)
    from .tokenize import load_tokenizer

    hf = load_tokenizer(p)
    return lambda ids: hf.decode([int(i) for i in ids], skip_special_tokens=False)


def tokenizer_mismatch(recorded: dict | None, path: str | os.PathLike) -> str | None:
    """Why the tokenizer at ``path`` may decode a dataset wrongly: its identity hash (``tokenize.tokenizer_hash``,
    the one a build records) is not the manifest's ``tokenizer.hash``; None when they agree, or when the
    manifest records no hash. A ``tokenizer.json`` given alone also agrees when its folder's hash does.
    """
    from .errors import PackfmtError
    from .tokenize import tokenizer_hash

    want = (recorded or {}).get("hash")
    p = Path(path)
    if not isinstance(want, str) or not p.exists():
        return None
    try:
        have = tokenizer_hash(p)
        if have == want or (p.is_file() and tokenizer_hash(p.parent) == want):
            return None
    except PackfmtError:  # no tokenizer files there: loading it says so
        return None
    return (f"tokenizer {str(p)!r} has hash {have}, but the dataset was built with tokenizer "
            f"{(recorded or {}).get('name')!r}, hash {want}: another tokenizer maps ids to other text, so the "
            "decoded text may be wrong")


# ----------------------------------------------------------------------------- pictures
def __getattr__(name: str):
    """``plot_summary`` / ``batch_grids`` live in ``packfmt.plot`` (imported, with matplotlib, only when drawing)."""
    if name in ("plot_summary", "batch_grids", "draw_summary"):
        from . import plot

        return getattr(plot, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
