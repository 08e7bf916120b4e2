"""The O(n) statistics of pack / validate --deep / inspect equal plain reference implementations.

Issue 10 replaced np.unique, full lexsorts and (n, 3) copies by counts from the packer's own
outputs, a per-document bincount and a whole-document fast path. Each test below runs the real
component on small random inputs (empty, one document, oversize documents, every oversize policy)
and compares it with a Python-loop reference that follows the spec's words.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packfmt import format as F
from packfmt import index_writer
from packfmt import _io
from packfmt._io import DIRECT_ALIGN, HashedFile, aligned_empty
from packfmt.index import PackIndex
from packfmt.packindex import build_pack_index
from packfmt.packing import segment_documents
from packfmt.summary import documents_per_pack, row_lengths
from packfmt.torch.testing import write_flat_dataset, write_pack_index
from packfmt.validate import validate

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
lengths_st = st.lists(st.integers(1, 40), min_size=1, max_size=30)
policy_st = st.sampled_from(["split", "truncate", "drop"])


# ----------------------------------------------------------------------------- references
def ref_segments(lengths, cap, policy):
    """Rows (doc, begin, end) by spec/packing.md §3 (no images), and the oversize counts."""
    rows, counts = [], Counter()
    for d, n in enumerate(lengths):
        if n == 0:
            counts["dropped_docs"] += 1
        elif n <= cap:
            rows.append((d, 0, n))
        elif policy == "split":
            rows += [(d, s, min(s + cap, n)) for s in range(0, n, cap)]
            counts["split_docs"] += 1
        elif policy == "truncate":
            rows.append((d, 0, cap))
            counts["truncated_docs"] += 1
            counts["truncated_tokens"] += n - cap
        else:
            counts["dropped_docs"] += 1
            counts["dropped_tokens"] += n
    return np.array(rows, dtype=np.int64).reshape(-1, 3), counts


def ref_index_stats(segs, po, lengths, cap, policy):
    """The stats of index.json recomputed from the written segments with sets and loops."""
    docs = [int(d) for d in segs[:, 0]]
    per_doc = Counter(docs)
    seg_len = [int(e - b) for _, b, e in segs]
    tokens = sum(seg_len)
    packs = len(po) - 1
    pack_tokens = [sum(seg_len[po[p]:po[p + 1]]) for p in range(packs)]
    covered = defaultdict(int)
    for d, n in zip(docs, seg_len):
        covered[d] += n
    long_docs = [d for d, n in enumerate(lengths) if n > cap and d in per_doc]
    items = [po[p + 1] - po[p] for p in range(packs)]
    lower = -(-tokens // cap)
    return {
        "documents": len(lengths), "documents_packed": len(per_doc), "segments": len(docs),
        "split_documents": sum(1 for c in per_doc.values() if c > 1),
        "dropped_documents": len(lengths) - len(per_doc),
        "dropped_tokens": sum(n for d, n in enumerate(lengths) if d not in per_doc),
        "packs": packs, "items": len(docs), "tokens": tokens, "lower_bound": lower,
        "fill_efficiency": tokens / (packs * cap) if packs else 0.0,
        "max_pack_tokens": max(pack_tokens, default=0),
        "items_per_pack": {"mean": float(np.mean(items)) if items else 0.0, "max": max(items, default=0),
                           "min": min(items, default=0)},
        "packs_per_lower_bound": packs / lower if lower else 1.0,
        "padding_baseline_efficiency": sum(min(n, cap) for n in lengths) / (len(lengths) * cap),
        "truncated_documents": len(long_docs) if policy == "truncate" else 0,
        "truncated_tokens": sum(lengths[d] - covered[d] for d in long_docs) if policy == "truncate" else 0,
    }


def listed(values) -> str:
    values = sorted(values)
    more = f" and {len(values) - 5} more" if len(values) > 5 else ""
    return ", ".join(map(str, values[:5])) + more


def ref_coverage(segs, lengths, cap, policy) -> list[str]:
    """The coverage findings of validate --deep, as messages, from per-document loops."""
    by_doc = defaultdict(list)
    for d, b, e in segs.tolist():
        by_doc[d].append((b, e))
    out = []
    absent_ok = {d for d, n in enumerate(lengths) if policy == "drop" and n > cap}
    missing = [d for d in range(len(lengths)) if d not in by_doc and d not in absent_ok]
    if missing:
        out.append(f"{len(missing)} document(s) missing from the index: {listed(missing)}")
    present = [d for d in absent_ok if d in by_doc]
    if present:
        out.append(f"{len(present)} present: {listed(present)}")
    if policy == "split":
        bad = []
        for d, pieces in by_doc.items():
            pos = 0
            for b, e in sorted(pieces):
                if b != pos:
                    break
                pos = e
            else:
                if pos == lengths[d]:
                    continue
            bad.append(d)
        if bad:
            out.append(f"gaps, overlaps or duplicates in {len(bad)} document(s): {listed(bad)}")
        return out
    dup = [d for d, pieces in by_doc.items() if len(pieces) > 1]
    if dup:
        out.append(f"{len(dup)} document(s) appear more than once: {listed(dup)}")
    bad_rows = [(d, b, e) for d, b, e in segs.tolist()
                if not (b == 0 and (e == lengths[d] or (policy == "truncate" and lengths[d] > cap and e <= cap)))]
    if bad_rows:
        out.append(f"{len(bad_rows)} segment(s) differ, documents {listed({d for d, _, _ in bad_rows})}")
    return out


# ----------------------------------------------------------------------------- segmentation
@SETTINGS
@given(lengths=st.lists(st.integers(0, 40), max_size=30), cap=st.integers(1, 20), policy=policy_st,
       seed=st.integers(0, 2**16))
def test_segmentation_equals_reference(lengths, cap, policy, seed):
    seg = segment_documents(np.array(lengths, dtype=np.int64), cap, policy)
    want, counts = ref_segments(lengths, cap, policy)
    np.testing.assert_array_equal(seg.segments, want)
    np.testing.assert_array_equal(seg.lengths, want[:, 2] - want[:, 1])
    np.testing.assert_array_equal(seg.image_counts, np.zeros(want.shape[0]))
    assert seg.num_segments == want.shape[0]
    for key in ("dropped_docs", "dropped_tokens", "split_docs", "truncated_docs", "truncated_tokens"):
        assert getattr(seg, key) == counts[key], key
    assert seg.is_whole_documents == all(1 <= n <= cap for n in lengths)
    idx = np.random.default_rng(seed).permutation(want.shape[0])
    np.testing.assert_array_equal(seg.rows(idx), want[idx])


def test_whole_documents_keep_images_and_lengths_uncopied():
    lengths = np.array([6, 8, 3], dtype=np.int64)
    seg = segment_documents(lengths, 8, image_spans=np.array([[1, 3], [4, 6], [0, 2]]),
                            doc_image_offsets=np.array([0, 2, 2, 3]))
    assert seg.is_whole_documents and seg.lengths is lengths
    np.testing.assert_array_equal(seg.image_counts, [2, 0, 1])
    np.testing.assert_array_equal(seg.rows(np.array([2, 0])), [[2, 0, 3], [0, 0, 6]])


def test_cut_documents_keep_8_bytes_per_segment():
    """One document to cut no longer costs a 24-byte row per segment: document id and length in int32,
    and a start only for the pieces that begin inside their document (images never cut)."""
    lengths = np.array([5, 30, 7, 0, 12], dtype=np.int32)
    seg = segment_documents(lengths, 8, "split", image_spans=np.array([[1, 3], [6, 10]]),
                            doc_image_offsets=np.array([0, 1, 2, 2, 2, 2]))
    want = [[0, 0, 5], [1, 0, 6], [1, 6, 14], [1, 14, 22], [1, 22, 30], [2, 0, 7], [4, 0, 8], [4, 8, 12]]
    np.testing.assert_array_equal(seg.segments, want)
    np.testing.assert_array_equal(seg.image_counts, [1, 0, 1, 0, 0, 0, 0, 0])
    assert seg.lengths.dtype == np.int32 and seg.lengths.nbytes == 4 * len(want)
    assert (seg.dropped_docs, seg.split_docs) == (1, 2)
    idx = np.array([7, 2, 0, 3], dtype=np.int32)
    np.testing.assert_array_equal(seg.rows(idx), np.array(want)[idx])
    trunc = segment_documents(lengths, 8, "truncate")
    np.testing.assert_array_equal(trunc.segments, [[0, 0, 5], [1, 0, 8], [2, 0, 7], [4, 0, 8]])
    assert (trunc.truncated_docs, trunc.truncated_tokens) == (2, 22 + 4)


def test_hashed_file_large_write_equals_buffered(tmp_path):
    data = np.arange(3 << 20, dtype=np.int64)  # 24 MiB: written through, not buffered
    big, small = HashedFile(tmp_path / "big"), HashedFile(tmp_path / "small")
    big.write_array(data[:10], np.int64)
    big.write_array(data[10:], np.int64)
    for a in range(0, data.size, 1 << 16):
        small.write_array(data[a:a + (1 << 16)], np.int64)
    assert big.close() == small.close()
    assert (tmp_path / "big").read_bytes() == data.tobytes()


@SETTINGS
@given(writes=st.lists(st.tuples(st.integers(0, 5 * DIRECT_ALIGN), st.integers(0, 2)), min_size=1, max_size=8))
def test_hashed_file_direct_writes_equal_buffered(writes):
    """``direct=True`` (O_DIRECT for aligned large writes, buffered otherwise) writes the same bytes and
    checksum as a buffered file, whatever mix of aligned, misaligned and small writes arrives
    (``CHUNK_BYTES`` lowered so that a few KiB count as large)."""
    saved, _io.CHUNK_BYTES = _io.CHUNK_BYTES, DIRECT_ALIGN
    try:
        with tempfile.TemporaryDirectory() as tmp:
            direct, plain = HashedFile(Path(tmp) / "direct", direct=True), HashedFile(Path(tmp) / "plain")
            expected = b""
            for i, (nbytes, shift) in enumerate(writes):  # shift: the buffer starts this many bytes past alignment
                buf = aligned_empty((nbytes + shift,), np.uint8)
                buf[:] = np.arange(buf.size, dtype=np.int64) * 7 + i
                data = buf[shift:]
                direct.write_array(data, np.uint8)
                plain.write_array(data, np.uint8)
                expected += data.tobytes()
            assert direct.close() == plain.close()
            assert (Path(tmp) / "direct").read_bytes() == expected
    finally:
        _io.CHUNK_BYTES = saved


def test_hashed_file_direct_goes_around_the_page_cache(tmp_path):
    """An aligned write of CHUNK_BYTES or more turns O_DIRECT on where the file system takes it (and a
    tail that is not a whole block is written buffered after it); the bytes are the same."""
    import fcntl

    data = aligned_empty((3 << 20,), np.int64)  # 24 MiB
    data[:] = np.arange(data.size)
    f = HashedFile(tmp_path / "seg", direct=True)
    f.write_array(data, np.int64)
    if f._direct:  # the file system took O_DIRECT (ext4, xfs; not tmpfs before Linux 6.6)
        assert fcntl.fcntl(f._f.fileno(), fcntl.F_GETFL) & os.O_DIRECT
    f.write_array(data[:5], np.int64)  # 40 bytes: not a whole block, written buffered
    f.flush()
    assert not fcntl.fcntl(f._f.fileno(), fcntl.F_GETFL) & os.O_DIRECT
    entry = f.close()
    want = data.tobytes() + data[:5].tobytes()
    assert (tmp_path / "seg").read_bytes() == want
    assert entry == {"bytes": len(want), "checksum": _io.checksum_file(tmp_path / "seg")}


def test_aligned_empty_is_aligned():
    for shape, dtype in (((5, 3), np.int64), ((4097,), np.uint8), ((1 << 20, 3), np.int64)):
        a = aligned_empty(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.ctypes.data % DIRECT_ALIGN == 0 and a.flags.c_contiguous
    assert aligned_empty((0, 3), np.int64).shape == (0, 3)  # no rows (an empty index): no address to align


def test_segments_written_direct_equal_reference_bytes(tmp_path):
    """segments.bin through aligned O_DIRECT chunks and a buffered tail: the rows the reference packs
    give, and tokens per pack summed across chunk boundaries."""
    rng = np.random.default_rng(5)
    lengths = [int(x) for x in rng.integers(1, 60, 1500)]
    store = _store(tmp_path, lengths)
    saved = index_writer.SEGMENT_ROWS_CHUNK, _io.CHUNK_BYTES
    index_writer.SEGMENT_ROWS_CHUNK, _io.CHUNK_BYTES = 512, DIRECT_ALIGN  # chunks of 3 blocks, direct
    try:
        index = build_pack_index(store, capacity=50, algorithm="ffd", oversize="split")
    finally:
        index_writer.SEGMENT_ROWS_CHUNK, _io.CHUNK_BYTES = saved
    rows, _ = ref_segments(lengths, 50, "split")
    packs = ref_pack([int(e - b) for _, b, e in rows], 50, "ffd")
    want = np.array([rows[i] for p in packs for i in p], dtype="<i8")
    assert want.nbytes % DIRECT_ALIGN  # a tail that is not a whole block
    assert (index.path / F.SEGMENTS).read_bytes() == want.tobytes()
    np.testing.assert_array_equal(index.pack_lengths, [sum(int(rows[i][2] - rows[i][1]) for i in p) for p in packs])


# ----------------------------------------------------------------------------- packfmt pack
@SETTINGS
@given(lengths=lengths_st, cap=st.integers(4, 32), policy=policy_st,
       algorithm=st.sampled_from(["ffd", "bfd", "greedy", "balanced", "first_fit_shuffle"]),
       chunk=st.sampled_from([1, 3, 1 << 20]))
def test_index_stats_equal_reference(lengths, cap, policy, algorithm, chunk):
    with tempfile.TemporaryDirectory() as tmp:
        store = _store(Path(tmp), lengths)
        saved, index_writer.SEGMENT_ROWS_CHUNK = index_writer.SEGMENT_ROWS_CHUNK, chunk  # rows streamed in chunks
        try:
            index = build_pack_index(store, capacity=cap, algorithm=algorithm, oversize=policy)
        finally:
            index_writer.SEGMENT_ROWS_CHUNK = saved
        segs, po = np.asarray(index.segments), np.asarray(index.pack_offsets)
        want = ref_index_stats(segs, po, lengths, cap, policy)
        stats = index.stats
        for key, value in want.items():
            if isinstance(value, float):
                assert abs(stats[key] - value) < 1e-12, key
            else:
                assert stats[key] == value, key
        assert index.manifest.raw["counts"]["packed_tokens"] == want["tokens"]
        # the rows on disk are the segmentation's rows in pack order
        ref, _ = ref_segments(lengths, cap, policy)
        assert sorted(map(tuple, segs.tolist())) == sorted(map(tuple, ref.tolist()))
        assert validate(store.path, deep=True).ok


def test_index_stats_of_one_document(tmp_path):
    index = build_pack_index(_store(tmp_path, [7]), capacity=4, oversize="split")
    assert (index.stats["documents_packed"], index.stats["split_documents"], index.stats["segments"]) == (1, 1, 2)
    np.testing.assert_array_equal(np.asarray(index.segments)[np.argsort(np.asarray(index.segments)[:, 1])],
                                  [[0, 0, 4], [0, 4, 7]])


# ----------------------------------------------------------------------------- validate --deep
mutation_st = st.lists(st.tuples(st.sampled_from(["delete", "duplicate", "move"]), st.integers(0, 10**6),
                                 st.integers(0, 10**6), st.integers(0, 10**6)), max_size=4)


@SETTINGS
@given(lengths=lengths_st, cap=st.integers(4, 32), policy=policy_st, mutations=mutation_st)
def test_validate_coverage_and_stats_equal_reference(lengths, cap, policy, mutations):
    with tempfile.TemporaryDirectory() as tmp:
        store = _store(Path(tmp), lengths)
        built = build_pack_index(store, capacity=cap, oversize=policy, name="built")
        recorded = dict(built.stats)
        segs = np.asarray(built.segments).copy()
        for op, i, a, b in mutations:
            if segs.shape[0] == 0:
                break
            i %= segs.shape[0]
            if op == "delete":
                segs = np.delete(segs, i, axis=0)
            elif op == "duplicate":
                segs = np.insert(segs, i, segs[i], axis=0)
            else:  # move the segment's bounds, staying inside its document and its pack's capacity (V27, V29)
                n = lengths[segs[i, 0]]
                begin = a % n
                segs[i, 1:] = (begin, begin + 1 + b % min(n - begin, cap))
        po = np.arange(segs.shape[0] + 1, dtype=np.int64)  # one segment per pack
        write_pack_index(store, segs, po, capacity=cap, name="mutated", oversize=policy)
        path = Path(tmp) / "ds" / F.PACKS_DIR / "mutated" / F.PACK_INDEX_JSON
        index_json = json.loads(path.read_text())
        index_json["stats"] = recorded
        path.write_bytes(F.canonical_json(index_json))
        report = validate(store.path, deep=True)
        label = f"{F.PACKS_DIR}/mutated/"
        got = [p.found for p in report.errors if p.file == label + F.SEGMENTS and p.field == "coverage"]
        assert got == ref_coverage(segs, lengths, cap, policy)
        want = ref_index_stats(segs, po, lengths, cap, policy)
        keys = ("packs", "segments", "documents", "documents_packed", "split_documents", "dropped_documents",
                "dropped_tokens") + (("truncated_documents", "truncated_tokens") if policy == "truncate" else ())
        stat_errors = {p.field: p.expected for p in report.errors if p.file == label + F.PACK_INDEX_JSON
                       and p.field.startswith("stats.") and p.field != "stats.fill_efficiency"}
        assert stat_errors == {f"stats.{k}": str(want[k]) for k in keys if recorded[k] != want[k]}
        assert not [p for p in report.errors if p.file.startswith(f"{F.PACKS_DIR}/built/")], report.format()


# ----------------------------------------------------------------------------- inspect
@SETTINGS
@given(n_docs=st.integers(1, 12), rows=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 5)), max_size=40),
       cuts=st.lists(st.integers(0, 40), max_size=8))
def test_documents_per_pack_equals_reference(n_docs, rows, cuts):
    docs = np.array([d % n_docs for d, _ in rows], dtype=np.int64)
    segs = np.stack([docs, np.zeros_like(docs), np.ones_like(docs)], axis=1) if rows else np.zeros((0, 3), np.int64)
    po = np.unique(np.concatenate([[0, len(rows)], np.minimum(cuts, len(rows))])).astype(np.int64)
    want = [len(set(docs[po[p]:po[p + 1]].tolist())) for p in range(po.size - 1)]
    np.testing.assert_array_equal(documents_per_pack(segs, po, n_docs), want)


@SETTINGS
@given(lengths=st.lists(st.integers(0, 40), max_size=30), cap=st.integers(1, 20))
def test_row_lengths_equal_reference(lengths, cap):
    want = [r for n in lengths for r in [cap] * (n // cap) + ([n % cap] if n % cap else [])]
    np.testing.assert_array_equal(row_lengths(np.array(lengths, dtype=np.int64), cap), want)


def _store(root: Path, lengths):
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.arange(int(offsets[-1]), dtype=np.int64) % 100
    return write_flat_dataset(root / "ds", tokens, offsets, vocab_size=100)


# ----------------------------------------------------------------------------- bytes on disk (issue "Internet scale")
def ref_pack(lengths, cap, algorithm, seed=0):
    """Packs of item ids by spec/packing.md §2.1 in plain Python (first fit, best fit, next fit)."""
    n = len(lengths)
    if algorithm == "first_fit_shuffle":
        order = np.random.default_rng(seed).permutation(n).tolist()
    elif algorithm == "greedy":
        order = list(range(n))
    else:
        order = sorted(range(n), key=lambda i: (-lengths[i], i))
    packs, room = [], []
    for i in order:
        fits = [p for p in range(len(packs)) if room[p] >= lengths[i]]
        if algorithm == "greedy":
            fits = fits[-1:] if fits and fits[-1] == len(packs) - 1 else []
        elif algorithm == "bfd" and fits:
            fits = [min(fits, key=lambda p: (room[p], p))]
        if fits:
            packs[fits[0]].append(i)
            room[fits[0]] -= lengths[i]
        else:
            packs.append([i])
            room.append(cap - lengths[i])
    return packs


@SETTINGS
@given(lengths=lengths_st, cap=st.integers(4, 32), policy=policy_st,
       algorithm=st.sampled_from(["ffd", "bfd", "first_fit_shuffle", "greedy"]), seed=st.integers(0, 3),
       chunk=st.sampled_from([1, 2, 1 << 20]), materialize=st.booleans())
def test_index_files_equal_reference_bytes(lengths, cap, policy, algorithm, seed, chunk, materialize):
    """segments.bin, pack_offsets.bin and index.json are what a plain reference writes, byte for byte
    (the int32 working arrays, streamed rows and the index returned unread change no byte)."""
    import xxhash

    with tempfile.TemporaryDirectory() as tmp:
        store = _store(Path(tmp), lengths)
        saved, index_writer.SEGMENT_ROWS_CHUNK = index_writer.SEGMENT_ROWS_CHUNK, chunk
        try:
            index = build_pack_index(store, capacity=cap, algorithm=algorithm, oversize=policy, seed=seed,
                                     materialize=materialize)
        finally:
            index_writer.SEGMENT_ROWS_CHUNK = saved
        rows, _ = ref_segments(lengths, cap, policy)
        packs = ref_pack([int(e - b) for _, b, e in rows], cap, algorithm, seed)
        want_segs = np.array([rows[i] for p in packs for i in p], dtype="<i8").reshape(-1, 3).tobytes()
        want_po = np.concatenate([[0], np.cumsum([len(p) for p in packs])]).astype("<i8").tobytes()
        assert (index.path / F.SEGMENTS).read_bytes() == want_segs
        assert (index.path / F.PACK_OFFSETS).read_bytes() == want_po
        doc = json.loads((index.path / F.PACK_INDEX_JSON).read_bytes())
        for fname, data in ((F.SEGMENTS, want_segs), (F.PACK_OFFSETS, want_po)):
            assert doc["files"][fname] == {"bytes": len(data), "checksum": "xxh3_64:" + xxhash.xxh3_64(data).hexdigest()}
        want_stats = ref_index_stats(rows[[i for p in packs for i in p]].reshape(-1, 3),
                                     np.frombuffer(want_po, dtype="<i8"), lengths, cap, policy)
        assert doc["counts"] == {"packs": len(packs), "segments": len(rows), "packed_tokens": want_stats["tokens"]}
        for key, value in want_stats.items():
            assert doc["stats"][key] == (pytest.approx(value, abs=1e-12) if isinstance(value, float) else value), key
        assert set(doc["stats"]) == set(want_stats) | {"capacity", "packs_over_lower_bound", "seconds"}
        if materialize:  # the tokens of each pack's segments, in order, and where each pack starts
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            pack_tokens = [[t for i in p for t in range(offsets[rows[i][0]] + rows[i][1], offsets[rows[i][0]] + rows[i][2])]
                           for p in packs]
            want_tokens = np.array([t % 100 for p in pack_tokens for t in p], dtype="<u2").tobytes()
            want_pto = np.concatenate([[0], np.cumsum([len(p) for p in pack_tokens])]).astype("<i8").tobytes()
            assert (index.path / F.TOKENS).read_bytes() == want_tokens
            assert (index.path / F.PACK_TOKEN_OFFSETS).read_bytes() == want_pto
        # the index returned without reading its files back is the one a reader opens from them
        opened = PackIndex(store, index.name)
        np.testing.assert_array_equal(index.pack_lengths, opened.pack_lengths)
        assert index.pack_lengths.dtype == opened.pack_lengths.dtype


def test_narrow_lengths_int32_unless_a_document_is_longer():
    from packfmt._resident import narrow_lengths

    offsets = np.array([0, 3, 3 + 2**31 - 1, 2**31 + 5], dtype=np.int64)
    assert narrow_lengths(offsets[:3]).dtype == np.int32
    np.testing.assert_array_equal(narrow_lengths(offsets[:3]), [3, 2**31 - 1])
    wide = narrow_lengths(np.array([0, 3, 3 + 2**31, 2**31 + 9], dtype=np.int64))
    assert wide.dtype == np.int64
    np.testing.assert_array_equal(wide, [3, 2**31, 6])
    assert narrow_lengths(offsets[:1]).shape == (0,)


@SETTINGS
@given(st.lists(st.integers(1, 50), min_size=0, max_size=40), st.integers(1, 7), st.integers(1, 5),
       st.one_of(st.none(), st.integers(0, 39)))
def test_narrowed_lengths_are_the_lengths_in_any_chunks_and_steps(lengths, chunk, step, long_at):
    # chunks (pages handed back) and steps (narrowed from the cache) of any size, a document too long for int32 in
    # any of them: the lengths, int32 unless one is longer, as from one np.diff
    from packfmt import _resident

    if long_at is not None and long_at < len(lengths):
        lengths[long_at] = 2**31 + long_at
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_resident, "CHUNK_ELEMS", chunk * step)
        mp.setattr(_resident, "STEP_ELEMS", step)
        got, again = _resident.narrow_lengths(offsets), _resident.narrow(np.asarray(lengths, dtype=np.int64))
    wide = any(x > 2**31 - 1 for x in lengths)
    for out in (got, again):
        assert out.dtype == (np.int64 if wide else np.int32)
        np.testing.assert_array_equal(out, lengths)


def _resident_bytes() -> int | None:
    """This process's resident set (Linux /proc), or None elsewhere."""
    import os

    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def test_released_memmap_pages_read_back_the_same(tmp_path):
    from packfmt._resident import release

    data = np.arange(3 << 20, dtype=np.int64)
    data.tofile(tmp_path / "a.bin")
    mm = np.memmap(tmp_path / "a.bin", dtype=np.int64, mode="r")
    before = _resident_bytes()
    assert int(mm.sum()) == int(data.sum())  # every page of the 24 MiB mapped in
    touched = _resident_bytes()
    release(mm)
    if touched is not None:  # Linux: the pages leave the resident set
        assert touched - _resident_bytes() > (touched - before) // 2 > 8 << 20
    release(mm[10:20])  # a view: the same mapping
    release(np.arange(3))  # not a mapping: nothing to do
    np.testing.assert_array_equal(mm, data)
    private = np.memmap(tmp_path / "a.bin", dtype=np.int64, mode="c")
    private[5] = -1
    release(private)  # copy-on-write: its change must survive
    assert int(private[5]) == -1


# ----------------------------------------------------------------------------- validate --deep in runs of packs
def _image_store(root: Path) -> Path:
    from images import png

    import packfmt

    rng = np.random.default_rng(3)
    with packfmt.DatasetWriter(root, vocab_size=500, loss_mask=True, special_tokens={"image": 3},
                               tokenizer={"name": "test", "hash": None}) as w:
        for d in range(60):
            n = int(rng.integers(3, 120))
            images = ([packfmt.ImageRecord(png(4, 4), 4, 4, "png", 1, 5), packfmt.ImageRecord(png(2, 3), 2, 3, "png", 6, 11)]
                      if d % 3 == 0 and n >= 12 else [])
            w.add_document(rng.integers(4, 500, n), rng.integers(0, 2, n), images=images)
    build_pack_index(root, capacity=64, algorithm="ffd", name="split", max_images_per_pack=4)
    build_pack_index(root, capacity=70, algorithm="bfd", name="trunc", oversize="truncate", materialize=True)
    return root


def _refile(index_dir: Path, fname: str, data: bytes) -> None:
    """Replace a file of an index and record its size and checksum (only content checks can object)."""
    from packfmt._io import checksum_file

    (index_dir / fname).write_bytes(data)
    obj = json.loads((index_dir / F.PACK_INDEX_JSON).read_text())
    obj["files"][fname] = {"bytes": len(data), "checksum": checksum_file(index_dir / fname)}
    (index_dir / F.PACK_INDEX_JSON).write_bytes(F.canonical_json(obj))


@pytest.mark.parametrize("corrupt", ["none", "image_cut", "image_budget", "packed_token", "coverage"])
def test_deep_pass_finds_the_same_in_any_run_of_packs(tmp_path, monkeypatch, corrupt):
    """The bounded deep pass reads segments.bin in runs of packs: one pack at a time or all at once,
    an image store with a materialized index reports the same problems (V28, V30, V31, V32, V33)."""
    from packfmt.validation import segment_rows

    root = _image_store(tmp_path / "ds")
    split, trunc = root / F.PACKS_DIR / "split", root / F.PACKS_DIR / "trunc"
    if corrupt == "image_cut":  # start a segment holding images inside the first one (image [1, 5))
        segs = np.fromfile(split / F.SEGMENTS, dtype="<i8").reshape(-1, 3)
        k = int(np.flatnonzero((segs[:, 1] == 0) & (segs[:, 2] >= 12) & (segs[:, 0] % 3 == 0))[0])
        segs[k, 1] = 3
        _refile(split, F.SEGMENTS, segs.tobytes())
        obj = json.loads((split / F.PACK_INDEX_JSON).read_text())
        obj["counts"]["packed_tokens"] -= 3  # the structure stays consistent
        (split / F.PACK_INDEX_JSON).write_bytes(F.canonical_json(obj))
    elif corrupt == "image_budget":
        obj = json.loads((split / F.PACK_INDEX_JSON).read_text())
        obj["params"]["max_images_per_pack"] = 1
        (split / F.PACK_INDEX_JSON).write_bytes(F.canonical_json(obj))
    elif corrupt == "packed_token":
        tokens = np.fromfile(trunc / F.TOKENS, dtype="<u2")
        tokens[-5] = (int(tokens[-5]) + 1) % 500
        _refile(trunc, F.TOKENS, tokens.tobytes())
    elif corrupt == "coverage":  # the same document twice (in place of another of the same length)
        segs = np.fromfile(trunc / F.SEGMENTS, dtype="<i8").reshape(-1, 3)
        seg_len = segs[:, 2] - segs[:, 1]
        i, j = next((i, j) for i in range(len(segs)) for j in range(len(segs) - 1, i, -1) if seg_len[i] == seg_len[j])
        segs[j] = segs[i]
        _refile(trunc, F.SEGMENTS, segs.tobytes())
    seen = []
    for rows in (1, 2, 7, 1 << 20):
        monkeypatch.setattr(segment_rows, "PACK_CHUNK_ROWS", rows)
        report = validate(root, deep=True)
        seen.append(sorted((p.file, str(p.field), p.message) for p in report.problems))
    assert all(s == seen[0] for s in seen), seen
    text = " | ".join(m for _, _, m in seen[0])
    want = {"none": None, "image_cut": "cuts through an image", "image_budget": "max_images_per_pack",
            "packed_token": "first difference at packed token", "coverage": "more than once"}[corrupt]
    assert (not seen[0]) if want is None else want in text, text
