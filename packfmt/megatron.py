"""Interop with Megatron-LM / Megatron-Core indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``).

The ``.idx`` layout (Megatron-Core ``indexed_dataset.py``; all little-endian, no alignment):

====================  =================================================================
bytes 0..8            magic ``b"MMIDIDX\\x00\\x00"``
uint64                version, must be 1
uint8                 dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)
uint64                sequence_count S
uint64                document_count D (number of documents + 1)
int32[S]              sequence lengths, in elements
int64[S]              sequence pointers, byte offsets into ``.bin``
int64[D]              document indices: sequence index where each document ends, leading 0
====================  =================================================================

A Megatron *document* may consist of several *sequences* (e.g. sentences); on import, the
sequences of one Megatron document become one packfmt document. On export, every packfmt
document is one sequence and one document, as ``tools/preprocess_data.py`` writes them; a
collection exports its documents in collection order.

Megatron's token files carry no loss mask. A store's loss mask is exported beside them as a
second indexed dataset, ``PREFIX_loss_mask.bin/.idx`` (uint8 0/1, the same sequence lengths and
document boundaries): ``IndexedDataset(PREFIX + "_loss_mask")[i]`` is the mask of document ``i``.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from .dataset import Dataset
from .errors import FormatError, WriteError
from .opening import whole_dataset
from .writer import DatasetWriter

__all__ = ["read_megatron_index", "import_megatron", "export_megatron", "loss_mask_prefix", "MEGATRON_DTYPES"]

_MAGIC = b"MMIDIDX\x00\x00"
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence_count, document_count
MEGATRON_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
_CODE_OF = {np.dtype(v): k for k, v in MEGATRON_DTYPES.items()}


def read_megatron_index(idx_path: str | os.PathLike) -> tuple[np.dtype, np.ndarray, np.ndarray, np.ndarray]:
    """Parse a ``.idx`` file; return ``(dtype, sequence_lengths, sequence_pointers, document_indices)`` (views)."""
    idx_path = Path(idx_path)
    raw = np.memmap(idx_path, dtype=np.uint8, mode="r")
    name = idx_path.name
    if raw.shape[0] < _HEADER.size:
        raise FormatError(file=name, field="header", expected=f">= {_HEADER.size} bytes", found=f"{raw.shape[0]} bytes")
    magic, version, code, n_seq, n_doc = _HEADER.unpack(bytes(raw[:_HEADER.size]))
    if magic != _MAGIC:
        raise FormatError(file=name, field="magic", expected=repr(_MAGIC), found=repr(magic))
    if version != 1:
        raise FormatError(file=name, field="version", expected=1, found=version)
    if code not in MEGATRON_DTYPES:
        raise FormatError(file=name, field="dtype code", expected=f"one of {sorted(MEGATRON_DTYPES)}", found=code)
    expected = _HEADER.size + 4 * n_seq + 8 * n_seq + 8 * n_doc
    if raw.shape[0] < expected:
        raise FormatError(file=name, field="size", expected=f">= {expected} bytes for {n_seq} sequences / {n_doc} document indices",
                          found=raw.shape[0])
    off = _HEADER.size
    lengths = np.frombuffer(raw, dtype="<i4", count=n_seq, offset=off)
    off += 4 * n_seq
    pointers = np.frombuffer(raw, dtype="<i8", count=n_seq, offset=off)
    off += 8 * n_seq
    doc_idx = np.frombuffer(raw, dtype="<i8", count=n_doc, offset=off)
    return np.dtype(MEGATRON_DTYPES[code]), lengths, pointers, doc_idx


def import_megatron(
    prefix: str | os.PathLike,
    out: str | os.PathLike,
    *,
    vocab_size: int,
    tokenizer: dict | None = None,
    special_tokens: dict | None = None,
    overwrite: bool = False,
) -> Path:
    """Convert ``PREFIX.bin/.idx`` into a packfmt dataset at ``out``; return its path.

    Megatron files carry no vocabulary size, so it must be given; ids >= ``vocab_size`` are
    refused by the writer (no silent wrap-around).
    """
    src = open_megatron(prefix)
    tok = dict(tokenizer or {"name": f"megatron:{Path(prefix).name}", "hash": None})
    skipped_empty = 0
    with DatasetWriter(out, vocab_size=vocab_size, tokenizer=tok, special_tokens=special_tokens, overwrite=overwrite,
                       extra=src.extra) as w:
        for toks in src.documents(0, src.num_documents):
            if toks is None:
                skipped_empty += 1
                continue
            w.add_document(toks)
        w.build_report = {"source": "megatron", "records_read": src.num_documents,
                          "documents_written": w.num_documents, "skipped": {"empty_document": skipped_empty} if skipped_empty else {}}
    return Path(out)


class MegatronSource:
    """An opened ``PREFIX.bin/.idx`` pair (checked), read document range by document range."""

    def __init__(self, prefix: str) -> None:
        prefix = str(prefix)
        _require_pair(prefix)
        dtype, lengths, pointers, doc_idx = read_megatron_index(prefix + ".idx")
        if dtype.kind not in "iu":
            raise FormatError(file=Path(prefix + ".idx").name, field="dtype", expected="an integer token dtype", found=str(dtype))
        n_seq = lengths.shape[0]
        if doc_idx.shape[0] == 0 or doc_idx[0] != 0 or doc_idx[-1] != n_seq or np.any(np.diff(doc_idx) < 0):
            raise FormatError(file=Path(prefix + ".idx").name, field="document_indices",
                              expected=f"non-decreasing from 0 to {n_seq}", found=f"[{doc_idx[:1]}...{doc_idx[-1:]}]")
        bin_path = Path(prefix + ".bin")
        data = np.memmap(bin_path, dtype=dtype, mode="r") if os.path.getsize(bin_path) else np.empty(0, dtype)
        itemsize = dtype.itemsize
        ends = pointers // itemsize + lengths
        if n_seq and (np.any(pointers % itemsize) or ends.max() > data.shape[0]):
            raise FormatError(file=bin_path.name, field="sequence_pointers", expected=f"aligned offsets within {data.shape[0]} elements",
                              found="out of range or misaligned")
        self.data, self.pointers, self.ends, self.doc_idx, self.itemsize = data, pointers, ends, doc_idx, itemsize
        self.contiguous = n_seq == 0 or bool(np.all(pointers[1:] == pointers[:-1] + lengths[:-1].astype(np.int64) * itemsize))
        self.num_documents = int(doc_idx.shape[0] - 1)
        self.extra = {"source": {"megatron_prefix": Path(prefix).name, "sequences": int(n_seq),
                                 "documents": self.num_documents}}

    def documents(self, d0: int, d1: int):
        """Tokens of documents ``d0..d1-1`` in order; None for an empty one (the importer counts it skipped)."""
        data, pointers, ends, doc_idx, itemsize = self.data, self.pointers, self.ends, self.doc_idx, self.itemsize
        for d in range(d0, d1):
            s0, s1 = int(doc_idx[d]), int(doc_idx[d + 1])
            if s0 == s1:
                yield None
                continue
            if self.contiguous:
                toks = data[int(pointers[s0]) // itemsize:int(ends[s1 - 1])]
            else:
                toks = np.concatenate([data[int(pointers[s]) // itemsize:int(ends[s])] for s in range(s0, s1)])
            yield toks if toks.size else None


def _require_pair(prefix: str) -> None:
    """Both files of the pair are there, else one ``FormatError`` naming the two paths looked for and what is missing
    (a prefix given with its ``.bin`` / ``.idx`` suffix says which prefix was meant)."""
    paths = [Path(prefix + ".bin"), Path(prefix + ".idx")]
    missing = [str(p) for p in paths if not p.is_file()]
    if not missing:
        return
    hint = ""
    if prefix.endswith((".bin", ".idx")) and Path(prefix[:-4] + ".idx").is_file():
        hint = f"; give the prefix without its suffix: {prefix[:-4]}"
    found = (f"neither {paths[0]} nor {paths[1]} exists" if len(missing) == 2 else
             f"{missing[0]} is missing (beside {paths[0] if missing[0] == str(paths[1]) else paths[1]})")
    raise FormatError(f"{prefix}: no Megatron dataset at this prefix (PREFIX.bin and PREFIX.idx): {found}{hint}",
                      file=missing[0], field="prefix", expected=f"{paths[0]} and {paths[1]}", found="missing")


def open_megatron(prefix: str | os.PathLike) -> MegatronSource:
    """Open and check ``PREFIX.bin/.idx`` (FormatError naming the file and field when they disagree)."""
    return MegatronSource(str(prefix))


def loss_mask_prefix(prefix: str | os.PathLike) -> Path:
    """Where :func:`export_megatron` writes a store's loss mask: ``PREFIX_loss_mask`` (+ ``.bin`` / ``.idx``)."""
    return Path(str(prefix) + "_loss_mask")


def _write_indexed(prefix: Path, values, out_dtype: np.dtype, lengths: np.ndarray, doc_offsets: np.ndarray,
                   chunk: int) -> tuple[Path, Path]:
    """``prefix.bin`` (``values`` as ``out_dtype``) + ``prefix.idx`` (one sequence per document), atomically renamed.

    ``values`` is a store's array (sliced) or a collection's ``token_sources`` gather (indexed by
    collection-wide offsets, in chunks of at most 2^20 so the index array stays small).
    """
    bin_path, idx_path = Path(str(prefix) + ".bin"), Path(str(prefix) + ".idx")
    tmp_bin, tmp_idx = Path(str(bin_path) + ".tmp"), Path(str(idx_path) + ".tmp")
    total = int(doc_offsets[-1]) if len(doc_offsets) else 0
    sliced = isinstance(values, np.ndarray)
    step = chunk if sliced else min(chunk, 1 << 20)
    with open(tmp_bin, "wb") as f:
        for i in range(0, total, step):
            j = min(i + step, total)
            part = values[i:j] if sliced else values[np.arange(i, j, dtype=np.int64)]
            f.write(np.ascontiguousarray(part, dtype=out_dtype).tobytes())
        f.flush()
        os.fsync(f.fileno())
    n = lengths.shape[0]
    with open(tmp_idx, "wb") as f:
        f.write(_HEADER.pack(_MAGIC, 1, _CODE_OF[np.dtype(out_dtype.newbyteorder("="))], n, n + 1))
        f.write(lengths.astype("<i4").tobytes())
        f.write((np.asarray(doc_offsets[:-1], dtype=np.int64) * out_dtype.itemsize).astype("<i8").tobytes())
        f.write(np.arange(n + 1, dtype="<i8").tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp_bin, bin_path)
    os.replace(tmp_idx, idx_path)
    return bin_path, idx_path


def export_megatron(dataset: Dataset | str | os.PathLike, prefix: str | os.PathLike, *, chunk_tokens: int = 1 << 24,
                    loss_mask: bool = True) -> tuple[Path, Path]:
    """Write a packfmt dataset or collection as ``PREFIX.bin`` + ``PREFIX.idx`` readable by Megatron-Core's IndexedDataset.

    Token dtype: uint16 when the store holds uint16, else int32 (Megatron has no uint32;
    ids must then be < 2^31). Each document becomes one sequence and one document; a collection's
    documents come in collection order (member after member), read through its public interface.
    Files are written under temporary names and renamed when complete.

    Megatron's format has no loss mask: with ``loss_mask=True`` (default) a dataset's mask is written
    beside the tokens as the indexed dataset ``loss_mask_prefix(prefix)`` (``PREFIX_loss_mask.bin``
    + ``.idx``, uint8, same documents); ``loss_mask=False`` leaves it out. Returns the token files.
    """
    from .collection.arrays import token_sources

    store = whole_dataset(dataset, "exported", "export_megatron(URL, ...), or `packfmt export megatron URL PREFIX`")
    if np.dtype(store.np_token_dtype) == np.uint16:
        out_dtype = np.dtype("<u2")
    else:
        if store.vocab_size > 2**31:
            raise WriteError(field="vocab_size", expected="<= 2^31 for Megatron's int32 tokens", found=store.vocab_size)
        out_dtype = np.dtype("<i4")
    offsets = np.asarray(store.doc_offsets, dtype=np.int64)  # a collection's is computed: read it once
    lengths = np.diff(offsets)
    if lengths.size and lengths.max() >= 2**31:
        raise WriteError(field="document length", expected="< 2^31 tokens (Megatron int32 lengths)", found=int(lengths.max()))
    tokens, mask = token_sources(store)
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    if loss_mask and store.has_loss_mask:
        _write_indexed(loss_mask_prefix(prefix), mask, np.dtype("u1"), lengths, offsets, chunk_tokens)
    return _write_indexed(prefix, tokens, out_dtype, lengths, offsets, chunk_tokens)
