"""Megatron-Core .bin/.idx interop, checked against megatron-core's own IndexedDataset when installed."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import packfmt
from packfmt.errors import FormatError, TokenRangeError
from packfmt.megatron import export_megatron, import_megatron, read_megatron_index


def _docs(seed: int, n: int, vocab: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(rng.integers(1, 50))) for _ in range(n)]


def _write(path, docs, vocab):
    with packfmt.DatasetWriter(path, vocab_size=vocab) as w:
        for d in docs:
            w.add_document(d)
    return packfmt.open(path)


@pytest.mark.parametrize("vocab", [1000, 70_000])
def test_round_trip_packfmt_megatron_packfmt(tmp_path, vocab):
    docs = _docs(0, 200, vocab)
    src = _write(tmp_path / "src", docs, vocab)
    bin_path, idx_path = export_megatron(src, tmp_path / "mg" / "corpus")
    dtype, lengths, pointers, doc_idx = read_megatron_index(idx_path)
    assert dtype == (np.uint16 if vocab <= 65536 else np.int32)
    assert lengths.tolist() == [len(d) for d in docs]
    assert doc_idx.tolist() == list(range(len(docs) + 1))
    back = packfmt.open(import_megatron(tmp_path / "mg" / "corpus", tmp_path / "back", vocab_size=vocab))
    assert np.array_equal(back.doc_offsets, src.doc_offsets)
    assert np.array_equal(back.tokens, src.tokens)
    assert back.manifest.token_dtype == src.manifest.token_dtype


def _megatron():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
        except Exception as exc:  # pragma: no cover - depends on the environment
            pytest.skip(f"megatron-core not importable: {exc}")
    return IndexedDataset, IndexedDatasetBuilder


def test_export_is_read_by_megatron_core(tmp_path):
    IndexedDataset, _ = _megatron()
    docs = _docs(1, 120, 30_000)
    src = _write(tmp_path / "src", docs, 30_000)
    export_megatron(src, tmp_path / "mg" / "corpus")
    ds = IndexedDataset(str(tmp_path / "mg" / "corpus"))
    assert len(ds) == len(docs)
    assert list(ds.sequence_lengths) == [len(d) for d in docs]
    assert list(ds.document_indices) == list(range(len(docs) + 1))
    for i in (0, 7, len(docs) - 1):
        assert np.array_equal(np.asarray(ds[i]), docs[i])


def test_import_of_megatron_core_builder_output_with_multi_sequence_documents(tmp_path):
    import torch

    _, IndexedDatasetBuilder = _megatron()
    rng = np.random.default_rng(2)
    prefix = str(tmp_path / "built")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    expected = []
    for _ in range(40):  # documents of 1-3 sequences ("sentences")
        parts = [rng.integers(0, 5000, size=int(rng.integers(1, 20))) for _ in range(int(rng.integers(1, 4)))]
        for p in parts:
            builder.add_item(torch.tensor(p, dtype=torch.int64))
        builder.end_document()
        expected.append(np.concatenate(parts))
    builder.finalize(prefix + ".idx")
    store = packfmt.open(import_megatron(prefix, tmp_path / "imported", vocab_size=5000))
    assert store.num_documents == len(expected)
    for i, want in enumerate(expected):
        assert np.array_equal(store.document(i), want)
    assert store.manifest.raw["build_report"]["documents_written"] == len(expected)


def test_import_refuses_ids_beyond_vocab_and_bad_magic(tmp_path):
    docs = [np.array([1, 2, 999])]
    src = _write(tmp_path / "src", docs, 1000)
    export_megatron(src, tmp_path / "mg")
    with pytest.raises(TokenRangeError, match="999"):
        import_megatron(tmp_path / "mg", tmp_path / "out", vocab_size=500)
    assert not (tmp_path / "out").exists()
    raw = bytearray((tmp_path / "mg.idx").read_bytes())
    raw[0:2] = b"XX"
    (tmp_path / "mg.idx").write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="magic"):
        read_megatron_index(tmp_path / "mg.idx")


def test_cli_export_then_build_megatron(tmp_path, capsys):
    from packfmt.cli import main

    docs = _docs(3, 30, 2000)
    _write(tmp_path / "src", docs, 2000)
    assert main(["export", "megatron", str(tmp_path / "src"), str(tmp_path / "mg" / "c")]) == 0
    assert main(["build", "megatron", str(tmp_path / "mg" / "c"), "-o", str(tmp_path / "back"), "--vocab-size", "2000"]) == 0
    assert "30 documents" in capsys.readouterr().out
    back = packfmt.open(tmp_path / "back")
    assert [back.document(i).tolist() for i in range(30)] == [d.tolist() for d in docs]
    assert main(["validate", str(tmp_path / "back"), "--deep"]) == 0


def _masked_store(path, seed: int, n: int, vocab: int) -> packfmt.Store:
    rng = np.random.default_rng(seed)
    with packfmt.DatasetWriter(path, vocab_size=vocab, loss_mask=True) as w:
        for d in _docs(seed, n, vocab):
            w.add_document(d, loss_mask=rng.integers(0, 2, size=len(d)).astype(np.uint8))
    return packfmt.open(path)


def test_collection_export_is_read_by_megatron_core_in_collection_order(tmp_path, capsys):
    """A collection (which crashed the export before) exports its documents member after member, its
    loss mask beside, read through the collection's interface; megatron-core reads back its documents."""
    from packfmt.cli import main
    from packfmt.collection import write_collection

    IndexedDataset, _ = _megatron()
    _masked_store(tmp_path / "a", 4, 25, 3000)
    _masked_store(tmp_path / "b", 5, 40, 3000)
    coll = write_collection(tmp_path / "coll", [("a", tmp_path / "a"), ("b", tmp_path / "b")])
    assert main(["export", "megatron", str(coll.path), str(tmp_path / "mg" / "c")]) == 0
    assert "loss_mask" in capsys.readouterr().err
    export_megatron(coll, tmp_path / "api" / "c", chunk_tokens=7)  # chunks that straddle member boundaries
    for prefix in (tmp_path / "mg" / "c", tmp_path / "api" / "c"):
        tokens, mask = IndexedDataset(str(prefix)), IndexedDataset(str(prefix) + "_loss_mask")
        assert len(tokens) == len(mask) == coll.num_documents == 65
        assert list(tokens.document_indices) == list(range(66))
        for g in range(coll.num_documents):
            assert np.array_equal(np.asarray(tokens[g]), coll.document(g))
            assert np.array_equal(np.asarray(mask[g]), coll.document_loss_mask(g))
    assert (tmp_path / "mg" / "c.bin").read_bytes() == (tmp_path / "api" / "c.bin").read_bytes()
    back = packfmt.open(import_megatron(tmp_path / "mg" / "c", tmp_path / "back", vocab_size=3000))
    assert np.array_equal(back.tokens, np.concatenate([coll.document(g) for g in range(65)]))
