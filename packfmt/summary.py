"""The numbers ``packfmt inspect`` reports, for one store or across a dataset's members (spec GLOSSARY).

Padding baselines (``padding_costs``) work on *rows*: each document cut into pieces of at most
``capacity`` tokens, in data order (so nothing is dropped):

* ``pad_to_capacity``: every row padded to ``capacity`` tokens.
* ``pad_to_longest``: consecutive rows in batches of ``batch_size``, each padded to the longest
  row of its batch.
* ``packed``: the index's packs, ``capacity`` slots each.

Efficiency = real tokens / token slots. ``packfmt.render`` turns these dicts into text and
``packfmt.inspect`` is the front door (a store's summary or a collection's).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import format as F
from ._resident import narrow_lengths, release
from .checks import pack_runs
from .collection.arrays import image_token_spans
from .collection.stats import distinct_documents, padding_rows
from .index import PackIndex

__all__ = ["length_stats", "row_lengths", "padding_costs", "mask_fraction", "index_summary", "documents_per_pack",
           "summarize_store", "DEFAULT_BATCH"]

#: Percentiles reported for document lengths (linear interpolation, numpy's default).
PERCENTILES = (50, 90, 99)
#: Rows per batch of the pad-to-longest baseline.
DEFAULT_BATCH = 8
#: Scan the loss mask in chunks of this many bytes; show a bar above PROGRESS_MIN_TOKENS.
_CHUNK = 1 << 24
PROGRESS_MIN_TOKENS = 1 << 28



def length_stats(lengths: np.ndarray) -> dict:
    """min / mean / p50 / p90 / p99 / max of a 1-D array (percentiles: numpy linear interpolation)."""
    lengths = np.asarray(lengths)
    if lengths.size == 0:
        return {"count": 0}
    out = {"count": int(lengths.size), "total": int(lengths.sum()), "min": int(lengths.min()),
           "mean": float(lengths.mean())}
    for q, v in zip(PERCENTILES, np.percentile(lengths, PERCENTILES)):
        out[f"p{q}"] = float(v)
    out["max"] = int(lengths.max())
    return out


def row_lengths(doc_lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Documents cut into rows of at most ``capacity`` tokens, in data order. int64 ``(n_rows,)``.

    When every document is non-empty and fits, the rows are the documents: returned without a copy.
    """
    doc_lengths = np.asarray(doc_lengths, dtype=np.int64)
    if doc_lengths.size == 0 or (doc_lengths.min() >= 1 and doc_lengths.max() <= capacity):
        return doc_lengths
    full, rem = np.divmod(doc_lengths, capacity)
    per_doc = full + (rem > 0)
    rows = np.full(int(per_doc.sum()), capacity, dtype=np.int64)
    last = np.cumsum(per_doc) - 1
    has_rem = rem > 0
    rows[last[has_rem]] = rem[has_rem]
    return rows


def padding_costs(doc_lengths: np.ndarray, capacity: int, batch_size: int = DEFAULT_BATCH,
                  num_packs: int | None = None, packed_tokens: int | None = None) -> dict:
    """Token slots and efficiency of the padding baselines (and of packing, when given).

    Returns ``{"pad_to_capacity": {...}, "pad_to_longest": {...}[, "packed": {...}]}``, each with
    ``rows``, ``slots`` (token positions fed to the model), ``padding`` and ``efficiency``.
    """
    n, real, longest = padding_rows(doc_lengths, capacity, batch_size)  # no rows array (8 bytes a row)

    def entry(n_rows: int, slots: int, tokens: int) -> dict:
        return {"rows": int(n_rows), "slots": int(slots), "tokens": int(tokens), "padding": int(slots - tokens),
                "efficiency": float(tokens / slots) if slots else 1.0}

    out = {"pad_to_capacity": entry(n, n * capacity, real),
           "pad_to_longest": dict(entry(n, int(longest), real), batch_size=batch_size)}
    if num_packs is not None and packed_tokens is not None:
        out["packed"] = entry(num_packs, num_packs * capacity, packed_tokens)
    return out


def mask_fraction(mask: np.ndarray, progress: bool) -> float:
    n = mask.shape[0]
    if n == 0:
        return 0.0
    bar = None
    if progress and n >= PROGRESS_MIN_TOKENS:
        from tqdm import tqdm

        bar = tqdm(total=n, unit="tok", unit_scale=True, desc="loss mask", leave=False)
    ones = 0
    for a in range(0, n, _CHUNK):
        chunk = mask[a:a + _CHUNK]
        ones += int(np.count_nonzero(chunk))
        release(mask)  # a mapped mask's pages handed back per chunk (1 byte a token)
        if bar is not None:
            bar.update(chunk.shape[0])
    if bar is not None:
        bar.close()
    return ones / n


def _image_summary(store) -> dict | None:
    images = store.images
    if images is None:
        return None
    meta = np.asarray(images.meta)
    per_doc = np.diff(np.asarray(images.doc_image_offsets))
    codes, counts = np.unique(meta[:, 2], return_counts=True)
    spans = np.asarray(images.token_spans)
    span_len = spans[:, 1] - spans[:, 0]
    return {
        "count": int(meta.shape[0]),
        "bytes": int(images.blobs.shape[0]),
        "codecs": {F.CODECS.get(int(c), f"unknown({int(c)})"): int(k) for c, k in zip(codes, counts)},
        "width": {"min": int(meta[:, 0].min()), "max": int(meta[:, 0].max())},
        "height": {"min": int(meta[:, 1].min()), "max": int(meta[:, 1].max())},
        "tokens_per_image": {"min": int(span_len.min()), "mean": float(span_len.mean()), "max": int(span_len.max())},
        "per_document": {"mean": float(per_doc.mean()) if per_doc.size else 0.0,
                         "max": int(per_doc.max()) if per_doc.size else 0,
                         "documents_with_images": int(np.count_nonzero(per_doc))},
    }


def _build_report(raw: dict) -> dict | None:
    """The manifest's ``build_report`` plus a check that records read = written + skipped."""
    report = raw.get("build_report")
    if not isinstance(report, dict):
        return None
    out = dict(report)
    read = report.get("records_read")
    written = report.get("documents_written", report.get("records_written"))
    skipped = report.get("skipped")
    if isinstance(read, int) and isinstance(written, int) and isinstance(skipped, dict):
        total_skipped = sum(v for v in skipped.values() if isinstance(v, int))
        out["skipped_total"] = total_skipped
        out["consistent"] = read == written + total_skipped
    return out


def index_summary(index: PackIndex, doc_lengths: np.ndarray, batch_size: int = DEFAULT_BATCH) -> dict:
    """Packing numbers of one index, with the padding baselines on the same documents."""
    po = np.asarray(index.pack_offsets)
    totals = index.pack_lengths  # every pack's tokens, from the scan that opened the index (V27, V29)
    packed = int(totals.sum())
    n_packs = int(po.shape[0] - 1)
    cap = index.capacity
    # the index's own dataset's documents: with a mixture, doc_lengths are its copies', not its documents
    docs_per_pack = documents_per_pack(index.segments, po, int(index.store.num_documents))
    stats = index.stats
    out = {
        "algorithm": index.algorithm,
        "capacity": cap,
        "oversize": index.manifest.oversize,
        "seed": index.manifest.seed,
        "params": index.manifest.params,
        "materialized": index.manifest.materialized,
        "format_version": index.manifest.raw.get("format_version"),
        "shard_rows": "shard_digests.bin" in index.manifest.files,  # a layout's, read a shard at a time (§9.4)
        "packs": n_packs,
        "segments": int(index.segments.shape[0]),
        "packed_tokens": packed,
        "fill_efficiency": float(packed / (n_packs * cap)) if n_packs else 1.0,
        "documents_per_pack": {"mean": float(docs_per_pack.mean()) if n_packs else 0.0,
                               "max": int(docs_per_pack.max()) if n_packs else 0},
        "segments_per_pack": {"mean": float(np.diff(po).mean()) if n_packs else 0.0,
                              "max": int(np.diff(po).max()) if n_packs else 0},
        "pack_tokens": length_stats(totals),
        "oversize_counts": {k: _stat_count(stats, k) for k in ("split_documents", "truncated_documents",
                                                                "truncated_tokens", "dropped_documents", "dropped_tokens")},
        "padding": padding_costs(doc_lengths, cap, batch_size, n_packs, packed),
    }
    images = _images_per_pack(index, po)
    if images is not None:
        out["images_per_pack"] = images
    return out


def _stat_count(stats: dict, key: str) -> int | None:
    """A count the index's ``stats`` record (informative: spec FORMAT §4.1, readers MUST NOT depend on them): 0 when
    absent, None when it is no count (a hand edit, which ``validate --deep`` reports: V33)."""
    value = stats.get(key, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def documents_per_pack(segs: np.ndarray, po: np.ndarray, n_docs: int) -> np.ndarray:
    """Distinct documents in each pack, int64 ``(n_packs,)``, in O(n_segments + n_docs).

    A pack can hold a document twice only through a document with several segments, so only
    those segments are compared within their pack to find the repeats (``collection.stats.distinct_documents``:
    one byte per document, ``segs`` read in runs of packs).
    """
    return distinct_documents(segs, po, n_docs)


def _images_per_pack(index: PackIndex, po: np.ndarray) -> dict | None:
    """Images whose token span starts inside each pack's segments (spans are globally sorted), in runs of packs."""
    spans = image_token_spans(index.store)  # every member's, in dataset token offsets
    if spans is None:
        return None
    off = np.asarray(index.store.doc_offsets)
    starts = spans[:, 0]
    segs = index.segments
    per_pack = np.zeros(po.shape[0] - 1, dtype=np.int64)
    for p0, p1 in pack_runs(po):
        s0 = int(po[p0])
        rows = np.asarray(segs[s0:int(po[p1])])
        base = off[rows[:, 0]]
        per_seg = (np.searchsorted(starts, base + rows[:, 2], side="left")
                   - np.searchsorted(starts, base + rows[:, 1], side="left"))
        cum = np.concatenate([[0], np.cumsum(per_seg)])
        local = po[p0:p1 + 1] - s0
        per_pack[p0:p1] = cum[local[1:]] - cum[local[:-1]]
        release(segs)
    return {"mean": float(per_pack.mean()) if per_pack.size else 0.0, "max": int(per_pack.max()) if per_pack.size else 0,
            "total": int(per_pack.sum())}


def summarize_store(store, *, progress: bool = False, batch_size: int = DEFAULT_BATCH) -> dict:
    """``packfmt.inspect.summarize`` of a store: manifest, lengths, images, loss mask, build report, indexes."""
    m = store.manifest
    # opened first: each open's scan (V27) reads the offsets at random, then hands their pages back
    indexes = {name: store.pack_index(name) for name in store.pack_index_names()}
    lengths = narrow_lengths(store.doc_offsets)  # int32 when every length fits; the offsets' pages handed back
    out: dict[str, Any] = {
        "path": store.location,
        "format_version": m.raw.get("format_version"),
        "producer": m.raw.get("producer"),
        "counts": {"documents": m.num_documents, "tokens": m.num_tokens, "images": m.num_images},
        "token_dtype": m.token_dtype,
        "vocab_size": m.vocab_size,
        "tokenizer": dict(m.tokenizer),
        "special_tokens": dict(m.special_tokens),
        "bytes": sum(e.bytes for e in m.files.values()),
        "document_lengths": length_stats(lengths),
        "images": _image_summary(store),
        "loss_mask": None,
        "build_report": _build_report(m.raw),
        "pack_indexes": {},
    }
    if store.loss_mask is not None:
        frac = mask_fraction(store.loss_mask, progress)
        out["loss_mask"] = {"trained_fraction": frac, "trained_tokens": int(round(frac * m.num_tokens))}
    for name, index in indexes.items():
        out["pack_indexes"][name] = index_summary(index, lengths, batch_size)
    return out
