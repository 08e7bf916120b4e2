"""Tests of the pure packing engine (packfmt.packing): exactness against slow references,
invariants of every algorithm, the toy example, oversize handling and the balanced spread."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packfmt.packing import ALGORITHMS, PackResult, pack_items, pack_stats, segment_documents
from packfmt.packing._balanced import balanced

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- slow references


def ref_any_fit(lengths, seq, capacity, rule, max_items=None, images=None, max_images=None):
    """Obviously-correct first fit / best fit: a list of open packs, scanned linearly.

    A pack can take an item iff room >= length, items < max_items and images + m <= max_images.
    first fit: the lowest-numbered such pack. best fit: the smallest room, ties lowest number.
    Returns a list of packs, each a list of item indices in insertion order.
    """
    room, count, imgs, packs = [], [], [], []
    for i in seq:
        length = int(lengths[i])
        m = int(images[i]) if images is not None and max_images is not None else 0
        fits = [p for p in range(len(packs))
                if room[p] >= length and (max_items is None or count[p] < max_items)
                and (max_images is None or imgs[p] + m <= max_images)]
        if not fits:
            room.append(capacity)
            count.append(0)
            imgs.append(0)
            packs.append([])
            p = len(packs) - 1
        elif rule == "first":
            p = fits[0]
        else:
            p = min(fits, key=lambda q: (room[q], q))
        room[p] -= length
        count[p] += 1
        imgs[p] += m
        packs[p].append(int(i))
    return packs


def ref_next_fit(lengths, seq, capacity, max_items=None, images=None, max_images=None):
    """Next fit: one open pack, a new one whenever the next item does not fit."""
    packs, room, imgs = [], -1, 0
    for i in seq:
        m = int(images[i]) if images is not None and max_images is not None else 0
        if not packs or lengths[i] > room or (max_items is not None and len(packs[-1]) >= max_items) \
                or (max_images is not None and imgs + m > max_images):
            packs.append([])
            room, imgs = capacity, 0
        packs[-1].append(int(i))
        room -= int(lengths[i])
        imgs += m
    return packs


def desc_order(lengths):
    return sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))


# --------------------------------------------------------------------------- strategies


@st.composite
def packing_inputs(draw, with_images=True):
    """(lengths, capacity, max_items, images, max_images) with every item placeable."""
    capacity = draw(st.integers(1, 60))
    n = draw(st.integers(0, 80))
    # a few distinct lengths make runs of equal items (the engines' fast path) frequent
    pool = draw(st.lists(st.integers(1, capacity), min_size=1, max_size=6))
    lengths = np.array(draw(st.lists(st.sampled_from(pool) | st.integers(1, capacity), min_size=n, max_size=n)),
                       dtype=np.int64)
    max_items = draw(st.none() | st.integers(1, 6))
    images = max_images = None
    if with_images and draw(st.booleans()):
        max_images = draw(st.integers(0, 6))
        images = np.array(draw(st.lists(st.integers(0, max_images), min_size=n, max_size=n)), dtype=np.int64)
        if draw(st.booleans()):
            max_images = None  # images counted but not limited
    return lengths, capacity, max_items, images, max_images


def check_invariants(result, lengths, capacity, max_items=None, images=None, max_images=None):
    """Every item exactly once, no empty pack, no pack over any limit, CSR well formed."""
    n = len(lengths)
    assert result.order.dtype == np.int64 and result.pack_offsets.dtype == np.int64
    assert result.pack_offsets[0] == 0 and result.pack_offsets[-1] == n
    assert np.all(np.diff(result.pack_offsets) >= 1)
    assert np.array_equal(np.sort(result.order), np.arange(n))
    if n:
        assert result.pack_sums(lengths).max() <= capacity
        if max_items is not None:
            assert result.items_per_pack.max() <= max_items
        if images is not None and max_images is not None:
            assert result.pack_sums(images).max() <= max_images


def packs_of(result):
    return result.packs()


# --------------------------------------------------------------------------- exactness


@FAST
@given(packing_inputs())
def test_ffd_equals_reference(args):
    lengths, capacity, max_items, images, max_images = args
    got = pack_items(lengths, capacity, "ffd", max_items_per_pack=max_items, image_counts=images,
                     max_images_per_pack=max_images)
    want = ref_any_fit(lengths, desc_order(lengths), capacity, "first", max_items, images, max_images)
    assert packs_of(got) == want


@FAST
@given(packing_inputs())
def test_bfd_equals_reference(args):
    lengths, capacity, max_items, images, max_images = args
    got = pack_items(lengths, capacity, "bfd", max_items_per_pack=max_items, image_counts=images,
                     max_images_per_pack=max_images)
    want = ref_any_fit(lengths, desc_order(lengths), capacity, "best", max_items, images, max_images)
    assert packs_of(got) == want


@FAST
@given(packing_inputs(), st.integers(0, 2**32))
def test_shuffled_algorithms_equal_reference(args, seed):
    lengths, capacity, max_items, images, max_images = args
    perm = np.random.default_rng(seed).permutation(len(lengths))
    limits = dict(max_items_per_pack=max_items, image_counts=images, max_images_per_pack=max_images)
    ffs = pack_items(lengths, capacity, "first_fit_shuffle", seed=seed, **limits)
    assert packs_of(ffs) == ref_any_fit(lengths, perm, capacity, "first", max_items, images, max_images)
    sap = pack_items(lengths, capacity, "shuffle_and_pack", seed=seed, **limits)
    assert packs_of(sap) == ref_next_fit(lengths, perm, capacity, max_items, images, max_images)
    greedy = pack_items(lengths, capacity, "greedy", **limits)
    assert packs_of(greedy) == ref_next_fit(lengths, range(len(lengths)), capacity, max_items, images, max_images)


@FAST
@given(packing_inputs(with_images=False))
def test_balanced_without_images_is_ffd(args):
    lengths, capacity, max_items, _, _ = args
    a = pack_items(lengths, capacity, "ffd", max_items_per_pack=max_items)
    b = PackResult(*balanced(lengths, capacity, max_items, None, None))
    assert packs_of(a) == packs_of(b)


def test_large_random_ffd_bfd_match_reference():
    """Larger inputs (many packs, deep trees, long runs) than hypothesis draws."""
    rng = np.random.default_rng(7)
    lengths = np.clip(rng.lognormal(4.0, 1.0, 3000).astype(np.int64), 1, 512)
    order = desc_order(lengths)
    for algorithm, rule in (("ffd", "first"), ("bfd", "best")):
        for max_items in (None, 3):
            got = pack_items(lengths, 512, algorithm, max_items_per_pack=max_items)
            assert packs_of(got) == ref_any_fit(lengths, order, 512, rule, max_items)
        # one item per pack: the engines must grow past their initial pack-slot estimate
        assert packs_of(pack_items(lengths, 512, algorithm, max_items_per_pack=1)) == [[i] for i in order]


# --------------------------------------------------------------------------- properties


@FAST
@given(packing_inputs(), st.sampled_from(ALGORITHMS), st.integers(0, 1000))
def test_invariants_all_algorithms(args, algorithm, seed):
    lengths, capacity, max_items, images, max_images = args
    limits = dict(max_items_per_pack=max_items, image_counts=images, max_images_per_pack=max_images)
    r1 = pack_items(lengths, capacity, algorithm, seed=seed, **limits)
    check_invariants(r1, lengths, capacity, max_items, images, max_images)
    r2 = pack_items(lengths, capacity, algorithm, seed=seed, **limits)
    assert np.array_equal(r1.order, r2.order) and np.array_equal(r1.pack_offsets, r2.pack_offsets)


@FAST
@given(packing_inputs(), st.sampled_from(ALGORITHMS), st.booleans())
def test_item_lengths_are_the_lengths_in_pack_order(args, algorithm, compact):
    """``PackResult.item_lengths`` (what ``write_segments`` reads instead of gathering a length per row) is
    ``lengths[order]`` wherever it is given: always for ffd and bfd of a counting sort, taken from the sort's
    runs (no length read), whatever the limits and images, int32 ids or int64."""
    lengths, capacity, max_items, images, max_images = args
    given_lengths = lengths.astype(np.int32) if compact else lengths
    r = pack_items(given_lengths, capacity, algorithm, max_items_per_pack=max_items, image_counts=images,
                   max_images_per_pack=max_images, compact=compact)
    if algorithm in ("ffd", "bfd") and lengths.size:
        assert r.item_lengths is not None
    if r.item_lengths is not None:
        assert r.item_lengths.dtype == r.order.dtype
        np.testing.assert_array_equal(r.item_lengths, lengths[r.order])


def test_item_lengths_not_given_after_an_argsort():
    """A capacity large against the items is sorted by argsort (no counting sort, no runs): no lengths given,
    the packs the same."""
    r = pack_items(np.array([5, 9, 5, 2]), 10**6, "ffd")
    assert r.item_lengths is None and r.packs() == [[1, 0, 2, 3]]


@pytest.mark.parametrize("algorithm", ["first_fit_shuffle", "shuffle_and_pack"])
def test_different_seeds_give_different_orders(algorithm):
    lengths = np.random.default_rng(0).integers(1, 100, 2000)
    a = pack_items(lengths, 256, algorithm, seed=1)
    b = pack_items(lengths, 256, algorithm, seed=2)
    assert not np.array_equal(a.order, b.order)
    assert np.array_equal(pack_items(lengths, 256, algorithm, seed=None).order,
                          pack_items(lengths, 256, algorithm, seed=0).order)


def test_toy_example_from_the_multimodal_pipeline_writeup():
    lengths = np.arange(1, 25)

    def as_lengths(result):
        return [lengths[p].tolist() for p in result.packs()]

    assert as_lengths(pack_items(lengths, 100, "greedy")) == [
        list(range(1, 14)), list(range(14, 20)), list(range(20, 24)), [24]]
    assert as_lengths(pack_items(lengths, 100, "ffd")) == [
        [24, 23, 22, 21, 10], [20, 19, 18, 17, 16, 9, 1], [15, 14, 13, 12, 11, 8, 7, 6, 5, 4, 3, 2]]
    assert as_lengths(pack_items(lengths, 100, "pad")) == [[x] for x in range(1, 25)]


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="length"):
        pack_items([5, 11], 10)
    with pytest.raises(ValueError, match="length"):
        pack_items([0, 3], 10)
    with pytest.raises(ValueError, match="algorithm"):
        pack_items([1], 10, "nope")
    with pytest.raises(ValueError, match="images"):
        pack_items([1, 2], 10, image_counts=[1, 5], max_images_per_pack=4)
    with pytest.raises(ValueError, match="max_items_per_pack"):
        pack_items([1, 2], 10, max_items_per_pack=0)
    empty = pack_items(np.zeros(0, np.int64), 10)
    assert empty.n_packs == 0 and empty.pack_offsets.tolist() == [0]


def test_pack_stats():
    lengths = np.array([6, 4, 5, 5, 3])
    result = pack_items(lengths, 10, "ffd")
    stats = pack_stats(lengths, result, 10, image_counts=np.array([1, 0, 2, 0, 0]))
    assert stats["packs"] == 3 and stats["tokens"] == 23 and stats["lower_bound"] == 3
    assert stats["packs_over_lower_bound"] == 0
    assert stats["fill_efficiency"] == pytest.approx(23 / 30)
    assert stats["items_per_pack"] == {"mean": 5 / 3, "max": 2, "min": 1}
    assert stats["images_per_pack"]["max"] == 2 and stats["images"] == 3


# --------------------------------------------------------------------------- segmentation


@st.composite
def documents_with_images(draw):
    """(doc_lengths, capacity, spans (n_images, 2), doc_image_offsets) with runs <= capacity."""
    capacity = draw(st.integers(2, 40))
    n_docs = draw(st.integers(0, 12))
    lengths, spans, offsets = [], [], [0]
    for _ in range(n_docs):
        pos, doc_spans = 0, []
        for _ in range(draw(st.integers(0, 6))):
            pos += draw(st.integers(0, capacity))  # text before the image
            run = draw(st.integers(1, capacity))
            doc_spans.append((pos, pos + run))
            pos += run
        length = pos + draw(st.integers(0 if doc_spans else 0, 3 * capacity))
        lengths.append(length)
        spans.extend(doc_spans)
        offsets.append(len(spans))
    return (np.array(lengths, dtype=np.int64), capacity, np.array(spans, dtype=np.int64).reshape(-1, 2),
            np.array(offsets, dtype=np.int64))


def _strictly_inside(pos, spans):
    return bool(np.any((spans[:, 0] < pos) & (pos < spans[:, 1]))) if spans.size else False


@FAST
@given(documents_with_images())
def test_split_tiles_documents_and_respects_images(doc):
    lengths, capacity, spans, offsets = doc
    seg = segment_documents(lengths, capacity, "split", image_spans=spans, doc_image_offsets=offsets)
    s = seg.segments
    assert s.dtype == np.int64 and s.shape[1] == 3
    assert np.all(s[:, 2] - s[:, 1] <= capacity) and np.all(s[:, 2] > s[:, 1])
    assert seg.split_docs == int(np.count_nonzero(lengths > capacity))
    assert seg.dropped_docs == int(np.count_nonzero(lengths == 0))
    assert seg.image_counts.sum() == spans.shape[0]
    for d in range(len(lengths)):
        rows = s[s[:, 0] == d]
        doc_spans = spans[offsets[d]: offsets[d + 1]]
        if lengths[d] == 0:
            assert rows.shape[0] == 0
            continue
        assert rows[0, 1] == 0 and rows[-1, 2] == lengths[d]
        assert np.array_equal(rows[1:, 1], rows[:-1, 2])  # contiguous tiling
        for begin, end in rows[:, 1:]:
            assert not _strictly_inside(begin, doc_spans) and not _strictly_inside(end, doc_spans)
        counts = seg.image_counts[s[:, 0] == d]
        for (begin, end), c in zip(rows[:, 1:], counts):
            inside = (doc_spans[:, 0] >= begin) & (doc_spans[:, 1] <= end) if doc_spans.size else []
            assert c == int(np.count_nonzero(inside))
    # sorted by (doc, begin)
    assert np.array_equal(np.lexsort((s[:, 1], s[:, 0])), np.arange(s.shape[0]))


@FAST
@given(documents_with_images())
def test_truncate_and_drop(doc):
    lengths, capacity, spans, offsets = doc
    over = lengths > capacity
    tr = segment_documents(lengths, capacity, "truncate", image_spans=spans, doc_image_offsets=offsets)
    assert tr.segments.shape[0] == int(np.count_nonzero(lengths > 0))
    assert np.all(tr.segments[:, 1] == 0)
    assert tr.truncated_docs == int(over.sum())
    kept = tr.segments[:, 2] - tr.segments[:, 1]
    assert tr.truncated_tokens == int(lengths.sum() - kept.sum())
    for d, end in tr.segments[:, [0, 2]]:
        assert not _strictly_inside(end, spans[offsets[d]: offsets[d + 1]])
    dr = segment_documents(lengths, capacity, "drop", image_spans=spans, doc_image_offsets=offsets)
    assert dr.dropped_docs == int(over.sum() + (lengths == 0).sum())
    assert dr.dropped_tokens == int(lengths[over].sum())
    assert np.array_equal(dr.segments[:, 0], np.flatnonzero(~over & (lengths > 0)))


def test_segment_examples():
    seg = segment_documents([10, 3, 0, 25], 8, "split")
    assert seg.segments.tolist() == [[0, 0, 8], [0, 8, 10], [1, 0, 3], [3, 0, 8], [3, 8, 16], [3, 16, 24],
                                     [3, 24, 25]]
    assert (seg.split_docs, seg.dropped_docs) == (2, 1)
    # an image run [6, 10) would be cut at 8: the piece ends at 6 instead
    seg = segment_documents([12], 8, "split", image_spans=[[6, 10]], doc_image_offsets=[0, 1])
    assert seg.segments.tolist() == [[0, 0, 6], [0, 6, 12]] and seg.image_counts.tolist() == [0, 1]
    seg = segment_documents([12], 8, "truncate", image_spans=[[6, 10]], doc_image_offsets=[0, 1])
    assert seg.segments.tolist() == [[0, 0, 6]] and seg.truncated_tokens == 6


def test_oversized_image_raises():
    with pytest.raises(ValueError, match=r"image 1 of document 2"):
        segment_documents([5, 5, 30], 8, "split", image_spans=[[0, 2], [3, 12]], doc_image_offsets=[0, 1, 1, 2])
    with pytest.raises(ValueError, match="sorted and disjoint"):
        segment_documents([20], 8, image_spans=[[0, 4], [3, 6]], doc_image_offsets=[0, 2])


# --------------------------------------------------------------------------- balanced


def multimodal_input(n=20000, seed=3):
    """Lognormal lengths; 40% of the items carry 1-3 images of 256 tokens each."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(600), 0.8, n).astype(np.int64), 1, 4096)
    images = np.where(rng.random(n) < 0.4, rng.integers(1, 4, n), 0)
    return np.minimum(np.maximum(lengths, 256 * images + 16), 4096), images


def test_balanced_spreads_images_and_respects_budgets():
    lengths, images = multimodal_input()
    kw = dict(image_counts=images, max_images_per_pack=8, max_items_per_pack=12)
    bal = pack_items(lengths, 4096, "balanced", **kw)
    ffd = pack_items(lengths, 4096, "ffd", **kw)
    check_invariants(bal, lengths, 4096, 12, images, 8)
    per_pack = bal.pack_sums(images)
    # measured: 0..5 images per pack, std 0.86 (ffd: 0..8, std 3.05), 0.9% fewer packs than ffd
    assert per_pack.max() - per_pack.min() <= 5
    assert per_pack.std() < 0.6 * ffd.pack_sums(images).std()
    assert bal.n_packs <= 1.01 * ffd.n_packs


# --------------------------------------------------------------------------- benchmark smoke test


def test_benchmark_quick_runs(tmp_path):
    """``benchmarks/bench_pack.py --quick`` runs and writes its JSON (no timing is checked)."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_pack.py"
    spec = importlib.util.spec_from_file_location("bench_pack", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    assert bench.main(["--quick", "--no-trl", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {r["algorithm"] for r in report["results"]} == set(ALGORITHMS)
    assert {r["dist"] for r in report["results"]} == {"web", "chat", "real"}
    assert all(r["packs_per_lower_bound"] >= 1 for r in report["results"])
