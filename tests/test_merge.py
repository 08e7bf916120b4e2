"""Physical merge (spec/COLLECTION.md §7): one contiguous store, byte-identical to a single build of the
concatenated inputs, equal to reading the collection, streamed in bounded chunks, atomic under SIGKILL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import limits
import packfmt
from packfmt import format as F
from packfmt._io import checksum_file
from packfmt.build import build_chat, build_multimodal, build_text
from packfmt.cli import main
from packfmt.collection import Collection, merge_physical, physical, write_collection
from packfmt.errors import ChecksumError, DatasetExistsError, FormatError
from packfmt.packindex import build_pack_index
from packfmt.writer import ImageRecord

os.environ["HF_HUB_OFFLINE"] = "1"
SAMPLE = Path(packfmt.__file__).parent / "sample_data"
SAMPLE_TOK = SAMPLE / "tokenizer"
STORE_FILES = (F.TOKENS, F.DOC_OFFSETS, F.LOSS_MASK, F.IMAGE_BLOBS, F.IMAGE_OFFSETS, F.IMAGE_META,
               F.DOC_IMAGE_OFFSETS, F.IMAGE_TOKEN_SPANS)


def split_jsonl(src: Path, root: Path, cuts: list[int]) -> list[Path]:
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    bounds = [0, *cuts, len(lines)]
    out = []
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        p = root / f"part{k}.jsonl"
        p.write_text("".join(lines[a:b]), encoding="utf-8")
        out.append(p)
    return out


def assert_same_as_single_build(merged: Path, single: Path) -> None:
    """Every binary file byte for byte; the manifests equal except build_report (the merge lists members)."""
    names = sorted(p.name for p in single.iterdir() if p.is_file())
    assert sorted(p.name for p in merged.iterdir() if p.is_file()) == names
    for name in names:
        if name != F.MANIFEST:
            assert (merged / name).read_bytes() == (single / name).read_bytes(), name
    a, b = (json.loads((p / F.MANIFEST).read_text()) for p in (merged, single))
    assert a.pop("build_report")["source"] == "merge --physical"
    b.pop("build_report", None)
    assert a == b  # files table (sizes, checksums), counts, tokenizer, special tokens, dtype, loss mask, producer


def assert_reads_like(store, coll) -> None:
    """Reading the physical merge and reading the collection give identical documents, masks and images."""
    assert store.num_documents == coll.num_documents and store.num_tokens == coll.num_tokens
    assert store.doc_offsets.tolist() == coll.doc_offsets.tolist()
    for g in range(coll.num_documents):
        assert store.document(g).tolist() == coll.document(g).tolist()
        mask = coll.document_loss_mask(g)
        assert (store.document_loss_mask(g) is None) == (mask is None)
        if mask is not None:
            assert store.document_loss_mask(g).tolist() == mask.tolist()
        m, d = coll.locate(g)
        member = coll.member(m)
        mine = list(store.images.of_document(g)) if store.images is not None else []
        theirs = list(member.images.of_document(d)) if member.images is not None else []
        assert len(mine) == len(theirs)
        for i, j in zip(mine, theirs):
            assert bytes(store.images.data(i)) == bytes(member.images.data(j))
            assert store.images.size(i) == member.images.size(j) and store.images.codec(i) == member.images.codec(j)
            assert (store.images.token_spans[i] - store.doc_offsets[g]).tolist() == \
                (member.images.token_spans[j] - member.doc_offsets[d]).tolist()


def test_text_parts_merge_to_the_single_build(tmp_path):
    parts = split_jsonl(SAMPLE / "text.jsonl", tmp_path, [17, 40])
    stores = [build_text([p], tmp_path / f"s{k}", SAMPLE_TOK, progress=False).path for k, p in enumerate(parts)]
    single = build_text(parts, tmp_path / "single", SAMPLE_TOK, progress=False).path
    merged = merge_physical(stores, tmp_path / "merged")
    assert_same_as_single_build(merged.path, single)
    report = merged.manifest.raw["build_report"]
    assert [m["name"] for m in report["members"]] == ["s0", "s1", "s2"]
    assert [m["manifest"] for m in report["members"]] == [checksum_file(s / F.MANIFEST) for s in stores]
    assert_reads_like(merged, write_collection(tmp_path / "coll", [(None, s) for s in stores]))


def test_chat_parts_merge_to_the_single_build_loss_mask_included(tmp_path):
    parts = split_jsonl(SAMPLE / "chat.jsonl", tmp_path, [1, 30])
    stores = [build_chat([p], tmp_path / f"s{k}", SAMPLE_TOK, progress=False).path for k, p in enumerate(parts)]
    single = build_chat(parts, tmp_path / "single", SAMPLE_TOK, progress=False).path
    merged = merge_physical(stores, tmp_path / "merged")
    assert (merged.path / F.LOSS_MASK).stat().st_size == merged.num_tokens
    assert_same_as_single_build(merged.path, single)


def test_multimodal_parts_merge_to_the_single_build_with_an_imageless_member(tmp_path):
    from PIL import Image

    root = tmp_path / "images"
    root.mkdir()
    rng = np.random.default_rng(0)
    for k, (w, h) in enumerate([(64, 48), (30, 100), (57, 29)]):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(root / f"img{k}.png")

    def rec(k: int, image: bool) -> dict:
        turn = {"from": "human", "value": ("<image>\n" if image else "") + f"What is {k}?"}
        return {"id": str(k), **({"image": f"img{k % 3}.png"} if image else {}),
                "conversations": [turn, {"from": "gpt", "value": f"It is {k}."}]}

    groups = [[rec(0, True), rec(1, False), rec(2, True)], [rec(3, False), rec(4, False)], [rec(5, True)]]
    parts = []
    for k, group in enumerate(groups):
        parts.append(tmp_path / f"part{k}.json")
        parts[-1].write_text(json.dumps(group), encoding="utf-8")
    kw = dict(image_root=root, image_tokens="dynamic", progress=False)
    stores = [build_multimodal([p], tmp_path / f"s{k}", SAMPLE_TOK, **kw).path for k, p in enumerate(parts)]
    assert packfmt.open(stores[1]).num_images == 0  # a member without image files between two with
    single = build_multimodal(parts, tmp_path / "single", SAMPLE_TOK, **kw).path
    merged = merge_physical(stores, tmp_path / "merged")
    assert merged.num_images == 3
    assert_same_as_single_build(merged.path, single)
    assert_reads_like(merged, write_collection(tmp_path / "coll", [(None, s) for s in stores]))


# -- property: any documents, any split into members (empty ones too), any chunk size


doc_strategy = st.tuples(st.integers(1, 6), st.integers(0, 2), st.integers(0, 2**16))


def write_docs(path: Path, docs, *, mask_seed: int = 0) -> Path:
    with packfmt.DatasetWriter(path, vocab_size=70_000, tokenizer={"name": "prop", "hash": None},
                               loss_mask=True) as w:
        for length, n_images, seed in docs:
            rng = np.random.default_rng(seed)
            images = [ImageRecord(rng.bytes(int(rng.integers(1, 5))), 1 + j, 2, "png", j, j + 1)
                      for j in range(min(n_images, length))]
            w.add_document(rng.integers(0, 70_000, length), rng.integers(0, 2, length), images)
    return path


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(doc_strategy, min_size=0, max_size=14), cuts=st.lists(st.integers(0, 14), max_size=4),
       small_chunks=st.booleans())
def test_any_split_merges_to_the_single_build(tmp_path_factory, monkeypatch, docs, cuts, small_chunks):
    """Documents split at any points (empty members included) merge into what one writer writes from all of them;
    with tiny chunks every offset array crosses chunk boundaries (documents and image runs split across reads)."""
    root = tmp_path_factory.mktemp("prop")
    bounds = [0, *sorted(min(c, len(docs)) for c in cuts), len(docs)]
    parts = [write_docs(root / f"p{k}", docs[a:b]) for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    single = write_docs(root / "single", docs)
    with monkeypatch.context() as mp:  # undone after each example
        if small_chunks:
            mp.setattr(physical, "CHUNK_BYTES", 24)
            mp.setattr(physical, "_OFFSET_ROWS", 3)
        merged = merge_physical(parts, root / "merged")
    assert_same_as_single_build(merged.path, single)
    assert_reads_like(merged, write_collection(root / "coll", [(None, p) for p in parts]))


# -- pack indexes


def collection_with_index(tmp_path, *, mixture: bool = False):
    """Parts, the single store of all their documents with a materialized index, and a collection of the parts
    holding the same index rebound to it (collection-wide ids == the single store's ids)."""
    rng = np.random.default_rng(3)
    docs = [(int(n), 0, int(s)) for n, s in zip(rng.integers(1, 7, 40), rng.integers(0, 2**16, 40))]
    parts = [write_docs(tmp_path / f"p{k}", docs[a:b]) for k, (a, b) in enumerate([(0, 9), (9, 30), (30, 40)])]
    single = write_docs(tmp_path / "single", docs)
    build_pack_index(single, capacity=8, name="ffd-8", materialize=True)
    coll = write_collection(tmp_path / "coll", [(None, p) for p in parts])
    shutil.copytree(single / F.PACKS_DIR / "ffd-8", coll.path / F.PACKS_DIR / "ffd-8")
    index = json.loads((single / F.PACKS_DIR / "ffd-8" / F.PACK_INDEX_JSON).read_text())
    index.pop("dataset")
    index.update(format_version="1.1", **coll.index_binding())
    if mixture:
        index["mixture"] = {"weights": {}, "seed": 0, "members": [], "proportions": {}}
    (coll.path / F.PACKS_DIR / "ffd-8" / F.PACK_INDEX_JSON).write_bytes(F.canonical_json(index))
    if not mixture:
        assert Collection(coll.path).pack_index("ffd-8").num_packs > 0  # a valid collection index (C5)
    return parts, single, coll


def test_collection_index_is_carried_rebound_to_the_merged_store(tmp_path, capsys):
    parts, single, coll = collection_with_index(tmp_path)
    merged = merge_physical([coll.path], tmp_path / "merged")
    assert_same_as_single_build(merged.path, single)
    assert merged.pack_index_names() == ["ffd-8"]
    got, want = merged.path / F.PACKS_DIR / "ffd-8", single / F.PACKS_DIR / "ffd-8"
    assert sorted(p.name for p in got.iterdir()) == sorted(p.name for p in want.iterdir())
    for p in want.iterdir():  # materialized tokens too; index.json equal: same tokens, so the same binding
        assert json.loads((got / p.name).read_text()) == json.loads(p.read_text()) if p.suffix == ".json" \
            else (got / p.name).read_bytes() == p.read_bytes()
    index = merged.pack_index("ffd-8")
    assert index.manifest.raw["format_version"] == "1.0" and "collection" not in index.manifest.raw
    assert [index.pack_tokens(p).tolist() for p in range(len(index))] == \
        [packfmt.open(single).pack_index("ffd-8").pack_tokens(p).tolist() for p in range(len(index))]
    assert merged.manifest.raw["build_report"]["pack_indexes"] == {"carried": ["ffd-8"], "not_carried": {}}
    assert main(["validate", str(merged.path), "--deep"]) == 0  # V21-V33 of the carried index against the store


def test_indexes_not_carried_are_named_with_why(tmp_path, capsys):
    parts, single, coll = collection_with_index(tmp_path, mixture=True)
    build_pack_index(parts[0], capacity=8)  # a member store's own index: never carried
    assert main(["merge", "--physical", str(coll.path), "-o", str(tmp_path / "m1")]) == 0
    out = capsys.readouterr().out
    assert "pack index ffd-8 not carried: weighted (mixture)" in out
    assert "1 pack index(es) of member stores not carried" in out
    assert f"next: pack the merged store with `packfmt pack {tmp_path / 'm1'} --capacity N`" in out
    assert packfmt.open(tmp_path / "m1").pack_index_names() == []
    store = merge_physical([coll.path, parts[0]], tmp_path / "m2")  # the collection is one source of two
    not_carried = store.manifest.raw["build_report"]["pack_indexes"]["not_carried"]
    assert list(not_carried) == ["coll/ffd-8"] and "covers only part" in not_carried["coll/ffd-8"]


def test_cli_physical_merge_says_what_it_wrote_and_refuses_an_existing_dst(tmp_path, capsys):
    parts, single, coll = collection_with_index(tmp_path)
    dst = tmp_path / "merged"
    assert main(["merge", "--physical", f"a={parts[0]}", str(parts[1]), str(parts[2]), "-o", str(dst)]) == 0
    out = capsys.readouterr().out
    assert f"wrote store {dst}: 3 members, 40 documents" in out and "tokens.bin (" in out
    assert packfmt.open(dst).manifest.raw["build_report"]["members"][0]["name"] == "a"
    assert main(["merge", "--physical", str(coll.path), "-o", str(dst)]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert main(["merge", "--physical", str(coll.path), "-o", str(dst), "--overwrite"]) == 0
    assert "pack indexes carried (rebound to the new store): ffd-8" in capsys.readouterr().out
    with pytest.raises(DatasetExistsError, match=r"overwrite=True"):
        merge_physical([coll.path], dst)


# -- refusals: nothing that breaks a member reaches DST


def test_damaged_member_bytes_are_refused_naming_the_file(tmp_path):
    a, b = write_docs(tmp_path / "a", [(3, 1, 1), (2, 0, 2)]), write_docs(tmp_path / "b", [(4, 2, 3)])
    raw = bytearray((b / F.TOKENS).read_bytes())
    raw[0] ^= 0xFF
    (b / F.TOKENS).write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match=rf"{b / F.TOKENS}: checksum: .*packfmt validate"):
        merge_physical([a, b], tmp_path / "m")
    assert not (tmp_path / "m").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".m.")] == []  # temp removed


def test_offsets_breaking_v13_with_a_matching_checksum_are_refused(tmp_path):
    a = write_docs(tmp_path / "a", [(3, 0, 1), (2, 0, 2), (4, 0, 3)])
    (a / F.DOC_OFFSETS).write_bytes(np.array([0, 5, 3, 9], dtype="<i8").tobytes())  # not increasing
    manifest = json.loads((a / F.MANIFEST).read_text())
    manifest["files"][F.DOC_OFFSETS]["checksum"] = checksum_file(a / F.DOC_OFFSETS)
    (a / F.MANIFEST).write_bytes(F.canonical_json(manifest))
    with pytest.raises(FormatError, match=r"doc_offsets\.bin: V13 \[1:3\]: expected strictly increasing \(every document has >= 1 token\), found 5 then 3"):
        merge_physical([a], tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_overlapping_image_spans_with_a_matching_checksum_are_refused_as_the_reader_refuses_them(tmp_path):
    """The streamed V19 check of a merge is packfmt.checks' own: same rule, same element named as when opening."""
    a = write_docs(tmp_path / "a", [(3, 0, 1), (6, 2, 2)])
    (a / F.IMAGE_TOKEN_SPANS).write_bytes(np.array([[3, 6], [4, 5]], dtype="<i8").tobytes())  # image 1 inside image 0
    manifest = json.loads((a / F.MANIFEST).read_text())
    manifest["files"][F.IMAGE_TOKEN_SPANS]["checksum"] = checksum_file(a / F.IMAGE_TOKEN_SPANS)
    (a / F.MANIFEST).write_bytes(F.canonical_json(manifest))
    with pytest.raises(FormatError, match=r"image_token_spans\.bin: V19 \[0:2\]: expected spans of one document sorted"
                                          r" and not overlapping, found a span ending at 6 then \[4, 5\)"):
        merge_physical([a], tmp_path / "m")
    assert not (tmp_path / "m").exists()
    with pytest.raises(FormatError, match=r"image_token_spans\.bin: \[0:2\]: expected spans of one document sorted"):
        packfmt.open(a)


def test_an_image_span_outside_its_document_names_the_document_whatever_the_chunk(tmp_path, monkeypatch):
    """Streamed in chunks of two documents, the bad span of document 2 is named as document 2 (not 0 of its chunk)."""
    a = write_docs(tmp_path / "a", [(3, 0, 1), (2, 0, 2), (6, 2, 3)])  # document 2: tokens [5, 11), images 0 and 1
    (a / F.IMAGE_TOKEN_SPANS).write_bytes(np.array([[5, 6], [10, 12]], dtype="<i8").tobytes())  # image 1 ends past it
    manifest = json.loads((a / F.MANIFEST).read_text())
    manifest["files"][F.IMAGE_TOKEN_SPANS]["checksum"] = checksum_file(a / F.IMAGE_TOKEN_SPANS)
    (a / F.MANIFEST).write_bytes(F.canonical_json(manifest))
    monkeypatch.setattr(physical, "_OFFSET_ROWS", 2)
    with pytest.raises(FormatError, match=r"image_token_spans\.bin: V19 \[1\]: expected doc_start <= begin < end <= "
                                          r"doc_end of document 2 = \[5, 11\), found \[10, 12\)"):
        merge_physical([a], tmp_path / "m")


def test_changed_collection_member_is_refused(tmp_path):
    parts, single, coll = collection_with_index(tmp_path)
    shutil.rmtree(parts[1])
    write_docs(parts[1], [(1, 0, 0)] * 21)
    with pytest.raises(FormatError, match=r"members\[1\] \(p1\).*changed after the collection was written"):
        merge_physical([coll.path], tmp_path / "m")


# -- a killed merge never leaves something at DST that opens

KILL_SCRIPT = """
import sys, time
from pathlib import Path
from packfmt.collection import merge_physical
marker, calls = Path(sys.argv[3]), []
def pause(n):
    calls.append(n)
    if len(calls) == 3:  # the second member's tokens are being copied: files half written in the temp dir
        marker.write_text("paused")
        time.sleep(600)
merge_physical(sys.argv[1].split(","), sys.argv[2], overwrite=True, on_bytes=pause)
"""


@pytest.mark.parametrize("existing", [False, True])
def test_sigkill_mid_merge_leaves_nothing_that_opens(tmp_path, existing):
    parts = [write_docs(tmp_path / f"p{k}", [(5, 1, k), (6, 0, k + 1)] * 50) for k in range(3)]
    dst, marker = tmp_path / "dst", tmp_path / "paused"
    if existing:
        merge_physical(parts[:1], dst)
        before = (dst / F.MANIFEST).read_bytes()
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, ",".join(map(str, parts)), str(dst), str(marker)],
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        limits.wait_until(marker.exists, "the merge reaching its pause", 120, alive=lambda: proc.poll() is None)
        temps = [p for p in tmp_path.iterdir() if p.name.startswith(".dst.packfmt-tmp-")]
        assert len(temps) == 1 and (temps[0] / F.TOKENS).exists()  # mid-merge: a half-written temp store
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    if existing:
        assert (dst / F.MANIFEST).read_bytes() == before and packfmt.open(dst).num_documents == 100
    else:
        assert not dst.exists()
        with pytest.raises(FormatError):
            packfmt.open(dst)
    store = merge_physical(parts, dst, overwrite=True)  # the next merge cleans up what the killed one left
    assert store.num_documents == 300
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dst.")] == []


def test_extra_is_kept_only_when_every_member_has_the_same(tmp_path):
    def store(name, extra):
        with packfmt.DatasetWriter(tmp_path / name, vocab_size=100, extra=extra) as w:
            w.add_document([1, 2, 3])
        return tmp_path / name

    same = [store("a", {"lang": "en"}), store("b", {"lang": "en"})]
    assert merge_physical(same, tmp_path / "m1").manifest.raw["extra"] == {"lang": "en"}
    assert "extra" not in merge_physical([*same, store("c", {"lang": "fr"})], tmp_path / "m2").manifest.raw


def test_members_of_a_newer_store_minor_are_listed_but_not_physically_merged(tmp_path):
    """A member is a store of any 1.x (COLLECTION §2.2): a collection lists a 1.5 store and reads it as a store of that
    version; a physical merge, which writes a 1.0 store, refuses it naming its manifest and version, writing nothing."""
    from packfmt.errors import UnsupportedVersionError, WriteError
    from packfmt.torch.testing import write_split_stores

    tokens = np.arange(1, 41, dtype=np.uint16)
    a, b = map(Path, write_split_stores(tmp_path / "s", tokens, np.array([0, 10, 25, 40]), np.array([0, 2, 3]),
                                        vocab_size=100))
    obj = json.loads((b / F.MANIFEST).read_text())
    obj["format_version"] = "1.5"
    (b / F.MANIFEST).write_bytes(F.canonical_json(obj))
    coll = write_collection(tmp_path / "c", [(None, a), (None, b)])
    assert coll.member(1).manifest.version == (1, 5)
    assert np.array_equal(np.concatenate([coll.document(g) for g in range(3)]), tokens)
    with pytest.raises(WriteError) as exc:
        merge_physical([tmp_path / "c"], tmp_path / "one")
    assert exc.value.field == "format_version" and exc.value.found == "1.5" and "s/m000001/manifest.json" in str(exc.value)
    assert not (tmp_path / "one").exists()
    obj["format_version"] = "2.0"  # another major: not a member at all (a store of it is refused)
    (b / F.MANIFEST).write_bytes(F.canonical_json(obj))
    with pytest.raises(UnsupportedVersionError):
        Collection(tmp_path / "c").member(1)
