"""Compute a pack index over a whole dataset and store it beside the token store (spec §4).

Adding an index is atomic: it is written into ``packs/.<name>.packfmt-tmp-*`` and renamed to
``packs/<name>`` when complete, so readers of other indexes (or of an older index of the same
name) are never disturbed and a killed run never leaves an index that opens.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np

from . import format as F
from . import index_format as IF
from ._io import (
    HashedFile,
    publish_dir,
    remove_stale_temps,
    temp_sibling,
    write_durably,
)
from ._resident import narrow, narrow_lengths
from .collection.arrays import relative_image_spans
from .errors import FormatError, WriteError
from .index import PackIndex
from .index_writer import write_packed_tokens, write_segments
from .opening import as_dataset
from .version import __version__

__all__ = ["build_pack_index", "index_stats", "doc_summary", "default_index_name", "lost_tokens", "LostTokensWarning",
           "DEFAULT_MAX_LOST_FRACTION"]

#: Share of a dataset's tokens that ``oversize="truncate"`` / ``"drop"`` may lose before a warning.
DEFAULT_MAX_LOST_FRACTION = 0.01


class LostTokensWarning(UserWarning):
    """A pack index left out more than ``max_lost_fraction`` of the dataset's tokens (oversize truncate/drop)."""


def default_index_name(algorithm: str, capacity: int, seed: int | None, weights: dict | None = None,
                       proportions: dict | None = None, tokens: int | None = None) -> str:
    """``ALGORITHM-CAPACITY[-sSEED][-weights|-proportions]``: what a user can tell from the command alone.

    ``-sSEED`` for the shuffled algorithms; a mixture says which kind it is, not which weights (a second mixture
    of one kind is refused while the first is there: ``--name`` names it, ``--overwrite`` replaces the first).
    ``tokens`` is accepted for the callers' sake; it does not change the name."""
    shuffled = algorithm in ("first_fit_shuffle", "shuffle_and_pack")
    name = f"{algorithm}-{capacity}" + (f"-s{seed}" if shuffled else "")
    if weights or proportions:
        name += "-weights" if weights else "-proportions"
    return name


def _refuse_existing(target: Path, name: str, overwrite: bool) -> None:
    """An index ``name`` at ``target`` (``packs/NAME``) is refused unless ``overwrite``, naming what it was packed with."""
    remove_stale_temps(target)  # first: it may restore a copy an interrupted overwrite had moved aside
    if not target.exists() or overwrite:
        return
    from .errors import DatasetExistsError

    what = ""
    try:
        raw = F.read_json(target / F.PACK_INDEX_JSON, file=str(target / F.PACK_INDEX_JSON))
        mix = raw.get("mixture") or {}
        asked = (f", weights {mix['weights']}" if "weights" in mix else
                 f", proportions {(mix.get('target') or {}).get('proportions')}" if "target" in mix else "")
        what = f" (capacity {raw.get('capacity')}, {raw.get('algorithm')}, seed {raw.get('seed')}{asked})"
    except Exception:  # a broken index: it is replaced with --overwrite all the same
        pass
    raise DatasetExistsError(f"{target}: pack index {name!r} already exists{what}; pass overwrite=True to replace it, "
                             "or name this one with name=", file=str(target), expected="no existing index",
                             found="exists", cli=f"{target}: pack index {name!r} already exists{what}; pass --overwrite "
                                                 "to replace it, or name this one with --name NAME")


def build_pack_index(
    dataset,
    *,
    capacity: int,
    algorithm: str = "ffd",
    name: str | None = None,
    seed: int | None = 0,
    max_docs_per_pack: int | None = None,
    max_images_per_pack: int | None = None,
    oversize: str = "split",
    materialize: bool = False,
    overwrite: bool = False,
    max_lost_fraction: float = DEFAULT_MAX_LOST_FRACTION,
    weights: dict | None = None,
    proportions: dict | None = None,
    tokens: int | None = None,
    storage_options: dict | None = None,
) -> PackIndex:
    """Pack every document of ``dataset`` (a store, a collection, or a path) into packs of at most
    ``capacity`` tokens and store the index.

    Args:
        capacity: tokens per pack (the training sequence length).
        algorithm: one of ``index_format.ALGORITHM_NAMES`` (see spec/packing.md).
        seed: seed of the shuffled algorithms (recorded for all).
        max_docs_per_pack: at most this many segments per pack.
        max_images_per_pack: at most this many images per pack (the image budget).
        oversize: what to do with documents longer than ``capacity``: ``split`` into segments,
            ``truncate`` to the first segment, or ``drop``. Never cuts through an image's tokens.
        materialize: also write the tokens (and loss mask) in pack order, one contiguous slice per pack.
        max_lost_fraction: warn (``LostTokensWarning``) when truncate/drop leave out more than this
            share of the dataset's tokens (see :func:`lost_tokens`); the index is written either way.
        weights: a collection only: ``{member or group name: weight}``, a weighted mixture
            (spec/COLLECTION.md §5): each document packed ``floor(w)`` times plus a seeded fraction,
            two copies never in one pack. Members no key names have weight 1.
        proportions: a collection only, instead of ``weights``: ``{member or group name: share}``,
            shares summing to 1 (spec/COLLECTION.md §5.1): the index holds ``tokens`` tokens (after
            oversize losses), each key's share of them to within half a document, its documents
            repeated in rounds when it holds too few. Members no key names are left out.
        tokens: with ``proportions``: the total; None: the largest total no key needs a second copy for.
    Returns:
        The new index, opened.
    """
    from .packing import pack_items, segment_documents

    store = as_dataset(dataset, storage_options=storage_options)
    is_collection = hasattr(store, "members")  # mixing needs named members: only a collection has them
    if is_collection:  # a pack-ordered layout's lookahead tokens are labels, never inputs (COLLECTION §9.2)
        from .collection.layout import refuse_laid_out

        refuse_laid_out(store.manifest, getattr(store, "url", None) or str(store.path))
        if getattr(store, "_stream", None) is None:  # (a streamed collection's members are not here: refused below)
            store.check_members_unchanged()  # C3: an index over a changed member would not open (validate says so too)
    if weights is not None and proportions is not None:
        raise WriteError("weights= and proportions= are two ways to mix; give one (weights: copies of each document; "
                         "proportions with tokens=: shares of the packed tokens)", field="proportions=",
                         expected="weights= or proportions=, not both", found="both",
                         cli="--weights and --proportions are two ways to mix; give one (--weights: copies of each "
                             "document; --proportions with --tokens: shares of the packed tokens)")
    if tokens is not None and proportions is None:
        raise WriteError("tokens= is the total of a mixture by proportion; give proportions= with it",
                         field="tokens=", expected="proportions= given", found="tokens= alone",
                         cli="--tokens is the total of a mixture by proportion; give --proportions NAME=SHARE,... with it")
    mixing = "weights" if weights is not None else "proportions" if proportions is not None else None
    if mixing and not is_collection:
        raise WriteError(f"{store.path}: {mixing}= mixes the members of a collection; this is a single store "
                         "(make a collection with packfmt.collection.write_collection first)", field=f"{mixing}=",
                         expected="a collection", found="a store",
                         cli=f"{store.path}: --{mixing} mixes the members of a collection; this is a single store "
                             "(make one with `packfmt merge`)")
    if algorithm not in IF.ALGORITHM_NAMES:
        raise WriteError(field="algorithm", expected=f"one of {list(IF.ALGORITHM_NAMES)}", found=repr(algorithm))
    if oversize not in IF.OVERSIZE_POLICIES:
        raise WriteError(field="oversize", expected=f"one of {list(IF.OVERSIZE_POLICIES)}", found=repr(oversize))
    if not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise WriteError(field="capacity", expected="integer >= 1", found=capacity)
    if not 0 <= max_lost_fraction <= 1:
        raise WriteError(field="max_lost_fraction", expected="a fraction in [0, 1]", found=max_lost_fraction)
    capacity = int(capacity)
    try:
        seed = IF.check_seed(seed, field="seed=")
    except FormatError as exc:
        raise WriteError(field="seed=", expected="None or an integer in [0, 2**63) (spec §4.1)", found=exc.found) from None
    for key, limit in (("max_docs_per_pack", max_docs_per_pack), ("max_images_per_pack", max_images_per_pack)):
        if limit is not None and (not isinstance(limit, (int, np.integer)) or isinstance(limit, bool) or limit < 1):
            raise WriteError(field=f"{key}=", expected="None (no limit) or an integer >= 1 (spec §4.1)", found=repr(limit))
    max_docs_per_pack = None if max_docs_per_pack is None else int(max_docs_per_pack)
    max_images_per_pack = None if max_images_per_pack is None else int(max_images_per_pack)
    if weights is not None:
        from .collection import mixture

        weights = mixture.check_weights(weights)
        resolved = mixture.member_weights([m.name for m in store.members], weights)
    if proportions is not None:
        from .collection import mixture
        from .collection import proportions as by_share

        proportions, tokens = by_share.check_proportions(proportions), by_share.check_tokens(tokens)
    name = IF.check_index_name(name or default_index_name(algorithm, capacity, seed, weights, proportions, tokens))
    target = store.path / F.PACKS_DIR / name
    _refuse_existing(target, name, overwrite)  # before the packing, not after it
    t0 = time.perf_counter()
    # int32 when every document fits (4 bytes per document, kept as is by segment_documents and
    # pack_items); the offsets' pages are handed back once read (packfmt._resident)
    bounds, are_lengths, per_member = store.segment_bounds()  # a collection holds its lengths: no offsets to diff
    if per_member is not None:
        raise ValueError(f"{store.path}: a streamed collection knows its members' sizes, not its documents' lengths; "
                         "pack the collection itself: packfmt.packindex.build_pack_index(URL or path, ...)")
    lengths = narrow(bounds) if are_lengths else narrow_lengths(bounds)
    del bounds
    plan_mixture = weights is not None or proportions is not None
    if plan_mixture:  # the mixture planners work on int64 lengths
        lengths = lengths.astype(np.int64, copy=False)
    spans, doc_image_offsets = relative_image_spans(store)
    try:
        seg = segment_documents(lengths, capacity, oversize, image_spans=spans, doc_image_offsets=doc_image_offsets)
    except ValueError as exc:  # an image run longer than capacity cannot be placed under any policy
        raise WriteError(f"capacity {capacity}: {exc}", field="capacity", expected=">= the longest image token run",
                         found=capacity) from None
    plan = None  # (copies, record head, per member fields)
    if weights is not None:
        plan = (mixture.document_copies(store.doc_start, resolved, seed or 0), {"weights": weights},
                [{"weight": float(w)} for w in resolved])
    elif proportions is not None:
        plan = by_share.plan_proportions([m.name for m in store.members], store.doc_start,
                                         mixture.kept_tokens(seg, lengths)[1], proportions, tokens, seed or 0)
    mixture_json, stat_lengths, num_tokens = None, lengths, store.num_tokens
    longest = int(lengths.max()) if lengths.size else 0
    if plan is None:
        if not seg.is_whole_documents:  # the segments keep their own lengths: 4 B per document less while packing
            stat_lengths = doc_summary(lengths, capacity)
            del lengths
        result = pack_items(seg.lengths, capacity, algorithm, seed=seed, max_items_per_pack=max_docs_per_pack,
                            image_counts=seg.image_counts if store.num_images else None,
                            max_images_per_pack=max_images_per_pack, compact=True)
    else:
        copies, head, member_fields = plan
        rounds = mixture.pack_rounds(seg, lengths, copies, capacity, algorithm, seed or 0, oversize,
                                     with_images=bool(store.num_images), max_items_per_pack=max_docs_per_pack,
                                     max_images_per_pack=max_images_per_pack)
        seg, result = rounds.items, rounds.result
        stat_lengths = np.repeat(lengths, copies)  # the mixture's document copies
        num_tokens = int(stat_lengths.sum(dtype=np.int64))
    image_counts = seg.image_counts if store.num_images else None
    pack_offsets = np.ascontiguousarray(result.pack_offsets, dtype=F.OFFSET_DTYPE)
    seconds = time.perf_counter() - t0
    target.parent.mkdir(exist_ok=True)
    _refuse_existing(target, name, overwrite)  # (again: another process may have written it meanwhile)
    tmp = temp_sibling(target)
    try:
        files = {}
        f = HashedFile(tmp / F.PACK_OFFSETS)
        f.write_array(pack_offsets, F.OFFSET_DTYPE)
        files[F.PACK_OFFSETS] = f.close()
        files[F.SEGMENTS], pack_tokens = write_segments(tmp / F.SEGMENTS, seg, result)
        whole = plan is None and seg.is_whole_documents  # every token of the dataset in the packs, once
        _check_built(pack_offsets, pack_tokens, result.n_items, capacity, tmp, store.num_tokens if whole else None)
        stats = index_stats(stat_lengths, seg, result, capacity, image_counts, pack_tokens=pack_tokens)
        stats["seconds"] = round(seconds, 6)
        packed_tokens = stats["tokens"]
        if materialize:
            files.update(write_packed_tokens(store, tmp, seg, result.order, pack_tokens))
        if plan is not None:  # per member sums: the order of the items does not matter
            mixture_json = mixture.mixture_record(head, seed or 0, [m.name for m in store.members], member_fields,
                                                  store.doc_start, copies, seg.item_docs(), seg.lengths,
                                                  rounds.packs_per_round)
            if proportions is not None:
                mixture_json["shares"] = by_share.key_shares(mixture_json)
        index = {
            "format": F.PACK_INDEX_FORMAT_NAME,
            "format_version": "1.1" if is_collection else F.FORMAT_VERSION_STR,
            "producer": {"name": "packfmt", "version": __version__},
            "name": name,
            "capacity": capacity,
            "algorithm": algorithm,
            "seed": seed,
            "oversize": oversize,
            "params": {"max_docs_per_pack": max_docs_per_pack, "max_images_per_pack": max_images_per_pack},
            "counts": {"packs": result.n_packs, "segments": result.n_items, "packed_tokens": packed_tokens},
            "stats": stats,
            "materialized": bool(materialize),
            **store.index_binding(),
            "files": files,
        }
        if mixture_json is not None:
            index["mixture"] = mixture_json
        write_durably(tmp / F.PACK_INDEX_JSON, F.canonical_json(index))
        publish_dir(tmp, target, overwrite=overwrite)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if store.origin is not None:  # opened from a URL: upload the index, index.json last (packfmt.storage)
        from .storage.upload import upload_index

        upload_index(store.path, store.origin, name)
    lost = lost_tokens(stats, num_tokens, max_lost_fraction)
    if lost["exceeded"]:
        warnings.warn(LostTokensWarning(
            f"{target}: oversize={oversize!r} left out {lost['tokens']:,} of {num_tokens:,} tokens "
            f"({lost['fraction']:.2%}), more than max_lost_fraction={max_lost_fraction}; keep them with "
            f"oversize='split', or a larger capacity= (longest document: {longest:,} tokens)"), stacklevel=2)
    # Opened without re-reading what was just written: its segments lie inside their documents
    # and its packs within capacity by construction (segment_documents, pack_items, _check_built)
    return PackIndex(store, name, _built_pack_lengths=pack_tokens)


def _check_built(pack_offsets: np.ndarray, pack_tokens: np.ndarray, n_segments: int, capacity: int, where: Path,
                 tokens: int | None = None) -> None:
    """The pack bounds of a new index (spec §4.2: V25, V29), from the packer's own outputs in O(packs).

    Every row of ``segments.bin`` comes from ``segment_documents`` (inside its document, V27) and
    every segment is in exactly one pack (``pack_items``); what is left to hold is checked here
    rather than by reading the written files back. ``tokens``: what the packs hold in all when known
    (whole documents: the dataset's, which the rows' lengths, taken from the packing, must add up to).
    A failure is a packfmt bug, never bad input.
    """
    po = pack_offsets
    ok = po.shape[0] >= 1 and int(po[0]) == 0 and int(po[-1]) == n_segments and bool(np.all(po[1:] > po[:-1]))
    if ok and pack_tokens.size:
        ok = int(pack_tokens.max()) <= capacity and int(pack_tokens.min()) >= 1
    if ok and tokens is not None:
        ok = int(pack_tokens.sum(dtype=np.int64)) == tokens
    if not ok:
        raise WriteError(f"{where}: internal error: the packs computed break spec §4.2 (pack offsets or pack "
                         "lengths); nothing was published; please report this with the command",
                         file=str(where), field="packs", expected="non-empty packs within capacity, holding every token once", found="other")


def lost_tokens(stats: dict, num_tokens: int, max_lost_fraction: float = DEFAULT_MAX_LOST_FRACTION) -> dict:
    """Tokens a pack index leaves out (truncated + dropped) against the dataset's ``num_tokens``.

    Returns ``{"tokens", "fraction", "max_fraction", "exceeded"}`` (``exceeded``: fraction > max_fraction).
    """
    lost = int(stats.get("truncated_tokens", 0)) + int(stats.get("dropped_tokens", 0))
    fraction = lost / num_tokens if num_tokens else 0.0
    return {"tokens": lost, "fraction": fraction, "max_fraction": max_lost_fraction,
            "exceeded": fraction > max_lost_fraction}


def doc_summary(doc_lengths: np.ndarray, capacity: int) -> tuple[int, int]:
    """``(documents, their tokens with each document clipped to capacity)``: what ``index_stats`` reads
    of the document lengths, so a caller may let go of them before packing."""
    lengths = np.asarray(doc_lengths)  # int32 or int64, summed in int64 (no widened copy)
    over = np.flatnonzero(lengths > capacity)
    clipped = int(lengths.sum(dtype=np.int64)) - int(lengths[over].sum(dtype=np.int64)) + capacity * int(over.size)
    return int(lengths.shape[0]), clipped


def index_stats(doc_lengths, seg, result, capacity: int, image_counts: np.ndarray | None = None,
                pack_tokens: np.ndarray | None = None) -> dict:
    """The ``stats`` of ``index.json`` (spec FORMAT §4, all but ``seconds``) from the inputs and outputs of packing.

    Args:
        doc_lengths: int (n_docs,) the store's document lengths, or their ``doc_summary``.
        seg: the ``Segmentation`` of those documents; result: the ``PackResult`` of its segments.
        pack_tokens: tokens per pack when already summed (else ``pack_stats`` sums them).

    O(n_documents) time and no temporary larger than one array of lengths (O(packs) for whole documents
    with ``pack_tokens``): every document with a segment is packed, so ``documents_packed`` is
    ``documents - dropped_documents`` (no search for distinct documents among the segments).
    """
    from .packing import Segmentation, pack_stats

    stats = pack_stats(seg.lengths, result, capacity, image_counts=image_counts, pack_tokens=pack_tokens)
    if isinstance(doc_lengths, tuple):
        n_docs, clipped_tokens = doc_lengths
    elif isinstance(seg, Segmentation) and seg.is_whole_documents:  # none over capacity: clipping keeps every token
        n_docs, clipped_tokens = int(doc_lengths.shape[0]), stats["tokens"]
    else:
        n_docs, clipped_tokens = doc_summary(doc_lengths, capacity)
    stats.update({
        "documents": n_docs,
        "documents_packed": n_docs - int(seg.dropped_docs),
        "segments": result.n_items,
        "dropped_documents": int(seg.dropped_docs),
        "dropped_tokens": int(seg.dropped_tokens),
        "split_documents": int(seg.split_docs),
        "truncated_documents": int(seg.truncated_docs),
        "truncated_tokens": int(seg.truncated_tokens),
        "packs_per_lower_bound": float(stats["packs"] / stats["lower_bound"]) if stats["lower_bound"] else 1.0,
        "padding_baseline_efficiency": float(clipped_tokens / max(1, n_docs * capacity)),
    })
    return stats
