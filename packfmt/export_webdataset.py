"""``packfmt export webdataset DATASET --index NAME OUT/``: one WebDataset sample per pack (spec/WEBDATASET.md).

Each pack ``p`` of the index becomes the sample with key ``%09d % p`` and members:

- ``input_ids.npy``: the pack's tokens in order, the store's own dtype (uint16 / uint32), ``np.save`` format;
- ``loss_mask.npy``: uint8 0/1, one per token (stores with a loss mask only);
- ``cu_seqlens.npy``: int32 ``(k + 1,)``, the segment boundaries (``[0, len0, len0 + len1, ...]``);
- ``last_labels.npy``: int64 ``(k,)``, the label of each segment's last token (spec/READER.md §2): the
  document's true next token at a cut (a segment ending before its document), unless its mask bit is 0;
  -100 at a document's end. Every other label follows from the members above (``packfmt.energon``);
- ``img{j}.{ext}``: the original stored bytes of the pack's j-th image (``png``, ``jpg``, ``webp``,
  ``bmp``, ``gif``, ``tiff``, or ``rgb8`` / ``rgb8.zst`` for raw pixels), in token order;
- ``json``: the pack's documents ``(document, begin, end)``, ``seq_lens``, and each image's member,
  id (collection-wide for a collection, as ``PackedDataset``'s ``image_ids``), codec name, size and
  token span ``[begin, end)`` inside the pack.

Shards ``shard-000000.tar``, ... hold whole samples and stay within ``shard_bytes``, end-of-archive
blocks included (a sample larger than that gets a shard of its own); ``export.json`` lists them with their sample counts. Tar headers
are deterministic (mtime 0, uid/gid 0, mode 0444), so the same index exports to the same bytes. The
folder is published atomically (nothing appears at ``OUT`` on failure).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._io import publish_dir, remove_stale_temps, temp_sibling
from .errors import DatasetExistsError, InputError
from .report_paths import report_path

__all__ = ["export_webdataset", "ExportResult", "DEFAULT_SHARD_BYTES", "CODEC_EXTENSIONS"]

DEFAULT_SHARD_BYTES = 1 << 30
#: Stored image codec -> member extension (what WebDataset decoders key on).
CODEC_EXTENSIONS = {"png": "png", "jpeg": "jpg", "webp": "webp", "bmp": "bmp", "gif": "gif", "tiff": "tiff",
                    "rgb8": "rgb8", "rgb8+zstd": "rgb8.zst"}
_BLOCK = 512
_END = 2 * _BLOCK  # the end-of-archive marker


@dataclass
class ExportResult:
    path: Path
    shards: list[Path]
    packs: int
    bytes: int


def _npy(arr: np.ndarray) -> bytes:
    """``np.save`` bytes (format 1.0) of a 1-D array, without numpy's per-call Python overhead."""
    head = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (arr.dtype.str, arr.shape[0])
    head += " " * (-(len(head) + 11) % 64) + "\n"  # magic 6 + version 2 + length 2 + header, padded to 64
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode("latin1") + np.ascontiguousarray(arr).tobytes()


def _tar_size(members: list[tuple[str, bytes]]) -> int:
    return sum(_BLOCK + -(-len(data) // _BLOCK) * _BLOCK for _, data in members)


class _Gather:
    """A pack's tokens, mask, cut labels and images through the dataset interface (``document``,
    ``document_loss_mask``, ``token_sources``, ``locate``, ``member``; a store is a collection of one), so every
    member reads as the dataset says it does. One member with its own mask reads as plain ndarray views
    (no per-document call)."""

    def __init__(self, store) -> None:
        from .collection.arrays import token_sources

        self.store = store
        self.flat = store.num_members == 1 and not store.all_trained[0]
        self.offsets = np.asarray(store.doc_offsets)  # a collection's is computed once: 8 bytes per document
        tokens, mask = token_sources(store)  # indexable by (collection-wide) token offset
        self.tokens = np.asarray(tokens) if self.flat else tokens
        self.mask = None if not store.has_loss_mask else (np.asarray(mask) if self.flat else mask)

    def runs(self, segs: np.ndarray, mask: bool) -> np.ndarray:
        """The tokens (or mask) of the segments ``(doc, begin, end)``, end to end."""
        if not self.flat:
            get = self.store.document_loss_mask if mask else self.store.document
            return np.concatenate([get(int(d))[b:e] for d, b, e in segs])
        src = self.mask if mask else self.tokens
        starts = self.offsets[segs[:, 0]]
        return np.concatenate([src[s + b:s + e] for s, b, e in zip(starts.tolist(), segs[:, 1].tolist(),
                                                                     segs[:, 2].tolist())])

    def last_labels(self, segs: np.ndarray) -> np.ndarray:
        """int64 ``(k,)``: the label of each segment's last token (spec/READER.md §2): at a cut
        (``end < len(doc)``) the document's next token unless its mask bit is 0, else -100."""
        out = np.full(segs.shape[0], -100, dtype=np.int64)
        start = self.offsets[segs[:, 0]]
        cut = segs[:, 2] < self.offsets[segs[:, 0] + 1] - start
        if cut.any():
            at = (start + segs[:, 2])[cut]
            target = np.asarray(self.tokens[at]).astype(np.int64)
            if self.mask is not None:
                target[np.asarray(self.mask[at]) == 0] = -100
            out[cut] = target
        return out

    def images(self, d: int):
        """``(image_store, local ids, spans relative to document d, first collection-wide id of the member)``."""
        m, d = self.store.locate(d)  # the member store holds the document and its images
        base = int(self.store.image_start[m])
        store = self.store.member(m)
        images = store.images
        if images is None:
            return None, range(0), None, base
        ids = images.of_document(d)
        if not len(ids):
            return images, ids, None, base
        return images, ids, np.asarray(images.token_spans[ids.start:ids.stop]) - int(store.doc_offsets[d]), base


def pack_sample(gather: _Gather, index, p: int) -> list[tuple[str, bytes]]:
    """The members ``(extension, bytes)`` of pack ``p``'s sample (module docstring)."""
    store = gather.store
    segs = np.asarray(index.pack_segments(p), dtype=np.int64)
    tokens = index.pack_tokens(p) if index.manifest.materialized else gather.runs(segs, mask=False)
    lens = segs[:, 2] - segs[:, 1]
    cu = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=cu[1:])
    members = [("input_ids.npy", _npy(tokens))]
    if store.has_loss_mask:
        members.append(("loss_mask.npy", _npy(gather.runs(segs, mask=True))))
    members.append(("cu_seqlens.npy", _npy(cu)))
    members.append(("last_labels.npy", _npy(gather.last_labels(segs))))
    image_meta = []
    if store.num_images:
        for (d, b, e), start in zip(segs, cu[:-1]):
            images, ids, rel, base = gather.images(int(d))
            for i, (rb, re) in zip(ids, rel if rel is not None else ()):
                if rb < b or re > e:
                    continue  # the packer never cuts an image; an image outside the segment is another pack's
                codec = images.codec(i)
                name = f"img{len(image_meta)}.{CODEC_EXTENSIONS[codec]}"
                w, h = images.size(i)
                members.append((name, bytes(images.data(i))))
                image_meta.append({"member": name, "image": base + int(i), "codec": codec, "width": w, "height": h,
                                   "span": [int(rb - b + start), int(re - b + start)]})
    meta = {"pack": p, "index": index.name, "token_dtype": np.dtype(tokens.dtype).name, "capacity": index.capacity,
            "num_tokens": int(cu[-1]), "seq_lens": lens.tolist(),
            "documents": [{"document": int(d), "begin": int(b), "end": int(e)} for d, b, e in segs],
            "images": image_meta}
    members.append(("json", json.dumps(meta, separators=(",", ":")).encode()))
    return members


def ustar_header(name: str, size: int) -> bytes:
    """One POSIX ustar header block: a regular file, mode 0444, uid/gid 0, mtime 0, no user names."""
    raw = name.encode("utf-8")
    if len(raw) > 100 or size >= 8 ** 11:
        raise ValueError(f"tar member {name!r} of {size} bytes: a ustar header holds names <= 100 bytes, sizes < 8 GiB")
    h = bytearray(_BLOCK)
    h[0:len(raw)] = raw
    h[100:108] = b"0000444\0"
    h[108:116] = h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[148:156] = b" " * 8
    h[156:157] = b"0"
    h[257:265] = b"ustar\x0000"
    h[329:337] = h[337:345] = b"0000000\0"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


class _ShardWriter:
    """Tar shards of whole samples within ``shard_bytes`` each; headers written directly (deterministic)."""

    def __init__(self, folder: Path, shard_bytes: int) -> None:
        self.folder, self.shard_bytes = folder, shard_bytes
        self.file = None
        self.size = 0
        self.shards: list[dict] = []

    def _open(self) -> None:
        self.close()
        name = f"shard-{len(self.shards):06d}.tar"
        self.file = open(self.folder / name, "wb")
        self.shards.append({"name": name, "samples": 0})
        self.size = 0

    def write(self, key: str, members: list[tuple[str, bytes]]) -> None:
        need = _tar_size(members)
        if self.file is None or (self.size and self.size + need + _END > self.shard_bytes):
            self._open()
        out = self.file
        for ext, data in members:
            out.write(ustar_header(f"{key}.{ext}", len(data)))
            out.write(data)
            out.write(b"\0" * (-len(data) % _BLOCK))
        self.size += need
        self.shards[-1]["samples"] += 1

    def close(self) -> None:
        if self.file is not None:
            self.file.write(b"\0" * _END)  # end of archive
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            self.file = None


def export_webdataset(dataset, out: str | os.PathLike, *, index: str | None = None,
                      shard_bytes: int = DEFAULT_SHARD_BYTES, overwrite: bool = False) -> ExportResult:
    """Write every pack of ``index`` (default: the dataset's only one) as a WebDataset sample under ``out``.

    Args:
        dataset: a dataset path, an open store or collection.
        shard_bytes: largest shard (tar bytes); a sample larger than it gets a shard of its own.
        overwrite: replace an existing ``out`` (atomically).
    """
    from .opening import whole_dataset

    if shard_bytes < _BLOCK * 4:
        raise InputError(f"shard_bytes: expected >= {_BLOCK * 4}, found {shard_bytes}", reason="invalid_option",
                         field="shard_bytes", expected=f">= {_BLOCK * 4}", found=shard_bytes,
                         cli=f"--shard-bytes: expected >= {_BLOCK * 4}, found {shard_bytes}")
    store = whole_dataset(dataset, "exported", "export_webdataset(URL, ...), or `packfmt export webdataset URL OUT`")
    idx = store.pack_index(index)
    target = Path(out)
    if (target.exists() or target.is_symlink()) and not overwrite:  # before the work, not after it
        raise DatasetExistsError(f"{target}: already exists (pass overwrite=True to replace it)", file=str(target),
                                 expected="no existing path", found="exists",
                                 cli=f"{target}: already exists (pass --overwrite to replace it)")
    remove_stale_temps(target)
    tmp = temp_sibling(target)
    writer = _ShardWriter(tmp, shard_bytes)
    try:
        gather = _Gather(store)
        for p in range(idx.num_packs):
            writer.write(f"{p:09d}", pack_sample(gather, idx, p))
        writer.close()
        source = getattr(store, "url", None) or report_path(store.path, target)  # never a host path (SECURITY A15)
        summary = {"format": "webdataset", "source": source, "index": idx.name,
                   "packs": idx.num_packs, "has_loss_mask": bool(store.has_loss_mask),
                   "token_dtype": np.dtype(store.np_token_dtype).name, "shards": writer.shards}
        (tmp / "export.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        total = sum((tmp / s["name"]).stat().st_size for s in writer.shards)
        publish_dir(tmp, target, overwrite=overwrite)
    except BaseException:
        writer.close()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(target, [target / s["name"] for s in writer.shards], idx.num_packs, total)
