"""PackedDataset and collate output checked against a reference built from the raw documents."""

from __future__ import annotations

import contextlib
import io
import pickle
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packfmt
from images import png
from packfmt.torch import IGNORE_INDEX, PAD_DOC_ID, PackedDataset, collate_hf, collate_padded, collate_varlen
from packfmt.torch.testing import next_fit_segments, write_pack_index


# ----------------------------------------------------------------------------- reference
def reference_pack(docs, masks, segments):
    """The expected per-token arrays of one pack, one token at a time."""
    ids, labels, pos, seg_ids = [], [], [], []
    for s, (d, b, e) in enumerate(segments):
        doc, mask = docs[d], masks[d]
        for t in range(b, e):
            ids.append(doc[t])
            target_ok = t + 1 < len(doc) and (mask is None or mask[t + 1] == 1)
            labels.append(doc[t + 1] if target_ok else IGNORE_INDEX)
            pos.append(t - b)
            seg_ids.append(s)
    return ids, labels, pos, seg_ids


def make_store(root: Path, docs, masks, vocab):
    with packfmt.DatasetWriter(root / "ds", vocab_size=vocab, loss_mask=masks[0] is not None) as w:
        for doc, mask in zip(docs, masks):
            w.add_document(doc, mask)
    return packfmt.open(root / "ds")


corpus = st.integers(1, 2**31 - 1).flatmap(lambda seed: st.tuples(
    st.just(seed),
    st.lists(st.integers(1, 40), min_size=1, max_size=25),   # document lengths
    st.integers(1, 32),                                      # capacity
    st.booleans(),                                           # loss mask
    st.booleans(),                                           # materialize
    st.booleans(),                                           # pad_to_capacity
    st.sampled_from([255, 70000]),                           # uint16 / uint32 tokens
))


def _case_store(tmp: Path, case):
    """Write the documents of a ``corpus`` case and a next-fit pack index "p" over them."""
    seed, lengths, capacity, with_mask, materialize, pad, vocab = case
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, vocab, n).tolist() for n in lengths]
    masks = [rng.integers(0, 2, n).tolist() if with_mask else None for n in lengths]
    store = make_store(tmp, docs, masks, vocab)
    segs, po = next_fit_segments(store.doc_lengths, capacity, order=rng.permutation(len(docs)))
    write_pack_index(store, segs, po, capacity=capacity, name="p", materialize=materialize)
    return store, rng, docs, masks, segs, po


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpus)
def test_items_and_collates_match_reference(case):
    seed, lengths, capacity, with_mask, materialize, pad, vocab = case
    with tempfile.TemporaryDirectory() as tmp:
        store, rng, docs, masks, segs, po = _case_store(Path(tmp), case)
        ds = PackedDataset(store, "p", pad_to_capacity=pad)
        assert len(ds) == len(po) - 1
        items = []
        for i in range(len(ds)):
            item = ds[i]
            pack_segs = segs[po[i]:po[i + 1]].tolist()
            ids, labels, pos, seg_ids = reference_pack(docs, masks, pack_segs)
            n = len(ids)
            assert item["input_ids"].dtype == torch.int64
            assert item["input_ids"][:n].tolist() == ids
            assert item["labels"][:n].tolist() == labels
            assert item["position_ids"][:n].tolist() == pos
            assert item["doc_ids"][:n].tolist() == seg_ids
            assert item["seq_lens"].tolist() == [e - b for _, b, e in pack_segs]
            assert item["document_ids"].tolist() == [d for d, _, _ in pack_segs]
            assert int(item["num_label_tokens"]) == sum(x != IGNORE_INDEX for x in labels)
            if pad:
                assert item["input_ids"].shape[0] == capacity
                assert set(item["labels"][n:].tolist()) <= {IGNORE_INDEX}
                assert set(item["doc_ids"][n:].tolist()) <= {PAD_DOC_ID}
            else:
                assert item["input_ids"].shape[0] == n
            items.append(item)
        check_collates(items, segs, po, docs, masks, capacity)


def check_collates(items, segs, po, docs, masks, capacity):
    batch_segs = np.concatenate([segs[po[int(it["pack_id"])]:po[int(it["pack_id"]) + 1]] for it in items])
    lens = (batch_segs[:, 2] - batch_segs[:, 1]).tolist()
    ids, labels, pos, _ = reference_pack(docs, masks, batch_segs.tolist())
    v = collate_varlen(items)
    assert v["cu_seqlens"].dtype == torch.int32
    assert v["cu_seqlens"].tolist() == np.concatenate([[0], np.cumsum(lens)]).tolist()
    assert all(x > 0 for x in np.diff(v["cu_seqlens"].numpy()))
    assert isinstance(v["max_seqlen"], int) and v["max_seqlen"] == max(lens)
    assert v["input_ids"][0].tolist() == ids and v["labels"][0].tolist() == labels and v["position_ids"][0].tolist() == pos
    assert v["doc_ids"][0].tolist() == np.repeat(np.arange(len(lens)), lens).tolist()
    assert int(v["num_label_tokens"]) == sum(x != IGNORE_INDEX for x in labels)

    hf = collate_hf(items)
    assert "attention_mask" not in hf and hf["use_cache"] is False
    assert torch.equal(hf["cu_seq_lens_q"], v["cu_seqlens"]) and hf["max_length_k"] == max(lens)
    assert torch.equal(hf["shift_labels"], v["labels"])
    # unshifted convention: labels[t] is the target of t-1 inside a segment, -100 at segment starts
    assert hf["labels"][0, v["cu_seqlens"][:-1].long()].eq(IGNORE_INDEX).all()

    p = collate_padded(items, length=capacity)
    assert p["input_ids"].shape == (len(items), capacity)
    real = p["doc_ids"] >= 0
    assert p["input_ids"][real].tolist() == ids and p["labels"][real].tolist() == labels
    assert p["labels"][~real].eq(IGNORE_INDEX).all()
    assert int(p["num_label_tokens"]) == int(v["num_label_tokens"])


# ----------------------------------------------------------------------------- specific behaviours
@pytest.fixture()
def chat(tmp_path):
    # document 0: user turn (mask 0) then assistant turn (mask 1), cut at token 4; pack 1 holds its
    # second part and document 1 (6 tokens: the capacity, V29)
    docs = [[10, 11, 12, 13, 20, 21, 22], [30, 31, 32]]
    masks = [[0, 0, 0, 0, 1, 1, 1], [0, 1, 1]]
    store = make_store(tmp_path, docs, masks, 100)
    segs = np.array([[0, 0, 4], [0, 4, 7], [1, 0, 3]])
    write_pack_index(store, segs, np.array([0, 1, 3]), capacity=6, name="p")
    return store


def test_split_document_cut_label_and_positions(chat):
    ds = PackedDataset(chat, "p")
    first, second = ds[0], ds[1]
    # label of the first segment's last token = the document's next token (20), a training target
    assert first["labels"].tolist() == [IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, 20]
    # the continuation restarts positions at 0; user-turn targets (mask 0) are never labels
    assert second["position_ids"].tolist() == [0, 1, 2, 0, 1, 2]
    assert second["labels"].tolist() == [21, 22, IGNORE_INDEX, 31, 32, IGNORE_INDEX]
    assert second["doc_ids"].tolist() == [0, 0, 0, 1, 1, 1]


def test_pickles_small_and_reopens_lazily(chat):
    ds = PackedDataset(chat, "p")
    _ = ds[0]
    blob = pickle.dumps(ds)
    assert len(blob) < 600
    clone = pickle.loads(blob)
    assert clone._store is None and clone._index is None  # nothing mapped until first use
    assert torch.equal(clone[1]["labels"], ds[1]["labels"])
    assert clone.fingerprint == ds.fingerprint


def test_collates_take_hand_built_items(chat):
    """Items a user builds or edits (own tensors, a plain int pack_id) collate like the dataset's own."""
    ds = PackedDataset(chat, "p")
    hand = [{k: (int(v) if k == "pack_id" else v.clone()) for k, v in ds[i].items()} for i in (1, 0)]
    hand[0]["labels"][0] = IGNORE_INDEX  # an edit must be honoured, and counted
    want_labels = torch.cat([hand[0]["labels"], hand[1]["labels"]])
    v = collate_varlen(hand)
    assert torch.equal(v["labels"][0], want_labels)
    assert int(v["num_label_tokens"]) == int((want_labels != IGNORE_INDEX).sum()) == 4
    assert v["pack_ids"].tolist() == [1, 0] and v["cu_seqlens"].tolist() == [0, 3, 6, 10]
    assert v["document_ids"].tolist() == [0, 1, 0] and v["max_seqlen"] == 4
    p = collate_padded(hand)
    assert p["pack_ids"].tolist() == [1, 0] and int(p["num_label_tokens"]) == 4
    assert p["labels"][1].tolist() == [IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, 20, IGNORE_INDEX, IGNORE_INDEX]


def test_index_out_of_range(chat):
    ds = PackedDataset(chat, "p")
    with pytest.raises(IndexError):
        ds[2]
    assert torch.equal(ds[-1]["input_ids"], ds[1]["input_ids"])


def test_multimodal_images_and_spans(tmp_path):
    IMG = 99
    docs = [[1, IMG, IMG, IMG, 2, 3], [4, 5, IMG, IMG, 6]]
    recs = [[packfmt.ImageRecord(png(4, 3, (255, 0, 0)), 4, 3, "png", 1, 4)],
            [packfmt.ImageRecord(png(2, 2, (0, 0, 255)), 2, 2, "png", 2, 4)]]
    with packfmt.DatasetWriter(tmp_path / "ds", vocab_size=100, special_tokens={"image": IMG}) as w:
        for doc, rec in zip(docs, recs):
            w.add_document(doc, images=rec)
    store = packfmt.open(tmp_path / "ds")
    write_pack_index(store, np.array([[1, 0, 5], [0, 0, 6]]), np.array([0, 2]), capacity=16, name="p")
    ds = PackedDataset(store, "p", image_transform=lambda t: t.permute(2, 0, 1).float() / 255)
    item = ds[0]
    assert item["image_ids"].tolist() == [1, 0]
    assert item["image_spans"].tolist() == [[2, 4], [6, 9]]
    for (b, e) in item["image_spans"].tolist():
        assert item["input_ids"][b:e].eq(IMG).all()
    assert item["images"][0].shape == (3, 2, 2) and item["images"][1].shape == (3, 3, 4)
    assert item["images"][1][0].eq(1.0).all() and item["images"][0][2].eq(1.0).all()  # red, blue
    v = collate_varlen([item, item])
    assert v["image_spans"].tolist() == [[2, 4], [6, 9], [13, 15], [17, 20]]
    assert len(v["images"]) == 4


def test_works_with_index_from_build_pack_index(tmp_path):
    pytest.importorskip("packfmt.packing")
    from packfmt.packindex import build_pack_index

    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50, n).tolist() for n in rng.integers(1, 30, 40)]
    store = make_store(tmp_path, docs, [None] * len(docs), 50)
    try:
        idx = build_pack_index(store, capacity=16, algorithm="ffd", materialize=True)
    except (ImportError, NotImplementedError) as exc:  # packing engine still landing
        pytest.skip(f"build_pack_index unavailable: {exc}")
    ds = PackedDataset(store, idx.name)
    seen = []
    for i in range(len(ds)):
        item = ds[i]
        segs = np.asarray(idx.pack_segments(i)).tolist()
        ids, labels, pos, _ = reference_pack(docs, [None] * len(docs), segs)
        assert item["input_ids"].tolist() == ids and item["labels"].tolist() == labels
        assert item["position_ids"].tolist() == pos and len(ids) <= 16
        seen += [(d, b, e) for d, b, e in segs]
    covered = {d: 0 for d in range(len(docs))}
    for d, b, e in seen:
        covered[d] += e - b
    assert covered == {d: len(doc) for d, doc in enumerate(docs)}


# ----------------------------------------------------------------------------- one buffer per batch, int32 mode
def _storages(batch) -> set[int]:
    return {v.untyped_storage().data_ptr() for v in batch.values() if isinstance(v, torch.Tensor)}


def _assert_same_batch(got, want, int32=False):
    assert list(got) == list(want)
    for k, w in want.items():
        g = got[k]
        if isinstance(w, torch.Tensor):
            narrow = int32 and k in ("input_ids", "position_ids", "doc_ids")
            assert g.dtype == (torch.int32 if narrow else w.dtype), k
            assert g.shape == w.shape and torch.equal(g.long(), w.long()), k
        else:
            assert g == w, k


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpus)
def test_int32_index_dtype_equals_int64_everywhere(case):
    """int32 mode: the same values as int64 in items, __getitems__ items and every collate (both paths)."""
    seed, lengths, capacity, with_mask, materialize, pad, vocab = case
    with tempfile.TemporaryDirectory() as tmp:
        store, rng, docs, masks, segs, po = _case_store(Path(tmp), case)
        d64 = PackedDataset(store, "p", pad_to_capacity=pad)
        d32 = PackedDataset(store, "p", pad_to_capacity=pad, index_dtype=torch.int32)
        packs = rng.integers(0, len(d64), 5).tolist()
        for d in (d32, d64):
            collate_hf(d.__getitems__(packs))  # from now on batches reserve collate_hf's labels
        for i in packs:
            _assert_same_batch(d32[i], d64[i], int32=True)
        for a, b in zip(d32.__getitems__(packs), d64.__getitems__(packs)):
            _assert_same_batch(a, b, int32=True)
        for collate in (collate_varlen, collate_hf, lambda b: collate_padded(b, length=capacity),
                        lambda b: collate_padded(b, length=capacity + 3, pad_token_id=7)):
            want = collate(d64.__getitems__(packs))
            for got in (collate(d32.__getitems__(packs)), collate([d32[i] for i in packs])):
                _assert_same_batch(got, want, int32=True)
                assert len(_storages(got)) == 1  # one buffer per batch, both paths


def test_int32_rejected_options(chat):
    with pytest.raises(ValueError, match="index_dtype"):
        PackedDataset(chat, "p", index_dtype=torch.int16)
    ds = pickle.loads(pickle.dumps(PackedDataset(chat, "p", index_dtype=torch.int32)))
    assert ds.index_dtype == torch.int32 and ds[0]["input_ids"].dtype == torch.int32


def _dupfd_count(obj, monkeypatch) -> int:
    """How many file descriptors torch's multiprocessing pickler would send for ``obj``."""
    import multiprocessing.reduction as mr

    import torch.multiprocessing  # noqa: F401  (registers torch's reductions with ForkingPickler)

    calls = []
    real = mr.DupFd
    monkeypatch.setattr(mr, "DupFd", lambda fd: calls.append(fd) or real(fd))
    mr.ForkingPickler(io.BytesIO()).dump(obj)
    monkeypatch.setattr(mr, "DupFd", real)
    return len(calls)


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_batch_is_one_storage_and_one_shared_segment(chat, monkeypatch, index_dtype):
    """Every collate returns views of one buffer, which torch's pickler sends as ONE fd."""
    ds = PackedDataset(chat, "p", index_dtype=index_dtype)
    dsp = PackedDataset(chat, "p", pad_to_capacity=True, index_dtype=index_dtype)
    # collate_hf's unshifted labels get room in the batch buffer once the dataset has seen collate_hf
    # in this process (a batch made before that holds no unused bytes, so it gets its own tensor).
    first = collate_hf(ds.__getitems__([1, 0]))
    assert len(_storages(first)) == 2 and ds._hf_room
    assert "hf_labels" not in PackedDataset(chat, "p").__getitems__([0]).arena
    batches = [collate_varlen(ds.__getitems__([0, 1])), collate_hf(ds.__getitems__([1, 0])),
               collate_padded(dsp.__getitems__([0, 0]), length=6), collate_padded(ds.__getitems__([0, 1])),
               collate_varlen([ds[0], ds[1]]),
               collate_padded([ds[0], ds[1]])]
    for b in batches:
        assert len(_storages(b)) == 1
        assert _dupfd_count(b, monkeypatch) == 1
    item = ds[1]
    assert len(_storages(item)) == 1 and _dupfd_count(item, monkeypatch) == 1
    # Counter-check that the counter counts: two separate storages send two fds.
    assert _dupfd_count({"a": torch.zeros(3), "b": torch.zeros(3)}, monkeypatch) == 2


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_worker_batches_arrive_as_one_storage(chat, index_dtype):
    """Real DataLoader workers: each batch reaches the main process as one shared storage, values intact."""
    from torch.utils.data import DataLoader

    ds = PackedDataset(chat, "p", index_dtype=index_dtype)
    for collate in (collate_varlen, collate_hf):
        want = [collate(ds.__getitems__([i])) for i in range(len(ds))]
        dl = DataLoader(ds, batch_size=1, collate_fn=collate, num_workers=2)
        got = list(dl)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _assert_same_batch(g, w)
            assert len(_storages(g)) == 1 and g["input_ids"].is_shared()


def test_to_and_pin_memory_copy_each_buffer_once(chat):
    """``SharedBatch.to`` / ``pin_memory`` rebuild the views on ONE copy of the buffer."""
    from torch.utils.data import DataLoader

    ds = PackedDataset(chat, "p")
    collate_hf(ds.__getitems__([0, 1]))  # the dataset now reserves room for collate_hf's labels
    b = collate_hf(ds.__getitems__([0, 1]))
    moved = b.to("meta")
    assert list(moved) == list(b) and moved["max_length_q"] == b["max_length_q"]
    assert all(v.device.type == "meta" for v in moved.values() if isinstance(v, torch.Tensor))
    assert len({v.untyped_storage().nbytes() for v in moved.values() if isinstance(v, torch.Tensor)}) == 1
    assert moved["cu_seq_lens_q"].shape == b["cu_seq_lens_q"].shape
    # The same rebuild on CPU: a copied span gives equal values, all views of one new storage.
    copied = b._map(lambda t: t.clone(), lambda v: v)
    _assert_same_batch(copied, b)
    assert len(_storages(copied)) == 1 and _storages(copied) != _storages(b)
    assert copied["cu_seq_lens_q"].data_ptr() == copied["cu_seq_lens_k"].data_ptr()
    # A replaced value is its own group; the rest still share one storage.
    b["labels"] = b["labels"].clone()
    copied = b._map(lambda t: t.clone(), lambda v: v)
    _assert_same_batch(copied, b)
    assert len(_storages(copied)) == 2
    # pin_memory=True still works end to end (on a CPU-only build torch skips pinning with a warning).
    with pytest.warns(UserWarning) if not torch.accelerator.is_available() else contextlib.nullcontext():
        got = list(DataLoader(ds, batch_size=2, collate_fn=collate_varlen, num_workers=1, pin_memory=True))
    _assert_same_batch(got[0], collate_varlen(ds.__getitems__([0, 1])))
