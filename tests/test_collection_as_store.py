"""A collection is the store a physical merge of its members would be (spec/COLLECTION.md §6), in every public name.

``Collection`` has every public attribute of ``Store`` (and its images every one of ``ImageStore``), and each one
either gives the value the physical merge of the same members gives (``packfmt merge --physical``), or is listed in
``BY_DESIGN`` with why it differs: a new public name on ``Store`` fails here until it is given to ``Collection``
and compared. The collection-wide arrays are lazy: an index reads only the members it touches. Also READER.md §6's
pack weights, computed here from their definition.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packfmt.collection import Collection, merge_physical, write_collection
from packfmt.collection.images import CollectionImages
from packfmt.packindex import build_pack_index
from packfmt.reader import ImageStore, Store
from packfmt.torch import DistributedPackSampler, PackedDataset

from mixed_stores import build_mixed_stores

#: Store's public names whose value is, by design, not the merged store's: how the data is held, not what it is.
BY_DESIGN = {
    "path": "the collection's own directory",
    "manifest": "a CollectionManifest (members, unified) where a store has a Manifest (files)",
    "manifest_bytes": "the collection's manifest.json, not the merged store's",
    "index_binding": "an index binds to the member list (COLLECTION §4), a store's to its tokens and offsets",
    "member": "the collection's member stores; a store is a collection of one",
    "member_of": "members are the collection's; a store has one",
    "locate": "(member, local document) over the collection's members",
    "num_members": "the collection's members; a store is one",
    "doc_start": "running sums over the collection's members",
    "token_start": "running sums over the collection's members",
    "image_start": "running sums over the collection's members",
    "all_trained": "per member of the collection: which read as all-trained (§2.3)",
    "segment_bounds": "the same bounds, as lengths (a collection holds them) rather than offsets",
    "origin": "where the object was opened from (a URL and its cache), not what it holds",
    "url": "where the object was opened from, not what it holds",
    "location": "where the object was opened from (its URL, else its path), not what it holds",
    "streamed": "whether members are fetched as reads need them (remote.streamed), not what they hold",
    "resident_members": "how the members are mapped for a reader (collection.resident), not what they hold",
}


def _public(obj) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The mixed collection (text: no mask, no image id; chat: a mask; vqa: a mask, images) with an index, and its
    physical merge (the index carried)."""
    root = tmp_path_factory.mktemp("as_store")
    stores = build_mixed_stores(root)
    coll = write_collection(root / "mix", [(None, stores[k]) for k in ("text", "chat", "vqa")])
    build_pack_index(coll.path, capacity=256, algorithm="ffd", name="ffd-256")
    merged = merge_physical([coll.path], root / "merged")
    return Collection(coll.path), merged


def _same_array(a, b) -> bool:
    return np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(np.asarray(a), np.asarray(b))


def _same_images(c: Collection, s: Store) -> bool:
    ci, si = c.images, s.images
    assert isinstance(ci, CollectionImages) and len(ci) == len(si) == s.num_images > 0
    for name in ("meta", "token_spans", "blobs", "offsets", "doc_image_offsets"):
        assert _same_array(getattr(ci, name), getattr(si, name)), name
    for i in range(len(si)):
        assert bytes(ci.data(i)) == bytes(si.data(i)) and ci.codec(i) == si.codec(i) and ci.size(i) == si.size(i)
        assert np.array_equal(ci.decode(i), si.decode(i))
    assert all(ci.of_document(g) == si.of_document(g) for g in range(s.num_documents))
    assert ci.store is c and si.store is s
    return True


def _same_indexes(c: Collection, s: Store) -> bool:
    assert c.pack_index_names() == s.pack_index_names() == ["ffd-256"]
    a, b = c.pack_index("ffd-256"), s.pack_index("ffd-256")
    return _same_array(a.pack_offsets, b.pack_offsets) and _same_array(a.segments, b.segments)


#: How each other public name of Store is compared with the merged store's.
COMPARED = {
    "tokens": lambda c, s: _same_array(c.tokens, s.tokens),
    "loss_mask": lambda c, s: _same_array(c.loss_mask, s.loss_mask),
    "doc_offsets": lambda c, s: _same_array(c.doc_offsets, s.doc_offsets),
    "doc_lengths": lambda c, s: _same_array(c.doc_lengths, s.doc_lengths),
    "images": _same_images,
    "document": lambda c, s: all(_same_array(c.document(g), s.document(g)) for g in range(-1, s.num_documents)),
    "document_loss_mask": lambda c, s: all(_same_array(c.document_loss_mask(g), s.document_loss_mask(g))
                                           for g in range(s.num_documents)),
    "pack_index": _same_indexes,
    "pack_index_names": _same_indexes,
    **{name: (lambda name: lambda c, s: getattr(c, name) == getattr(s, name))(name)
       for name in ("num_documents", "num_tokens", "num_images", "vocab_size", "token_dtype", "np_token_dtype",
                    "has_loss_mask", "special_tokens")},
}


def test_every_public_name_of_store_is_on_collection(pair):
    coll, merged = pair
    missing = sorted(_public(merged) - _public(coll))
    assert not missing, f"Collection lacks Store's {missing} (spec/COLLECTION.md §6: a collection is that store)"
    assert not sorted(_public(merged.images) - _public(coll.images)), "CollectionImages lacks ImageStore names"
    assert set(BY_DESIGN).isdisjoint(COMPARED)
    assert _public(merged) == set(BY_DESIGN) | set(COMPARED), "decide for each new public name of Store: compare it"
    assert {n for n in dir(ImageStore) if not n.startswith("_")} <= _public(CollectionImages(coll))


@pytest.mark.parametrize("name", sorted(COMPARED))
def test_each_value_is_the_physical_merges(pair, name):
    coll, merged = pair
    assert COMPARED[name](coll, merged), name


def test_the_views_are_lazy_and_zero_copy_inside_a_member(pair):
    """An index opens only the members it touches; a slice inside one member is a view of its memmap."""
    coll = Collection(pair[0].path)
    a, b = int(coll.token_start[1]), int(coll.token_start[2])
    part = coll.tokens[a + 1:b - 1]
    assert list(coll._open) == [1] and np.shares_memory(part, coll.member(1).tokens)
    assert not part.flags.writeable
    j = int(coll.image_start[2])
    assert bytes(coll.images.data(j)) == bytes(coll.member(2).images.data(0)) and list(coll._open) == [1, 2]
    text = Collection(pair[0].path)  # the text member has no mask: its bits are ones, and it is never opened for them
    assert text.loss_mask[0:int(text.token_start[1])].tolist() == [1] * int(text.token_start[1])
    assert list(text._open) == []
    assert text.manifest_bytes == (pair[0].path / "manifest.json").read_bytes()


def _position(data, view) -> int:
    """An index near a member boundary of ``view`` (or its ends), sometimes out of range, sometimes negative."""
    n = len(view)
    anchor = data.draw(st.sampled_from(sorted(set(view.starts.tolist()) | {0, n})))
    i = anchor + data.draw(st.integers(-3, 3))
    return i - n if data.draw(st.booleans()) else i


def _key(data, view):
    kind = data.draw(st.sampled_from(["int", "slice", "array", "row"]))
    if kind in ("int", "row"):
        i = _position(data, view)
        return (i, data.draw(st.integers(-2, 1))) if kind == "row" and view.ndim == 2 else i
    if kind == "slice":
        bounds = [data.draw(st.none() | st.just(_position(data, view))) for _ in range(2)]
        return slice(*bounds, data.draw(st.none() | st.sampled_from([1, 2, 5, -1, -3])))
    return np.array([_position(data, view) for _ in range(data.draw(st.integers(0, 8)))], dtype=np.int64)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_indexing_a_view_is_indexing_the_merged_array(pair, data):
    """Every index a numpy array takes (integers, slices of any step, integer arrays; a (row, column) pair of a 2-D
    array), near and across member boundaries, gives the merged store's answer, or the same IndexError."""
    coll, merged = pair
    views = [(coll.tokens, merged.tokens), (coll.loss_mask, merged.loss_mask),
             (coll.images.token_spans, merged.images.token_spans), (coll.images.meta, merged.images.meta)]
    for view, want in views:
        key = _key(data, view)
        try:
            expected = np.asarray(want)[key]
        except IndexError:
            with pytest.raises(IndexError):
                view[key]
            continue
        got = view[key]
        assert np.asarray(got).shape == np.asarray(expected).shape and np.array_equal(got, expected), (key, got)
    mask = np.zeros(len(coll.tokens), dtype=bool)
    mask[::7] = True
    assert np.array_equal(coll.tokens[mask], np.asarray(merged.tokens)[mask])


@pytest.mark.parametrize("balance", ["tokens", "images", "none"])
def test_pack_weights_are_readers_definition(pair, balance):
    """READER.md §6: tokens: sum(end - begin) over a pack's segments; images: images whose token runs lie inside one
    of its segments; none: no weights. Computed here from the index and the store, then compared with the sampler's."""
    coll, merged = pair
    idx = merged.pack_index("ffd-256")
    po, segs = np.asarray(idx.pack_offsets), np.asarray(idx.segments)
    dio, spans, doc_off = (np.asarray(merged.images.doc_image_offsets), np.asarray(merged.images.token_spans),
                           np.asarray(merged.doc_offsets))
    want = []
    for p in range(idx.num_packs):
        tokens = images = 0
        for d, b, e in segs[po[p]:po[p + 1]].tolist():
            tokens += e - b
            runs = spans[dio[d]:dio[d + 1]] - doc_off[d]
            images += int(((runs[:, 0] >= b) & (runs[:, 1] <= e)).sum())
        want.append(tokens if balance == "tokens" else images)
    for ds in (PackedDataset(coll.path, "ffd-256"), PackedDataset(merged.path, "ffd-256")):
        got = DistributedPackSampler._pack_weights(ds, balance)
        assert got is None if balance == "none" else got.tolist() == want
    if balance == "images":
        assert sum(want) == merged.num_images  # ffd splits: every image lies in exactly one segment
