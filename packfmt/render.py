"""``packfmt inspect`` as text: the summaries of ``packfmt.summary`` and one pack, in the glossary's words."""

from __future__ import annotations

import numpy as np

from .index import PackIndex

__all__ = ["pct", "length_and_mask_lines", "format_store", "format_index", "format_pack"]


def pct(x: float) -> str:
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
        lines.append(f"loss mask {pct(lm['trained_fraction'])} of tokens are trained ({lm['trained_tokens']:,})")
    return lines


def counts_lines(s: dict) -> list[str]:
    """The counts and tokenizer lines of a store's or a collection's summary."""
    c, tok = s["counts"], s["tokenizer"]
    return [f"counts    {c['documents']:,} documents, {c['tokens']:,} tokens, {c['images']:,} images",
            f"tokens    {s['token_dtype']}, vocab_size {s['vocab_size']:,}; tokenizer {tok.get('name')!r} "
            f"{tok.get('hash') or '(no hash)'}"]


def format_store(s: dict) -> str:
    """Human-readable report of a store's summary (``summary.summarize_store``)."""
    lines = [f"dataset   {s['path']}  (packfmt {s['format_version']}, {s['bytes']:,} bytes)", *counts_lines(s),
             "special   " + ", ".join(f"{k}={v}" for k, v in s["special_tokens"].items())]
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
        lines += format_index(name, ix)
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


def format_index(name: str, ix: dict) -> list[str]:
    pad = ix["padding"]
    oc = {k: "?" if v is None else f"{v:,}" for k, v in ix["oversize_counts"].items()}  # None: stats holds no count
    lines = [
        f"pack index {name!r}: {ix['algorithm']}, capacity {ix['capacity']:,}, oversize={ix['oversize']}"
        + (", materialized" if ix["materialized"] else ""),
        f"  {ix['packs']:,} packs, {ix['segments']:,} segments, {ix['packed_tokens']:,} tokens; fill efficiency "
        f"{pct(ix['fill_efficiency'])}; documents per pack mean {ix['documents_per_pack']['mean']:.2f}, "
        f"max {ix['documents_per_pack']['max']}",
        f"  oversize: {oc['split_documents']} split, {oc['truncated_documents']} truncated "
        f"({oc['truncated_tokens']} tokens), {oc['dropped_documents']} dropped ({oc['dropped_tokens']} tokens)",
    ]
    if "images_per_pack" in ix:
        lines.append(f"  images per pack mean {ix['images_per_pack']['mean']:.2f}, max {ix['images_per_pack']['max']}")
    lines.append("  same data, token slots fed to the model:")
    for key, label in (("packed", "packed (this index)"), ("pad_to_longest", f"pad to longest (batches of "
                                                                             f"{pad['pad_to_longest']['batch_size']})"),
                       ("pad_to_capacity", "pad every document to capacity")):
        e = pad[key]
        lines.append(f"    {label:34s} {e['rows']:>10,} rows {e['slots']:>14,} slots  efficiency {pct(e['efficiency'])}")
    return lines


def format_pack(index: PackIndex, p: int, decode=None) -> str:
    """Pack ``p``: its segments, then its text (or token ids) with ``‖ doc D [b:e) ‖`` boundary markers."""
    if not 0 <= p < index.num_packs:
        raise IndexError(f"pack {p} out of range [0, {index.num_packs})")
    segs = np.asarray(index.pack_segments(p))
    total = int((segs[:, 2] - segs[:, 1]).sum()) if segs.size else 0
    lines = [f"pack {p} of index {index.name!r}: {segs.shape[0]} segment(s), {total:,} / {index.capacity:,} tokens "
             f"({pct(total / index.capacity)} full)"]
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
