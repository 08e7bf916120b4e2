"""``packfmt inspect``: exact numbers on a known dataset, JSON, the plot, and one pack's text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import packfmt
from images import png
from packfmt import format as F
from packfmt.cli import main
from packfmt.inspect import batch_grids, summarize
from packfmt.summary import padding_costs, row_lengths
from packfmt.packindex import build_pack_index

LENGTHS = [10, 20, 30, 40]  # 100 tokens
CAPACITY = 32


@pytest.fixture(scope="module")
def known(tmp_path_factory) -> Path:
    """4 documents of 10/20/30/40 tokens; the first half of each is masked out; doc 0 has 2 images."""
    root = tmp_path_factory.mktemp("known") / "ds"
    with packfmt.DatasetWriter(root, vocab_size=300, loss_mask=True, special_tokens={"image": 7},
                               tokenizer={"name": "toy", "hash": None}) as w:
        for d, n in enumerate(LENGTHS):
            mask = np.r_[np.zeros(n // 2), np.ones(n - n // 2)]
            images = [packfmt.ImageRecord(png(6, 4), 6, 4, "png", 0, 3),
                      packfmt.ImageRecord(png(3, 9), 3, 9, "png", 4, 6)] if d == 0 else []
            w.add_document(np.arange(n) + d, mask, images=images)
        w.build_report = {"source": "jsonl", "records_read": 7, "documents_written": 4,
                          "skipped": {"empty_text": 2, "too_long": 1}}
    build_pack_index(root, capacity=CAPACITY, algorithm="ffd", name="ffd")
    return root


def test_summary_numbers_are_exact(known):
    s = summarize(known)
    assert s["counts"] == {"documents": 4, "tokens": 100, "images": 2}
    assert s["token_dtype"] == "uint16" and s["vocab_size"] == 300
    assert s["tokenizer"]["name"] == "toy" and s["special_tokens"]["image"] == 7
    d = s["document_lengths"]
    # numpy linear percentiles of [10, 20, 30, 40]: p50 = 25, p90 = 37, p99 = 39.7
    assert (d["min"], d["max"], d["mean"], d["total"]) == (10, 40, 25.0, 100)
    assert d["p50"] == pytest.approx(25.0) and d["p90"] == pytest.approx(37.0) and d["p99"] == pytest.approx(39.7)
    assert s["loss_mask"] == {"trained_fraction": 0.5, "trained_tokens": 50}
    im = s["images"]
    assert im["count"] == 2 and im["codecs"] == {"png": 2}
    assert im["width"] == {"min": 3, "max": 6} and im["height"] == {"min": 4, "max": 9}
    assert im["per_document"] == {"mean": 0.5, "max": 2, "documents_with_images": 1}
    assert im["bytes"] == len(png(6, 4)) + len(png(3, 9))
    br = s["build_report"]
    assert br["records_read"] == 7 and br["skipped_total"] == 3 and br["consistent"] is True


def test_index_summary_and_padding_baselines(known):
    ix = summarize(known)["pack_indexes"]["ffd"]
    # rows at capacity 32: 10, 20, 30, 32, 8 -> FFD packs {32}, {30}, {20, 10}, {8}
    assert ix["segments"] == 5 and ix["packed_tokens"] == 100 and ix["packs"] == 4
    assert ix["fill_efficiency"] == pytest.approx(100 / 128)
    assert ix["oversize_counts"]["split_documents"] == 1
    assert ix["documents_per_pack"] == {"mean": 1.25, "max": 2}
    assert ix["images_per_pack"]["total"] == 2
    pad = ix["padding"]
    assert pad["pad_to_capacity"] == {"rows": 5, "slots": 160, "tokens": 100, "padding": 60, "efficiency": 0.625}
    assert pad["pad_to_longest"]["slots"] == 160  # one batch of 5 rows, longest 32
    assert pad["packed"]["slots"] == 128


def test_padding_costs_by_hand():
    np.testing.assert_array_equal(row_lengths(np.array(LENGTHS), CAPACITY), [10, 20, 30, 32, 8])
    costs = padding_costs(np.array(LENGTHS), CAPACITY, batch_size=2)
    # batches [10, 20] -> 2 x 20, [30, 32] -> 2 x 32, [8] -> 8: 112 slots
    assert costs["pad_to_longest"]["slots"] == 112
    assert costs["pad_to_longest"]["efficiency"] == pytest.approx(100 / 112)
    assert costs["pad_to_capacity"]["slots"] == 5 * CAPACITY


def test_batch_grids_show_the_same_tokens(known):
    store = packfmt.open(known)
    grids = batch_grids(store, store.pack_index("ffd"), rows=8)
    assert list(grids) == ["pad_to_longest", "pad_to_capacity", "packed"]
    packed_grid, packed_eff = grids["packed"]
    assert packed_grid.shape == (4, CAPACITY) and packed_eff == pytest.approx(100 / 128)
    for grid, _ in grids.values():
        assert int(np.count_nonzero(grid > 0)) == 100  # every token drawn once, at full resolution
    assert grids["pad_to_capacity"][1] == pytest.approx(0.625)


def test_cli_json_parses_and_matches_library(known, capsys):
    assert main(["inspect", str(known), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == json.loads(json.dumps(summarize(known)))


def test_cli_text_report(known, capsys):
    assert main(["inspect", str(known)]) == 0
    out = capsys.readouterr().out
    assert "4 documents, 100 tokens, 2 images" in out
    assert "p50 25.0" in out and "50.00% of tokens are trained" in out
    assert "pack index 'ffd'" in out and "fill efficiency 78.12%" in out
    assert "(read = written + skipped)" in out


def test_cli_plot_writes_png(known, tmp_path, capsys):
    out = tmp_path / "summary.png"
    assert main(["inspect", str(known), "--plot", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    from PIL import Image

    with Image.open(out) as im:
        assert im.size[0] >= 800 and im.size[1] >= 600


def test_show_pack_without_tokenizer_prints_ids(known, capsys):
    assert main(["inspect", str(known), "--show-pack", "2", "--index", "ffd"]) == 0
    out = capsys.readouterr().out
    markers = re.findall(r"‖ doc (\d+) \[(\d+):(\d+)\) ‖", out)
    assert sorted((int(d), int(b), int(e)) for d, b, e in markers) == [(0, 0, 10), (1, 0, 20)]
    assert "‖ doc 0 [0:10) ‖ 0 1 2 3 4 5 6 7 8 9" in out  # document d holds ids d, d+1, ...
    assert main(["inspect", str(known), "--show-pack", "99"]) == 1
    assert main(["inspect", str(known), "--index", "nope"]) == 1


TEXT = """The quick brown fox jumps over the lazy dog. Packing puts several documents into one
sequence so that no token slot is wasted on padding. A pack index records which segment of which
document goes where. Validation checks every offset, every checksum and every segment.
""" * 30


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """A tiny byte-level BPE trained here, and a dataset of three sentences encoded with it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    base = tmp_path_factory.mktemp("tok")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok_dir = base / "tokenizer"
    tok_dir.mkdir()
    tok.save(str(tok_dir / "tokenizer.json"))
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"))
    docs = ["The quick brown fox jumps over the lazy dog.", "A pack index records which segment goes where.",
            "Validation checks every checksum."]
    root = base / "ds"
    with packfmt.DatasetWriter(root, vocab_size=hf.vocab_size, tokenizer={"name": "tiny-bpe", "hash": None}) as w:
        for text in docs:
            w.add_document(hf(text)["input_ids"])
    build_pack_index(root, capacity=64, algorithm="ffd", name="ffd-64")
    return root, tok_dir, docs


def test_show_pack_decodes_with_explicit_tokenizer(tokenized, capsys):
    root, tok_dir, docs = tokenized
    assert main(["inspect", str(root), "--show-pack", "0", "--tokenizer", str(tok_dir)]) == 0
    out = capsys.readouterr().out
    for d, text in enumerate(docs):
        assert f"‖ doc {d} [0:" in out
        assert text in out  # decoded, not token ids


def test_show_pack_never_opens_a_path_from_the_manifest(tokenized, tmp_path, capsys):
    """spec §2.2: a manifest's tokenizer.path (written by older builds) is ignored, even when it exists here."""
    root, tok_dir, docs = tokenized
    moved = tmp_path / "ds"
    import shutil

    shutil.copytree(root, moved)
    manifest = json.loads((moved / F.MANIFEST).read_text())
    manifest["tokenizer"]["path"] = str(tok_dir)  # an existing, working tokenizer: still not opened
    (moved / F.MANIFEST).write_bytes(F.canonical_json(manifest))
    assert main(["inspect", str(moved), "--show-pack", "0"]) == 0
    assert docs[0] not in capsys.readouterr().out  # no --tokenizer: ids only
    assert main(["inspect", str(moved), "--show-pack", "0", "--tokenizer", str(tok_dir)]) == 0
    out = capsys.readouterr().out
    assert all(text in out for text in docs)


def test_tokenizer_with_another_hash_warns_naming_both(tokenized, tmp_path, capsys):
    """--tokenizer is compared with the manifest's tokenizer.hash (the build's own hash function): another
    tokenizer warns in one line naming both hashes; the dataset's own (its folder or its tokenizer.json) is silent."""
    from packfmt.build import build_text
    from packfmt.tokenize import tokenizer_hash

    sample_tok = Path(packfmt.__file__).parent / "sample_data" / "tokenizer"
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["Packing wastes no slot.", "Every offset is checked."]))
    root = build_text([src], tmp_path / "ds", sample_tok).path
    build_pack_index(root, capacity=64, algorithm="ffd", name="ffd-64")
    recorded = packfmt.open(root).manifest.tokenizer["hash"]
    assert recorded == tokenizer_hash(sample_tok)
    for same in (sample_tok, sample_tok / "tokenizer.json"):
        assert main(["inspect", str(root), "--show-pack", "0", "--tokenizer", str(same)]) == 0
        captured = capsys.readouterr()
        assert "warning" not in captured.err and "Packing wastes no slot." in captured.out
    other = tokenized[1]  # the tiny BPE trained in the fixture
    assert main(["inspect", str(root), "--tokenizer", str(other)]) == 0
    warnings = [x for x in capsys.readouterr().err.splitlines() if "warning" in x]
    assert len(warnings) == 1
    assert warnings[0].startswith("packfmt inspect: warning: --tokenizer: ")
    assert tokenizer_hash(other) in warnings[0] and recorded in warnings[0] and tokenizer_hash(other) != recorded
    assert "decoded text may be wrong" in warnings[0]
    assert main(["inspect", str(tokenized[0]), "--tokenizer", str(other)]) == 0  # the manifest records no hash
    assert "warning" not in capsys.readouterr().err


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(1, 10_000), max_size=9), min_size=1, max_size=8))
def test_member_length_stats_equal_length_stats_of_each_member(members):
    """inspect's per-member statistics, all members from one sort, equal ``length_stats`` of each slice."""
    from packfmt.collection.inspect import member_length_stats
    from packfmt.summary import length_stats

    lengths = np.array([x for m in members for x in m], dtype=np.int64)
    doc_start = np.concatenate([[0], np.cumsum([len(m) for m in members])]).astype(np.int64)
    got = member_length_stats(lengths, doc_start)
    assert got == [length_stats(lengths[a:b]) for a, b in zip(doc_start[:-1], doc_start[1:])]


def test_inspect_of_many_members_elides_rows_and_totals_groups(tmp_path, capsys):
    """A collection of 40 members prints 30 rows, a line saying how many more and how to see them, the last 5,
    and per-group totals (web.*, code.*); --json still lists every member."""
    from packfmt.collection import write_collection
    from packfmt.torch.testing import write_split_stores

    offsets = np.arange(0, 81, 2, dtype=np.int64)  # 40 documents of 2 tokens
    paths = write_split_stores(tmp_path / "s", np.ones(80, dtype=np.uint16), offsets, np.arange(41), vocab_size=10)
    names = [f"{'web' if i < 25 else 'code'}.{i:02d}" for i in range(40)]
    write_collection(tmp_path / "c", list(zip(names, paths)))
    assert main(["inspect", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "code.29" in out and "code.30" not in out and "code.34" not in out and "code.35" in out
    assert "... 5 more members (`packfmt inspect --json` lists every one)" in out
    assert re.search(r"^  web\s+25\s+25\s+50\s+62\.50%$", out, re.M), out
    assert re.search(r"^  code\s+15\s+15\s+30\s+37\.50%$", out, re.M), out
    assert main(["inspect", "--json", str(tmp_path / "c")]) == 0
    assert [m["name"] for m in json.loads(capsys.readouterr().out)["members"]] == names


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.one_of(st.integers(0, 3000), st.integers(0, 2**62)), max_size=40), min_size=1,
                max_size=12))
def test_sorted_within_members_equals_a_sort_of_each_member(members):
    """The radix sort (keys of up to 63 bits, several passes) and its lexsort fallback (wider keys) sort each
    member's lengths and keep members in place, empty members included."""
    from packfmt.collection.inspect import sorted_within

    lengths = np.array([x for m in members for x in m], dtype=np.int64)
    got = sorted_within(lengths, np.array([len(m) for m in members], dtype=np.int64))
    assert got.tolist() == [x for m in members for x in sorted(m)]
