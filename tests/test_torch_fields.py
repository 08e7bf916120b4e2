"""PackedDataset options that change what crosses the pipe: ``fields``, ``input_ids_dtype``, lazy batches.

Every variant is checked against the default dataset (itself checked against a per-token reference
in test_torch_dataset.py): the same values under every key both produce, through ``ds[i]``, the items
of ``__getitems__`` and every collate on both of its paths (shared layout and copy).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_torch_dataset import _case_store, _storages, corpus, make_store

from packfmt.torch import (
    FIELDS,
    PackBatch,
    PackedDataset,
    collate_hf,
    collate_padded,
    collate_varlen,
    doc_ids_from_cu_seqlens,
    position_ids_from_cu_seqlens,
)
from packfmt.torch.testing import write_pack_index

VARIANTS = [
    {"fields": ("input_ids", "labels")},
    {"fields": ("input_ids", "labels", "position_ids")},
    {"fields": ("labels", "doc_ids", "input_ids")},  # order does not matter
    {"input_ids_dtype": "native"},
    {"input_ids_dtype": "native", "fields": ("input_ids", "labels"), "index_dtype": torch.int32},
    {"input_ids_dtype": torch.int32},
]


def _same_values(got: dict, want: dict, fields) -> None:
    """``got`` has exactly ``want``'s keys minus the left-out rows, with equal values."""
    dropped = {k for k in FIELDS if k not in fields}
    assert set(got) == set(want) - dropped, (sorted(got), sorted(want))
    for k, w in want.items():
        if k in dropped:
            continue
        g = got[k]
        if isinstance(w, torch.Tensor):
            assert g.shape == w.shape and torch.equal(g.to(torch.int64), w.to(torch.int64)), k
        elif isinstance(w, list):
            assert len(g) == len(w) and all(torch.equal(a, b) for a, b in zip(g, w)), k
        else:
            assert g == w, k


def _expected_ids_dtype(store, opts) -> torch.dtype:
    d = opts.get("input_ids_dtype")
    if d is None:
        return opts.get("index_dtype", torch.int64)
    if d == "native":
        return torch.uint16 if store.manifest.np_token_dtype == np.uint16 else torch.int32
    return d


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpus, st.sampled_from(VARIANTS))
def test_variants_equal_default_everywhere(case, opts):
    seed, lengths, capacity, with_mask, materialize, pad, vocab = case
    with tempfile.TemporaryDirectory() as tmp:
        store, rng, docs, masks, segs, po = _case_store(Path(tmp), case)
        base = PackedDataset(store, "p", pad_to_capacity=pad)
        ds = PackedDataset(store, "p", pad_to_capacity=pad, **opts)
        fields = ds.fields
        assert set(fields) == set(opts.get("fields", FIELDS))
        packs = rng.integers(0, len(base), 5).tolist()
        for i in packs:
            item = ds[i]
            assert item["input_ids"].dtype == _expected_ids_dtype(store, opts)
            _same_values(item, base[i], fields)
        for got, want in zip(ds.__getitems__(packs), base.__getitems__(packs)):
            _same_values(got, want, fields)
        collates = [collate_varlen, lambda b: collate_padded(b, length=capacity),
                    lambda b: collate_padded(b, length=capacity + 2, pad_token_id=5)]
        if "position_ids" in fields and ds[0]["input_ids"].dtype in (torch.int64, torch.int32):
            collates.append(collate_hf)
            collate_hf(ds.__getitems__(packs))  # later batches reserve room for its labels
            collate_hf(base.__getitems__(packs))
        for collate in collates:
            want = collate(base.__getitems__(packs))
            for got in (collate(ds.__getitems__(packs)), collate([ds[i] for i in packs])):
                _same_values(got, want, fields)
                assert len(_storages(got)) == 1


def test_rows_derived_on_device_equal_collated_rows(tmp_path):
    """``position_ids_from_cu_seqlens`` / ``doc_ids_from_cu_seqlens`` rebuild what a slim batch leaves out."""
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 300, n).tolist() for n in rng.integers(1, 50, 40)]
    store = make_store(tmp_path, docs, [None] * len(docs), 300)
    from packfmt.packindex import build_pack_index

    build_pack_index(store, capacity=64, algorithm="ffd", name="p")
    full = collate_varlen(PackedDataset(store, "p").__getitems__(range(6)))
    slim = collate_varlen(PackedDataset(store, "p", fields=("input_ids", "labels")).__getitems__(range(6)))
    assert "position_ids" not in slim and "doc_ids" not in slim
    T = slim["input_ids"].shape[-1]
    assert torch.equal(position_ids_from_cu_seqlens(slim["cu_seqlens"], T), full["position_ids"])
    assert torch.equal(doc_ids_from_cu_seqlens(slim["cu_seqlens"], T), full["doc_ids"])
    assert torch.equal(slim["labels"], full["labels"]) and torch.equal(slim["input_ids"], full["input_ids"])


@pytest.fixture()
def two_stores(tmp_path):
    """A uint16 and a uint32 store, each with a materialized index "m" and an index-only one "g"."""
    out = {}
    for vocab in (1000, 70000):
        rng = np.random.default_rng(vocab)
        docs = [rng.integers(0, vocab, n).tolist() for n in (5, 9, 3, 7)]
        store = make_store(tmp_path / str(vocab), docs, [None] * 4, vocab)
        segs, po = np.array([[0, 0, 5], [2, 0, 3], [1, 0, 9], [3, 0, 7]]), np.array([0, 2, 3, 4])
        write_pack_index(store, segs, po, capacity=9, name="m", materialize=True)
        write_pack_index(store, segs, po, capacity=9, name="g")
        out[vocab] = store
    return out


def test_native_input_ids_are_zero_copy_on_materialized_index(two_stores):
    for vocab, store in two_stores.items():
        want_dtype = torch.uint16 if vocab == 1000 else torch.int32
        ds = PackedDataset(store, "m", input_ids_dtype="native")
        tokens_file = store.path / "packs" / "m" / "tokens.bin"
        on_disk = tokens_file.read_bytes()
        a, b = ds[0]["input_ids"], ds[1]["input_ids"]
        assert a.dtype == want_dtype
        ref = PackedDataset(store, "m")
        assert torch.equal(a.long(), ref[0]["input_ids"]) and torch.equal(b.long(), ref[1]["input_ids"])
        # Zero-copy: consecutive packs are adjacent views of one mapping, not copies.
        assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        assert b.data_ptr() == a.data_ptr() + a.numel() * a.element_size()
        # The mapping is private: a write is seen through the same dataset, never by the file.
        old = int(a[0])
        a[0] = 7
        assert int(ds[0]["input_ids"][0]) == 7
        assert tokens_file.read_bytes() == on_disk
        assert int(PackedDataset(store, "m", input_ids_dtype="native")[0]["input_ids"][0]) == old
        # Labels are still right (they are computed from the file's tokens, not the view).
        assert torch.equal(ds[0]["labels"], ref[0]["labels"])
        # Index-only packs and padded packs are gathered: a copy in the native width.
        for other in (PackedDataset(store, "g", input_ids_dtype="native"),
                      PackedDataset(store, "m", input_ids_dtype="native", pad_to_capacity=True)):
            it = other[1]
            assert it["input_ids"].dtype == want_dtype
            assert it["input_ids"].untyped_storage().data_ptr() == it["labels"].untyped_storage().data_ptr()


def test_native_and_slim_batches_through_workers(two_stores):
    """Real DataLoader workers carry native-width ids and slim batches unchanged, one storage each."""
    from torch.utils.data import DataLoader

    for store in two_stores.values():
        for opts in ({"input_ids_dtype": "native"}, {"fields": ("input_ids", "labels")}):
            ds = PackedDataset(store, "m", **opts)
            want = [collate_varlen(ds.__getitems__([i])) for i in range(len(ds))]
            got = list(DataLoader(ds, batch_size=1, collate_fn=collate_varlen, num_workers=2))
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert list(g) == list(w)
                for k in w:
                    if isinstance(w[k], torch.Tensor):
                        assert g[k].dtype == w[k].dtype and torch.equal(g[k].long(), w[k].long()), k
                assert len(_storages(g)) == 1 and g["input_ids"].is_shared()
            # ds[i] items with a zero-copy input_ids also cross (their ids are copied into shared memory).
            items = list(DataLoader(ds, batch_size=None, num_workers=1))
            for i, it in enumerate(items):
                assert torch.equal(it["input_ids"].long(), ds[i]["input_ids"].long())


def test_rejected_options_name_the_problem(two_stores):
    store = two_stores[1000]
    with pytest.raises(ValueError, match="fields"):
        PackedDataset(store, "m", fields=("labels",))
    with pytest.raises(ValueError, match="fields"):
        PackedDataset(store, "m", fields=("input_ids", "labels", "attention_mask"))
    with pytest.raises(ValueError, match="input_ids_dtype"):
        PackedDataset(store, "m", input_ids_dtype=torch.int16)
    with pytest.raises(ValueError, match="position_ids"):
        collate_hf(PackedDataset(store, "m", fields=("input_ids", "labels")).__getitems__([0]))
    with pytest.raises(ValueError, match="uint16"):
        collate_hf(PackedDataset(store, "m", input_ids_dtype="native").__getitems__([0]))


def test_pack_batch_items_are_lazy_stable_and_guarded(two_stores):
    store = two_stores[70000]
    ds = PackedDataset(store, "g")
    batch = ds.__getitems__([2, 0, -1])
    assert isinstance(batch, PackBatch) and len(batch) == 3
    assert batch._items is None  # nothing built before use (not even the list of items)
    first = batch[0]
    assert batch[0] is first and batch[-3] is first and batch[1:2] == [batch[1]]
    assert [int(it["pack_id"]) for it in batch] == [2, 0, len(ds) - 1]
    for it, i in zip(batch, [2, 0, len(ds) - 1]):
        _same_values(it, ds[i], FIELDS)
    with pytest.raises(IndexError):
        batch[3]
    with pytest.raises(IndexError):
        ds.__getitems__([0, len(ds)])
    # Replacing an item's tensor makes the collates copy from the items (the new value wins).
    shared = collate_varlen(batch)
    first["input_ids"] = first["input_ids"] + 1
    assert not batch.intact()
    copied = collate_varlen(batch)
    n = first["input_ids"].shape[0]
    assert torch.equal(copied["input_ids"][0, :n], shared["input_ids"][0, :n] + 1)
    assert torch.equal(copied["input_ids"][0, n:], shared["input_ids"][0, n:])
    # The default collate of torch also takes a PackBatch (a Sequence of dicts).
    from torch.utils.data import default_collate

    fresh = ds.__getitems__([1, 1])
    stacked = default_collate(fresh)
    assert stacked["input_ids"].shape == (2, fresh[0]["input_ids"].shape[0])


def _identity(batch):
    return batch


def test_pack_batch_crosses_workers_uncollated_as_its_buffer(two_stores):
    """``collate_fn=lambda b: b`` sends the PackBatch itself: its one buffer, not numpy copies of it."""
    import pickle

    from torch.utils.data import DataLoader

    ds = PackedDataset(two_stores[1000], "g")
    local = ds.__getitems__([0, 1, 2])
    assert len(pickle.dumps(local)) < 2 * local.arena.base.numel() + 4096  # was ~4x: every numpy view copied
    for got in DataLoader(ds, batch_size=3, num_workers=2, collate_fn=_identity):
        assert isinstance(got, PackBatch) and got.arena.base.is_shared()
        want = ds.__getitems__(got.pack_ids.tolist())
        for g, w in zip(got, want):
            _same_values(g, w, FIELDS)
        v, w = collate_varlen(got), collate_varlen(want)
        assert all(torch.equal(v[k], w[k]) for k in ("input_ids", "labels", "position_ids", "doc_ids", "cu_seqlens"))
