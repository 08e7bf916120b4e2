"""``packfmt validate``: a valid dataset passes; every corruption is caught and named.

The pristine dataset has a loss mask, real PNG images and two pack indexes (one split and not
materialized, one truncated and materialized). Each corruption test works on a copy.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packfmt
from packfmt import format as F
from packfmt import index_format as IF
from packfmt._io import checksum_file
from packfmt.cli import main
from packfmt.packindex import build_pack_index
from packfmt.validate import validate

VOCAB = 1000
SPLIT, TRUNC = "ffd-split", "bfd-trunc"


def _png(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _write_dataset(root: Path, n_docs: int = 40, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    special = {"pad": 0, "bos": 1, "eos": 2, "image": 3}
    with packfmt.DatasetWriter(root, vocab_size=VOCAB, loss_mask=True, special_tokens=special,
                               tokenizer={"name": "test", "hash": None}) as w:
        for d in range(n_docs):
            n = int(rng.integers(3, 150))
            tokens = rng.integers(4, VOCAB, n)
            tokens[0] = VOCAB - 1 if d == 5 else tokens[0]  # the max id occurs
            images = []
            if d % 4 == 0 and n >= 12:
                images = [packfmt.ImageRecord(_png(6, 4, d), 6, 4, "png", 1, 5),
                          packfmt.ImageRecord(_png(3, 7, d + 1), 3, 7, "png", 6, 11)]
            w.add_document(tokens, rng.integers(0, 2, n), images=images)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pristine") / "ds"
    _write_dataset(root)
    build_pack_index(root, capacity=96, algorithm="ffd", name=SPLIT, max_images_per_pack=4)
    build_pack_index(root, capacity=100, algorithm="bfd", name=TRUNC, oversize="truncate", materialize=True,
                     max_docs_per_pack=3)
    return root


@pytest.fixture
def ds(pristine, tmp_path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(pristine, root)
    return root


def _all_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _owner_json(root: Path, rel: str) -> tuple[Path, str]:
    """The JSON file whose ``files`` table lists ``rel``, and the name used there."""
    parts = rel.split("/")
    if parts[0] == F.PACKS_DIR:
        return root / F.PACKS_DIR / parts[1] / F.PACK_INDEX_JSON, parts[2]
    return root / F.MANIFEST, rel


def _edit_json(path: Path, fn) -> None:
    obj = json.loads(path.read_text())
    fn(obj)
    path.write_bytes(F.canonical_json(obj))


def _rewrite(root: Path, rel: str, arr: np.ndarray, dtype=F.OFFSET_DTYPE) -> None:
    """Replace a binary file and record its new size and checksum (so only content checks can object)."""
    path = root / rel
    path.write_bytes(np.ascontiguousarray(arr, dtype=dtype).tobytes())
    owner, name = _owner_json(root, rel)

    def fix(obj):
        obj["files"][name] = {"bytes": path.stat().st_size, "checksum": checksum_file(path)}

    _edit_json(owner, fix)


def _names(report, text: str) -> bool:
    return any(text in p.message for p in report.errors)


# ----------------------------------------------------------------------------- valid data
def test_pristine_dataset_is_valid(pristine, capsys):
    report = validate(pristine, deep=True)
    assert report.ok, report.format()
    assert report.problems == []
    assert report.checked["pack_indexes"] == 2 and report.checked["images"] > 0
    assert main(["validate", str(pristine)]) == 0
    assert main(["validate", str(pristine), "--deep"]) == 0
    assert "OK:" in capsys.readouterr().out


def test_json_output_parses(pristine, ds, capsys):
    assert main(["validate", str(pristine), "--deep", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["deep"] is True and out["problems"] == []
    (ds / F.TOKENS).write_bytes((ds / F.TOKENS).read_bytes()[:-2])
    assert main(["validate", str(ds), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False
    assert any(p["file"] == F.TOKENS and p["severity"] == "error" for p in out["problems"])


def test_usage_and_missing_paths(tmp_path, capsys):
    assert main(["validate"]) == 2
    assert main(["validate", str(tmp_path / "nope")]) == 1
    assert "not a packfmt dataset" in capsys.readouterr().err
    assert main(["validate", str(tmp_path)]) == 1  # a directory without manifest.json
    assert F.MANIFEST in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "nope"), "--quiet"]) == 1
    assert capsys.readouterr().err == ""


def test_drop_policy_index_is_valid(ds):
    build_pack_index(ds, capacity=60, algorithm="ffd", name="drop", oversize="drop", materialize=True)
    report = validate(ds, deep=True)
    assert report.ok, report.format()


# ----------------------------------------------------------------------------- corruption matrix
def test_corruption_matrix_covers_every_file(pristine):
    files = _all_files(pristine)
    assert {F.TOKENS, F.LOSS_MASK, F.IMAGE_BLOBS, F.IMAGE_TOKEN_SPANS, F.MANIFEST}.issubset(files)
    assert f"{F.PACKS_DIR}/{TRUNC}/{F.PACKED_LOSS_MASK}" in files and f"{F.PACKS_DIR}/{SPLIT}/{F.SEGMENTS}" in files
    assert len(files) == 9 + 3 + 6  # dataset, split index, materialized index


def test_flip_one_byte_in_each_file(pristine, tmp_path):
    """For every file: one flipped byte -> deep validate fails and names that file."""
    for rel in _all_files(pristine):
        root = tmp_path / rel.replace("/", "_")
        shutil.copytree(pristine, root)
        data = bytearray((root / rel).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (root / rel).write_bytes(bytes(data))
        report = validate(root, deep=True)
        assert not report.ok, rel
        assert any(p.file == rel or p.message.startswith(rel) for p in report.errors), (rel, report.format())
        assert main(["validate", str(root), "--deep", "--quiet"]) == 1


def test_truncate_each_file_fails_structurally(pristine, tmp_path):
    """For every file: cut at the end -> even the structural check fails and names the file.

    JSON files lose two bytes: the trailing newline alone is JSON whitespace, so dropping it is harmless.
    """
    for rel in _all_files(pristine):
        root = tmp_path / rel.replace("/", "_")
        shutil.copytree(pristine, root)
        data = (root / rel).read_bytes()
        (root / rel).write_bytes(data[:-2] if rel.endswith(".json") else data[:-1])
        report = validate(root, deep=False)
        assert not report.ok, rel
        assert any(p.file == rel or p.message.startswith(rel) for p in report.errors), (rel, report.format())


@pytest.mark.parametrize("field, value, named", [
    ("counts.documents", 41, "counts.documents"),
    ("counts.tokens", 1, "counts.tokens"),
    ("counts.images", 3, "counts.images"),
    ("token_dtype", "uint32", "token_dtype"),
    ("vocab_size", 70000, "token_dtype"),  # vocab above uint16 range: dtype no longer fits
    ("loss_mask", False, "loss_mask"),
    ("checksum_algorithm", "sha256", "checksum_algorithm"),
    ("special_tokens.bos", 5000, "special_tokens.bos"),
    ("files.doc_offsets.bin.bytes", 8, "doc_offsets.bin"),
])
def test_falsified_manifest_field_is_named(ds, field, value, named):
    def edit(obj):
        keys = field.split(".") if not field.startswith("files.") else ["files", field[6:-6], "bytes"]
        target = obj
        for k in keys[:-1]:
            target = target[k]
        if field == "counts.tokens":
            value_ = target[keys[-1]] + value
        else:
            value_ = value
        target[keys[-1]] = value_

    _edit_json(ds / F.MANIFEST, edit)
    report = validate(ds, deep=True)
    assert not report.ok, report.format()
    assert any(named in (p.field or "") or p.message.startswith(named) for p in report.errors), report.format()


def test_vocab_size_below_max_id_is_named(ds):
    _edit_json(ds / F.MANIFEST, lambda o: o.update(vocab_size=500))
    assert validate(ds).ok  # structure alone cannot see token values
    report = validate(ds, deep=True)
    assert not report.ok
    assert any(p.field == "vocab_size" and p.file == F.TOKENS for p in report.errors), report.format()
    assert "first at token" in report.errors[0].message or _names(report, "vocab_size")


def test_falsified_checksum_is_named(ds):
    _edit_json(ds / F.MANIFEST, lambda o: o["files"][F.LOSS_MASK].update(checksum="xxh3_64:" + "0" * 16))
    assert validate(ds).ok
    report = validate(ds, deep=True)
    assert [p.file for p in report.errors] == [F.LOSS_MASK]
    assert report.errors[0].message.startswith("loss_mask.bin: checksum: expected xxh3_64:0000000000000000, found xxh3_64:")


def test_token_checksum_change_breaks_index_link(ds):
    _edit_json(ds / F.MANIFEST, lambda o: o["files"][F.TOKENS].update(checksum="xxh3_64:" + "1" * 16))
    report = validate(ds)
    assert not report.ok
    assert _names(report, f"dataset.{F.TOKENS}") and _names(report, SPLIT) and _names(report, TRUNC)


def test_newer_major_version_is_refused_clearly(ds, capsys):
    _edit_json(ds / F.MANIFEST, lambda o: o.update(format_version="2.0"))
    report = validate(ds, deep=True)
    assert not report.ok
    assert "newer major version" in report.errors[0].message and report.errors[0].field == "format_version"
    assert main(["validate", str(ds)]) == 1
    assert "newer major version" in capsys.readouterr().err


def test_newer_minor_version_is_accepted(ds):
    _edit_json(ds / F.MANIFEST, lambda o: o.update(format_version="1.7"))
    report = validate(ds, deep=True)
    assert report.ok, report.format()
    assert any(p.field == "format_version" for p in report.warnings)


def test_unknown_files_are_warnings(ds):
    (ds / "notes.txt").write_text("hello")
    (ds / F.PACKS_DIR / ".x.packfmt-tmp-999999-abcd").mkdir()
    report = validate(ds)
    assert report.ok
    assert {p.file for p in report.warnings} == {"notes.txt", f"{F.PACKS_DIR}/.x.packfmt-tmp-999999-abcd"}


# ----------------------------------------------------------------------------- content corruptions
def test_decreasing_doc_offsets_named(ds):
    off = np.fromfile(ds / F.DOC_OFFSETS, dtype=F.OFFSET_DTYPE)
    off[3], off[4] = off[4], off[3]
    _rewrite(ds, F.DOC_OFFSETS, off)
    report = validate(ds)  # structural is enough
    assert not report.ok
    bad = [p for p in report.errors if p.file == F.DOC_OFFSETS]
    assert bad and "strictly increasing" in bad[0].message and bad[0].field == "[3:5]", report.format()


def test_empty_document_named(ds):
    off = np.fromfile(ds / F.DOC_OFFSETS, dtype=F.OFFSET_DTYPE)
    off[7] = off[6]
    _rewrite(ds, F.DOC_OFFSETS, off)
    report = validate(ds)
    assert any(p.file == F.DOC_OFFSETS and ">= 1 token" in p.message for p in report.errors), report.format()


def test_empty_pack_and_empty_image_blob_named(ds):
    """V25 / V14: pack_offsets and image_offsets are strictly increasing (no empty pack, no empty blob)."""
    rel = f"{F.PACKS_DIR}/{SPLIT}/{F.PACK_OFFSETS}"
    po = np.fromfile(ds / rel, dtype=F.OFFSET_DTYPE)
    po[1] = po[0]  # pack 0 empty, pack 1 takes its segments
    _rewrite(ds, rel, po)
    io_ = np.fromfile(ds / F.IMAGE_OFFSETS, dtype=F.OFFSET_DTYPE)
    io_[1] = io_[0]  # image 0 has no bytes, image 1 takes them
    _rewrite(ds, F.IMAGE_OFFSETS, io_)
    report = validate(ds)  # structural is enough
    assert any(p.file == rel and p.field == "[0:2]" and ">= 1 segment" in p.message for p in report.errors), report.format()
    assert any(p.file == F.IMAGE_OFFSETS and p.field == "[0:2]" and ">= 1 byte" in p.message
               for p in report.errors), report.format()


def test_segment_beyond_document_named(ds):
    rel = f"{F.PACKS_DIR}/{SPLIT}/{F.SEGMENTS}"
    segs = np.fromfile(ds / rel, dtype=F.OFFSET_DTYPE).reshape(-1, 3)
    lengths = packfmt.open(ds).doc_lengths
    segs[2, 2] = lengths[segs[2, 0]] + 5
    _rewrite(ds, rel, segs)
    report = validate(ds, deep=True)
    assert any(p.file == rel and "beyond its document" in p.message for p in report.errors), report.format()


def test_pack_over_capacity_named(ds):
    rel = f"{F.PACKS_DIR}/{SPLIT}"
    _edit_json(ds / rel / F.PACK_INDEX_JSON, lambda o: o.update(capacity=50))
    report = validate(ds, deep=True)
    assert any(p.file == f"{rel}/{F.SEGMENTS}" and "over capacity" in p.message for p in report.errors), report.format()


def test_document_missing_from_index_named(ds):
    rel = f"{F.PACKS_DIR}/{SPLIT}"
    segs = np.fromfile(ds / rel / F.SEGMENTS, dtype=F.OFFSET_DTYPE).reshape(-1, 3)
    po = np.fromfile(ds / rel / F.PACK_OFFSETS, dtype=F.OFFSET_DTYPE)
    docs, counts = np.unique(segs[:, 0], return_counts=True)
    victim = int(docs[counts == 1][0])
    k = int(np.flatnonzero(segs[:, 0] == victim)[0])
    pack = int(np.searchsorted(po, k, side="right")) - 1
    lost = int(segs[k, 2] - segs[k, 1])
    segs = np.delete(segs, k, axis=0)
    po[pack + 1:] -= 1
    _rewrite(ds, f"{rel}/{F.SEGMENTS}", segs)
    _rewrite(ds, f"{rel}/{F.PACK_OFFSETS}", po)
    _edit_json(ds / rel / F.PACK_INDEX_JSON, lambda o: o["counts"].update(
        segments=int(segs.shape[0]), packed_tokens=o["counts"]["packed_tokens"] - lost))
    assert validate(ds).ok  # structure is consistent; only coverage shows the hole
    report = validate(ds, deep=True)
    missing = [p for p in report.errors if "missing from the index" in p.message]
    assert missing and missing[0].message.endswith(f": {victim}"), report.format()


def test_duplicate_segment_named(ds):
    rel = f"{F.PACKS_DIR}/{TRUNC}"
    segs = np.fromfile(ds / rel / F.SEGMENTS, dtype=F.OFFSET_DTYPE).reshape(-1, 3)
    segs[1] = segs[0]
    _rewrite(ds, f"{rel}/{F.SEGMENTS}", segs)
    report = validate(ds, deep=True)
    assert _names(report, "more than once"), report.format()
    assert _names(report, f"{rel}/{F.PACKED_TOKENS}")  # materialized tokens no longer match the segments


def test_max_docs_per_pack_param_checked(ds):
    rel = f"{F.PACKS_DIR}/{TRUNC}/{F.PACK_INDEX_JSON}"
    _edit_json(ds / rel, lambda o: o["params"].update(max_docs_per_pack=1))
    report = validate(ds, deep=True)
    assert _names(report, "params.max_docs_per_pack"), report.format()


def test_image_span_outside_document_named(ds):
    spans = np.fromfile(ds / F.IMAGE_TOKEN_SPANS, dtype=F.OFFSET_DTYPE).reshape(-1, 2)
    spans[0] = [spans[0, 0], spans[0, 0] + 10_000]
    _rewrite(ds, F.IMAGE_TOKEN_SPANS, spans)
    report = validate(ds, deep=True)
    assert any(p.file == F.IMAGE_TOKEN_SPANS and p.field == "[0]" for p in report.errors), report.format()


def test_bad_mask_value_and_codec_named(ds):
    mask = np.fromfile(ds / F.LOSS_MASK, dtype=np.uint8)
    mask[10] = 7
    _rewrite(ds, F.LOSS_MASK, mask, dtype=np.uint8)
    meta = np.fromfile(ds / F.IMAGE_META, dtype=F.IMAGE_META_DTYPE).reshape(-1, 3)
    meta[1, 2] = 99
    meta[2, 0] = 0
    _rewrite(ds, F.IMAGE_META, meta, dtype=F.IMAGE_META_DTYPE)
    report = validate(ds, deep=True)
    fields = {(p.file, p.field) for p in report.errors}
    assert (F.LOSS_MASK, "values") in fields
    assert (F.IMAGE_META, "codec (column 2)") in fields and (F.IMAGE_META, "width/height (columns 0, 1)") in fields
    assert len(report.errors) >= 3  # every problem is reported, not only the first


# ----------------------------------------------------------------------------- round trip property
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    vocab=st.sampled_from([1000, 70000]),
    docs=st.lists(st.integers(1, 60), min_size=1, max_size=25),
    seed=st.integers(0, 2**32 - 1),
    capacity=st.integers(1, 80),
    oversize=st.sampled_from(IF.OVERSIZE_POLICIES),
    algorithm=st.sampled_from(["ffd", "bfd", "first_fit_shuffle"]),
)
def test_roundtrip_then_validate_deep(vocab, docs, seed, capacity, oversize, algorithm):
    rng = np.random.default_rng(seed)
    tokens = [rng.integers(0, vocab, n) for n in docs]
    masks = [rng.integers(0, 2, n) for n in docs]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ds"
        with packfmt.DatasetWriter(root, vocab_size=vocab, loss_mask=True) as w:
            for t, m in zip(tokens, masks):
                w.add_document(t, m)
        store = packfmt.open(root)
        assert store.tokens.dtype == (np.uint16 if vocab <= 65536 else np.uint32)
        np.testing.assert_array_equal(store.doc_offsets, np.concatenate([[0], np.cumsum(docs)]))
        np.testing.assert_array_equal(store.tokens, np.concatenate(tokens))
        np.testing.assert_array_equal(store.loss_mask, np.concatenate(masks))
        for i in range(len(docs)):
            np.testing.assert_array_equal(store.document(i), tokens[i])
        build_pack_index(store, capacity=capacity, algorithm=algorithm, oversize=oversize, seed=seed % 1000,
                         materialize=bool(seed % 2))
        report = validate(root, deep=True)
        assert report.ok, report.format()


def test_index_with_every_document_dropped(tmp_path):
    """oversize='drop' with every document longer than capacity: an empty but valid index."""
    with packfmt.DatasetWriter(tmp_path / "ds", vocab_size=VOCAB) as w:
        for n in (5, 9, 3):
            w.add_document(np.arange(n))
    build_pack_index(tmp_path / "ds", capacity=2, algorithm="ffd", name="empty", oversize="drop")
    report = validate(tmp_path / "ds", deep=True)
    assert report.ok, report.format()


def test_deep_decodes_every_image(tmp_path):
    """V20: a blob that is not the image its meta claims is found by --deep (the checksums still match)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (3, 2), (10, 20, 30)).save(buf, format="PNG")
    good = buf.getvalue()
    with packfmt.DatasetWriter(tmp_path / "ds", vocab_size=VOCAB) as w:
        w.add_document([1, 2, 3, 4], images=[packfmt.ImageRecord(good, 3, 2, "png", 1, 3)])
        w.add_document([5, 6, 7], images=[packfmt.ImageRecord(b"\x89PNG not really", 3, 2, "png", 0, 2)])
        w.add_document([8, 9], images=[packfmt.ImageRecord(good, 4, 2, "png", 0, 1)])  # meta says 4x2, pixels are 3x2
    report = validate(tmp_path / "ds", deep=True)
    assert not report.ok
    [problem] = [p for p in report.errors if p.file == "image_blobs.bin"]
    assert "2 image(s)" in problem.found and "1" in problem.found and "2" in problem.found
    assert validate(tmp_path / "ds", deep=True, decode_images=False).ok
    assert main(["validate", str(tmp_path / "ds"), "--deep", "--skip-image-decode", "--quiet"]) == 0
    assert main(["validate", str(tmp_path / "ds"), "--deep", "--quiet"]) == 1
