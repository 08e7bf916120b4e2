"""Worker of test_corruption.py: read every byte of each dataset given, through every public entry.

Run as ``python corruption_reader.py DIR...``. For each directory it prints ``BEGIN i`` before and
``END i OUTCOME`` after, flushing each line, so that the parent knows which case was running if
this process dies by a signal or hangs. OUTCOME is one of:

* ``refused-open``, ``refused-read`` or ``refused-decode``: a ``PackfmtError`` (the only exception
  allowed) when opening, reading packs, or decoding images, with ``validate=ok|invalid``: the
  verdict of the quick (structural) ``validate`` on the same directory;
* ``ok``: every read succeeded and every pack equals a reference built with bounds-checked Python
  indexing (so nothing was read from outside the dataset);
* ``BAD ...``: any other exception, or a pack that differs from the reference.
"""

from __future__ import annotations

import sys
import traceback

import numpy as np

import packfmt
from packfmt.errors import PackfmtError
from packfmt.torch import IGNORE_INDEX, PackedDataset, collate_varlen
from packfmt.validate import validate


class OutOfRange(Exception):
    pass


def _at(seq, i):
    if not 0 <= i < len(seq):
        raise OutOfRange(f"index {i} outside [0, {len(seq)})")
    return seq[i]


def reference(store, index, p):
    """input_ids and labels of pack ``p`` by plain Python lists with explicit bounds checks.

    Like the reader, a materialized index supplies the pack's own tokens (and mask) from its copy;
    the label at a cut is the document's next token in the store.
    """
    tokens = store.tokens.tolist()
    mask = None if store.loss_mask is None else store.loss_mask.tolist()
    off = store.doc_offsets.tolist()
    po = index.pack_offsets.tolist()
    materialized = index.pack_token_offsets is not None
    if materialized:
        src = index.packed_tokens.tolist()
        src_mask = None if index.packed_loss_mask is None else index.packed_loss_mask.tolist()
        r = _at(index.pack_token_offsets.tolist(), p)
    ids, labels = [], []
    for s in range(_at(po, p), _at(po, p + 1)):
        d, b, e = (int(v) for v in index.segments[s])
        start, stop = _at(off, d), _at(off, d + 1)
        for t in range(b, e):
            g = start + t
            if not start <= g < stop:
                raise OutOfRange(f"token {g} outside document {d}")
            inside = t + 1 < e  # the next token is in this segment (else: a cut, or the document's end)
            if materialized:
                ids.append(_at(src, r + t - b))
                tok_src, mask_src, at = (src, src_mask, r + t - b + 1) if inside else (tokens, mask, g + 1)
            else:
                ids.append(_at(tokens, g))
                tok_src, mask_src, at = tokens, mask, g + 1
            keep = g + 1 < stop and (mask is None or _at(mask_src, at) != 0)
            labels.append(_at(tok_src, at) if keep else IGNORE_INDEX)
        if materialized:
            r += e - b
    return ids, labels


def read_everything(path: str, stage: list[str]) -> None:
    """Read everything; ``stage[0]`` says whether a failure came when opening or when decoding."""
    stage[0] = "open"
    store = packfmt.open(path)
    for d in range(store.num_documents):
        int(store.document(d).sum())
        if store.loss_mask is not None:
            int(store.document_loss_mask(d).sum())
    for name in store.pack_index_names():
        stage[0] = "open"
        index = store.pack_index(name)
        for p in range(index.num_packs):
            index.pack_tokens(p)
        ds = PackedDataset(store, name)
        stage[0] = "decode" if store.images is not None else "read"  # items decode their images
        items = [ds[p] for p in range(len(ds))]
        batch = ds.__getitems__(list(range(len(ds)))) if len(ds) else []
        for p, item in enumerate(items):
            try:
                want = reference(store, index, p)
            except OutOfRange as exc:
                raise AssertionError(f"the reader accepted pack {p} of {name}, which reads outside the dataset: {exc}")
            got = (item["input_ids"].tolist(), item["labels"].tolist())
            if got != want or (batch[p]["input_ids"].tolist(), batch[p]["labels"].tolist()) != want:
                raise AssertionError(f"pack {p} of {name} differs from the bounds-checked reference")
        if len(ds):
            collate_varlen(batch)
    if store.images is not None:
        stage[0] = "decode"  # image bytes are checked when decoded (V20 is deep), not when opened
        for i in range(len(store.images)):
            store.images.decode(i)


def main(paths: list[str]) -> None:
    for i, path in enumerate(paths):
        print(f"BEGIN {i}", flush=True)
        stage = ["open"]
        try:
            read_everything(path, stage)
            outcome = "ok"
        except PackfmtError:
            outcome = f"refused-{stage[0]} validate=" + ("ok" if validate(path).ok else "invalid")
        except BaseException as exc:  # noqa: BLE001  (anything else is the finding)
            tb = traceback.format_exc().strip().splitlines()
            outcome = f"BAD {type(exc).__name__}: {exc} | {' / '.join(tb[-3:])}".replace("\n", " ")
        print(f"END {i} {outcome}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
