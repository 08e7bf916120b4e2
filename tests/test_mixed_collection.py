"""Collections that mix text, chat and image-text stores of one tokenizer (spec/COLLECTION.md §2.3, format 1.2).

Real stores built by the CLI from the bundled sample data and real PNGs: a text store (no loss
mask, no image id), a chat store (a loss mask) and a LLaVA store (a loss mask, an image id, images).
The collection of the three reads as the store a physical merge writes, which is byte-identical to
one DatasetWriter given the same documents with all-ones masks for the text documents; labels from
PackedDataset (plain, weighted, materialized, through DataLoader workers) equal labels computed
here from that store's bytes.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import packfmt
from packfmt import format as F
from packfmt.cli import main
from packfmt.collection import Collection, merge_physical, write_collection
from packfmt.collection.vmap import concatenate_members
from packfmt.errors import FormatError, WriteError
from packfmt.torch import PackedDataset, collate_varlen
from packfmt.validate import validate
from packfmt.writer import ImageRecord

from mixed_stores import SAMPLE, SAMPLE_TOK, build_mixed_stores, build_store
from test_merge import STORE_FILES, assert_reads_like

IGNORE = -100


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    return build_mixed_stores(tmp_path_factory.mktemp("mixed"))


@pytest.fixture(scope="module")
def mix(stores, tmp_path_factory) -> Collection:
    return write_collection(tmp_path_factory.mktemp("coll") / "mix", [(None, stores[k]) for k in ("text", "chat", "vqa")])


@pytest.fixture(scope="module")
def merged(mix, tmp_path_factory):
    """The physical merge of the collection, with its ffd index carried over (spec/COLLECTION.md §7.2)."""
    assert main(["pack", str(mix.path), "--capacity", "512", "--algorithm", "ffd"]) == 0
    return merge_physical([(None, mix.path)], tmp_path_factory.mktemp("merged") / "one")


def expected_labels(store, segments: np.ndarray) -> np.ndarray:
    """FORMAT.md §7 labels of a run of segments, from a store's own arrays (the oracle)."""
    out = []
    for d, b, e in segments:
        doc = store.document(int(d))
        mask = store.document_loss_mask(int(d))
        nxt = np.arange(b + 1, e + 1)
        inside = nxt < doc.shape[0]
        lab = np.full(e - b, IGNORE, dtype=np.int64)
        keep = inside.copy()
        keep[inside] &= mask[nxt[inside]] != 0
        lab[keep] = doc[nxt[keep]]
        out.append(lab)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def assert_labels_of_every_pack(ds: PackedDataset, oracle) -> None:
    idx = ds.index
    segs, po = np.asarray(idx.segments), np.asarray(idx.pack_offsets)
    for p in range(len(ds)):
        assert ds[p]["labels"].numpy().tolist() == expected_labels(oracle, segs[po[p]:po[p + 1]]).tolist(), p


def same_item(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        elif isinstance(a[key], list):
            assert len(a[key]) == len(b[key]) and all(torch.equal(x, y) for x, y in zip(a[key], b[key])), key
        else:
            assert a[key] == b[key], key


# -- the collection and what it records


def test_merge_unifies_loss_mask_and_image_id_and_records_which_members(mix, stores):
    raw = mix.manifest.raw
    image_id = packfmt.open(stores["vqa"]).special_tokens["image"]
    assert raw["format_version"] == "1.3" and raw["loss_mask"] is True
    assert isinstance(image_id, int) and raw["special_tokens"]["image"] == image_id
    assert raw["unified"] == {"loss_mask": ["text"], "special_tokens.image": ["text", "chat"]}
    assert mix.all_trained == (True, False, False)
    text, chat = packfmt.open(stores["text"]), packfmt.open(stores["chat"])
    for d in range(text.num_documents):
        mask = mix.document_loss_mask(d)
        assert mask.tolist() == [1] * len(text.document(d)) and not mask.flags.writeable
    g = text.num_documents
    assert mix.document_loss_mask(g + 3).tolist() == chat.document_loss_mask(3).tolist()
    # the kernels' table: the text member's mask is never mapped, the others' are
    assert concatenate_members(mix).docs[4].tolist() == [0, 1, 1]


def test_a_collection_of_members_that_agree_has_no_unified_and_1_1_still_reads(stores, tmp_path):
    coll = write_collection(tmp_path / "c", [("a", stores["chat"]), ("b", stores["chat"])])
    raw = dict(coll.manifest.raw)
    assert "unified" not in raw and raw["loss_mask"] is True and raw["format_version"] == "1.3"
    raw["format_version"] = "1.1"
    del raw["files"]  # added in 1.3 (doc_lengths.bin): an error in a 1.1 collection
    (tmp_path / "c" / F.MANIFEST).write_bytes(F.canonical_json(raw))
    old = packfmt.open(tmp_path / "c")
    assert old.manifest.version == (1, 1) and old.document(0).tolist() == coll.document(0).tolist()


# -- byte-identical physical merge, labels everywhere


def test_physical_merge_equals_one_writer_with_all_ones_masks_for_text(mix, merged, stores, tmp_path):
    ref = tmp_path / "ref"
    shared = mix.manifest.shared
    with packfmt.DatasetWriter(ref, vocab_size=shared["vocab_size"], tokenizer=shared["tokenizer"],
                               special_tokens=shared["special_tokens"], loss_mask=True) as w:
        for name in ("text", "chat", "vqa"):
            s = packfmt.open(stores[name])
            for d in range(s.num_documents):
                toks = s.document(d)
                mask = s.document_loss_mask(d)
                imgs = []
                if s.images is not None:
                    start = int(s.doc_offsets[d])
                    for i in s.images.of_document(d):
                        (wd, ht), (b, e) = s.images.size(i), s.images.token_spans[i]
                        imgs.append(ImageRecord(bytes(s.images.data(i)), wd, ht, s.images.codec(i),
                                                int(b) - start, int(e) - start))
                w.add_document(toks, np.ones(len(toks), np.uint8) if mask is None else mask, imgs)
    for name in STORE_FILES:
        assert (merged.path / name).read_bytes() == (ref / name).read_bytes(), name
    a, b = (json.loads((p / F.MANIFEST).read_text()) for p in (merged.path, ref))
    assert a.pop("build_report")["pack_indexes"]["carried"] == ["ffd-512"]
    b.pop("build_report", None)
    assert a == b
    assert_reads_like(merged, mix)
    assert int(np.count_nonzero(np.asarray(merged.loss_mask)[:mix.member(0).num_tokens])) == mix.member(0).num_tokens


def test_packed_dataset_labels_equal_the_physical_merge_and_the_oracle(mix, merged):
    a, b = PackedDataset(mix.path, "ffd-512"), PackedDataset(merged.path, "ffd-512")
    assert len(a) == len(b) > 1
    every = list(range(len(a)))
    for p in every:
        same_item(a[p], b[p])
    batch_a, batch_b = collate_varlen(a.__getitems__(every)), collate_varlen(b.__getitems__(every))
    for key in ("input_ids", "labels", "cu_seqlens", "position_ids"):
        assert torch.equal(batch_a[key], batch_b[key]), key
    assert_labels_of_every_pack(a, merged)
    # a text document is trained on every next token: no -100 inside it
    segs = np.asarray(a.index.segments)
    text_docs = int(mix.doc_start[1])
    p = next(p for p in every if any(segs[s, 0] < text_docs for s in range(int(a.index.pack_offsets[p]),
                                                                            int(a.index.pack_offsets[p + 1]))))
    item = a[p]
    first = int(a.index.pack_offsets[p])
    run = 0
    for k, (d, b_, e) in enumerate(segs[first:int(a.index.pack_offsets[p + 1])]):
        if d < text_docs:
            labels = item["labels"][run:run + e - b_]
            assert bool((labels[:-1] != IGNORE).all())
        run += e - b_


def test_dataloader_workers_read_the_mixed_collection(mix, merged):
    ds = PackedDataset(mix.path, "ffd-512")
    loader = DataLoader(ds, batch_size=3, collate_fn=collate_varlen, num_workers=2)
    got = torch.cat([batch["labels"].reshape(-1) for batch in loader]).numpy()
    segs = np.asarray(ds.index.segments)
    assert got.tolist() == expected_labels(merged, segs).tolist()
    assert int((got != IGNORE).sum()) > 0


def test_weighted_and_materialized_packs_of_a_mixed_collection(mix, merged, capsys):
    assert main(["pack", str(mix.path), "--capacity", "512", "--weights", "text=0.5,chat=2,vqa=3", "--seed", "3",
                 "--max-images-per-pack", "2", "--name", "w"]) == 0
    assert main(["pack", str(mix.path), "--capacity", "300", "--algorithm", "bfd", "--materialize", "--name", "m"]) == 0
    w = PackedDataset(mix.path, "w")
    mixture = w.index.manifest.raw["mixture"]
    assert [m["weight"] for m in mixture["members"]] == [0.5, 2, 3]
    assert max(int(n) for n in w.pack_num_images()) <= 2 and int(w.pack_num_images().sum()) == 3 * mix.num_images
    assert_labels_of_every_pack(w, merged)
    m = PackedDataset(mix.path, "m")
    segs, off, mask = np.asarray(m.index.segments), np.asarray(merged.doc_offsets), np.asarray(merged.loss_mask)
    want = np.concatenate([mask[off[d] + b:off[d] + e] for d, b, e in segs])  # ones for the text member's tokens
    assert np.array_equal(np.asarray(m.index.packed_loss_mask), want)
    assert_labels_of_every_pack(m, merged)
    capsys.readouterr()
    assert main(["validate", str(mix.path), "--deep"]) == 0
    report = validate(mix.path, deep=True)
    assert report.ok and report.checked["pack_indexes"] == 3


def test_validate_and_inspect_count_the_text_member_as_all_trained(mix, merged, capsys):
    capsys.readouterr()
    assert main(["validate", str(mix.path)]) == 0
    assert "is a valid packfmt dataset" in capsys.readouterr().out
    assert main(["inspect", str(mix.path), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    trained = int(np.count_nonzero(np.asarray(merged.loss_mask)))
    assert s["loss_mask"]["trained_tokens"] == trained
    assert s["unified"] == {"loss_mask": ["text"], "special_tokens.image": ["text", "chat"]}
    assert main(["inspect", str(mix.path)]) == 0
    assert "unified   loss_mask: text" in capsys.readouterr().out


# -- refusals


def test_another_tokenizer_is_refused_naming_both_and_a_command_that_can_be_typed(stores, tmp_path, capsys):
    """Inputs and tokenizers beside the stores (a report names them relative to the store; one sharing nothing but
    the root with it would be named by its last component only: SECURITY A15), so the fix names typeable paths."""
    tok, tok2, src = tmp_path / "tok", tmp_path / "tok2", tmp_path / "text.jsonl"
    shutil.copytree(SAMPLE_TOK, tok)
    shutil.copytree(SAMPLE_TOK, tok2)
    shutil.copy(SAMPLE / "text.jsonl", src)
    config = json.loads((tok2 / "tokenizer_config.json").read_text())
    config["model_max_length"] = 7  # another tokenizer by its hash (FORMAT.md §2.3), with the same vocabulary
    (tok2 / "tokenizer_config.json").write_text(json.dumps(config))
    chat = build_store("chat", SAMPLE / "chat.jsonl", tmp_path / "chat", "--limit", "5", tok=tok)
    other = build_store("text", src, tmp_path / "other", "--limit", "5", tok=tok2)
    capsys.readouterr()
    assert main(["merge", str(stores["text"]), str(stores["chat"]), "-o", str(tmp_path / "ok")]) == 0
    assert "unified loss_mask: text (no loss mask of their own: read as all-trained)" in capsys.readouterr().out
    assert main(["merge", str(chat), str(other), "-o", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    chat_hash = packfmt.open(chat).manifest.tokenizer["hash"]
    other_hash = packfmt.open(other).manifest.tokenizer["hash"]
    assert chat_hash != other_hash and f"'tok' ({chat_hash}) vs 'tok2' ({other_hash})" in err
    # the command rebuilds 'other' from its own input, at its own path, with the chat store's tokenizer folder
    fix = f"rebuild 'other' with 'chat''s tokenizer 'tok' ({chat_hash}): `packfmt build text {src} -o {other} --overwrite --tokenizer {tok}`"
    assert fix in err, err
    assert "Traceback" not in err and not (tmp_path / "x").exists()
    moved = tmp_path / "tokenizer"
    shutil.copytree(SAMPLE_TOK, moved)  # a store built with a folder that is gone: a placeholder, said what it is
    gone = build_store("chat", SAMPLE / "chat.jsonl", tmp_path / "gone", "--limit", "5", tok=moved)
    shutil.rmtree(moved)
    assert main(["merge", str(gone), str(other), "-o", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert f"-o {other} --overwrite --tokenizer TOKENIZER` (TOKENIZER: the folder holding tokenizer 'tokenizer'" in err


def test_one_tokenizer_reached_by_two_names_mixes(tmp_path, capsys):
    """The same tokenizer folder typed as two paths (a link): two names, one hash. The stores merge, pack and read;
    the names are informative (COLLECTION.md §2.3)."""
    tok = tmp_path / "tok"
    shutil.copytree(SAMPLE_TOK, tok)
    (tmp_path / "TOK").symlink_to(tok)
    text = build_store("text", SAMPLE / "text.jsonl", tmp_path / "text", tok=tok)
    chat = build_store("chat", SAMPLE / "chat.jsonl", tmp_path / "chat", tok=tmp_path / "TOK")
    named = build_store("text", SAMPLE / "text.jsonl", tmp_path / "named", "--limit", "3", "--tokenizer-name",
                        "sample-bpe", tok=tmp_path / "TOK")
    names = [packfmt.open(p).manifest.tokenizer["name"] for p in (text, chat, named)]
    assert names == ["tok", "TOK", "sample-bpe"]
    assert len({packfmt.open(p).manifest.tokenizer["hash"] for p in (text, chat, named)}) == 1
    capsys.readouterr()
    assert main(["merge", str(text), str(chat), str(named), "-o", str(tmp_path / "mix")]) == 0
    assert main(["pack", str(tmp_path / "mix"), "--capacity", "512"]) == 0
    assert main(["validate", str(tmp_path / "mix"), "--deep"]) == 0
    ds = PackedDataset(tmp_path / "mix")  # its only index
    merged = merge_physical([(None, tmp_path / "mix")], tmp_path / "one")
    assert_labels_of_every_pack(ds, merged)
    assert packfmt.open(tmp_path / "mix").manifest.raw["tokenizer"]["name"] == "tok"  # the first member's


def test_two_different_image_ids_are_refused(tmp_path):
    paths = []
    for name, image in (("a", 5), ("b", 7), ("c", None)):
        with packfmt.DatasetWriter(tmp_path / name, vocab_size=100, tokenizer={"name": "t", "hash": None},
                                   special_tokens={"image": image}) as w:
            w.add_document([1, 2, 3])
        paths.append((None, tmp_path / name))
    with pytest.raises(WriteError, match=r"'a' .* and 'b' .* different image placeholder ids .* 5 vs 7.*image marker .a. was built with.*--image-token MARKER"):
        write_collection(tmp_path / "x", paths)
    coll = write_collection(tmp_path / "y", [paths[0], paths[2]])  # a null id beside an id is fine
    assert coll.special_tokens["image"] == 5 and coll.manifest.unified == {"special_tokens.image": ("c",)}


def _lie(mix: Collection, tmp_path: Path, edit) -> Path:
    """A copy of the collection's manifest elsewhere (member paths re-made relative to it), edited by hand."""
    raw = json.loads(json.dumps(mix.manifest.raw))
    dst = tmp_path / "lie"
    dst.mkdir()
    for m, entry in enumerate(raw["members"]):
        entry["path"] = Path(os.path.relpath(mix.member_path(m).resolve(), dst)).as_posix()
    edit(raw)
    (dst / F.MANIFEST).write_bytes(F.canonical_json(raw))
    return dst


@pytest.mark.parametrize("edit, field", [
    (lambda r: r["unified"].update(loss_mask=["text", "chat"]), "unified.loss_mask"),   # chat has a mask
    (lambda r: r["unified"].pop("loss_mask"), "members[0].loss_mask"),                   # text has none
    (lambda r: r["unified"].update({"special_tokens.image": ["chat"]}), "members[0].special_tokens.image"),
])
def test_a_unified_record_that_lies_is_refused_naming_the_field(mix, tmp_path, edit, field):
    lie = _lie(mix, tmp_path, edit)
    coll = packfmt.open(lie)
    with pytest.raises(FormatError) as info:
        for m in range(len(coll.members)):
            coll.member(m)
    assert info.value.field == field and field in str(info.value)
    report = validate(lie)
    assert not report.ok and any(p.field == field for p in report.errors)


@pytest.mark.parametrize("edit, field", [
    (lambda r: r["unified"].update(loss_mask=["text", "chat", "vqa"]), "unified.loss_mask"),  # not every member
    (lambda r: r["unified"].update(loss_mask=["chat", "text"]), "unified.loss_mask"),          # member order
    (lambda r: r["unified"].update(pad=["text"]), "unified.pad"),                               # unknown key
    (lambda r: r.update(format_version="1.1"), "unified"),                                      # added in 1.2
    (lambda r: r.update(loss_mask=False), "unified.loss_mask"),                                 # nothing to lack
])
def test_a_malformed_unified_record_is_refused_at_open(mix, tmp_path, edit, field):
    lie = _lie(mix, tmp_path, edit)
    with pytest.raises(FormatError) as info:
        packfmt.open(lie)
    assert info.value.field == field


def test_member_paths_resolve_through_the_file_system(stores, tmp_path):
    """spec/COLLECTION.md §2.2: a path is opened as given, so '..' after a symbolic link leaves the link's target."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    shutil.copytree(stores["chat"], tmp_path / "real" / "chat")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "link").symlink_to(tmp_path / "real" / "sub")
    coll = write_collection(tmp_path / "a" / "coll", [(None, tmp_path / "real" / "chat")])
    raw = dict(coll.manifest.raw)
    raw["members"] = [dict(raw["members"][0], path="../link/../chat")]  # lexically a/chat (absent); really real/chat
    (tmp_path / "a" / "coll" / F.MANIFEST).write_bytes(F.canonical_json(raw))
    again = packfmt.open(tmp_path / "a" / "coll")
    assert again.document(2).tolist() == packfmt.open(stores["chat"]).document(2).tolist()
    assert validate(tmp_path / "a" / "coll").ok


def test_torch_image_index_reads_a_members_table_when_a_segment_needs_it(mix):
    """``PackedDataset``'s image index opens no member when it is made, and reads one member's image table when a
    segment of that member first needs it (what lets stream=True fetch members lazily); the images it finds are
    those of the whole-collection table."""
    from packfmt.collection.arrays import relative_image_spans
    from packfmt.torch._sources import _ImageIndex

    spans, dio = relative_image_spans(mix)
    lengths = mix.doc_lengths
    images = _ImageIndex(mix)
    assert images.tables == {}
    text_docs = np.arange(int(mix.doc_start[1]))  # member 0, the text store
    assert images.in_segments(text_docs, np.zeros_like(text_docs), lengths[text_docs])[0].size == 0
    assert images.tables == {}  # a member without images is never opened for them
    docs = np.arange(mix.num_documents)
    ids, got, counts = images.in_segments(docs, np.zeros_like(docs), lengths)
    assert ids.tolist() == list(range(mix.num_images)) and counts.tolist() == np.diff(dio).tolist()
    assert np.array_equal(got, spans)
    assert sorted(images.tables) == [m for m in range(mix.num_members) if mix.members[m].images]
    j = int(ids[-1])
    assert np.array_equal(images.decode(j), mix.member(2).images.decode(j - int(mix.image_start[2])))
