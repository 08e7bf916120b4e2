"""The bounded-memory passes behind ``packfmt inspect`` (``packfmt.collection.stats``, the open's V27 scan in runs
of packs) equal the plain numpy expressions they replace, on inputs that reach every branch: members long
enough for the radix sort, int32 and int64 lengths, segments in several runs of packs, findings in a later run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packfmt import checks
from packfmt.collection.inspect import member_length_stats, sorted_within
from packfmt.collection.stats import padding_rows, segment_lengths_if_in_order
from packfmt.summary import documents_per_pack, length_stats, padding_costs, row_lengths


def _reference_padding(lengths, cap, batch):
    rows = row_lengths(np.asarray(lengths, dtype=np.int64), cap)
    n = rows.shape[0]
    n_full = n // batch * batch
    longest = int(rows[:n_full].reshape(-1, batch).max(axis=1).sum()) * batch if n_full else 0
    if n > n_full:
        longest += int(rows[n_full:].max()) * (n - n_full)
    return n, int(rows.sum()), longest


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 200), max_size=60), st.integers(1, 64), st.integers(1, 9))
def test_padding_rows_equal_the_rows_array(lengths, cap, batch):
    for dtype in (np.int64, np.int32):
        assert padding_rows(np.array(lengths, dtype=dtype), cap, batch) == _reference_padding(lengths, cap, batch)


def test_padding_costs_of_int32_lengths_equal_int64():
    lengths = np.random.default_rng(0).integers(0, 9000, 100_001)
    assert padding_costs(lengths.astype(np.int32), 4096, 8, 7, 123) == padding_costs(lengths, 4096, 8, 7, 123)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_long_members_radix_sorted_and_stats_equal_length_stats(dtype):
    """Members of thousands of documents (the radix sort), short and empty ones between them."""
    rng = np.random.default_rng(1)
    top = int(np.iinfo(np.int32).max) if dtype == np.int32 else 2**40  # 4 passes of 11 bits; sums exact in float64
    members = [rng.integers(1, 16, 5000), np.zeros(0, dtype=np.int64), rng.integers(1, top, 2500), [7],
               rng.integers(1, 2**11 + 3, 4097), rng.integers(100, 40_000, 30), np.full(3000, 9)]
    lengths = np.concatenate([np.asarray(m, dtype=dtype) for m in members])
    counts = np.array([len(m) for m in members], dtype=np.int64)
    got = sorted_within(lengths, counts)
    assert got.dtype == dtype
    assert got.tolist() == [x for m in members for x in sorted(int(v) for v in m)]
    doc_start = np.concatenate([[0], np.cumsum(counts)])
    want = [length_stats(lengths.astype(np.int64)[a:b]) for a, b in zip(doc_start[:-1], doc_start[1:])]
    assert member_length_stats(lengths, doc_start) == want


def test_stats_of_int32_lengths_equal_int64():
    lengths = np.random.default_rng(2).integers(1, 5000, 1_000_003)
    assert length_stats(lengths.astype(np.int32)) == length_stats(lengths)


def _reference_documents_per_pack(doc, po):
    return np.array([len(set(doc[po[p]:po[p + 1]].tolist())) for p in range(po.shape[0] - 1)])


def test_documents_per_pack_over_several_runs_of_packs():
    """2.5M segments (3 runs of packs): documents split in several segments, some twice in one pack."""
    rng = np.random.default_rng(3)
    n_docs = 2_000_000
    doc = np.concatenate([np.arange(n_docs), rng.integers(0, n_docs, 500_000)])
    rng.shuffle(doc)
    po = np.concatenate([[0], np.sort(rng.choice(np.arange(1, doc.shape[0]), 20_000, replace=False)), [doc.shape[0]]])
    segs = np.zeros((doc.shape[0], 3), dtype=np.int64)
    segs[:, 0] = doc
    got = documents_per_pack(segs, po, n_docs)
    np.testing.assert_array_equal(got, _reference_documents_per_pack(doc, po))
    assert got.sum() < doc.shape[0]  # repeats found


def test_v27_scan_in_runs_names_the_file_positions_and_counts_every_bad_segment():
    """Segments spread over 3 runs of packs: findings in later runs name their index in the whole file, the
    counts add up over the runs, and without findings every pack's tokens equal the per-segment sum."""
    n_docs, n_segs = 1000, 2_500_000
    offsets = np.arange(0, 10 * n_docs + 1, 10, dtype=np.int64)  # documents of 10 tokens
    segs = np.zeros((n_segs, 3), dtype=np.int64)
    segs[:, 0] = np.arange(n_segs) % n_docs
    segs[:, 1] = np.arange(n_segs) % 7
    segs[:, 2] = 10
    po = np.arange(0, n_segs + 1, 500, dtype=np.int64)
    found, lengths = checks.segments(segs, offsets, po, file="segments.bin")
    assert found == []
    np.testing.assert_array_equal(lengths, (segs[:, 2] - segs[:, 1]).reshape(-1, 500).sum(axis=1))
    bad = segs.copy()
    bad[[1_300_000, 2_400_000], 0] = n_docs  # a document id out of range, in the 2nd and 3rd runs
    bad[[1_500_001, 2_000_000, 2_000_001], 2] = 11  # beyond its document
    found, lengths = checks.segments(bad, offsets, po, file="segments.bin")
    assert lengths is None
    assert [(f.field, f.found) for f in found] == [
        ("[1300000].doc", f"{n_docs} (2 bad in all)"),
        ("[1500001]", f"[{1_500_001 % 7}, 11) (segment beyond its document, or empty; 3 bad segment(s) in all)")]


def test_layout_lengths_only_for_segments_in_document_order():
    segs = np.array([[0, 0, 3], [1, 1, 5], [2, 0, 2]], dtype=np.int64)
    po = np.array([0, 2, 3])
    got = segment_lengths_if_in_order(segs, po, 3)
    assert got.tolist() == [3, 4, 2]
    assert segment_lengths_if_in_order(segs[[1, 0, 2]], po, 3) is None
    assert segment_lengths_if_in_order(segs, po, 4) is None


def test_documents_per_pack_of_a_mixture_counts_the_collection_documents(tmp_path):
    """A weighted index packs fewer copies than the collection has documents (a weight below 1): its documents per
    pack are counted over the collection's document ids, not over the copies' lengths that its padding baselines
    use (an array of one byte per copy was indexed by document id: written past its end, then a crash at exit)."""
    from packfmt.collection import Collection
    from packfmt.collection.stats import distinct_documents
    from packfmt.packindex import build_pack_index
    from packfmt.inspect import summarize
    from packfmt.torch.testing import write_random_collection

    root, _, _ = write_random_collection(tmp_path, [40, 300])
    coll = Collection(root)
    names = [m.name for m in coll.members]
    index = build_pack_index(root, capacity=64, algorithm="ffd", name="w",
                             weights={names[0]: 1.0, names[1]: 0.1})
    segs, po = np.asarray(index.segments), np.asarray(index.pack_offsets)
    assert segs.shape[0] < coll.num_documents and int(segs[:, 0].max()) >= segs.shape[0]  # ids past the copies
    want = [len(set(segs[po[p]:po[p + 1], 0].tolist())) for p in range(po.shape[0] - 1)]
    got = summarize(root)["pack_indexes"]["w"]["documents_per_pack"]
    assert got == {"mean": float(np.mean(want)), "max": max(want)}
    with pytest.raises(ValueError, match="outside"):  # the kernel checks what it indexes with
        distinct_documents(segs, po, segs.shape[0])
