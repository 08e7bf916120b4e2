"""C6 of a pack-ordered layout's index (spec/COLLECTION.md §9): the checks ``collection.validate`` runs on the index a
``layout`` names, beside the collection index checks (``_CollectionIndexChecks`` mixes this class in): the record
against the index, the coverage rule of §9.2, and the per-shard digests and pack lengths of §9.4."""

from __future__ import annotations

import numpy as np

from .. import format as F
from ..validation.report import _listed
from . import shard_rows as R

__all__ = ["LayoutChecks"]


class LayoutChecks:
    """Mixed into a collection's index checks (``self.ds``: the collection view, ``self.out``, ``self.pm`` ...)."""

    def _laid_out(self) -> bool:
        return self.ds.layout is not None and self.ds.layout["index"] == self.name

    def _layout_structural(self) -> None:
        """C6 (structural): the packs the record counts, and the two files of §9.4 listed together, from 1.2."""
        if self.pm.num_packs != sum(self.ds.layout["member_packs"]):
            self.out.add(F.MANIFEST, "layout.member_packs", f"packs summing to {self.pm.num_packs} (counts.packs of "
                         f"{self.file(F.PACK_INDEX_JSON)})", sum(self.ds.layout["member_packs"]))
        listed = [k for k in (R.SHARD_DIGESTS, R.PACK_TOKENS) if k in self.pm.files]
        if listed and (len(listed) == 1 or self.pm.version < R.ROWS_VERSION):
            self.out.add(self.file(F.PACK_INDEX_JSON), "files", f"both {R.SHARD_DIGESTS} and {R.PACK_TOKENS}, in an "
                         f"index of format {R.ROWS_VERSION_STR} or newer (spec/COLLECTION.md §9.4)",
                         f"{listed} in format {self.pm.version[0]}.{self.pm.version[1]}")

    def _optional_files(self) -> dict:
        """A layout's index (§9.4): the digests of each shard's rows and each pack's length."""
        if not self._laid_out():
            return {}
        k, p = len(self.ds.layout["member_packs"]), self.pm.num_packs
        return {R.SHARD_DIGESTS: (R.DIGEST_DTYPE, (k, 2), f"layout.member_packs: {k} shards"),
                R.PACK_TOKENS: (R.PACK_TOKENS_DTYPE, (p,), f"counts.packs={p}")}

    def _shard_rows(self, segs, po) -> None:
        """C6 of §9.4 (deep): the digests of every shard's rows and every pack's length, when listed."""
        if self.ds.coll is None or not R.listed(self.pm.files) or not all(self.sizes_ok.get(k) for k in self.layout):
            return
        c, d = R.bounds(self.ds.layout["member_packs"], np.diff(np.asarray(self.ds.coll.doc_start)))
        # every shard's rows start at its first document (pack_offsets[c_k] = D_k): else a shard boundary cuts a pack
        # or the record miscounts a member's packs, which C6 reports (_layout_coverage), and there are no rows to hash
        if c[-1] == po.shape[0] - 1 and d[-1] == segs.shape[0] and np.array_equal(np.asarray(po)[c], d):
            R.validate_rows(self.out, self.label, po, segs, c, d, self.array(R.SHARD_DIGESTS), self.array(R.PACK_TOKENS))

    def _layout_coverage(self, segs, po, seg_len, doc_len, per_doc) -> None:
        """C6 (spec/COLLECTION.md §9): segment ``s`` is document ``s`` as ``[0, L)`` or ``[0, L - 1)``, the
        lookahead token a training target outside every image run; each pack inside one member, the members
        holding ``layout.member_packs`` packs; the ``stats`` as V33 over the covered lengths."""
        label, layout, n = self.file(F.SEGMENTS), self.ds.layout, doc_len.shape[0]
        rule = f"(layout {layout['kind']!r}, manifest.json layout.index = {self.name!r})"
        docs = segs[:, 0]
        if segs.shape[0] != n or not np.array_equal(docs, np.arange(n)):
            m = min(n, docs.shape[0])
            diff = np.flatnonzero(docs[:m] != np.arange(m))
            k = int(diff[0]) if diff.size else m
            self.out.add(label, "coverage", f"segment s is document s, {n} segments for {n} documents {rule}",
                         f"{segs.shape[0]} segments; segment {k} is " + (f"document {int(docs[k])}" if k < docs.shape[0]
                                                                        else "missing"))
            return
        length = doc_len[docs]
        ahead = segs[:, 2] == length - 1
        bad = np.flatnonzero((segs[:, 1] != 0) | ~((segs[:, 2] == length) | ahead))
        if bad.size:
            d, b, e = (int(v) for v in segs[bad[0]])
            self.out.add(label, "coverage", f"every segment [0, L) or [0, L - 1) of its document {rule}",
                         f"segment {int(bad[0])} is [{b}, {e}) of document {d} of length {int(length[bad[0]])} "
                         f"({bad.size} segment(s): {_listed(bad)})")
            return
        if int(ahead.sum()) != layout["lookahead_tokens"]:
            self.out.add(F.MANIFEST, "layout.lookahead_tokens", f"{int(ahead.sum())} (segments ending at L - 1)",
                         layout["lookahead_tokens"])
        self._lookahead_tokens(np.flatnonzero(ahead), rule)
        member = np.searchsorted(self.ds.coll.doc_start, docs, side="right") - 1 if self.ds.coll is not None else None
        if member is not None:
            first, last = member[po[:-1]], member[po[1:] - 1]
            if not np.array_equal(first, last):
                p = int(np.flatnonzero(first != last)[0])
                self.out.add(self.file(F.PACK_OFFSETS), f"[{p}]", f"every pack inside one member {rule}",
                             f"pack {p} spans members {int(first[p])} to {int(last[p])}")
            elif np.bincount(first, minlength=len(layout["member_packs"])).tolist() != layout["member_packs"]:
                self.out.add(F.MANIFEST, "layout.member_packs", np.bincount(first, minlength=len(layout["member_packs"]))
                             .tolist(), layout["member_packs"])
        covered = seg_len  # the V33 counts of the documents as the index covers them: nothing split, dropped or cut
        self._stats_of(int(seg_len.sum()), int(po.shape[0] - 1), int(segs.shape[0]), covered, per_doc, 0)

    def _lookahead_tokens(self, docs: np.ndarray, rule: str) -> None:
        """The last token of each document in ``docs`` is a lookahead: a training target (mask 1), in no image run."""
        if docs.size == 0:
            return
        off = np.asarray(self.ds.array(F.DOC_OFFSETS))
        at = off[docs + 1] - 1
        mask = self.ds.array(F.LOSS_MASK) if self.ds.m.has_loss_mask else None
        if mask is not None:
            bad = docs[np.asarray(mask[at]) != 1]
            if bad.size:
                self.out.add(self.file(F.SEGMENTS), "coverage", f"a lookahead token (the last of a document covered as "
                             f"[0, L - 1)) is a training target, loss mask 1 {rule}",
                             f"mask 0 at the last token of document(s) {_listed(bad)}")
        spans = self.ds.array(F.IMAGE_TOKEN_SPANS) if self.ds.m.num_images else None
        if spans is not None and spans.shape[0]:
            i = np.searchsorted(spans[:, 0], at, side="right") - 1
            inside = (i >= 0) & (spans[np.maximum(i, 0), 1] > at)
            if inside.any():
                self.out.add(self.file(F.SEGMENTS), "coverage", f"a lookahead token in no image run {rule}",
                             f"the last token of document(s) {_listed(docs[inside])} lies in an image run")
