"""``packfmt validate`` of a collection (spec/COLLECTION.md §3): C1-C5, per member and whole.

Structural: the collection manifest (C1), each member's manifest checksum (C3), counts and shared
keys (C2), each member's own structural checks (``validate`` of the member, its problems named by
member), and each collection pack index's structural checks (the store's index checks with the
collection's document offsets, C5). Deep: each member deep (C4) and each collection index deep;
an index packed with a mixture has its coverage checked round by round (§5) and its ``mixture``
record compared with the segments.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from .. import format as F
from ..errors import PackfmtError
from ..validation.directory import index_dirs, validate_store
from ..validation.index import _IndexChecks
from ..validation.report import (
    WARNING,
    Problem,
    _Collector,
    parsed_or_reported,
)
from .validate_layout import LayoutChecks

__all__ = ["validate_collection"]


def validate_collection(root: Path, report, *, deep: bool, progress: bool, decode_images: bool, record=None,
                        obj: dict | None = None):
    """Fill ``report`` (a ``packfmt.validate.Report``) with every problem of the collection at ``root``; ``obj``: its
    manifest's JSON, when the caller has read it (``packfmt.validate``: read and parsed once per command).

    ``record``: for a mirror of a collection in object storage that lacks its ``doc_lengths.bin`` (the cache
    leaves out one missing from the bucket), a function giving that file's bytes from the bucket (None when
    it is not there)."""
    from .manifest import collection_reader, parse_collection_manifest

    out = _Collector(report)
    cm = parsed_or_reported(lambda: parse_collection_manifest(F.read_json(root / F.MANIFEST, file=F.MANIFEST)  # C1
                                                              if obj is None else obj, file=F.MANIFEST,
                                                              read=collection_reader(root)), out, F.MANIFEST)
    if cm is None:
        return report
    report.checked.update(members=len(cm.members), documents=cm.num_documents, tokens=cm.num_tokens,
                          images=cm.num_images)
    if deep:
        failed = {m for m in range(len(cm.members)) if not _check_member(root, cm, m, out, deep, progress, decode_images)}
        lengths = None
    else:  # a member with nothing to report passes the reader's own checks of it, read once (member_checks)
        lengths, failed = _structural_members(root, cm, out, decode_images)
    members_ok = not failed
    _check_lengths_record(root, cm, out, lengths, failed, record)  # C7: doc_lengths.bin against the members' own
    listed = set(cm.files)
    for p in sorted(root.iterdir()):  # members/: a Ray build's stores; shards/: a pack-ordered layout's (§1)
        if p.name not in (F.MANIFEST, F.PACKS_DIR, "members", "shards", *listed):
            out.add(p.name, None, severity=WARNING, detail="unknown entry in a collection directory; readers ignore it")
    view = _CollectionView(root, cm, out, members_ok, lengths)
    names = index_dirs(root, out)
    if view.layout is not None and view.layout["index"] not in names:  # C6 (structural)
        out.add(F.MANIFEST, "layout.index", f"a pack index {F.PACKS_DIR}/{view.layout['index']}/ (the index the members "
                "hold in pack order)", f"no such index (indexes: {names or 'none'})")
    indexes = [_CollectionIndexChecks(view, name) for name in names]
    for ix in indexes:
        ix.structural()
    report.checked["pack_indexes"] = len(indexes)
    if deep:
        for ix in indexes:
            ix.deep(None)
    return report


def _structural_members(root: Path, cm, out, decode_images: bool) -> tuple[np.ndarray, set]:
    """C2, C3 and every member's structural checks; the collection's document lengths (read from the members,
    those of a failed member unset), and the members that have an error. A member that passes
    ``member_doc_lengths``' checks with ``bare`` (C2, C3, V1-V11, V13, a known version and only the format's files
    listed) has nothing to report; any other takes ``_check_member``, which reports it all. No member's directory is
    listed (what it holds besides its files, and its own pack indexes, are C4's: ``--deep``): a member costs seven
    system calls (its manifest read, ``tokens.bin`` sized, ``doc_offsets.bin`` read; benchmarks/bench_members.py
    ``--syscalls``)."""
    from ..dataset import running_sum
    from .member_checks import member_doc_lengths

    failed: set = set()

    def slow(m: int):
        if not _check_member(root, cm, m, out, False, False, decode_images):
            failed.add(m)
            return None
        offsets = np.fromfile(root / cm.members[m].path / F.DOC_OFFSETS, dtype=F.OFFSET_DTYPE)  # V13 held
        return np.diff(offsets)

    doc_start = running_sum(cm.members.documents)
    lengths = member_doc_lengths(root, cm, doc_start, slow, bare=True)
    return lengths, failed


def _check_lengths_record(root: Path, cm, out, lengths: np.ndarray | None, failed: set, remote=None) -> None:
    """C7: ``doc_lengths.bin``, when the manifest lists it, exists (a warning: readers then use the members) with its
    size and checksum, its contents agree with the counts, and each member that passed its checks has exactly its slice of it (``lengths``: the
    members' own, from their ``doc_offsets.bin``; None: read here)."""
    from ..dataset import running_sum
    from ..mapped import map_bytes
    from .lengths import LENGTHS_FILE, check_record, member_lengths_problem

    entry = cm.files.get(LENGTHS_FILE)
    if entry is None:
        return
    raw = None
    if (root / LENGTHS_FILE).is_file():
        raw = map_bytes(root / LENGTHS_FILE)  # checked in place, as readers do (no private copy)
    elif remote is not None:
        raw = remote(entry.bytes + 1)
    if raw is None:
        out.add(LENGTHS_FILE, None, f"{entry.bytes} bytes (listed in {F.MANIFEST} files)", "missing",
                detail=f"missing (listed in {F.MANIFEST} files with {entry.bytes} bytes); readers read every "
                "member's lengths instead (slower, as valid); run `packfmt merge` again to write it", severity=WARNING)
        return
    try:
        record = check_record(raw, cm)
    except PackfmtError as exc:
        out.from_error(exc, LENGTHS_FILE)
        return
    if lengths is not None and not failed and np.array_equal(lengths, record):
        return  # the one comparison of a valid collection
    doc_start = running_sum(cm.members.documents)
    for m, x in enumerate(cm.members):
        if m in failed:
            continue  # its own problems are reported; its lengths are not known
        a, b = int(doc_start[m]), int(doc_start[m + 1])
        where = root / x.path / F.DOC_OFFSETS
        own = lengths[a:b] if lengths is not None else np.diff(np.fromfile(where, dtype=F.OFFSET_DTYPE))
        problem = member_lengths_problem(cm, m, a, own, record[a:b], where)
        if problem is not None:
            out.from_error(problem, LENGTHS_FILE)


def _check_member(root: Path, cm, m: int, out, deep: bool, progress: bool, decode_images: bool) -> bool:
    """C2, C3 and the member's own checks (C4 when ``deep``); True when the member has no error."""
    from .manifest import is_collection
    from .member_checks import manifest_checksum, member_problems
    from .reader import nested_collection_error

    entry = cm.members[m]
    path = root / entry.path
    try:  # read once: the nested-collection check, the member's own checks and C2 / C3 share its bytes
        raw = F.read_json_bytes(path / F.MANIFEST, file=F.MANIFEST)
        obj = F.parse_json(raw, file=F.MANIFEST)
    except (PackfmtError, OSError):
        obj = None  # validate_store reads it again and names the problem
    if obj is not None and is_collection(obj):
        nested = nested_collection_error(root, m, entry)
        if nested is not None:  # not validated as a collection: a collection listing itself would recurse forever
            out.from_error(nested, F.MANIFEST)
            return False
    before = len(out.report.errors)
    # structural: C2's checks of the member, its directory not listed (its strays and own indexes are C4's, deep)
    sub = validate_store(path, deep=deep, progress=progress, decode_images=decode_images, obj=obj, listed=deep)
    for p in sub.problems:
        file = f"{entry.path}/{p.file}"
        out.report.problems.append(Problem(file, p.field, p.expected, p.found,
                                             f"member {entry.name!r} ({entry.path}): {p.message}", p.severity))
    if obj is not None:
        try:
            sm = F.parse_manifest(obj, file=F.MANIFEST)
        except PackfmtError as exc:
            sm = None
            if sub.ok:  # e.g. a collection listed as a member: valid on its own, not a store (C2)
                out.add(F.MANIFEST, f"members[{m}].path", f"a store (C2; {entry.path}: {exc})", entry.path)
        if sm is not None:
            for exc in member_problems(cm, m, manifest_checksum(raw), sm, path / F.MANIFEST):
                out.from_error(exc, F.MANIFEST)
    return len(out.report.errors) == before


class _CollectionView:
    """What the index checks of ``packfmt.validate`` ask of a dataset, answered for a collection."""

    def __init__(self, root: Path, cm, out, members_ok: bool, lengths: np.ndarray | None = None) -> None:
        from .layout import layout_of
        from .reader import Collection

        self.root, self.out = root, out
        self.layout = layout_of(cm)  # a pack-ordered layout (§9): its index has its own coverage rule
        self.m = SimpleNamespace(np_token_dtype=F.TOKEN_DTYPES[cm.shared["token_dtype"]],
                                 has_loss_mask=cm.shared["loss_mask"], num_images=cm.num_images)
        self._members, self._binding = cm.members, None
        self.coll = Collection._of_manifest(root, cm) if members_ok else None
        self.doc_offsets_ok = self.spans_ok = members_ok
        self._arrays: dict = {}
        if members_ok and lengths is not None:  # every member's lengths, read and checked with the members
            self._arrays[F.DOC_OFFSETS] = offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])

    @property
    def member_names(self) -> list[str]:
        return self._members.names

    def binding(self) -> dict:
        from .manifest import member_list_checksum

        if self._binding is None:  # only a collection with pack indexes asks
            self._binding = {"collection": member_list_checksum(self._members)}
        return self._binding

    def array(self, name: str):
        """Collection-wide doc offsets, image token spans, and tokens / loss mask gathered across members."""
        if self.coll is None:
            return None
        if name not in self._arrays:
            from .arrays import image_token_spans, token_sources

            if name == F.DOC_OFFSETS:
                self._arrays[name] = self._doc_offsets()
            elif name == F.IMAGE_TOKEN_SPANS:
                self._arrays[name] = image_token_spans(self.coll)
            elif name in (F.TOKENS, F.LOSS_MASK):
                tokens, mask = token_sources(self.coll)
                self._arrays[F.TOKENS], self._arrays[F.LOSS_MASK] = tokens, mask
        return self._arrays.get(name)


    def _doc_offsets(self) -> np.ndarray:
        """The collection's doc offsets from each member's ``doc_offsets.bin``, read once: every member passed its
        own structural checks (V13) and C2 / C3 above, so no member is opened (and checked) a second time."""
        coll = self.coll
        out = np.zeros(coll.num_documents + 1, dtype=np.int64)
        for m, entry in enumerate(coll.members):
            a, b = int(coll.doc_start[m]), int(coll.doc_start[m + 1])
            offsets = np.fromfile(self.root / entry.path / F.DOC_OFFSETS, dtype=F.OFFSET_DTYPE)
            out[a + 1:b + 1] = offsets[1:] + (out[a] - offsets[0])
        return out


class _CollectionIndexChecks(LayoutChecks, _IndexChecks):
    """A collection's pack index: the store's index checks, and a mixture's rounds and record (§5)."""

    def _bounded_deep(self) -> bool:
        return super()._bounded_deep() and not self._laid_out()

    def structural(self) -> None:
        super().structural()
        if self.pm is not None and self._laid_out():
            self._layout_structural()
        self._copies_asked = self._mixture_structural() if self.pm is not None else None

    def _mixture_structural(self):
        """C5 (structural) of a ``mixture``: its keys and types, as the reader checks them when it opens the index,
        and what it asked for resolving (its keys name members, its shares plan an index): what ``inspect`` reads.
        ``(copies, head, member fields)`` recomputed from it, or None (no mixture, or a problem reported)."""
        from .mixture_record import check_mixture_record
        from .proportions import copies_of_record

        if "mixture" not in self.pm.raw:  # (a null one is no object: refused, as the reader refuses it)
            return None
        mixture = self.pm.raw["mixture"]
        label = self.file(F.PACK_INDEX_JSON)
        try:
            check_mixture_record(mixture, file=label, names=self.ds.member_names, packs=self.pm.num_packs)
            if self.ds.coll is None:  # a member failed: its lengths, which the plan needs, are not known
                return None
            return copies_of_record(self.ds.coll, mixture, self.pm.capacity, self.pm.oversize, file=label)
        except PackfmtError as exc:
            self.out.from_error(exc, label)
            return None

    def _coverage_and_stats(self, segs, po, seg_len, length, doc_len, per_doc) -> None:
        if self._laid_out():
            self._shard_rows(segs, po)
            return self._layout_coverage(segs, po, seg_len, doc_len, per_doc)
        mixture = self.pm.raw.get("mixture")
        if mixture is None:
            return super()._coverage_and_stats(segs, po, seg_len, length, doc_len, per_doc)
        copies = self._copies(mixture)
        if copies is None:
            return
        rounds = np.concatenate([[0], np.cumsum(mixture["rounds"])]).astype(np.int64)
        for r in range(len(mixture["rounds"])):
            a, b = int(po[rounds[r]]), int(po[rounds[r + 1]])
            per_round = np.bincount(segs[a:b, 0], minlength=doc_len.shape[0])
            self._coverage(segs[a:b], length[a:b], doc_len, per_round, wanted=copies > r,
                           where=f" in mixture round {r} (packs {int(rounds[r])}..{int(rounds[r + 1]) - 1})")
        self._stats(segs, po, seg_len, doc_len, per_doc, copies=copies)
        self._record(mixture, copies, segs, seg_len)

    def _copies(self, mixture) -> np.ndarray | None:
        """copies(d) from what the record asked for (weights, or proportions and tokens) and its seed, recomputed by
        the structural check; None when the record is unusable (reported there) or has another number of rounds."""
        if self._copies_asked is None:
            return None
        copies, self._head, self._member_fields = self._copies_asked
        most = int(copies.max()) if copies.size else 0
        if len(mixture["rounds"]) != most:
            self.out.add(self.file(F.PACK_INDEX_JSON), "mixture.rounds", f"{most} rounds (the most copies of a "
                         "document)", len(mixture["rounds"]))
            return None
        return copies

    def _record(self, mixture, copies, segs, seg_len) -> None:
        """The rest of ``mixture`` agrees with what it asked for and with the segments (spec/COLLECTION.md §5)."""
        from .mixture import mixture_record
        from .proportions import key_shares

        coll = self.ds.coll
        want = mixture_record(self._head, mixture["seed"], [m.name for m in coll.members], self._member_fields,
                              coll.doc_start, copies, segs[:, 0], seg_len, mixture["rounds"])
        label = self.file(F.PACK_INDEX_JSON)
        for key in ("target", "plan", "members"):
            if key in want and mixture.get(key) != want[key]:
                self.out.add(label, f"mixture.{key}", want[key], mixture.get(key))
        _shares_agree(self.out, label, "mixture.proportions", want["proportions"], mixture.get("proportions"))
        if "target" in want:
            shares = key_shares(want)
            have = mixture.get("shares")
            if not (isinstance(have, dict) and set(have) == set(shares)
                    and all(isinstance(have[k], dict) and have[k].get("tokens") == v["tokens"] for k, v in shares.items())):
                self.out.add(label, "mixture.shares", shares, have)
            else:
                _shares_agree(self.out, label, "mixture.shares", {k: v["share"] for k, v in shares.items()},
                              {k: v.get("share") for k, v in have.items()})


def _shares_agree(out, label: str, field: str, want: dict, have) -> None:
    """``have`` maps the same names as ``want`` to numbers within 1e-9 of its shares."""
    if not (isinstance(have, dict) and set(have) == set(want)
            and all(isinstance(have[k], (int, float)) and not isinstance(have[k], bool) and abs(have[k] - v) <= 1e-9
                    for k, v in want.items())):
        out.add(label, field, want, have)
