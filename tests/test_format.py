"""The format rules of spec/FORMAT.md as the reader and writer enforce them.

Reader side: a manifest that breaks a rule is refused with an error naming the key; a newer minor
version with unknown keys and files is accepted (§8). Writer side: ids outside the vocabulary,
empty documents, bad masks and bad image spans are refused before anything is written. Plus
pickling a Store across a spawn-started process and a write/read round-trip property.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import pickle
import tempfile
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packfmt
from packfmt import format as F
from packfmt.errors import FormatError, TokenRangeError, UnsupportedVersionError, WriteError
from packfmt.packindex import build_pack_index

DOCS = [[5, 6, 7], [8, 9], [1]]


# ----------------------------------------------------------------------------- helpers
def write_ds(path: Path, docs=DOCS, *, vocab_size: int = 100, loss_mask: bool = False, **kw) -> Path:
    with packfmt.DatasetWriter(path, vocab_size=vocab_size, loss_mask=loss_mask, **kw) as w:
        for d in docs:
            w.add_document(d, loss_mask=[1] * len(d) if loss_mask else None)
    return path


def load_manifest(path: Path) -> dict:
    return json.loads((path / F.MANIFEST).read_text("utf-8"))


def save_manifest(path: Path, obj: dict) -> None:
    (path / F.MANIFEST).write_bytes(F.canonical_json(obj))


def edit(obj: dict, dotted: str, value=None, *, delete: bool = False) -> dict:
    """Set (or delete) a dotted key of ``obj``; ``files.tokens.bin`` style names are handled."""
    if dotted.startswith("files."):
        parents, last = ["files"], dotted[len("files."):]
        if last.endswith((".bytes", ".checksum")):
            name, field = last.rsplit(".", 1)
            parents, last = ["files", name], field
    else:
        *parents, last = dotted.split(".")
    node = obj
    for key in parents:
        node = node[key]
    if delete:
        del node[last]
    else:
        node[last] = value
    return obj


@pytest.fixture()
def ds(tmp_path) -> Path:
    return write_ds(tmp_path / "ds")


def refused(path: Path, exc_type=FormatError) -> str:
    with pytest.raises(exc_type) as info:
        packfmt.open(path)
    return str(info.value)


# ----------------------------------------------------------------------------- reader: versions
@pytest.mark.parametrize("version", ["2.0", "0.9", "3.1"])
def test_refuses_other_major_version(ds, version):
    save_manifest(ds, edit(load_manifest(ds), "format_version", version))
    message = refused(ds, UnsupportedVersionError)
    assert version in message and "format_version" in message and "major version 1" in message


@pytest.mark.parametrize("value", ["1", "v1.0", "1.0.0", "", 1.0, None])
def test_refuses_malformed_version(ds, value):
    save_manifest(ds, edit(load_manifest(ds), "format_version", value))
    assert "format_version" in refused(ds)


@pytest.mark.parametrize("name", ["safetensors", "packfmt-pack-index", "PACKFMT", None])
def test_refuses_wrong_format_name(ds, name):
    save_manifest(ds, edit(load_manifest(ds), "format", name))
    message = refused(ds, UnsupportedVersionError)
    assert "format" in message and "'packfmt'" in message


def test_accepts_newer_minor_with_unknown_keys_and_files(ds):
    m = load_manifest(ds)
    m["format_version"] = "1.9"
    m["future_top_level"] = {"anything": [1, 2, 3]}
    m["counts"]["future_count"] = 7
    m["tokenizer"]["revision"] = "abc"
    m["special_tokens"]["sep"] = 4
    m["files"]["tokens.bin"]["future_field"] = True
    data = b"a file a 1.0 reader does not know"
    (ds / "future.bin").write_bytes(data)
    m["files"]["future.bin"] = {"bytes": len(data), "checksum": "xxh3_64:" + xxhash.xxh3_64(data).hexdigest()}
    (ds / "NOTES.txt").write_text("an unlisted stray file is not part of the dataset")
    save_manifest(ds, m)
    store = packfmt.open(ds)
    assert store.manifest.version == (1, 9)
    assert [store.document(i).tolist() for i in range(len(store))] == DOCS


@pytest.mark.parametrize("version,ok", [("1.0", False), ("1.1", False), ("1.2", True)])
def test_unknown_codec_id_is_valid_only_in_a_newer_minor(tmp_path, version, ok):
    """§8: a newer minor may add codec ids; readers open the dataset and fail only at decode time."""
    from packfmt.validate import validate

    root = tmp_path / "ds"
    with packfmt.DatasetWriter(root, vocab_size=100) as w:
        w.add_document([1, 3, 3, 2], images=[_img(1, 3)])
    meta = np.fromfile(root / F.IMAGE_META, dtype=F.IMAGE_META_DTYPE)
    meta[2] = 99  # (width, height, codec) of image 0: a codec this reader does not know
    meta.tofile(root / F.IMAGE_META)
    m = edit(load_manifest(root), "format_version", version)
    m["files"][F.IMAGE_META]["checksum"] = "xxh3_64:" + xxhash.xxh3_64(meta.tobytes()).hexdigest()
    save_manifest(root, m)
    report = validate(root, deep=True)
    codec_problems = [p for p in report.problems if p.file == F.IMAGE_META]
    assert report.ok is ok and len(codec_problems) == 1 and "99" in codec_problems[0].message
    assert codec_problems[0].severity == ("warning" if ok else "error")
    store = packfmt.open(root)
    assert store.document(0).tolist() == [1, 3, 3, 2]  # tokens are served either way
    with pytest.raises(FormatError) as info:
        store.images.decode(0)
    assert "codec" in str(info.value) and "99" in str(info.value)


def test_unknown_listed_file_is_still_size_checked(ds):
    m = load_manifest(ds)
    m["format_version"] = "1.9"
    (ds / "future.bin").write_bytes(b"12345")
    m["files"]["future.bin"] = {"bytes": 6, "checksum": "xxh3_64:" + "0" * 16}
    save_manifest(ds, m)
    assert "future.bin" in refused(ds)


# ----------------------------------------------------------------------------- reader: keys and types
REQUIRED = ["format_version", "producer", "producer.name", "producer.version", "tokenizer", "tokenizer.name",
            "tokenizer.hash", "vocab_size", "token_dtype", "special_tokens", "special_tokens.bos",
            "special_tokens.eos", "special_tokens.pad", "special_tokens.image", "counts", "counts.documents",
            "counts.tokens", "counts.images", "loss_mask", "checksum_algorithm", "files", "files.tokens.bin",
            "files.doc_offsets.bin", "files.tokens.bin.bytes", "files.tokens.bin.checksum"]


@pytest.mark.parametrize("key", REQUIRED)
def test_refuses_missing_required_key(ds, key):
    save_manifest(ds, edit(load_manifest(ds), key, delete=True))
    message = refused(ds)
    assert key in message and "missing" in message


@pytest.mark.parametrize("key,value", [
    ("vocab_size", "100"), ("vocab_size", True), ("vocab_size", 100.0), ("vocab_size", 0), ("vocab_size", 2**32 + 1),
    ("loss_mask", 1), ("loss_mask", "false"), ("counts.documents", -1), ("counts.tokens", "5"),
    ("counts.images", None), ("producer", "packfmt"), ("producer.version", 1), ("tokenizer", "gpt2"),
    ("tokenizer.hash", "md5:abc"), ("tokenizer.hash", "sha256:" + "A" * 64), ("special_tokens.eos", 100),
    ("special_tokens.bos", -1), ("special_tokens.pad", "0"), ("special_tokens.image", False), ("files", []),
    ("files.tokens.bin", "10 bytes"), ("files.tokens.bin.bytes", "10"), ("files.tokens.bin.bytes", -10),
])
def test_refuses_wrong_types_and_ranges(ds, key, value):
    save_manifest(ds, edit(load_manifest(ds), key, value))
    message = refused(ds)
    assert key in message, message


@pytest.mark.parametrize("vocab,dtype", [(100, "uint32"), (65536, "uint32"), (65537, "uint16"), (100, "int32"),
                                         (100, "uint8")])
def test_refuses_token_dtype_inconsistent_with_vocab(ds, vocab, dtype):
    m = edit(load_manifest(ds), "vocab_size", vocab)
    save_manifest(ds, edit(m, "token_dtype", dtype))
    message = refused(ds)
    assert "token_dtype" in message and str(vocab) in message


@pytest.mark.parametrize("checksum", ["xxh3_64:C8952709C5EA8CE1", "xxh3_64:c8952709c5ea8ce", "xxh3:c8952709c5ea8ce1",
                                      "md5:c8952709c5ea8ce1", "c8952709c5ea8ce1", "xxh3_64:c8952709c5ea8ce1 "])
def test_refuses_bad_checksum_string(ds, checksum):
    save_manifest(ds, edit(load_manifest(ds), "files.tokens.bin.checksum", checksum))
    message = refused(ds)
    assert "files.tokens.bin.checksum" in message


def test_refuses_other_checksum_algorithm(ds):
    save_manifest(ds, edit(load_manifest(ds), "checksum_algorithm", "sha256"))
    assert "checksum_algorithm" in refused(ds)


@pytest.mark.parametrize("name", ["../tokens.bin", "sub/x.bin", "/etc/passwd", "..", ".", ".hidden", "a\\b.bin", ""])
def test_refuses_unsafe_file_names(ds, name):
    m = load_manifest(ds)
    m["files"][name] = {"bytes": 0, "checksum": "xxh3_64:2d06800538d394c2"}
    save_manifest(ds, m)
    message = refused(ds)
    assert "files" in message and repr(name) in message


def test_refuses_file_size_mismatch(ds):
    with open(ds / "tokens.bin", "ab") as f:
        f.write(b"\x00\x00")
    message = refused(ds)
    assert "tokens.bin" in message and "size" in message


def test_refuses_counts_that_disagree_with_sizes(ds):
    save_manifest(ds, edit(load_manifest(ds), "counts.tokens", 7))
    assert "tokens.bin" in refused(ds)


@pytest.mark.parametrize("content", [b"", b"[]", b"\xff\xfe{", b'{"format": NaN}', b"{" * 10])
def test_refuses_unparseable_manifest(ds, content):
    (ds / F.MANIFEST).write_bytes(content)
    assert "manifest.json" in refused(ds)


def test_refuses_huge_manifest_without_parsing(ds):
    with open(ds / F.MANIFEST, "wb") as f:
        f.truncate(F.MAX_JSON_BYTES + 1)  # sparse: no memory used
    message = refused(ds)
    assert "manifest.json" in message and str(F.MAX_JSON_BYTES) in message


def test_refuses_deeply_nested_manifest(ds):
    (ds / F.MANIFEST).write_bytes(b'{"extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert "manifest.json" in refused(ds)


def test_refuses_duplicate_keys(ds):
    text = (ds / F.MANIFEST).read_text("utf-8")
    (ds / F.MANIFEST).write_text(text.replace('"vocab_size": 100', '"vocab_size": 100,\n  "vocab_size": 100'), "utf-8")
    assert "vocab_size" in refused(ds)


def test_refuses_pack_index_renamed_directory(ds):
    build_pack_index(ds, capacity=4, algorithm="ffd", name="a")
    (ds / F.PACKS_DIR / "a").rename(ds / F.PACKS_DIR / "b")
    with pytest.raises(FormatError):
        packfmt.open(ds).pack_index("b")


def test_refuses_pack_index_of_another_store(tmp_path):
    a = write_ds(tmp_path / "a")
    b = write_ds(tmp_path / "b", [[5, 6, 7], [8, 9], [2]])  # same lengths, other tokens
    build_pack_index(a, capacity=4, algorithm="ffd", name="ix")
    (b / F.PACKS_DIR).mkdir()
    (b / F.PACKS_DIR / "ix").symlink_to(a / F.PACKS_DIR / "ix")
    with pytest.raises(FormatError) as info:
        packfmt.open(b).pack_index("ix")
    assert "dataset.tokens.bin" in str(info.value)


def _index_json(ds: Path, name: str = "ix") -> Path:
    build_pack_index(ds, capacity=4, algorithm="ffd", name=name)
    return ds / F.PACKS_DIR / name / F.PACK_INDEX_JSON


@pytest.mark.parametrize("key,value", [
    ("seed", -1), ("seed", 2**63), ("seed", True), ("seed", 1.0),
    ("params.max_images_per_pack", 0), ("params.max_docs_per_pack", 0), ("params.max_docs_per_pack", "4"),
])
def test_refuses_pack_index_values_out_of_range(ds, key, value):
    path = _index_json(ds)
    path.write_bytes(F.canonical_json(edit(json.loads(path.read_text("utf-8")), key, value)))
    with pytest.raises(FormatError) as info:
        packfmt.open(ds).pack_index("ix")
    assert info.value.field == key


@pytest.mark.parametrize("key,value", [("seed", None), ("seed", 2**63 - 1), ("seed", 0)])
def test_accepts_seed_range_bounds(ds, key, value):
    path = _index_json(ds)
    path.write_bytes(F.canonical_json(edit(json.loads(path.read_text("utf-8")), key, value)))
    assert packfmt.open(ds).pack_index("ix").manifest.seed == value


def test_absent_params_keys_read_as_no_limit(ds):
    path = _index_json(ds)
    path.write_bytes(F.canonical_json(edit(json.loads(path.read_text("utf-8")), "params", {})))
    assert packfmt.open(ds).pack_index("ix").manifest.params == {}


@pytest.mark.parametrize("kwargs,field", [
    ({"seed": -1}, "seed="), ({"seed": 2**63}, "seed="), ({"seed": 1.5}, "seed="),
    ({"max_images_per_pack": 0}, "max_images_per_pack="), ({"max_docs_per_pack": 0}, "max_docs_per_pack="),
])
def test_build_pack_index_refuses_what_index_json_cannot_hold(ds, kwargs, field):
    with pytest.raises(WriteError) as info:
        build_pack_index(ds, capacity=4, algorithm="ffd", name="ix", **kwargs)
    assert info.value.field == field and "spec §4.1" in str(info.value)
    assert not (ds / F.PACKS_DIR / "ix").exists()


def test_cli_pack_refuses_a_seed_out_of_range_in_cli_words(ds, capsys):
    from packfmt.cli import main

    assert main(["pack", str(ds), "--capacity", "4", "--seed", "-1"]) == 2
    assert "--seed must be in [0, 2**63), got -1" in capsys.readouterr().err
    assert not (ds / F.PACKS_DIR).exists()


# ----------------------------------------------------------------------------- writer: token range
def test_writer_refuses_token_id_ge_vocab_naming_document_and_position(tmp_path):
    w = packfmt.DatasetWriter(tmp_path / "ds", vocab_size=100)
    w.add_document([1, 2, 3])
    with pytest.raises(TokenRangeError) as info:
        w.add_document([4, 5, 100, 6])
    message = str(info.value)
    assert "document 1" in message and "token 2" in message and "100" in message
    assert info.value.found == 100
    w.add_document([7])  # the refused document left nothing behind
    w.finalize()
    s = packfmt.open(tmp_path / "ds")
    assert [s.document(i).tolist() for i in range(len(s))] == [[1, 2, 3], [7]]


@pytest.mark.parametrize("vocab,dtype,max_id", [(65536, "<u2", 65535), (65537, "<u4", 65536), (2**32, "<u4", 2**32 - 1)])
def test_writer_dtype_boundary(tmp_path, vocab, dtype, max_id):
    w = packfmt.DatasetWriter(tmp_path / "ds", vocab_size=vocab)
    with pytest.raises(TokenRangeError) as info:
        w.add_document(np.array([0, max_id + 1], dtype=np.int64))
    assert "document 0" in str(info.value) and "token 1" in str(info.value)
    w.add_document(np.array([0, max_id], dtype=np.int64))
    w.finalize()
    s = packfmt.open(tmp_path / "ds")
    assert s.tokens.dtype == np.dtype(dtype)
    assert s.tokens.tolist() == [0, max_id]
    assert s.manifest.token_dtype == ("uint16" if vocab <= 65536 else "uint32")


@pytest.mark.parametrize("tokens", [[-1, 2], [3, -70000], np.array([1, -1], dtype=np.int8)])
def test_writer_refuses_negative_ids(tmp_path, tokens):
    w = packfmt.DatasetWriter(tmp_path / "ds", vocab_size=100)
    with pytest.raises(TokenRangeError) as info:
        w.add_document(tokens)
    assert "document 0" in str(info.value)
    w.abort()
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("tokens", [[], np.zeros(0, dtype=np.int64), [[1, 2]], [1.5, 2.0], [True, False]])
def test_writer_refuses_empty_or_non_integer_documents(tmp_path, tokens):
    w = packfmt.DatasetWriter(tmp_path / "ds", vocab_size=100)
    with pytest.raises(WriteError):
        w.add_document(tokens)
    w.abort()


def test_writer_refuses_a_tokenizer_path(tmp_path):
    """§2.2: a host path does not belong in a manifest; the writer says so instead of storing it."""
    with pytest.raises(WriteError) as info:
        packfmt.DatasetWriter(tmp_path / "ds", vocab_size=100, tokenizer={"name": "t", "hash": None, "path": "/home/x/tok"})
    assert info.value.field == "tokenizer.path" and "--tokenizer" in str(info.value)
    assert not (tmp_path / "ds").exists()


def test_writer_refuses_special_token_out_of_range(tmp_path):
    with pytest.raises(TokenRangeError):
        packfmt.DatasetWriter(tmp_path / "ds", vocab_size=100, special_tokens={"eos": 100})
    with pytest.raises(WriteError):
        packfmt.DatasetWriter(tmp_path / "ds", vocab_size=100, special_tokens={"sep": 1})


# ----------------------------------------------------------------------------- writer: loss mask
@pytest.mark.parametrize("mask", [[1, 1], [1, 2, 0], [0, -1, 1], [[1, 1, 1]], None])
def test_writer_refuses_bad_loss_mask(tmp_path, mask):
    w = packfmt.DatasetWriter(tmp_path / "ds", vocab_size=100, loss_mask=True)
    with pytest.raises(WriteError) as info:
        w.add_document([1, 2, 3], loss_mask=mask)
    assert "loss_mask" in str(info.value)
    w.abort()


def test_writer_refuses_mask_without_loss_mask_flag(tmp_path):
    w = packfmt.DatasetWriter(tmp_path / "ds", vocab_size=100)
    with pytest.raises(WriteError):
        w.add_document([1, 2], loss_mask=[1, 1])
    w.abort()


def test_writer_refuses_fractional_loss_mask(tmp_path):
    w = packfmt.DatasetWriter(tmp_path / "ds", vocab_size=100, loss_mask=True)
    try:
        with pytest.raises(WriteError):
            w.add_document([1, 2], loss_mask=[0.5, 1.0])
    finally:
        w.abort()


def test_loss_mask_round_trip(tmp_path):
    with packfmt.DatasetWriter(tmp_path / "ds", vocab_size=100, loss_mask=True) as w:
        w.add_document([1, 2, 3], loss_mask=[0, 1, 1])
        w.add_document([4, 5], loss_mask=np.array([True, False]))
    s = packfmt.open(tmp_path / "ds")
    assert s.loss_mask.tolist() == [0, 1, 1, 1, 0]
    assert s.document_loss_mask(1).tolist() == [1, 0]


# ----------------------------------------------------------------------------- writer: images
PNG = bytes.fromhex("89504e470d0a1a0a")  # the writer does not decode; any non-empty bytes are stored


def _img(begin, end, *, codec="png", width=2, height=2, data=PNG):
    return packfmt.ImageRecord(data, width, height, codec, begin, end)


@pytest.mark.parametrize("images,what", [
    ([_img(2, 2)], "token span"),                 # empty run
    ([_img(3, 1)], "token span"),                 # begin > end
    ([_img(-1, 2)], "token span"),                # before the document
    ([_img(4, 7)], "token span"),                 # past the end (document has 6 tokens)
    ([_img(0, 3), _img(2, 4)], "token span"),     # overlapping
    ([_img(3, 5), _img(0, 2)], "token span"),     # out of order
    ([_img(0, 2, codec="heic")], "codec"),
    ([_img(0, 2, width=0)], "size"),
    ([_img(0, 2, height=2**32)], "size"),
    ([_img(0, 2, width=13_379, height=13_376)], "size"),  # 178,957,504 pixels > F.MAX_IMAGE_PIXELS (§3.4)
    ([_img(0, 2, data=b"")], "data"),
])
def test_writer_refuses_bad_images(tmp_path, images, what):
    w = packfmt.DatasetWriter(tmp_path / "ds", vocab_size=100)
    with pytest.raises(WriteError) as info:
        w.add_document([1, 3, 3, 3, 3, 2], images=images)
    assert "document 0, image" in str(info.value) and what in str(info.value)
    w.add_document([1, 2])  # nothing of the refused document was written
    w.finalize()
    s = packfmt.open(tmp_path / "ds")
    assert s.num_images == 0 and s.tokens.tolist() == [1, 2]
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["doc_offsets.bin", "manifest.json", "tokens.bin"]


def test_image_spans_are_global_and_adjacent_runs_allowed(tmp_path):
    with packfmt.DatasetWriter(tmp_path / "ds", vocab_size=100) as w:
        w.add_document([1, 2])
        w.add_document([3, 3, 3, 3, 9], images=[_img(0, 2), _img(2, 4, data=b"x")])
    s = packfmt.open(tmp_path / "ds")
    assert s.images.token_spans.tolist() == [[2, 4], [4, 6]]
    assert s.images.doc_image_offsets.tolist() == [0, 0, 2]
    assert s.images.offsets.tolist() == [0, 8, 9]


def _encoded(im, fmt="PNG", **params) -> bytes:
    import io

    buf = io.BytesIO()
    im.save(buf, format=fmt, **params)
    return buf.getvalue()


def _decoded_pixel_cases():
    """(name, encoded bytes, codec, expected (C, pixel [0, 0])) for each colour model of §3.4."""
    from PIL import Image

    palette = Image.new("P", (2, 2), 1)
    palette.putpalette([0, 0, 0, 200, 10, 20])
    gray16 = Image.fromarray(np.array([[0x12FF, 0], [0, 0]], dtype=np.uint16))
    return [
        ("gray", _encoded(Image.new("L", (2, 2), 77)), "png", (1, [77])),
        ("bilevel", _encoded(Image.new("1", (2, 2), 1)), "png", (1, [255])),
        ("gray16", _encoded(gray16), "png", (1, [0x12])),
        ("rgb", _encoded(Image.new("RGB", (2, 2), (1, 2, 3))), "png", (3, [1, 2, 3])),
        ("palette", _encoded(palette), "png", (3, [200, 10, 20])),
        ("cmyk", _encoded(Image.new("CMYK", (2, 2), (0, 0, 0, 0)), "JPEG", quality=100), "jpeg", (3, [255, 255, 255])),
        ("rgba", _encoded(Image.new("RGBA", (2, 2), (1, 2, 3, 4))), "png", (4, [1, 2, 3, 4])),
        ("gray+alpha", _encoded(Image.new("LA", (2, 2), (9, 8))), "png", (4, [9, 9, 9, 8])),
        ("palette+transparency", _encoded(palette, transparency=1), "png", (4, [200, 10, 20, 0])),
    ]


@pytest.mark.parametrize("case", _decoded_pixel_cases(), ids=lambda c: c[0])
def test_decoded_channel_count_follows_the_image(case):
    """§3.4 "Decoded pixels": 1 channel for grayscale, 4 with alpha (palette transparency included), else 3."""
    from packfmt.images import decode_image

    _, data, codec, (channels, first) = case
    px = decode_image(data, codec, 2, 2)
    assert px.dtype == np.uint8 and px.shape == (2, 2, channels)
    assert px[0, 0].tolist() == first


def test_decode_refuses_more_than_the_pixel_bound_before_decoding():
    from packfmt.images import decode_image

    with pytest.raises(FormatError, match="pixels"):  # the bytes are not even an image: never looked at
        decode_image(b"not an image", "png", 13_379, 13_376)
    assert F.MAX_IMAGE_PIXELS == 178_956_970


# ----------------------------------------------------------------------------- atomicity
def test_nothing_at_target_until_finalize_and_nothing_after_error(tmp_path):
    target = tmp_path / "ds"
    with pytest.raises(RuntimeError):
        with packfmt.DatasetWriter(target, vocab_size=100) as w:
            w.add_document([1, 2])
            assert not target.exists()
            raise RuntimeError("interrupted")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # the temporary sibling is gone too


# ----------------------------------------------------------------------------- pickling across processes
def test_store_pickle_is_small(ds):
    store = packfmt.open(ds)
    _ = store.tokens, store.doc_offsets  # mapped arrays must not travel
    blob = pickle.dumps(store)
    assert len(blob) < 500
    assert pickle.loads(blob).tokens.tolist() == [5, 6, 7, 8, 9, 1]


def test_store_works_in_spawned_process(ds):
    store = packfmt.open(ds)
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        docs = pool.starmap(packfmt.Store.document, [(store, i) for i in range(len(store))])
        tokens = pool.apply(getattr, (store, "tokens"))
    assert [np.asarray(d).tolist() for d in docs] == DOCS
    assert np.asarray(tokens).tolist() == [5, 6, 7, 8, 9, 1]


# ----------------------------------------------------------------------------- property: write -> read
documents = st.lists(st.integers(min_value=1, max_value=40), min_size=0, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=documents, big_vocab=st.booleans(), with_mask=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_write_read_round_trip(lengths, big_vocab, with_mask, seed):
    vocab = 70_000 if big_vocab else 1_000
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, vocab, size=n) for n in lengths]
    masks = [rng.integers(0, 2, size=n) for n in lengths]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ds"
        with packfmt.DatasetWriter(path, vocab_size=vocab, loss_mask=with_mask) as w:
            for d, m in zip(docs, masks):
                w.add_document(d, loss_mask=m if with_mask else None)
        s = packfmt.open(path)
        assert len(s) == len(docs) and s.num_tokens == sum(lengths)
        assert s.tokens.dtype == np.dtype("<u4" if big_vocab else "<u2")
        assert s.doc_offsets.tolist() == np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).tolist()
        for i, d in enumerate(docs):
            np.testing.assert_array_equal(s.document(i), d)
            if with_mask:
                np.testing.assert_array_equal(s.document_loss_mask(i), masks[i])
        assert (s.loss_mask is not None) == with_mask
        for name, entry in s.manifest.files.items():
            data = (path / name).read_bytes()
            assert len(data) == entry.bytes
            assert "xxh3_64:" + xxhash.xxh3_64(data).hexdigest() == entry.checksum


def test_add_documents_bulk_equals_one_by_one(tmp_path):
    """The vectorised bulk append writes the same bytes as per-document appends."""
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 1000, size=int(rng.integers(1, 30))) for _ in range(50)]
    masks = [rng.integers(0, 2, size=d.size) for d in docs]
    with packfmt.DatasetWriter(tmp_path / "a", vocab_size=1000, loss_mask=True) as w:
        for d, m in zip(docs, masks):
            w.add_document(d, loss_mask=m)
    with packfmt.DatasetWriter(tmp_path / "b", vocab_size=1000, loss_mask=True) as w:
        w.add_document(docs[0], loss_mask=masks[0])
        assert w.add_documents(np.concatenate(docs[1:]), [d.size for d in docs[1:]], np.concatenate(masks[1:])) == range(1, 50)
    for name in ("tokens.bin", "doc_offsets.bin", "loss_mask.bin", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_add_documents_refuses_out_of_range_and_empty(tmp_path):
    w = packfmt.DatasetWriter(tmp_path / "c", vocab_size=100)
    with pytest.raises(packfmt.TokenRangeError, match=r"document 1: .*found 100"):
        w.add_documents(np.array([1, 2, 3, 100]), [2, 2])
    with pytest.raises(packfmt.WriteError, match="length"):
        w.add_documents(np.array([1, 2]), [2, 0])
    w.abort()
    assert not (tmp_path / "c").exists()


# ----------------------------------------------------------------------------- labels (§7)
@pytest.mark.parametrize("materialize", [False, True])
def test_label_at_a_truncation_cut_is_the_documents_next_token(tmp_path, materialize):
    """§7: labels follow the document, so a truncation cut keeps its true next token (unless masked)."""
    pytest.importorskip("torch")
    from packfmt.torch import IGNORE_INDEX, PackedDataset

    root = tmp_path / "ds"
    with packfmt.DatasetWriter(root, vocab_size=100, loss_mask=True) as w:
        w.add_document([5, 6, 7, 8, 9], [1, 1, 1, 1, 1])
        w.add_document([10, 11, 12, 13], [1, 1, 1, 0])  # the target at the cut (13) is not trained
    build_pack_index(root, capacity=3, algorithm="pad", oversize="truncate", name="t", materialize=materialize)
    ds = PackedDataset(root, "t")
    assert [ds[i]["input_ids"].tolist() for i in range(len(ds))] == [[5, 6, 7], [10, 11, 12]]
    assert ds[0]["labels"].tolist() == [6, 7, 8]  # 8 is in no pack, yet it is the label at the cut
    assert ds[1]["labels"].tolist() == [11, 12, IGNORE_INDEX]
