"""The conformance vectors of spec/conformance/ (its README): every expected value, three ways.

1. packfmt's reader, collates, mixture planner and samplers give every value of ``expected/``;
2. a reader written from the spec alone (``conformance_reference.py``, numpy only) gives them too, so the
   vectors are held to the spec's rules, not only to the program that wrote them;
3. ``tools/make_conformance.py`` writes the committed files again byte for byte, so the vectors cannot
   drift from the code silently: a change that alters them fails here until they are regenerated.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import xxhash

import packfmt
from packfmt.torch import DistributedPackSampler, PackedDataset, collate_varlen

import conformance_reference as ref

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "spec" / "conformance"
NAMES = sorted(p.stem for p in (CONF / "expected").glob("*.json") if p.stem != "samplers")


@cache
def expected(name: str) -> dict:
    return json.loads((CONF / "expected" / f"{name}.json").read_text("utf-8"))


def _lists(value):
    return np.asarray(value).tolist() if not isinstance(value, (int, list)) else value


def _item(item: dict) -> dict:
    return {k: _lists(v) for k, v in item.items() if k not in ("images", "pixel_values")}


def _batch(batch: dict) -> dict:
    out = {k: _lists(v) for k, v in batch.items() if k not in ("images", "pixel_values")}
    for k in ("input_ids", "labels", "position_ids", "doc_ids"):
        out[k] = out[k][0]  # (1, T)
    return out


def test_every_dataset_has_its_expected_values():
    data = sorted(p.name for p in (CONF / "data").iterdir())
    assert NAMES == data and len(NAMES) == 7
    readme = (CONF / "README.md").read_text("utf-8")
    missing = [n for n in NAMES if f"| `{n}` |" not in readme or f"{n}.json`" not in readme]
    assert not missing and "`expected/samplers.json`" in readme, f"spec/conformance/README.md: describe {missing}"


# ----------------------------------------------------------------------------- packfmt's reader
@pytest.mark.parametrize("name", NAMES)
def test_packfmt_reads_the_documents(name):
    exp = expected(name)
    ds = packfmt.open(CONF / exp["dataset"])
    raw = json.loads((ds.path / "manifest.json").read_text("utf-8"))
    assert {k: raw[k] for k in exp["format"]} == exp["format"]
    if "members" in exp:
        assert [[m.name, m.path, m.documents, m.tokens, m.images, m.manifest] for m in ds.members] == [
            [m[k] for k in ("name", "path", "documents", "tokens", "images", "manifest")] for m in exp["members"]]
        assert ds.doc_start[:-1].tolist() == [m["doc_start"] for m in exp["members"]]
        assert ds.doc_lengths.tolist() == exp["doc_lengths"] and raw.get("unified", {}) == exp["unified"]
    else:
        assert ds.doc_offsets.tolist() == exp["doc_offsets"]
    for d, doc in enumerate(exp["documents"]):
        assert ds.document(d).tolist() == doc["tokens"]
        mask = ds.document_loss_mask(d)
        assert (None if mask is None else mask.tolist()) == doc.get("loss_mask")
        if ds.num_images:
            assert list(ds.images.of_document(d)) == doc["images"]
    for i, image in enumerate(exp.get("images", [])):
        blob = bytes(ds.images.data(i))
        assert (ds.images.codec(i), *ds.images.size(i), len(blob)) == (image["codec"], image["width"],
                                                                       image["height"], image["bytes"])
        assert "xxh3_64:" + xxhash.xxh3_64_hexdigest(blob) == image["checksum"]
        assert ds.images.token_spans[i].tolist() == image["token_span"]
        assert ds.images.decode(i).tolist() == image["pixels"] and len(image["pixels"][0][0]) == image["channels"]


@pytest.mark.parametrize("name", NAMES)
def test_packfmt_reads_every_index(name):
    exp = expected(name)
    ds = packfmt.open(CONF / exp["dataset"])
    assert ds.pack_index_names() == sorted(exp["indexes"])
    for index, want in exp["indexes"].items():
        idx = ds.pack_index(index)
        raw = json.loads((idx.path / "index.json").read_text("utf-8"))
        assert {k: raw[k] for k in want["index"]} == want["index"], index
        assert {k: raw[k] for k in ("dataset", "collection") if k in raw} == want["binding"]
        assert idx.pack_offsets.tolist() == want["pack_offsets"] and idx.segments.tolist() == want["segments"]
        assert np.asarray(idx.pack_lengths).tolist() == want["pack_lengths"]
        if raw["materialized"]:
            assert idx.pack_token_offsets.tolist() == want["pack_token_offsets"]
            for p, item in enumerate(want["items"]):
                assert idx.pack_tokens(p).tolist() == item["input_ids"]
        reader = PackedDataset(ds, index)
        assert [_item(reader[p]) for p in range(len(reader))] == want["items"], index
        assert _item(PackedDataset(ds, index, pad_to_capacity=True)[0]) == want["padded_item"], index
        batch = want["batch"]
        got = _batch(collate_varlen(reader.__getitems__(batch["packs"])))
        assert got == {k: v for k, v in batch.items() if k not in ("collate", "packs")}, index


def test_packfmt_plans_the_mixtures():
    """COLLECTION §5, §5.1: the copies of every document, recomputed from the record alone."""
    from packfmt.collection.mixture import extra_copy_draws
    from packfmt.collection.proportions import copies_of_record

    coll = packfmt.open(CONF / "data" / "array")
    mixtures = {n: ix["mixture"] for n, ix in expected("array")["indexes"].items() if "mixture" in ix}
    assert len(mixtures) == 2
    for name, mix in mixtures.items():
        meta = expected("array")["indexes"][name]["index"]
        copies, head, _ = copies_of_record(coll, mix["record"], meta["capacity"], meta["oversize"], file=name)
        assert copies.tolist() == [d["copies"] for d in mix["documents"]], name
        assert extra_copy_draws(mix["record"]["seed"], np.arange(len(copies))).tolist() == [
            d["u"] for d in mix["documents"]]
        if "plan" in head:
            assert head["plan"] == mix["record"]["plan"]


def test_packfmt_samplers_deal_and_resume():
    exp = expected("samplers")
    reader = PackedDataset(CONF / exp["dataset"], exp["index"])
    assert (len(reader), reader.fingerprint) == (exp["num_packs"], exp["fingerprint"])
    assert reader.pack_num_tokens().tolist() == exp["pack_weights"]["tokens"]
    assert reader.pack_num_images().tolist() == exp["pack_weights"]["images"]
    assert reader.pack_groups().tolist() == exp["pack_groups"]

    def sampler(cfg: dict, rank: int) -> DistributedPackSampler:
        s = DistributedPackSampler(reader, cfg["num_replicas"], rank, nodes=cfg["nodes"], shuffle=cfg["shuffle"],
                                   seed=cfg["seed"], window=cfg["window"], drop_last=cfg["drop_last"],
                                   balance=cfg["balance"])
        s.set_epoch(cfg["epoch"])
        return s

    for d in exp["deals"]:
        cfg = d["sampler"]
        ranks = [sampler(cfg, r) for r in range(cfg["num_replicas"])]
        assert [list(s) for s in ranks] == d["assignment"] and len(ranks[0]) == d["len"], cfg
        one = {**cfg, "num_replicas": 1, "nodes": 1, "drop_last": False, "balance": "none"}
        assert list(sampler(one, 0)) == d["order"], cfg
    for r in exp["resumes"]:
        saver = sampler(r["saved_by"], r["state"]["rank"])
        if not r["state"]["deals"] and r["state"]["start"] == 0:  # saved on the epoch's first deal: re-save it
            assert saver.state_dict(num_consumed=r["state"]["yielded"]) == r["state"]
        new = {**r["saved_by"], **r["resume_on"]}
        ranks = [sampler(new, k) for k in range(new["num_replicas"])]
        for s in ranks:
            s.load_state_dict(r["state"])
        assert len(ranks[0]) == r["len"] and [list(s) for s in ranks] == r["assignment"], r["resume_on"]


def test_packfmt_validates_every_dataset_without_a_warning():
    from packfmt.validate import validate

    for name in NAMES:
        report = validate(CONF / "data" / name, deep=True)
        assert report.ok and not report.warnings, report.format()


# ----------------------------------------------------------------------------- a reader from the spec alone
@pytest.mark.parametrize("name", NAMES)
def test_spec_reference_reads_every_value(name):
    exp = expected(name)
    ds = ref.Dataset(CONF / exp["dataset"])
    assert [d["tokens"] for d in exp["documents"]] == ds.docs
    assert [d.get("loss_mask") for d in exp["documents"]] == (ds.masks or [None] * len(ds.docs))
    for i, image in enumerate(exp.get("images", [])):
        blob, width, height, codec = ds.blobs[i]
        assert (len(blob), width, height) == (image["bytes"], image["width"], image["height"])
        if image["codec"] == "rgb8":  # FORMAT §3.4: raw pixels, rows top to bottom
            assert codec == 16 and list(blob) == np.asarray(image["pixels"]).reshape(-1).tolist()
    for index, want in exp["indexes"].items():
        idx = ref.Index(ds, index)
        assert (idx.pack_offsets, idx.segments, idx.pack_lengths()) == (
            want["pack_offsets"], want["segments"], want["pack_lengths"])
        items = [ref.item(idx, p) for p in range(len(want["items"]))]
        assert items == want["items"], index
        assert ref.item(idx, 0, pad_to_capacity=True) == want["padded_item"], index
        batch = ref.collate_varlen([items[p] for p in want["batch"]["packs"]])
        assert batch == {k: v for k, v in want["batch"].items() if k not in ("collate", "packs")}, index


def test_spec_reference_plans_the_mixtures():
    ds = ref.Dataset(CONF / "data" / "array")
    kept = [len(doc) for doc in ds.docs]  # oversize "split" keeps every token
    for name, ix in expected("array")["indexes"].items():
        if "mixture" not in ix:
            continue
        mix, docs = ix["mixture"]["record"], ix["mixture"]["documents"]
        assert [ref.draw(mix["seed"], d["document"]) for d in docs] == [d["u"] for d in docs]
        if "weights" in mix:
            weight = {m["name"]: m["weight"] for m in mix["members"]}
            assert weight == {"text": 2.0, "chat": 0.5, "images": 1.0}
            assert [ref.weight_copies(weight[d["member"]], mix["seed"], d["document"]) for d in docs] == [
                d["copies"] for d in docs]
            continue
        for key, plan in ix["mixture"]["keys"].items():
            got = ref.proportion_plan(kept, plan["pool"], mix["target"]["proportions"][key],
                                      mix["target"]["total"], mix["seed"])
            assert got == {k: plan[k] for k in got}, key
            extra = set(plan["order"][:plan["extra_documents"]])
            assert all(d["copies"] == plan["copies"] + (d["document"] in extra) for d in docs
                       if d["document"] in plan["pool"])


def test_spec_reference_reads_the_layout_as_its_source():
    """COLLECTION §9: lookahead bits, shard rows and digests, and the same items as the source index."""
    exp = expected("layout")
    layout = exp["layout"]
    out, source = ref.Dataset(CONF / "data" / "layout"), ref.Dataset(CONF / "data" / "array")
    src_index, idx = ref.Index(source, layout["record"]["index"]), ref.Index(out, layout["record"]["index"])
    bits = [int(e < len(source.docs[d]) and (source.masks is None or source.masks[d][e] == 1))
            for d, _, e in src_index.segments]
    assert bits == layout["lookahead"] and sum(bits) == layout["record"]["lookahead_tokens"]
    raw = (CONF / "data" / "layout" / "packs" / layout["record"]["index"])
    po, segs = (raw / "pack_offsets.bin").read_bytes(), (raw / "segments.bin").read_bytes()
    for shard in layout["shards"]:
        (c0, c1), (d0, d1) = shard["packs"], shard["documents"]
        assert xxhash.xxh3_64_hexdigest(po[8 * c0:8 * (c1 + 1)]) == shard["pack_offsets_rows"]
        assert xxhash.xxh3_64_hexdigest(segs[24 * d0:24 * d1]) == shard["segments_rows"]
    assert idx.pack_lengths() == layout["pack_tokens"]
    for p in range(len(src_index.pack_offsets) - 1):
        a, b = ref.item(src_index, p), ref.item(idx, p)
        assert {k: v for k, v in a.items() if k not in ("document_ids", "image_ids")} == {
            k: v for k, v in b.items() if k not in ("document_ids", "image_ids")}, p


def test_spec_reference_deals_and_resumes():
    exp = expected("samplers")
    n, groups = exp["num_packs"], exp["pack_groups"]
    for d in exp["deals"]:
        cfg = d["sampler"]
        order = ref.global_order(n, groups, cfg["shuffle"], cfg["seed"], cfg["epoch"], cfg["window"])
        weights = None if cfg["balance"] == "none" else exp["pack_weights"][cfg["balance"]]
        assert order == d["order"], cfg
        assert ref.deal(order, order, cfg["num_replicas"], cfg["nodes"], cfg["drop_last"], weights) == d["assignment"]
    for r in exp["resumes"]:
        cfg, state = r["saved_by"], r["state"]
        order = ref.global_order(n, groups, cfg["shuffle"], cfg["seed"], state["epoch"], cfg["window"])
        weights = None if cfg["balance"] == "none" else exp["pack_weights"][cfg["balance"]]
        shape = r["resume_on"]
        assert ref.resumed_deal(order, state, shape["num_replicas"], shape["nodes"], weights) == r["assignment"]


# ----------------------------------------------------------------------------- no drift
def test_the_generator_writes_the_committed_bytes(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    import make_conformance

    make_conformance.write_all(tmp_path)
    committed = {str(p.relative_to(CONF)): p for name in make_conformance.GENERATED
                 for p in sorted((CONF / name).rglob("*")) if p.is_file()}
    written = {str(p.relative_to(tmp_path)): p for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    assert sorted(written) == sorted(committed), "run tools/make_conformance.py --force and commit spec/conformance"
    changed = [name for name, p in written.items() if p.read_bytes() != committed[name].read_bytes()]
    assert not changed, f"{changed}: the code writes other bytes now; if that is meant, run " \
                        "tools/make_conformance.py --force and commit spec/conformance with the change"
    hosts = {str(tmp_path).encode(), str(ROOT).encode()}
    assert not [n for n, p in written.items() if any(h in p.read_bytes() for h in hosts)], "a host path was written"
