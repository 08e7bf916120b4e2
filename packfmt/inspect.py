"""What is in a dataset, in numbers and pictures: ``packfmt inspect``.

``summarize(store)`` returns a plain dict (JSON-ready) with the counts, the document length
distribution, images, loss mask, the build report and, for each pack index, its packing
efficiency next to what naive padding would cost on the same data. ``packfmt.plot`` draws it;
``format_pack`` shows one pack's segments (and decoded text when a tokenizer is at hand).

Padding baselines (``padding_costs``) work on *rows*: each document cut into pieces of at most
``capacity`` tokens, in data order (so nothing is dropped):

* ``pad_to_capacity``: every row padded to ``capacity`` tokens.
* ``pad_to_longest``: consecutive rows in batches of ``batch_size``, each padded to the longest
  row of its batch.
* ``packed``: the index's packs, ``capacity`` slots each.

Efficiency = real tokens / token slots.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from . import format as F
from .index import PackIndex
from .dataset import Dataset

__all__ = ["summarize", "length_stats", "padding_costs", "index_summary", "documents_per_pack", "format_summary",
           "format_pack", "load_decoder", "plot_summary", "batch_grids"]

#: Percentiles reported for document lengths (linear interpolation, numpy's default).
PERCENTILES = (50, 90, 99)
#: Rows per batch of the pad-to-longest baseline.
DEFAULT_BATCH = 8
#: Scan the loss mask in chunks of this many bytes; show a bar above PROGRESS_MIN_TOKENS.
_CHUNK = 1 << 24
PROGRESS_MIN_TOKENS = 1 << 28


# ----------------------------------------------------------------------------- numbers
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
    rows = row_lengths(doc_lengths, capacity)
    real = int(rows.sum())
    n = rows.shape[0]
    n_full = n // batch_size * batch_size
    longest = rows[:n_full].reshape(-1, batch_size).max(axis=1).sum() * batch_size if n_full else 0
    if n > n_full:
        longest += int(rows[n_full:].max()) * (n - n_full)

    def entry(n_rows: int, slots: int, tokens: int) -> dict:
        return {"rows": int(n_rows), "slots": int(slots), "tokens": int(tokens), "padding": int(slots - tokens),
                "efficiency": float(tokens / slots) if slots else 1.0}

    out = {"pad_to_capacity": entry(n, n * capacity, real),
           "pad_to_longest": dict(entry(n, int(longest), real), batch_size=batch_size)}
    if num_packs is not None and packed_tokens is not None:
        out["packed"] = entry(num_packs, num_packs * capacity, packed_tokens)
    return out


def _mask_fraction(mask: np.ndarray, progress: bool) -> float:
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
        if bar is not None:
            bar.update(chunk.shape[0])
    if bar is not None:
        bar.close()
    return ones / n


def _image_summary(store: Dataset) -> dict | None:
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
    segs = np.asarray(index.segments)
    seg_len = segs[:, 2] - segs[:, 1]
    packed = int(seg_len.sum())
    n_packs = int(po.shape[0] - 1)
    cap = index.capacity
    cum = np.zeros(seg_len.shape[0] + 1, dtype=np.int64)
    np.cumsum(seg_len, out=cum[1:])
    totals = cum[po[1:]] - cum[po[:-1]]
    docs_per_pack = documents_per_pack(segs, po, len(doc_lengths))
    stats = index.stats
    out = {
        "algorithm": index.algorithm,
        "capacity": cap,
        "oversize": index.manifest.oversize,
        "seed": index.manifest.seed,
        "params": index.manifest.params,
        "materialized": index.manifest.materialized,
        "packs": n_packs,
        "segments": int(segs.shape[0]),
        "packed_tokens": packed,
        "fill_efficiency": float(packed / (n_packs * cap)) if n_packs else 1.0,
        "documents_per_pack": {"mean": float(docs_per_pack.mean()) if n_packs else 0.0,
                               "max": int(docs_per_pack.max()) if n_packs else 0},
        "segments_per_pack": {"mean": float(np.diff(po).mean()) if n_packs else 0.0,
                              "max": int(np.diff(po).max()) if n_packs else 0},
        "pack_tokens": length_stats(totals),
        "oversize_counts": {k: int(stats.get(k, 0)) for k in ("split_documents", "truncated_documents",
                                                               "truncated_tokens", "dropped_documents", "dropped_tokens")},
        "padding": padding_costs(doc_lengths, cap, batch_size, n_packs, packed),
    }
    images = _images_per_pack(index, segs, po)
    if images is not None:
        out["images_per_pack"] = images
    return out


def documents_per_pack(segs: np.ndarray, po: np.ndarray, n_docs: int) -> np.ndarray:
    """Distinct documents in each pack, int64 ``(n_packs,)``, in O(n_segments + n_docs).

    A pack can hold a document twice only through a document with several segments, so only
    those segments are sorted (by pack, then document) to find the repeats.
    """
    per_pack = np.diff(po).astype(np.int64)
    if segs.shape[0] == 0:
        return per_pack
    doc = segs[:, 0]
    per_doc = np.bincount(doc, minlength=n_docs)
    if per_doc.max() <= 1:  # no document has two segments: nothing can repeat
        return per_pack
    several = np.flatnonzero(per_doc[doc] > 1)
    if several.size:
        pack = np.searchsorted(po, several, side="right") - 1
        d = doc[several]
        order = np.lexsort((d, pack))
        pack, d = pack[order], d[order]
        repeat = (pack[1:] == pack[:-1]) & (d[1:] == d[:-1])
        per_pack -= np.bincount(pack[1:][repeat], minlength=per_pack.shape[0])
    return per_pack


def _images_per_pack(index: PackIndex, segs: np.ndarray, po: np.ndarray) -> dict | None:
    """Images whose token span starts inside each pack's segments (spans are globally sorted)."""
    from .collection.arrays import image_token_spans

    spans = image_token_spans(index.store)  # every member's, in dataset token offsets
    if spans is None:
        return None
    off = np.asarray(index.store.doc_offsets)
    starts = spans[:, 0]
    g_begin = off[segs[:, 0]] + segs[:, 1]
    g_end = off[segs[:, 0]] + segs[:, 2]
    per_seg = np.searchsorted(starts, g_end, side="left") - np.searchsorted(starts, g_begin, side="left")
    cum = np.concatenate([[0], np.cumsum(per_seg)])
    per_pack = cum[po[1:]] - cum[po[:-1]]
    return {"mean": float(per_pack.mean()) if per_pack.size else 0.0, "max": int(per_pack.max()) if per_pack.size else 0,
            "total": int(per_seg.sum())}


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
    m = store.manifest
    lengths = np.asarray(store.doc_lengths)
    out: dict[str, Any] = {
        "path": str(store.path),
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
        frac = _mask_fraction(store.loss_mask, progress)
        out["loss_mask"] = {"trained_fraction": frac, "trained_tokens": int(round(frac * m.num_tokens))}
    for name in store.pack_index_names():
        out["pack_indexes"][name] = index_summary(store.pack_index(name), lengths, batch_size)
    return out


# ----------------------------------------------------------------------------- text
def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def length_and_mask_lines(s: dict) -> list[str]:
    """The document-length and loss-mask lines of a summary (a store's or a collection's)."""
    lines = []
    d = s["document_lengths"]
    if d.get("count"):
        lines.append(f"doc len   min {d['min']:,}  mean {d['mean']:,.1f}  p50 {d['p50']:,.1f}  p90 {d['p90']:,.1f}  "
                     f"p99 {d['p99']:,.1f}  max {d['max']:,}")
    if s["loss_mask"]:
        lm = s["loss_mask"]
        lines.append(f"loss mask {_pct(lm['trained_fraction'])} of tokens are trained ({lm['trained_tokens']:,})")
    return lines


def format_summary(s: dict) -> str:
    """Human-readable report of ``summarize``'s dict, in the glossary's words."""
    if s.get("kind") == "collection":
        from .collection.inspect import format_collection

        return format_collection(s)
    c = s["counts"]
    tok = s["tokenizer"]
    lines = [
        f"dataset   {s['path']}  (packfmt {s['format_version']}, {s['bytes']:,} bytes)",
        f"counts    {c['documents']:,} documents, {c['tokens']:,} tokens, {c['images']:,} images",
        f"tokens    {s['token_dtype']}, vocab_size {s['vocab_size']:,}; tokenizer {tok.get('name')!r} "
        f"{tok.get('hash') or '(no hash)'}",
        "special   " + ", ".join(f"{k}={v}" for k, v in s["special_tokens"].items()),
    ]
    lines += length_and_mask_lines(s)
    im = s["images"]
    if im:
        codecs = ", ".join(f"{k} {v:,}" for k, v in im["codecs"].items())
        lines.append(f"images    {im['count']:,} ({im['bytes']:,} bytes; {codecs}); width {im['width']['min']}-"
                     f"{im['width']['max']}, height {im['height']['min']}-{im['height']['max']}; per document mean "
                     f"{im['per_document']['mean']:.2f}, max {im['per_document']['max']}")
    br = s["build_report"]
    if br:
        lines.append("build     " + _format_build_report(br))
    for name, ix in s["pack_indexes"].items():
        lines += _format_index(name, ix)
    if not s["pack_indexes"]:
        lines.append("pack indexes: none (add one with `packfmt pack PATH --capacity N`)")
    return "\n".join(lines)


def _format_build_report(br: dict) -> str:
    """One line on the record accounting, one on the source and settings (details stay in --json)."""
    def n(key):
        v = br.get(key)
        return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else "?"

    skipped = br.get("skipped")
    reasons = ", ".join(f"{k} {v:,}" for k, v in skipped.items()) if isinstance(skipped, dict) and skipped else "none"
    check = ""
    if "consistent" in br:
        check = " (read = written + skipped)" if br["consistent"] else " (MISMATCH: read != written + skipped)"
    written = br.get("documents_written", br.get("records_written"))
    line = (f"{br.get('command', br.get('source', '?'))}: {n('records_read')} records read = "
            f"{written:,} written + {br.get('skipped_total', 0):,} skipped [{reasons}]{check}" if isinstance(written, int)
            else f"{br.get('command', br.get('source', '?'))}: records read {n('records_read')}, skipped [{reasons}]")
    sources = br.get("sources")
    if isinstance(sources, list) and sources:
        names = [str(src.get("path", src)) if isinstance(src, dict) else str(src) for src in sources[:3]]
        line += "\n          sources " + ", ".join(names) + (f" (+{len(sources) - 3} more)" if len(sources) > 3 else "")
    extras = [f"{k} {br[k]}" for k in ("on_error", "workers", "seconds") if k in br]
    if extras:
        line += "\n          " + "; ".join(extras)
    return line


def _format_index(name: str, ix: dict) -> list[str]:
    pad = ix["padding"]
    oc = ix["oversize_counts"]
    lines = [
        f"pack index {name!r}: {ix['algorithm']}, capacity {ix['capacity']:,}, oversize={ix['oversize']}"
        + (", materialized" if ix["materialized"] else ""),
        f"  {ix['packs']:,} packs, {ix['segments']:,} segments, {ix['packed_tokens']:,} tokens; fill efficiency "
        f"{_pct(ix['fill_efficiency'])}; documents per pack mean {ix['documents_per_pack']['mean']:.2f}, "
        f"max {ix['documents_per_pack']['max']}",
        f"  oversize: {oc['split_documents']:,} split, {oc['truncated_documents']:,} truncated "
        f"({oc['truncated_tokens']:,} tokens), {oc['dropped_documents']:,} dropped ({oc['dropped_tokens']:,} tokens)",
    ]
    if "images_per_pack" in ix:
        lines.append(f"  images per pack mean {ix['images_per_pack']['mean']:.2f}, max {ix['images_per_pack']['max']}")
    lines.append("  same data, token slots fed to the model:")
    for key, label in (("packed", "packed (this index)"), ("pad_to_longest", f"pad to longest (batches of "
                                                                             f"{pad['pad_to_longest']['batch_size']})"),
                       ("pad_to_capacity", "pad every document to capacity")):
        e = pad[key]
        lines.append(f"    {label:34s} {e['rows']:>10,} rows {e['slots']:>14,} slots  efficiency {_pct(e['efficiency'])}")
    return lines


# ----------------------------------------------------------------------------- one pack
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


def format_pack(index: PackIndex, p: int, decode=None) -> str:
    """Pack ``p``: its segments, then its text (or token ids) with ``‖ doc D [b:e) ‖`` boundary markers."""
    if not 0 <= p < index.num_packs:
        raise IndexError(f"pack {p} out of range [0, {index.num_packs})")
    segs = np.asarray(index.pack_segments(p))
    total = int((segs[:, 2] - segs[:, 1]).sum()) if segs.size else 0
    lines = [f"pack {p} of index {index.name!r}: {segs.shape[0]} segment(s), {total:,} / {index.capacity:,} tokens "
             f"({_pct(total / index.capacity)} full)"]
    for k, (d, b, e) in enumerate(segs.tolist()):
        lines.append(f"  segment {k}: document {d} [{b}:{e}) ({e - b:,} tokens)")
    lines.append("")
    store = index.store
    pieces = []
    for d, b, e in segs.tolist():
        toks = np.asarray(store.document(d)[b:e])
        body = decode(toks) if decode is not None else " ".join(map(str, toks.tolist()))
        pieces.append(f"‖ doc {d} [{b}:{e}) ‖ {body}")
    lines.append("\n".join(pieces) + " ‖")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- pictures
def __getattr__(name: str):
    """``plot_summary`` / ``batch_grids`` live in ``packfmt.plot`` (imported, with matplotlib, only when drawing)."""
    if name in ("plot_summary", "batch_grids", "draw_summary"):
        from . import plot

        return getattr(plot, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
