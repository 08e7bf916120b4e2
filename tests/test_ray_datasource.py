"""packfmt.ray.datasource.read_packs: rows are exactly PackedDataset's items; equal shares of every pack once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("ray")
pytest.importorskip("torch")

import packfmt  # noqa: E402
from packfmt.build import build_multimodal, build_text  # noqa: E402
from packfmt.collection import write_collection  # noqa: E402
from packfmt.packindex import build_pack_index  # noqa: E402
from packfmt.ray.datasource import ROW_KEYS, deal_packs, read_packs  # noqa: E402
from packfmt.torch import DistributedPackSampler, ImageProcessorTransform, PackedDataset  # noqa: E402

from ray_session import ray_session, time_limit  # noqa: E402,F401

SAMPLE = Path(packfmt.__file__).parent / "sample_data"
SAMPLE_TOK = SAMPLE / "tokenizer"
pytestmark = [pytest.mark.usefixtures("ray_session", "time_limit"), pytest.mark.xdist_group("ray")]


@pytest.fixture(scope="module")
def text_collection(tmp_path_factory):
    """A collection of two real text stores, packed globally at 512 tokens."""
    tmp = tmp_path_factory.mktemp("coll")
    lines = (SAMPLE / "text.jsonl").read_text(encoding="utf-8").splitlines()
    parts = []
    for k, chunk in enumerate((lines[:25], lines[25:])):
        src = tmp / f"part{k}.jsonl"
        src.write_text("\n".join(chunk) + "\n", encoding="utf-8")
        parts.append((f"part{k}", build_text([src], tmp / f"s{k}", SAMPLE_TOK).path))
    coll = write_collection(tmp / "coll", parts)
    build_pack_index(coll, capacity=512, name="p")
    return tmp / "coll"


def assert_row_is_item(row: dict, item: dict) -> None:
    for key in ROW_KEYS:
        want = item[key].numpy()
        assert np.array_equal(np.asarray(row[key]), want), key


def test_rows_are_packed_dataset_items(text_collection):
    ds = PackedDataset(text_collection, "p")
    rows = read_packs(text_collection, "p", packs_per_block=3).take_all()
    assert sorted(int(r["pack_id"]) for r in rows) == list(range(len(ds)))  # every pack once (Ray's order)
    for row in rows:
        assert_row_is_item(row, ds[int(row["pack_id"])])


def test_equal_streaming_split_gives_equal_shares_of_every_pack_once(text_collection):
    """Ray Train's split (``equal=True``) of a deal over 2: equal shares, no pack truncated, the padding declared."""
    ds = PackedDataset(text_collection, "p")
    n = len(ds)
    deal = deal_packs(ds, num_replicas=2, epoch=3)
    first, second = read_packs(text_collection, "p", num_replicas=2, epoch=3, packs_per_block=2).streaming_split(
        2, equal=True)
    # the two iterators must be consumed concurrently (the coordinator feeds both)
    import threading

    seen: list[list[int]] = [[], []]

    def consume(k, it):
        for batch in it.iter_batches(batch_size=4, batch_format="numpy"):
            seen[k].extend(int(x) for x in batch["pack_id"])

    threads = [threading.Thread(target=consume, args=(k, it)) for k, it in enumerate((first, second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=200)
    assert len(seen[0]) == len(seen[1]) == -(-n // 2)
    assert sorted(seen[0] + seen[1]) == sorted(deal.tolist())
    assert sorted(set(seen[0] + seen[1])) == list(range(n))


def test_a_rank_reads_its_share_in_the_samplers_order(text_collection):
    ds = PackedDataset(text_collection, "p")
    sampler = DistributedPackSampler(ds, 3, 1, seed=7, balance="tokens")
    sampler.set_epoch(1)
    rows = read_packs(text_collection, "p", num_replicas=3, rank=1, seed=7, epoch=1, balance="tokens",
                      packs_per_block=2).take_all()
    assert [int(r["pack_id"]) for r in rows] == list(sampler)
    for row in rows:
        assert_row_is_item(row, ds[int(row["pack_id"])])


def _processor():
    try:
        from transformers import CLIPImageProcessorPil as cls
    except ImportError:
        from transformers import CLIPImageProcessor as cls
    return cls(size={"shortest_edge": 8}, crop_size={"height": 8, "width": 8})


def test_images_processed_in_cpu_actors_match_packed_dataset(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    rng = np.random.default_rng(1)
    lines = []
    for k in range(6):
        Image.fromarray(rng.integers(0, 255, (20 + k, 30 - k, 3), dtype=np.uint8)).save(root / f"{k}.png")
        lines.append(json.dumps({"image": f"{k}.png", "conversations": [
            {"from": "human", "value": f"<image>\nPicture {k}?"}, {"from": "gpt", "value": f"Noise {k}."}]}))
    (tmp_path / "l.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    store = build_multimodal([tmp_path / "l.jsonl"], tmp_path / "ds", SAMPLE_TOK, image_root=root, image_tokens=4).path
    build_pack_index(store, capacity=96, name="p")
    proc = _processor()
    ds = PackedDataset(store, "p", image_transform=ImageProcessorTransform(proc))
    rows = read_packs(store, "p", packs_per_block=1, image_processor=proc).take_all()
    assert len(rows) == len(ds)
    images = 0
    for row in rows:
        item = ds[int(row["pack_id"])]
        assert_row_is_item(row, item)
        assert np.array_equal(np.asarray(row["image_spans"]), item["image_spans"].numpy())
        want = np.stack([im.numpy() for im in item["images"]])
        assert row["pixel_values"].shape == want.shape == (len(item["images"]), 3, 8, 8)
        assert np.allclose(row["pixel_values"], want)
        images += len(want)
    assert images == 6


def test_multimodal_without_a_processor_is_refused(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(root / "a.png")
    (tmp_path / "l.jsonl").write_text(json.dumps({"image": "a.png", "conversations": [
        {"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "Black."}]}) + "\n", encoding="utf-8")
    store = build_multimodal([tmp_path / "l.jsonl"], tmp_path / "ds", SAMPLE_TOK, image_root=root, image_tokens=2).path
    build_pack_index(store, capacity=64, name="p")
    with pytest.raises(ValueError, match="image_processor="):
        read_packs(store, "p")


def test_preprocess_bench_runs_tiny(tmp_path, monkeypatch):
    """benchmarks/bench_ray_preprocess.py end to end at a tiny size on the session's Ray (no timing checked)."""
    from bench_runner import run_benchmark

    out = tmp_path / "r.json"
    rc, _ = run_benchmark(monkeypatch, "bench_ray_preprocess", [
        "--records", 12, "--resolution", 16, "--repeat", 1, "--out", out], env={"BENCH_TMP": tmp_path})
    assert rc == 0
    rec = json.loads(out.read_text())
    assert [r["case"] for r in rec["rows"]] == ["dataloader, 0 workers", "dataloader, 1 workers", "ray, 1 actors"]
    assert rec["images"] == 12 and all(r["packs"] == rec["packs"] > 1 for r in rec["rows"])
    assert rec["rows"][-1]["vs_dataloader_same_n"] == rec["rows"][-1]["packs_per_s"] / rec["rows"][1]["packs_per_s"]
