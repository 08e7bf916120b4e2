"""The ``layout`` record of a collection manifest (spec/COLLECTION.md §9): C1 of a pack-ordered layout.

Floor 0 like ``collection.manifest``: plain JSON checked key by key. A collection written by
``packfmt pack --shards`` (``collection.shards``) records here which of its pack indexes is laid
out in pack order over its members, so that validation checks that index by the layout's coverage
rule (every document once, as ``[0, L)`` or ``[0, L - 1)``: the lookahead token only a label)
instead of FORMAT.md §4.3.
"""

from __future__ import annotations

from typing import Any

from .. import format as F
from ..errors import FormatError, WriteError
from ..index_format import check_index_name
from .mixture_record import check_mixture_record

__all__ = ["LAYOUT_KIND", "LAYOUT_VERSION", "LAYOUT_VERSION_STR", "layout_of", "parse_layout", "refuse_laid_out"]

#: The one kind of layout 1.3 defines: members hold the packs of one index, in pack order.
LAYOUT_KIND = "pack-ordered"
#: ``layout`` was added in collection format 1.3; a collection with one is written as 1.3.
from .versions import LAYOUT_VERSION, newer_minor  # noqa: E402
LAYOUT_VERSION_STR = "1.3"


def parse_layout(obj: dict, version: tuple[int, int], *, file: str) -> dict | None:
    """C1 of ``layout``: None when absent (or, in a collection of a minor version newer than this reader knows, of a
    kind it does not know: it reads the data the same and checks that index by FORMAT §4.3)."""
    if "layout" not in obj:
        return None
    raw = obj["layout"]
    if version < LAYOUT_VERSION:
        raise FormatError(file=file, field="layout", expected=f"absent in a collection of format "
                          f"{version[0]}.{version[1]} (added in {LAYOUT_VERSION_STR})", found=repr(raw)[:200])
    if not isinstance(raw, dict):
        raise FormatError(file=file, field="layout", expected="an object", found=repr(raw)[:200])
    kind = F.require(raw, "kind", str, file=file, prefix="layout.")
    if kind != LAYOUT_KIND:
        if newer_minor(version):
            return None
        raise FormatError(file=file, field="layout.kind", expected=repr(LAYOUT_KIND), found=repr(kind))
    index = F.require(raw, "index", str, file=file, prefix="layout.")
    try:
        check_index_name(index)
    except FormatError as exc:
        raise FormatError(file=file, field="layout.index", expected=exc.expected, found=exc.found) from None
    for key in ("shard_bytes", "lookahead_tokens"):
        value = F.require(raw, key, int, file=file, prefix="layout.")
        F.nonneg(value, file=file, field=f"layout.{key}", low=1 if key == "shard_bytes" else 0)
    packs = F.require(raw, "member_packs", list, file=file, prefix="layout.")
    n_members = obj["counts"]["members"]  # checked (C1) before the layout: the number of entries
    if len(packs) != n_members or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= F.INT64_MAX
                                         for x in packs):
        raise FormatError(file=file, field="layout.member_packs", expected=f"one integer >= 1 per member ({n_members}): "
                          "the packs each member holds, in order", found=repr(packs)[:200])
    source = F.require(raw, "source", dict, file=file, prefix="layout.")
    for key in ("manifest", "index"):
        digest = F.require(source, key, str, file=file, prefix="layout.source.")
        if not F.CHECKSUM_RE.match(digest):
            raise FormatError(file=file, field=f"layout.source.{key}", expected='"xxh3_64:" + 16 lowercase hex digits',
                              found=repr(digest))
    F.require(source, "name", str, file=file, prefix="layout.source.")
    if "url" in source:
        F.require(source, "url", str, file=file, prefix="layout.source.")
    mixture = F.require(source, "mixture", (dict, type(None)), file=file, prefix="layout.source.")
    if mixture is not None:  # the source's record, as its index held it (its member names and packs are not here)
        check_mixture_record(mixture, file=file, field="layout.source.mixture")
    return raw


def layout_of(manifest: Any) -> dict | None:
    """The checked ``layout`` record of a parsed collection manifest (``CollectionManifest``), or None."""
    return parse_layout(manifest.raw, manifest.version, file=F.MANIFEST)


def refuse_laid_out(manifest: Any, where: str, *, merge: bool = False) -> None:
    """Refuse a new pack index over, or a merge of, a pack-ordered layout (spec/COLLECTION.md §9.2).

    Its documents end with lookahead tokens (labels only): an index packed over its documents by
    FORMAT.md §4.3 trains on them as inputs, and a merge drops the ``layout`` record that tells them
    apart. ``manifest``: the parsed collection manifest (``CollectionManifest``); ``where``: its
    path or URL, as the user named it. No-op without a ``layout`` (or one of a kind this reader skips).
    """
    layout = layout_of(manifest)
    if layout is None:
        return
    index, source = layout["index"], layout["source"]
    src = source.get("url") or source["name"]
    verb = "merge" if merge else "pack"
    what = ("a merge drops that record, and any index packed over the result"
            if merge else "a new pack index over its documents")
    head = (f"{where}: a pack-ordered layout ({F.MANIFEST} key `layout`, spec/COLLECTION.md §9): its documents are "
            f"the segments of its source's index {index!r}, {layout['lookahead_tokens']:,} of them ending with a "
            f"lookahead token that is a label only; {what} would train on those tokens as inputs and on the segments "
            f"as documents. Train from the index it lays out, {where}/{F.PACKS_DIR}/{index} "
            f"(PackedDataset({str(where)!r}, index={index!r})), or {verb} the source collection it was cut from "
            f"({src!r}) instead")
    tail = "" if merge else ": packfmt pack SRC --capacity N [--shards NEW]"
    raise WriteError(head, file=f"{where}/{F.MANIFEST}", field="layout",
                     expected="a collection whose documents are all inputs (no `layout`)",
                     found=f"a pack-ordered layout of index {index!r}", cli=head + tail)

