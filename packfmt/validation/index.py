"""Checks of one pack index against its ``index.json`` and its store (spec FORMAT §6, V21-V33)."""

from __future__ import annotations

import numpy as np

from .. import checks
from .. import format as F
from .. import index_format as IF
from .report import (
    CHUNK_ELEMS,
    WARNING,
    _check_offsets,
    _listed,
    _map_file,
    _minor_version_note,
    parsed_or_reported,
)
from .segment_rows import CoverageRows, image_rows, segments_in_chunks
from .store import _check_checksum, _check_file_size, _DatasetChecks


# ----------------------------------------------------------------------------- pack indexes
class _IndexChecks:
    """Checks of one ``packs/<name>/`` directory against its ``index.json`` and the token store."""

    def __init__(self, ds: _DatasetChecks, name: str) -> None:
        self.ds, self.name, self.out = ds, name, ds.out
        self.dir = ds.root / F.PACKS_DIR / name
        self.label = f"{F.PACKS_DIR}/{name}/"
        self.pm: IF.PackIndexManifest | None = None
        self.layout: dict = {}
        self.sizes_ok: dict[str, bool] = {}
        self.offsets_ok = False
        self.segments_ok = False  # V27 and V29 hold (structural)

    def file(self, name: str) -> str:
        return self.label + name

    # -- structural
    def structural(self) -> None:
        json_label = self.file(F.PACK_INDEX_JSON)
        self.pm = parsed_or_reported(lambda: IF.parse_pack_index_manifest(
            F.read_json(self.dir / F.PACK_INDEX_JSON, file=json_label), file=json_label), self.out, json_label)
        if self.pm is None:
            return
        _minor_version_note(self.pm.version, json_label, self.out, F.KNOWN_INDEX_VERSION)
        if self.pm.name != self.name:  # V22 (the rest of V21/V22: format.parse_pack_index_manifest)
            self.out.add(json_label, "name", repr(self.name) + " (its directory name)", repr(self.pm.name))
        m = self.ds.m
        self._binding(json_label)  # V23 (a collection's index: COLLECTION C5)
        n_packed = self.pm.raw.get("counts", {}).get("packed_tokens")
        if self.pm.materialized and not (isinstance(n_packed, int) and n_packed >= 0):
            self.out.add(json_label, "counts.packed_tokens", "an integer >= 0 (materialized index)", repr(n_packed))
            n_packed = None
        self.layout = IF.pack_index_layout(self.pm, m.np_token_dtype, m.has_loss_mask, n_packed)
        more = self._optional_files()  # name -> (dtype, shape, what the shape comes from): listed ones are checked
        self.layout.update({k: v[:2] for k, v in more.items() if k in self.pm.files})
        for fname, entry in sorted(self.pm.files.items()):  # V24
            source = "counts.packs" if fname in (F.PACK_OFFSETS, F.PACK_TOKEN_OFFSETS) else (
                "counts.segments" if fname == F.SEGMENTS else "counts.packed_tokens")
            note = more[fname][2] if fname in more else f"{source}={self.pm.raw['counts'].get(source.split('.')[1])}"
            self.sizes_ok[fname] = _check_file_size(self.out, self.dir / fname, self.file(fname), entry,
                                                    self.layout.get(fname), note)
        for fname in self.layout:
            if fname not in self.pm.files:
                self.sizes_ok[fname] = False
                self.out.add(json_label, f"files.{fname}", "an entry", "missing")
        for fname in sorted(set(self.pm.files) - set(self.layout)):
            if fname == F.PACKED_LOSS_MASK and self.pm.materialized and not m.has_loss_mask:
                self.out.add(json_label, f"files.{fname}", "absent (the dataset has no loss mask)", "listed")
            elif fname in (F.PACK_TOKEN_OFFSETS, F.PACKED_TOKENS, F.PACKED_LOSS_MASK) and not self.pm.materialized:
                self.out.add(json_label, "materialized", f"true (files lists {fname})", "false")
            elif fname not in (F.PACKED_TOKENS, F.PACKED_LOSS_MASK):
                self.out.add(self.file(fname), None, severity=WARNING,
                             detail="listed in index.json but not a file of a pack index; readers ignore it")
        known = set(self.pm.files) | {F.PACK_INDEX_JSON}
        for p in sorted(self.dir.iterdir()):
            if p.name not in known:
                self.out.add(self.file(p.name), None, severity=WARNING, detail="unknown file, not listed in index.json")
        self._offsets(n_packed)  # V25

    def _optional_files(self) -> dict:
        """Optional files this kind of index may list: name -> (dtype, shape, what the shape comes from)."""
        return {}

    def _binding(self, json_label: str) -> None:
        want, have = self.ds.binding(), self.pm.binding
        if set(want) != set(have):
            self.out.add(json_label, sorted(have)[0], f"{sorted(want)[0]!r} (this index must bind to "
                         f"{'a collection' if 'collection' in want else 'a single store'})",
                         f"{sorted(have)[0]!r} (built for {'a collection' if 'collection' in have else 'a store'}; "
                         "pack it again here)")
            return
        if "collection" in want:
            if have["collection"] != want["collection"]:
                self.out.add(json_label, "collection", f"{want['collection']} (manifest.json: the member list this "
                             "index must describe)", f"{have['collection']} (built for another member list? pack it again)")
            return
        for key, expected in want["dataset"].items():
            if have["dataset"][key] != expected:
                self.out.add(json_label, f"dataset.{key}", f"{expected} (manifest.json: the token store "
                             "this index must describe)", f"{have['dataset'][key]} (built for another token store?)")

    def array(self, fname: str) -> np.ndarray | None:
        if not self.sizes_ok.get(fname) or fname not in self.layout:
            return None
        dtype, shape = self.layout[fname]
        return _map_file(self.dir / fname, dtype, shape)

    def _offsets(self, n_packed: int | None) -> None:
        po = self.array(F.PACK_OFFSETS)
        if po is not None:
            self.offsets_ok = _check_offsets(self.out, self.file(F.PACK_OFFSETS), po, rule="V25",
                                             last=self.pm.num_segments, last_what="counts.segments", strict=True,
                                             unit="every pack has >= 1 segment")
        pto = self.array(F.PACK_TOKEN_OFFSETS)
        pto_ok = pto is not None and n_packed is not None and _check_offsets(
            self.out, self.file(F.PACK_TOKEN_OFFSETS), pto, rule="V25", last=n_packed,
            last_what="counts.packed_tokens", strict=False, unit="tokens per pack")
        self._segments(pto if pto_ok else None)

    def _segments(self, pto: np.ndarray | None) -> None:
        """V27, V29: what the reader checks when it opens the index."""
        segs, po, off = self.array(F.SEGMENTS), self.array(F.PACK_OFFSETS), self.ds.array(F.DOC_OFFSETS)
        if segs is None or po is None or off is None or not (self.offsets_ok and self.ds.doc_offsets_ok):
            return
        found, lengths = segments_in_chunks(segs, off, po, self.file(F.SEGMENTS))
        if not self.out.findings(found):
            return
        found = checks.packs(lengths, self.pm.capacity, self.pm.raw["counts"]["packed_tokens"],
                             file=self.file(F.SEGMENTS), pack_token_offsets=pto,
                             pto_file=self.file(F.PACK_TOKEN_OFFSETS))
        self.segments_ok = self.out.findings(found)

    # -- deep
    def deep_bytes(self) -> int:
        if self.pm is None:
            return 0
        return sum(e.bytes for e in self.pm.files.values())

    def deep(self, bar) -> None:
        if self.pm is None:
            return
        for fname, entry in sorted(self.pm.files.items()):
            _check_checksum(self.out, self.dir / fname, self.file(fname), entry, bar)  # V26
        if not self.segments_ok:
            return  # reported structurally
        if self._bounded_deep():  # one bounded pass over the segments, in runs of packs
            # (a mixture's rounds and record, a laid-out index: collection.validate's whole-array checks below)
            from .index_pass import deep_pass

            deep_pass(self, bar)
            return
        segs, po = np.asarray(self.array(F.SEGMENTS)), np.asarray(self.array(F.PACK_OFFSETS))
        seg_len = segs[:, 2] - segs[:, 1]
        self._max_docs(po)  # V30 (segments)
        off = np.asarray(self.ds.array(F.DOC_OFFSETS))
        doc_len = np.diff(off)
        self._images_per_pack(segs, po, off)  # V28, V30 (images)
        length = doc_len[segs[:, 0]]  # every segment lies inside its document (V27, structural)
        per_doc = np.bincount(segs[:, 0], minlength=doc_len.shape[0])  # segments of each document
        self._coverage_and_stats(segs, po, seg_len, length, doc_len, per_doc)  # V31, V33
        if self.pm.materialized:
            self._materialized(segs, po, seg_len, off, bar)  # V32

    def _bounded_deep(self) -> bool:
        """Whether ``deep`` checks this index in one bounded pass (FORMAT §4.3 coverage): not a mixture's."""
        return self.pm.raw.get("mixture") is None

    def _max_docs(self, po) -> None:
        """V30: each pack holds at most ``params.max_docs_per_pack`` segments."""
        per_pack = np.diff(po)
        max_docs = self.pm.params.get("max_docs_per_pack")
        if isinstance(max_docs, int) and per_pack.size and int(per_pack.max()) > max_docs:
            bad = np.flatnonzero(per_pack > max_docs)
            self.out.add(self.file(F.PACK_OFFSETS), "params.max_docs_per_pack", f"<= {max_docs} segments per pack",
                         f"{int(per_pack[bad[0]])} in pack {int(bad[0])} ({bad.size} pack(s): {_listed(bad)})")

    def _images_per_pack(self, segs, po, off) -> None:
        """Images inside each segment (by their global token spans); no segment cuts through an image."""
        if self.ds.m.num_images == 0 or not self.ds.spans_ok:
            return
        cut, per_pack = image_rows(segs, po, off, np.asarray(self.ds.array(F.IMAGE_TOKEN_SPANS)))
        self._report_images(cut, segs[cut[0]] if cut.size else None, per_pack)

    def _report_images(self, cut: np.ndarray, first_cut_row, per_pack: np.ndarray) -> None:
        """V28 (segments ``cut`` cut through an image, the first being ``first_cut_row``), V30 (images per pack)."""
        if cut.size:
            k, (d, b, e) = int(cut[0]), (int(v) for v in first_cut_row)
            self.out.add(self.file(F.SEGMENTS), f"[{k}]", "segment boundaries outside image token spans",
                         f"segment (doc {d}, [{b}, {e})) cuts through an image ({cut.size} segment(s): {_listed(cut)})")
        max_images = self.pm.params.get("max_images_per_pack")
        if isinstance(max_images, int):
            bad = np.flatnonzero(per_pack > max_images)
            if bad.size:
                self.out.add(self.file(F.SEGMENTS), "params.max_images_per_pack", f"<= {max_images} images per pack",
                             f"{int(per_pack[bad[0]])} in pack {int(bad[0])} ({bad.size} pack(s): {_listed(bad)})")

    def _coverage_and_stats(self, segs, po, seg_len, length, doc_len, per_doc) -> None:
        """V31 and V33 (a collection's index with a mixture checks them per round, see collection.validate)."""
        self._coverage(segs, length, doc_len, per_doc)  # V31
        self._stats(segs, po, seg_len, doc_len, per_doc)  # V33

    def _coverage(self, segs: np.ndarray, length: np.ndarray, doc_len: np.ndarray, per_doc: np.ndarray,
                  wanted: np.ndarray | None = None, where: str = "") -> None:
        """Every document covered as the ``oversize`` policy says (``length``: each segment's document length).

        ``wanted``: only these documents (bool per document) may appear, each once as the policy
        says (a mixture round); ``where`` names the part of the index checked, in messages.
        O(n_segments): the rows are checked by ``CoverageRows`` (the same code the bounded deep
        pass feeds chunk by chunk).
        """
        self._coverage_docs(doc_len, per_doc, wanted, where)
        rows = CoverageRows(self.pm.oversize, self.pm.capacity)
        rows.add(segs, length, 0)
        rows.report(self.out, self.file(F.SEGMENTS), doc_len, per_doc, where)

    def _coverage_docs(self, doc_len: np.ndarray, per_doc: np.ndarray, wanted: np.ndarray | None = None,
                       where: str = "") -> None:
        """The per-document half of the coverage: present when it must be, absent when it must be."""
        label, policy, cap = self.file(F.SEGMENTS), self.pm.oversize, self.pm.capacity
        present = per_doc > 0
        if wanted is not None:
            unwanted = np.flatnonzero(present & ~wanted)
            if unwanted.size:
                self.out.add(label, "coverage", f"only the documents with more copies than the round{where}",
                             f"{unwanted.size} other document(s) present: {_listed(unwanted)}")
        if policy == "drop":
            must_be_absent = doc_len > cap
            missing = np.flatnonzero(~present & ~(must_be_absent if wanted is None else must_be_absent | ~wanted))
        else:
            missing = np.flatnonzero(~present if wanted is None else ~present & wanted)
        if missing.size:
            self.out.add(label, "coverage", f"every document in the index (oversize={policy!r}){where}",
                         f"{missing.size} document(s) missing from the index: {_listed(missing)}")
        if policy == "drop":
            dropped_present = np.flatnonzero(present & (doc_len > cap))
            if dropped_present.size:
                self.out.add(label, "coverage", f"documents longer than capacity {cap} absent (oversize='drop'){where}",
                             f"{dropped_present.size} present: {_listed(dropped_present)}")

    def _stats(self, segs, po, seg_len, doc_len, per_doc, copies: np.ndarray | None = None) -> None:
        """Counts in index.json (counts, stats) agree with the segments. O(n_segments + n_docs).

        ``copies``: a mixture's copies of each document (spec/COLLECTION.md §5): the document
        stats then count copies (``per_doc`` holds the segments of all copies).
        """
        truncated_rows = int(seg_len[doc_len[segs[:, 0]] > self.pm.capacity].sum()) \
            if self.pm.oversize == "truncate" else 0
        self._stats_of(int(seg_len.sum()), int(po.shape[0] - 1), int(segs.shape[0]), doc_len, per_doc,
                       truncated_rows, copies)

    def _stats_of(self, packed: int, n_packs: int, n_segments: int, doc_len: np.ndarray, per_doc: np.ndarray,
                  truncated_rows: int, copies: np.ndarray | None = None) -> None:
        """``_stats`` from sums over the segments: ``truncated_rows`` is the tokens of the segments
        whose document is longer than the capacity (with ``oversize="truncate"``)."""
        label = self.file(F.PACK_INDEX_JSON)
        cap = self.pm.capacity
        per_copy = per_doc if copies is None else per_doc // np.maximum(copies, 1)

        def docs(mask):  # documents (or copies) where mask holds
            return int(np.count_nonzero(mask)) if copies is None else int(copies[mask].sum())

        def tokens(mask):  # their tokens, times their copies
            return int(doc_len[mask].sum(dtype=np.int64)) if copies is None else int((doc_len * copies)[mask].sum())

        n_docs = doc_len.shape[0] if copies is None else int(copies.sum())
        present = per_doc > 0
        docs_packed = docs(present)
        expected = {
            "counts.packed_tokens": packed,
            "stats.packs": n_packs,
            "stats.segments": n_segments,
            "stats.documents": n_docs,
            "stats.documents_packed": docs_packed,
            "stats.split_documents": docs(per_copy > 1),
            "stats.dropped_documents": n_docs - docs_packed,
            "stats.dropped_tokens": tokens(~present),
        }
        if self.pm.oversize == "truncate":
            truncated = (doc_len > cap) & present
            expected["stats.truncated_documents"] = docs(truncated)
            expected["stats.truncated_tokens"] = tokens(truncated) - truncated_rows
        for key, want in expected.items():
            section, name = key.split(".")
            table = self.pm.raw.get(section, {})
            if name in table and isinstance(table[name], (int, float)) and table[name] != want:
                self.out.add(label, key, want, table[name])
        fill = self.pm.stats.get("fill_efficiency")
        if isinstance(fill, (int, float)) and n_packs > 0:
            want = packed / (n_packs * cap)
            if abs(fill - want) > 1e-6:
                self.out.add(label, "stats.fill_efficiency", f"{want:.6f} (packed tokens / (packs x capacity))", fill)

    def _materialized(self, segs, po, seg_len, off, bar, first_pack: int = 0, first_token: int = 0,
                      found: set | None = None) -> None:
        """pack_token_offsets follow the segments; packed tokens (and mask) equal the gathered segments.

        ``segs``/``po`` may be a run of whole packs from pack ``first_pack`` on (``po`` local to the
        run), whose first token is packed token ``first_token``; ``found`` collects the files
        already reported (one finding each).
        """
        found = set() if found is None else found
        cum = first_token + np.concatenate([[0], np.cumsum(seg_len)])
        pto = self.array(F.PACK_TOKEN_OFFSETS)
        if pto is not None and F.PACK_TOKEN_OFFSETS not in found:
            p0 = first_pack
            mine = np.asarray(pto[p0:p0 + po.shape[0]])
            if not np.array_equal(mine, cum[po]):
                k = int(np.flatnonzero(mine != cum[po])[0])
                found.add(F.PACK_TOKEN_OFFSETS)
                self.out.add(self.file(F.PACK_TOKEN_OFFSETS), f"[{p0 + k}]", f"{int(cum[po][k])} (sum of segment lengths)",
                             int(mine[k]))
        pairs = [(F.PACKED_TOKENS, self.ds.array(F.TOKENS))]
        if self.ds.m.has_loss_mask:
            pairs.append((F.PACKED_LOSS_MASK, self.ds.array(F.LOSS_MASK)))
        starts = off[segs[:, 0]] + segs[:, 1]
        for fname, src in pairs:
            packed = self.array(fname)
            if packed is None or src is None or packed.shape[0] != self.pm.raw["counts"]["packed_tokens"] \
                    or fname in found:
                continue
            bad = _first_gather_mismatch(packed, src, starts, seg_len, cum)
            if bad is not None:
                found.add(fname)
                self.out.add(self.file(fname), f"token {bad}", "the tokens of the segments gathered in pack order",
                             f"a different value (first difference at packed token {bad})")


def _first_gather_mismatch(packed, src, starts, seg_len, cum) -> int | None:
    """Compare ``packed`` with ``src`` gathered segment by segment, in chunks of ~16M tokens."""
    n = starts.shape[0]
    i = 0
    budget = CHUNK_ELEMS * 4
    while i < n:
        j = int(np.searchsorted(cum, cum[i] + budget, side="right")) - 1
        j = min(max(j, i + 1), n)
        lens = seg_len[i:j]
        total = int(lens.sum())
        idx = np.repeat(starts[i:j] - cum[i:j] + cum[i], lens) + np.arange(total, dtype=np.int64)
        got = np.asarray(packed[cum[i]:cum[i] + total])
        diff = np.flatnonzero(got != np.asarray(src[idx]))
        if diff.size:
            return int(cum[i] + diff[0])
        i = j
    return None

