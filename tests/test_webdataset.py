"""WebDataset in (tar shards of image + JSON samples -> a store) and out (one sample per pack, read back
with the ``webdataset`` library and compared with ``PackedDataset``: tokens, boundaries, labels at every
position including cuts, documents, and image ids, collection-wide for a collection)."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import packfmt
from packfmt import cli
from packfmt.build import build_chat, build_multimodal, build_text
from packfmt.collection import write_collection
from packfmt.energon import pack_labels
from packfmt.errors import DatasetExistsError, InputError
from packfmt.export_webdataset import export_webdataset
from packfmt.packindex import build_pack_index

os.environ["HF_HUB_OFFLINE"] = "1"
wds = pytest.importorskip("webdataset")
torch_ds = pytest.importorskip("packfmt.torch")
SAMPLE = Path(packfmt.__file__).parent / "sample_data"
TOK = SAMPLE / "tokenizer"


def image_bytes(w: int, h: int, seed: int, fmt: str) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def chat(question: str, answer: str, images: int) -> list[dict]:
    return [{"role": "user", "content": "<image>\n" * images + question}, {"role": "assistant", "content": answer}]


def samples() -> list[tuple[str, dict, dict[str, bytes]]]:
    """``(key, json, image members)``: one image by extension, two by member name, none, and a base-name reference."""
    out = []
    for i in range(12):
        n = i % 3
        imgs = {f"{j}.{'png' if (i + j) % 2 else 'jpg'}": image_bytes(20 + 3 * i, 16 + j, i * 10 + j,
                                                                     "PNG" if (i + j) % 2 else "JPEG")
                for j in range(n)}
        key = f"s{i:04d}"
        names = list(imgs) if i % 2 else [f"{key}.{e}" for e in imgs]
        rec = {"messages": chat(f"What is in picture {i}?", f"Shapes number {i}, in colour.", n), "images": names}
        out.append((key, rec, imgs))
    return out


def write_tar(path: Path, items: list[tuple[str, dict | None, dict[str, bytes]]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for key, rec, members in items:
            entries = dict(members)
            if rec is not None:
                entries["json"] = json.dumps(rec).encode()
            for ext, data in entries.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def write_plain(tmp: Path, items) -> tuple[Path, Path]:
    """The same samples as a JSON array + an image folder (the reference build)."""
    root = tmp / "images"
    root.mkdir()
    records = []
    for key, rec, members in items:
        for ext, data in members.items():
            (root / f"{key}.{ext}").write_bytes(data)
        records.append({**rec, "images": [f"{key}.{e}" for e in members]})
    (tmp / "plain.json").write_text(json.dumps(records))
    return tmp / "plain.json", root


def binaries(path: Path) -> dict[str, bytes]:
    out = {p.name: p.read_bytes() for p in sorted(Path(path).glob("*.bin"))}
    assert {"tokens.bin", "loss_mask.bin"} <= set(out)
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> tuple[list[Path], Path]:
    tmp = tmp_path_factory.mktemp("wds")
    items = samples()
    tars = [write_tar(tmp / "a.tar", items[:7]), write_tar(tmp / "b.tar", items[7:])]
    return tars, tmp


@pytest.fixture(scope="module")
def vlm_store(shards) -> Path:
    tars, tmp = shards
    return build_multimodal(tars, tmp / "store", TOK, image_tokens="dynamic", patch_size=4, merge=2).path


def test_tar_shards_build_like_json_with_an_image_folder(shards, vlm_store, tmp_path):
    items = samples()
    plain, root = write_plain(tmp_path, items)
    ref = build_multimodal([plain], tmp_path / "ref", TOK, image_root=root, image_tokens="dynamic", patch_size=4, merge=2)
    assert binaries(vlm_store) == binaries(ref.path)
    store = packfmt.open(vlm_store)
    assert store.num_images == sum(len(m) for _, _, m in items) == 12
    assert store.manifest.raw["build_report"]["records_read"] == 12


def test_bad_samples_are_counted_by_reason(tmp_path):
    items = samples()[:4]
    key, rec, members = items[1]
    items[1] = (key, {**rec, "images": ["9.png"]}, members)  # names no member
    items.append(("nojson", None, {"jpg": image_bytes(8, 8, 1, "JPEG")}))
    items.append(("broken", None, {"json": b"{not json"}))
    tar = write_tar(tmp_path / "bad.tar", items)
    with pytest.raises(InputError) as err:
        build_multimodal([tar], tmp_path / "f", TOK, image_tokens=4)
    assert err.value.reason == "missing_image" and "'9.png'" in str(err.value) and err.value.line == 2
    result = build_multimodal([tar], tmp_path / "s", TOK, image_tokens=4, on_error="skip")
    r = result.report
    assert r["skipped"] == {"malformed_json": 1, "missing_field": 1, "missing_image": 1}
    assert r["records_read"] == 6 == r["documents_written"] + sum(r["skipped"].values())


def test_chat_and_text_from_tar_equal_jsonl(tmp_path):
    chats = [json.loads(line) for line in (SAMPLE / "chat.jsonl").read_text().splitlines()][:20]
    tar = write_tar(tmp_path / "chat.tar", [(f"c{i:03d}", rec, {}) for i, rec in enumerate(chats)])
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chats))
    a = build_chat([tar], tmp_path / "a", TOK)
    b = build_chat([tmp_path / "chat.jsonl"], tmp_path / "b", TOK)
    assert binaries(a.path) == binaries(b.path)
    texts = [json.loads(line)["text"] for line in (SAMPLE / "text.jsonl").read_text().splitlines()][:10]
    tar = write_tar(tmp_path / "text.tar", [(f"t{i:03d}", None, {"txt": t.encode()}) for i, t in enumerate(texts)])
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    x = packfmt.open(build_text([tar], tmp_path / "x", TOK).path)
    y = packfmt.open(build_text([tmp_path / "t.jsonl"], tmp_path / "y", TOK).path)
    assert np.array_equal(x.tokens, y.tokens) and np.array_equal(x.doc_offsets, y.doc_offsets)


def read_back(out: Path) -> list[dict]:
    urls = [str(p) for p in sorted(out.glob("shard-*.tar"))]
    return list(wds.WebDataset(urls, shardshuffle=False).decode())


def check_export(store_path: Path, index: str, out: Path) -> int:
    return check_samples(store_path, index, read_back(out))


def same_bytes(member, stored: bytes) -> bool:
    return member == stored


def stored_image(source, g: int) -> bytes:
    """The stored bytes of image ``g``: a store's image id, or a collection-wide id (members in order)."""
    if not hasattr(source, "members"):
        return bytes(source.images.data(g))
    m = int(np.searchsorted(source.image_start, g, side="right")) - 1
    return bytes(source.member(m).images.data(g - int(source.image_start[m])))


def cut_labels(store, got: list[dict]) -> list[int]:
    """The labels at the cuts (segments that end before their document) of the decoded samples."""
    lengths = store.doc_lengths
    return [int(s["last_labels.npy"][j]) for s in got for j, d in enumerate(s["json"]["documents"])
            if d["end"] < lengths[d["document"]]]


def check_samples(store_path: Path, index: str, got: list[dict], same_image=same_bytes) -> int:
    """Decoded samples (pack order) against ``PackedDataset``; ``same_image(member, stored bytes)``
    compares an image member as the reader decoded it. Returns the number of images checked."""
    ds = torch_ds.PackedDataset(store_path, index)
    store = packfmt.open(store_path)
    assert len(got) == len(ds)
    images_seen = 0
    for p, sample in enumerate(got):
        item = ds[p]
        meta = sample["json"]
        assert sample["__key__"] == f"{p:09d}" and meta["pack"] == p
        ids = sample["input_ids.npy"]
        assert ids.dtype == store.np_token_dtype
        assert np.array_equal(ids.astype(np.int64), item["input_ids"].numpy())
        cu = sample["cu_seqlens.npy"]
        assert np.array_equal(np.diff(cu), item["seq_lens"].numpy()) and meta["seq_lens"] == item["seq_lens"].tolist()
        assert [d["document"] for d in meta["documents"]] == item["document_ids"].tolist()
        assert ("loss_mask.npy" in sample) == store.has_loss_mask
        last = sample["last_labels.npy"]
        assert last.dtype == np.int64 and last.shape == (len(cu) - 1,)
        # every label, cuts included, follows from the exported members (spec/WEBDATASET.md §2)
        labels = pack_labels(ids, sample.get("loss_mask.npy"), cu, last)
        assert np.array_equal(labels, item["labels"].numpy())
        if "image_ids" in item:
            assert [m["image"] for m in meta["images"]] == item["image_ids"].tolist()
            assert [m["span"] for m in meta["images"]] == item["image_spans"].tolist()
            for m in meta["images"]:  # decode() without an image handler leaves image members as bytes
                assert isinstance(m["codec"], str)  # the codec's name (FORMAT.md §3.4), never its id
                assert same_image(sample[m["member"]], stored_image(store, m["image"]))
            images_seen += len(meta["images"])
    return images_seen


def raw_members(out: Path) -> dict[str, bytes]:
    found = {}
    for shard in sorted(out.glob("shard-*.tar")):
        for sample in wds.WebDataset(str(shard), shardshuffle=False):  # undecoded: the bytes as stored
            for k, v in sample.items():
                if k.startswith("img"):
                    found[f"{sample['__key__']}.{k}"] = v
    return found


def test_export_round_trip_multimodal(vlm_store, tmp_path):
    idx = build_pack_index(vlm_store, capacity=160, algorithm="ffd").name
    res = export_webdataset(vlm_store, tmp_path / "out", index=idx, shard_bytes=8192)
    assert len(res.shards) > 1 and res.packs == packfmt.open(vlm_store).pack_index(idx).num_packs
    for shard, entry in zip(res.shards, json.loads((tmp_path / "out" / "export.json").read_text())["shards"]):
        assert shard.stat().st_size <= 8192 or entry["samples"] == 1  # only a pack larger than a shard exceeds it
    assert check_export(vlm_store, idx, tmp_path / "out") == 12
    store = packfmt.open(vlm_store)
    raw = raw_members(tmp_path / "out")
    stored = sorted(bytes(store.images.data(i)) for i in range(store.num_images))
    assert sorted(raw.values()) == stored  # every image exported once, original bytes
    summary = json.loads((tmp_path / "out" / "export.json").read_text())
    assert sum(s["samples"] for s in summary["shards"]) == res.packs


def test_export_text_materialized_deterministic_and_cli(tmp_path):
    store = build_text([SAMPLE / "text.jsonl"], tmp_path / "t", TOK).path
    idx = build_pack_index(store, capacity=256, algorithm="ffd", materialize=True).name
    export_webdataset(store, tmp_path / "o1", index=idx)
    assert check_export(store, idx, tmp_path / "o1") == 0
    assert cli.main(["export", "webdataset", str(store), str(tmp_path / "o2"), "--index", idx]) == 0
    one, two = (sorted((tmp_path / o).glob("*.tar")) for o in ("o1", "o2"))
    assert [p.read_bytes() for p in one] == [p.read_bytes() for p in two]
    with pytest.raises(DatasetExistsError):
        export_webdataset(store, tmp_path / "o1", index=idx)
    assert cli.main(["export", "webdataset", str(store), str(tmp_path / "o1"), "--index", idx, "--overwrite"]) == 0
    # a truncated document's cut label is its next token, in no pack at all (READER.md §2)
    trunc = build_pack_index(store, capacity=64, algorithm="ffd", oversize="truncate", max_lost_fraction=1.0).name
    export_webdataset(store, tmp_path / "t1", index=trunc)
    got = read_back(tmp_path / "t1")
    assert check_samples(store, trunc, got) == 0
    assert any(c != -100 for c in cut_labels(packfmt.open(store), got))


def vlm_collection(tmp: Path, tars: list[Path]) -> Path:
    """Two image stores (samples 0-6 and 7-11, images numbered from 0 in each) as one collection."""
    a = build_multimodal(tars[:1], tmp / "a", TOK, image_tokens="dynamic", patch_size=4, merge=2).path
    b = build_multimodal(tars[1:], tmp / "b", TOK, image_tokens="dynamic", patch_size=4, merge=2).path
    return write_collection(tmp / "coll", [("a", a), ("b", b)]).path


def test_collection_export_has_collection_wide_image_ids_and_cut_labels(shards, tmp_path):
    tars, _ = shards
    coll_path = vlm_collection(tmp_path, tars)
    coll = packfmt.open(coll_path)
    assert [m.images for m in coll.members] == [6, 6]  # member-local ids 0..5 twice: they would collide
    idx = build_pack_index(coll_path, capacity=40, algorithm="ffd", oversize="split").name
    export_webdataset(coll_path, tmp_path / "out", index=idx)
    got = read_back(tmp_path / "out")
    assert check_samples(coll_path, idx, got) == 12
    image_ids = sorted(m["image"] for s in got for m in s["json"]["images"])
    assert image_ids == list(range(12))  # every image once, under its collection-wide id
    cuts = cut_labels(coll, got)
    assert cuts and any(c != -100 for c in cuts)  # documents really were cut, and cut labels really carried
    for s in got:  # and each is the document's true next token, from the collection's own documents
        for j, d in enumerate(s["json"]["documents"]):
            doc = coll.document(d["document"])
            if d["end"] < len(doc) and coll.document_loss_mask(d["document"])[d["end"]]:
                assert s["last_labels.npy"][j] == doc[d["end"]]


def test_sample_to_batch_needs_no_megatron(tmp_path):
    """``packfmt.energon`` imports megatron-core only for ``packed_seq_params=True`` (a fresh process)."""
    import subprocess
    import sys

    from limits import time_limit

    code = ("import sys, numpy as np\n"
            "from packfmt.energon import sample_to_batch\n"
            "s = {'input_ids.npy': np.array([5, 6, 7, 8], np.uint16), 'cu_seqlens.npy': np.array([0, 3, 4], np.int32),\n"
            "     'last_labels.npy': np.array([9, -100]), 'json': {'pack': 0, 'documents': [], 'images': []}}\n"
            "b = sample_to_batch(s)\n"
            "assert b['labels'].tolist() == [[6, 7, 9, -100]] and b['position_ids'].tolist() == [[0, 1, 2, 0]]\n"
            "assert not any(m.split('.')[0] == 'megatron' for m in sys.modules), 'megatron imported'\n")
    with time_limit(120, "python -c sample_to_batch"):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(packfmt.__file__).parent.parent)})
    assert run.returncode == 0, run.stderr
