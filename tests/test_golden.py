"""Golden files: the committed format-1.0 dataset and the byte-by-byte example of spec/EXAMPLE.md.

``tests/data/golden_v1_0/`` was written once by ``tools/make_golden.py``; these tests never
regenerate it. They check (1) that today's reader returns the literal values below from those
bytes, and (2) that today's writer and packer, given the same input, produce the same bytes. A
failure here means the on-disk format changed: that needs a new format version and a new golden
directory, not an edit of this file.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import xxhash

import packfmt
from packfmt import format as F
from packfmt.packindex import build_pack_index

GOLDEN = Path(__file__).parent / "data" / "golden_v1_0"
INDEX = "ffd-8"

# ----------------------------------------------------------------------------- literal expectations
TOKENS = [1, 10, 11, 12, 2,
          1, 3, 3, 3, 3, 20, 21, 2,
          1, 30, 31, 32, 33, 34, 35, 36, 37, 2,
          1, 40, 3, 3, 41, 999, 2]
DOC_OFFSETS = [0, 5, 13, 23, 30]
LOSS_MASK = [0, 0, 1, 1, 1,
             0, 0, 0, 0, 0, 1, 1, 1,
             0, 1, 1, 1, 1, 1, 1, 1, 1, 1,
             0, 0, 0, 0, 1, 1, 1]
IMAGE_OFFSETS = [0, 79, 156]
IMAGE_META = [[2, 2, 1], [1, 3, 1]]  # width, height, codec (1 = png)
DOC_IMAGE_OFFSETS = [0, 0, 1, 1, 2]
IMAGE_TOKEN_SPANS = [[6, 10], [25, 27]]  # global token offsets
PIXELS = [
    np.array([[[255, 0, 0], [0, 255, 0]], [[0, 0, 255], [255, 255, 255]]], dtype=np.uint8),  # 2x2
    np.array([[[0, 0, 0]], [[128, 128, 128]], [[255, 255, 255]]], dtype=np.uint8),  # 1 wide, 3 high
]
TOKENIZER_FILES = {  # hashed with the rule of spec/FORMAT.md §2.3
    "tokenizer.json": b'{"model": {"type": "WordLevel"}, "version": "1.0"}\n',
    "special_tokens_map.json": b'{"bos_token": "<s>", "eos_token": "</s>"}\n',
}
TOKENIZER_HASH = "sha256:5d71cf328ca334d3e800a2ec2e63e84fa94fcf58604d8daee6bb9724a0275b97"
FILES = {
    "doc_image_offsets.bin": (40, "xxh3_64:8d4186a64d6b3376"),
    "doc_offsets.bin": (40, "xxh3_64:a27b4ebbd49ca5f5"),
    "image_blobs.bin": (156, "xxh3_64:887759f309c4f397"),
    "image_meta.bin": (24, "xxh3_64:729066f85808c701"),
    "image_offsets.bin": (24, "xxh3_64:134179dda77a236a"),
    "image_token_spans.bin": (32, "xxh3_64:391ca20f82ad7e47"),
    "loss_mask.bin": (30, "xxh3_64:95e76b52c6116b11"),
    "tokens.bin": (60, "xxh3_64:50b8f3fb17ac21e4"),
}
PACK_OFFSETS = [0, 1, 2, 3, 5]
SEGMENTS = [[1, 0, 8], [2, 0, 8], [3, 0, 7], [0, 0, 5], [2, 8, 10]]  # doc 2 (10 tokens) split at 8
PACK_TOKEN_OFFSETS = [0, 8, 16, 23, 30]
INDEX_FILES = {
    "loss_mask.bin": (30, "xxh3_64:e7bcf55dc9bafff9"),
    "pack_offsets.bin": (40, "xxh3_64:473e39267b575b92"),
    "pack_token_offsets.bin": (40, "xxh3_64:418863fefe37f5ac"),
    "segments.bin": (120, "xxh3_64:6df7ba7681d08733"),
    "tokens.bin": (60, "xxh3_64:7fdf3cb4ffe12d68"),
}


def _gathered(values: list[int]) -> list[int]:
    """``values`` (parallel to TOKENS) gathered by SEGMENTS in pack order."""
    out = []
    for d, b, e in SEGMENTS:
        out += values[DOC_OFFSETS[d] + b:DOC_OFFSETS[d] + e]
    return out


def _binary_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.bin"))}


@pytest.fixture(scope="module")
def store() -> packfmt.Store:
    return packfmt.open(GOLDEN)


# ----------------------------------------------------------------------------- the committed bytes
def test_golden_manifest(store):
    m = store.manifest
    assert m.version == (1, 0)
    assert m.raw["format"] == "packfmt" and m.raw["format_version"] == "1.0"
    assert (m.vocab_size, m.token_dtype) == (1000, "uint16")
    assert m.special_tokens == {"bos": 1, "eos": 2, "pad": 0, "image": 3}
    assert (m.num_documents, m.num_tokens, m.num_images, m.has_loss_mask) == (4, 30, 2, True)
    assert m.tokenizer == {"name": "golden-tokenizer", "hash": TOKENIZER_HASH}
    assert {name: (e.bytes, e.checksum) for name, e in m.files.items()} == FILES


def test_golden_json_is_canonical():
    for path in (GOLDEN / F.MANIFEST, GOLDEN / F.PACKS_DIR / INDEX / F.PACK_INDEX_JSON):
        raw = path.read_bytes()
        assert raw == F.canonical_json(json.loads(raw)), f"{path} is not in canonical form"
        assert raw.endswith(b"}\n") and b"\r" not in raw


def test_golden_store_arrays(store):
    assert store.tokens.dtype == np.dtype("<u2")
    assert store.tokens.tolist() == TOKENS
    assert store.doc_offsets.dtype == np.dtype("<i8")
    assert store.doc_offsets.tolist() == DOC_OFFSETS
    assert store.loss_mask.dtype == np.uint8
    assert store.loss_mask.tolist() == LOSS_MASK
    assert [store.document(d).tolist() for d in range(4)] == [TOKENS[a:b] for a, b in zip(DOC_OFFSETS, DOC_OFFSETS[1:])]


def test_golden_raw_bytes_are_little_endian():
    """The files are headerless little-endian arrays: decode them with struct, not numpy."""
    raw = (GOLDEN / "tokens.bin").read_bytes()
    assert list(struct.unpack(f"<{len(TOKENS)}H", raw)) == TOKENS
    assert raw[-4:] == bytes.fromhex("e7030200")  # 999, 2
    raw = (GOLDEN / "doc_offsets.bin").read_bytes()
    assert list(struct.unpack("<5q", raw)) == DOC_OFFSETS


def test_golden_images(store):
    images = store.images
    assert len(images) == 2
    assert images.offsets.tolist() == IMAGE_OFFSETS
    assert images.meta.dtype == np.dtype("<u4") and images.meta.tolist() == IMAGE_META
    assert images.doc_image_offsets.tolist() == DOC_IMAGE_OFFSETS
    assert images.token_spans.tolist() == IMAGE_TOKEN_SPANS
    assert [list(images.of_document(d)) for d in range(4)] == [[], [0], [], [1]]
    for i, pixels in enumerate(PIXELS):
        data = bytes(images.data(i))
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and images.codec(i) == "png"
        np.testing.assert_array_equal(images.decode(i), pixels)
    # image runs hold the image placeholder id
    for b, e in IMAGE_TOKEN_SPANS:
        assert set(TOKENS[b:e]) == {3}


def test_golden_pack_index(store):
    assert store.pack_index_names() == [INDEX]
    ix = store.pack_index(INDEX)
    pm = ix.manifest
    assert (pm.capacity, pm.algorithm, pm.oversize, pm.seed, pm.materialized) == (8, "ffd", "split", 0, True)
    assert (pm.num_packs, pm.num_segments, pm.raw["counts"]["packed_tokens"]) == (4, 5, 30)
    assert pm.params == {"max_docs_per_pack": None, "max_images_per_pack": None}
    assert pm.dataset == {"tokens.bin": FILES["tokens.bin"][1], "doc_offsets.bin": FILES["doc_offsets.bin"][1]}
    assert {name: (e.bytes, e.checksum) for name, e in pm.files.items()} == INDEX_FILES
    assert ix.pack_offsets.tolist() == PACK_OFFSETS
    assert ix.segments.tolist() == SEGMENTS
    assert ix.pack_token_offsets.tolist() == PACK_TOKEN_OFFSETS
    assert ix.packed_tokens.tolist() == _gathered(TOKENS)
    assert ix.packed_loss_mask.tolist() == _gathered(LOSS_MASK)
    for p in range(4):
        assert sum(e - b for _, b, e in SEGMENTS[PACK_OFFSETS[p]:PACK_OFFSETS[p + 1]]) <= 8
        segs = ix.pack_segments(p)
        from_store = np.concatenate([store.document(int(d))[b:e] for d, b, e in segs])
        np.testing.assert_array_equal(ix.pack_tokens(p), from_store)
    stats = pm.stats
    assert (stats["packs"], stats["segments"], stats["split_documents"], stats["fill_efficiency"]) == (4, 5, 1, 0.9375)


def test_golden_checksums_match_the_bytes():
    for root, table in ((GOLDEN, FILES), (GOLDEN / F.PACKS_DIR / INDEX, INDEX_FILES)):
        for name, (nbytes, checksum) in table.items():
            data = (root / name).read_bytes()
            assert len(data) == nbytes
            assert "xxh3_64:" + xxhash.xxh3_64(data).hexdigest() == checksum
            assert "xxh3_64:" + format(xxhash.xxh3_64(data).intdigest(), "016x") == checksum  # big-endian hex


def test_golden_tokenizer_hash_rule(tmp_path):
    """spec §2.3: sha256 over (path, NUL, u64le length, bytes) of each file sorted by path."""
    h = hashlib.sha256()
    for name in sorted(TOKENIZER_FILES):
        data = TOKENIZER_FILES[name]
        h.update(name.encode() + b"\x00" + len(data).to_bytes(8, "little") + data)
    assert "sha256:" + h.hexdigest() == TOKENIZER_HASH
    tokenize = pytest.importorskip("packfmt.tokenize")
    for name, data in TOKENIZER_FILES.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "README.md").write_text("not part of the tokenizer")
    assert tokenize.tokenizer_hash(tmp_path) == TOKENIZER_HASH


def test_golden_validates_deep():
    validate = pytest.importorskip("packfmt.validate")
    report = validate.validate(GOLDEN, deep=True)
    assert report.ok, report.format()


# ----------------------------------------------------------------------------- today's writer, same bytes
def _rewrite(store: packfmt.Store, target: Path) -> None:
    """Write the golden input again: tokens and masks from the literals, image bytes from the store."""
    images = store.images
    blobs = [bytes(images.data(i)) for i in range(len(images))]
    per_doc = {1: [(0, 1, 5)], 3: [(1, 2, 4)]}  # doc -> (image, begin, end) relative to the document
    with packfmt.DatasetWriter(target, vocab_size=1000, tokenizer={"name": "golden-tokenizer", "hash": TOKENIZER_HASH},
                               special_tokens={"bos": 1, "eos": 2, "pad": 0, "image": 3}, loss_mask=True) as w:
        for d, (a, b) in enumerate(zip(DOC_OFFSETS, DOC_OFFSETS[1:])):
            recs = [packfmt.ImageRecord(blobs[i], IMAGE_META[i][0], IMAGE_META[i][1], "png", begin, end)
                    for i, begin, end in per_doc.get(d, [])]
            w.add_document(TOKENS[a:b], loss_mask=LOSS_MASK[a:b], images=recs)


def _without(obj: dict, *paths: str) -> dict:
    obj = json.loads(json.dumps(obj))
    for path in paths:
        *parents, last = path.split(".")
        node = obj
        for key in parents:
            node = node[key]
        node.pop(last, None)
    return obj


def test_rewrite_is_byte_identical(store, tmp_path):
    target = tmp_path / "ds"
    _rewrite(store, target)
    build_pack_index(target, capacity=8, algorithm="ffd", oversize="split", materialize=True)
    assert _binary_files(target) == _binary_files(GOLDEN)
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in GOLDEN.iterdir())
    new = json.loads((target / F.MANIFEST).read_text("utf-8"))
    old = json.loads((GOLDEN / F.MANIFEST).read_text("utf-8"))
    assert _without(new, "producer.version") == _without(old, "producer.version")
    new_ix = json.loads((target / F.PACKS_DIR / INDEX / F.PACK_INDEX_JSON).read_text("utf-8"))
    old_ix = json.loads((GOLDEN / F.PACKS_DIR / INDEX / F.PACK_INDEX_JSON).read_text("utf-8"))
    assert _without(new_ix, "producer.version", "stats.seconds") == _without(old_ix, "producer.version", "stats.seconds")


def test_golden_copy_opens_anywhere(tmp_path):
    """The dataset is relocatable: nothing in it depends on its path."""
    copy = tmp_path / "elsewhere"
    shutil.copytree(GOLDEN, copy)
    s = packfmt.open(copy)
    assert s.tokens.tolist() == TOKENS
    assert s.pack_index(INDEX).packed_tokens.tolist() == _gathered(TOKENS)


# ----------------------------------------------------------------------------- spec/EXAMPLE.md, inline
EXAMPLE_TOKENS_BIN = bytes.fromhex("05000600070008000900")
EXAMPLE_DOC_OFFSETS_BIN = bytes.fromhex("0000000000000000" "0300000000000000" "0500000000000000")
EXAMPLE_MANIFEST = """{
  "checksum_algorithm": "xxh3_64",
  "counts": {
    "documents": 2,
    "images": 0,
    "tokens": 5
  },
  "files": {
    "doc_offsets.bin": {
      "bytes": 24,
      "checksum": "xxh3_64:286e7d46fa99ed60"
    },
    "tokens.bin": {
      "bytes": 10,
      "checksum": "xxh3_64:c8952709c5ea8ce1"
    }
  },
  "format": "packfmt",
  "format_version": "1.0",
  "loss_mask": false,
  "producer": {
    "name": "packfmt",
    "version": "@VERSION@"
  },
  "special_tokens": {
    "bos": null,
    "eos": null,
    "image": null,
    "pad": null
  },
  "token_dtype": "uint16",
  "tokenizer": {
    "hash": null,
    "name": "example"
  },
  "vocab_size": 100
}
"""
EXAMPLE_FFD4 = {
    "pack_offsets.bin": bytes.fromhex("0000000000000000" "0100000000000000" "0200000000000000"),
    "segments.bin": bytes.fromhex("0000000000000000" "0000000000000000" "0300000000000000"
                                  "0100000000000000" "0000000000000000" "0200000000000000"),
}
EXAMPLE_FFD2 = {
    "pack_offsets.bin": bytes.fromhex("0000000000000000" "0100000000000000" "0200000000000000" "0300000000000000"),
    "segments.bin": bytes.fromhex("0000000000000000" "0000000000000000" "0200000000000000"
                                  "0100000000000000" "0000000000000000" "0200000000000000"
                                  "0000000000000000" "0200000000000000" "0300000000000000"),
    "pack_token_offsets.bin": bytes.fromhex("0000000000000000" "0200000000000000" "0400000000000000" "0500000000000000"),
    "tokens.bin": bytes.fromhex("05000600" "08000900" "0700"),
}


@pytest.fixture()
def example(tmp_path) -> Path:
    path = tmp_path / "ds"
    with packfmt.DatasetWriter(path, vocab_size=100, tokenizer={"name": "example", "hash": None}) as w:
        w.add_document([5, 6, 7])
        w.add_document([8, 9])
    return path


def test_example_store_bytes(example):
    assert sorted(p.name for p in example.iterdir()) == ["doc_offsets.bin", "manifest.json", "tokens.bin"]
    assert (example / "tokens.bin").read_bytes() == EXAMPLE_TOKENS_BIN
    assert (example / "doc_offsets.bin").read_bytes() == EXAMPLE_DOC_OFFSETS_BIN
    text = (example / "manifest.json").read_bytes().decode("utf-8")
    assert text == EXAMPLE_MANIFEST.replace("@VERSION@", packfmt.__version__)
    assert xxhash.xxh3_64(EXAMPLE_TOKENS_BIN).hexdigest() == "c8952709c5ea8ce1"


def test_example_manifest_is_documented_verbatim(example):
    """The manifest printed in spec/EXAMPLE.md is the one the writer produces."""
    spec = Path(__file__).resolve().parents[1] / "spec" / "EXAMPLE.md"
    if not spec.exists():
        pytest.skip("spec/EXAMPLE.md not present")
    documented = EXAMPLE_MANIFEST.replace("@VERSION@", "0.1.0")
    assert documented in spec.read_text("utf-8")


def test_example_pack_indexes(example):
    ix4 = build_pack_index(example, capacity=4, algorithm="ffd")
    assert ix4.name == "ffd-4"
    assert {n: (example / "packs" / "ffd-4" / n).read_bytes() for n in EXAMPLE_FFD4} == EXAMPLE_FFD4
    assert sorted(p.name for p in ix4.path.iterdir()) == ["index.json", "pack_offsets.bin", "segments.bin"]
    idx = json.loads((ix4.path / "index.json").read_text("utf-8"))
    assert idx["counts"] == {"packed_tokens": 5, "packs": 2, "segments": 2}
    assert idx["dataset"] == {"doc_offsets.bin": "xxh3_64:286e7d46fa99ed60", "tokens.bin": "xxh3_64:c8952709c5ea8ce1"}
    assert idx["files"] == {"pack_offsets.bin": {"bytes": 24, "checksum": "xxh3_64:7fb6f0c094f81c5d"},
                            "segments.bin": {"bytes": 48, "checksum": "xxh3_64:44c512aca1b9fb11"}}

    ix2 = build_pack_index(example, capacity=2, algorithm="ffd", materialize=True)
    assert ix2.name == "ffd-2"
    assert {n: (ix2.path / n).read_bytes() for n in EXAMPLE_FFD2} == EXAMPLE_FFD2
    assert not (ix2.path / "loss_mask.bin").exists()  # the store has no loss mask
    assert ix2.manifest.stats["split_documents"] == 1


def test_example_uint32_tokens(tmp_path):
    """vocab_size 65537 switches the same ids to little-endian uint32 (spec/EXAMPLE.md §2)."""
    with packfmt.DatasetWriter(tmp_path / "ds", vocab_size=65537) as w:
        w.add_document([5, 6, 7])
        w.add_document([8, 9])
    raw = (tmp_path / "ds" / "tokens.bin").read_bytes()
    assert raw == bytes.fromhex("05000000" "06000000" "07000000" "08000000" "09000000")
    assert json.loads((tmp_path / "ds" / "manifest.json").read_text())["token_dtype"] == "uint32"


def test_example_png_bytes_decode_with_pillow():
    """The golden PNG blobs are ordinary PNG files any decoder reads."""
    from PIL import Image

    blobs = (GOLDEN / "image_blobs.bin").read_bytes()
    for i, pixels in enumerate(PIXELS):
        with Image.open(io.BytesIO(blobs[IMAGE_OFFSETS[i]:IMAGE_OFFSETS[i + 1]])) as im:
            assert im.format == "PNG" and im.mode == "RGB"
            np.testing.assert_array_equal(np.asarray(im), pixels)
