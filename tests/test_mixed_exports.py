"""A mixed collection (text + chat + image-text, one tokenizer; spec/COLLECTION.md §2.3) exports exactly.

The collection is four real stores built by the CLI: ``text`` (no loss mask, no image id), ``pics`` (a
small LLaVA store, 3 images), ``chat`` (a loss mask) and ``vqa`` (LLaVA, 6 images); ``pics`` sits before
``vqa`` so that the vqa member's collection-wide image ids are offset (3..8), not its own (0..5). It is
packed with ``--weights`` (text's fractional: 1.5 copies) and ``--oversize split`` at a capacity that
cuts text and chat documents. Then:

- ``export webdataset`` read back through Megatron-Energon (``energon prepare``, ``get_train_dataset`` +
  ``get_loader``, the task encoder of spec/WEBDATASET.md §3) equals ``PackedDataset`` at every position,
  cuts included, with the concrete collection-wide image ids, and the text member trained everywhere
  but at its documents' ends;
- ``export megatron`` read back by megatron-core's ``IndexedDataset`` holds every document in collection
  order, and the loss-mask dataset beside it ones for the text member and each other member's own mask.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import packfmt
from packfmt.cli import main
from packfmt.collection import write_collection
from packfmt.torch import PackedDataset

from mixed_stores import build_llava, build_mixed_stores
from test_energon import PackTaskEncoder, check_cooked, energon_epoch, energon_read, export_and_prepare, same_pixels
from test_megatron import _megatron

IGNORE = -100
CAPACITY = 128
WEIGHTS = {"text": 1.5, "pics": 1, "chat": 1, "vqa": 2}
ORDER = ("text", "pics", "chat", "vqa")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """(collection, member store paths by name, the pack index's name)."""
    root = tmp_path_factory.mktemp("mixed_exports")
    stores = build_mixed_stores(root)
    stores["pics"] = build_llava(root, "pics", [(20, 36), (44, 18)], records=4, shade=120)
    coll = write_collection(root / "mix", [(name, stores[name]) for name in ORDER])
    weights = ",".join(f"{k}={v}" for k, v in WEIGHTS.items())
    assert main(["pack", str(coll.path), "--capacity", str(CAPACITY), "--weights", weights, "--seed", "5",
                 "--oversize", "split", "--algorithm", "ffd", "--name", "mix"]) == 0
    return packfmt.open(coll.path), stores, "mix"


def member_of(coll, doc: int) -> str:
    return ORDER[int(np.searchsorted(np.asarray(coll.doc_start), doc, side="right")) - 1]


def test_the_pack_index_cuts_text_and_chat_documents_and_repeats_by_weight(mixed):
    coll, stores, idx = mixed
    assert coll.manifest.unified == {"loss_mask": ("text",), "special_tokens.image": ("text", "chat")}
    assert [int(coll.member(m).num_images) for m in range(4)] == [0, 3, 0, 6]
    ds = PackedDataset(coll.path, idx)
    segs = np.asarray(ds.index.segments)
    lengths = np.asarray(coll.doc_lengths)
    copies = Counter(int(d) for d, b, e in segs if b == 0)  # one first piece per copy of a document
    text = packfmt.open(stores["text"]).num_documents
    assert {copies[d] for d in range(text)} == {1, 2}  # 1.5: every document once, some twice
    assert all(copies[d] == 2 for d in range(int(coll.doc_start[3]), coll.num_documents))  # vqa=2
    cut = {member_of(coll, int(d)) for d, b, e in segs if e < lengths[d]}
    assert {"text", "chat"} <= cut


def test_webdataset_export_through_energon_equals_packed_dataset(mixed, tmp_path):
    from megatron.energon import SampleDecoder

    coll, stores, idx = mixed
    out = export_and_prepare(coll.path, idx, tmp_path / "wds", shard_bytes=1 << 16)
    assert len(list(out.glob("shard-*.tar"))) > 1
    ds = PackedDataset(coll.path, idx)
    lengths = np.asarray(coll.doc_lengths)

    # the crude samples: the label at every cut is the document's true next token unless masked
    crude = energon_read(out, SampleDecoder())
    text_cuts = chat_cuts = 0
    for s in crude:
        for j, d in enumerate(s["json"]["documents"]):
            g, end = d["document"], d["end"]
            if end == lengths[g]:
                assert s["last_labels.npy"][j] == IGNORE
                continue
            nxt, bit = int(coll.document(g)[end]), int(coll.document_loss_mask(g)[end])
            assert s["last_labels.npy"][j] == (nxt if bit else IGNORE)
            if member_of(coll, g) == "text":
                assert s["last_labels.npy"][j] == nxt != IGNORE  # maskless: every cut has its real target
                text_cuts += 1
            elif member_of(coll, g) == "chat" and bit:
                chat_cuts += 1
    assert text_cuts > 0 and chat_cuts > 0

    # the task encoder's batches equal PackedDataset's everywhere (labels, positions, cu_seqlens, images)
    got = energon_epoch(out, PackTaskEncoder())
    images = check_cooked(got, ds, coll)
    ids = Counter(i for s in got for i in s.image_ids.tolist())
    assert images == sum(ids.values()) == 3 * 1 + 6 * 2
    assert ids == Counter({0: 1, 1: 1, 2: 1, **{3 + i: 2 for i in range(6)}})  # vqa's own 0..5 come out as 3..8
    pics, vqa = packfmt.open(stores["pics"]), packfmt.open(stores["vqa"])
    docs_of_image = {}
    for c, s in zip(crude, got):
        cu = s.cu_seqlens.tolist()
        for g, (b, e), pixels in zip(s.image_ids.tolist(), s.image_spans.tolist(), s.images):
            j = int(np.searchsorted(cu, b, side="right")) - 1
            assert cu[j] <= b < e <= cu[j + 1]  # an image's tokens lie in one segment
            docs_of_image.setdefault(g, set()).add(member_of(coll, c["json"]["documents"][j]["document"]))
            own = pics if g < 3 else vqa
            assert same_pixels(pixels, bytes(own.images.data(g if g < 3 else g - 3)))
    assert docs_of_image == {**{g: {"pics"} for g in range(3)}, **{g: {"vqa"} for g in range(3, 9)}}

    # the text member is trained at every position but its documents' last tokens
    text_docs = int(coll.doc_start[1])
    trained = 0
    for c, s in zip(crude, got):
        assert c["__key__"] == s.__key__
        cu, labels = s.cu_seqlens.tolist(), s.labels[0]
        for j, d in enumerate(c["json"]["documents"]):
            if d["document"] >= text_docs:
                continue
            seg = labels[cu[j]:cu[j + 1]]
            assert bool((seg[:-1] != IGNORE).all())
            assert (int(seg[-1]) == IGNORE) == (d["end"] == lengths[d["document"]])
            trained += int((seg != IGNORE).sum())
    copies = Counter(int(d) for d, b, e in np.asarray(ds.index.segments) if b == 0)
    assert trained == sum(copies[d] * (int(lengths[d]) - 1) for d in range(text_docs))


def test_megatron_export_of_the_mixed_collection(mixed, tmp_path):
    IndexedDataset, _ = _megatron()
    coll, stores, _ = mixed
    prefix = tmp_path / "mg" / "mix"
    assert main(["export", "megatron", str(coll.path), str(prefix)]) == 0
    tokens, mask = IndexedDataset(str(prefix)), IndexedDataset(str(prefix) + "_loss_mask")
    assert len(tokens) == len(mask) == coll.num_documents
    assert list(tokens.document_indices) == list(range(coll.num_documents + 1))
    g = 0
    for name in ORDER:  # each member's own store, member after member
        store = packfmt.open(stores[name])
        for d in range(store.num_documents):
            assert np.array_equal(np.asarray(tokens[g]), store.document(d)), (name, d)
            own = store.document_loss_mask(d)
            if name == "text":
                assert own is None and not store.has_loss_mask
                assert np.asarray(mask[g]).tolist() == [1] * len(store.document(d))
            else:
                assert np.array_equal(np.asarray(mask[g]), own), (name, d)
            g += 1
    assert g == coll.num_documents
    chat_mask = np.concatenate([np.asarray(mask[k]) for k in range(int(coll.doc_start[2]), int(coll.doc_start[3]))])
    assert 0 < chat_mask.sum() < chat_mask.size  # the chat member's own mask: prompts 0, answers 1
