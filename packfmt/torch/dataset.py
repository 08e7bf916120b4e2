"""``PackedDataset``: a map-style torch Dataset over one pack index (spec/READER.md).

Each item is one pack, written in one pass by a numba kernel (``_kernels.fill_item``); a batch
(``__getitems__``) is written by one kernel call (``_kernels.fill_packs``). Every item and every
batch lives in ONE byte buffer whose typed slots are returned as tensor views (a zero-copy native
``input_ids``, and the ``doc_ids`` of an item taken from an unpadded batch, excepted): an item's
slots are grouped by dtype so that one ``split_with_sizes`` per group makes its views; a batch is an
``_Arena``. A DataLoader worker thus sends a batch to the main process as one shared-memory segment
(allocated in shared memory directly inside workers, as ``default_collate`` does); nothing is
cached per pack. The dataset pickles as (path, index name, options) only: the memmaps are
re-opened lazily in every DataLoader worker, so fork and spawn both stay small and safe.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from ..dataset import Dataset as Source
from ..errors import FormatError
from ..index import PackIndex
from ..opening import as_dataset, open_dataset
from ._arena import _ALIGN, _alloc, _Arena
from ._kernels import PLAN_PACKS, ROW_DIDS, fill_item, fill_packs
from ._plan import N_SLOTS, batch_layout, pack_length, plan_batch
from ._sources import _ImageIndex, _segment_sums
from ._views import _INT32_LIMIT, INDEX_DTYPES, arrays_of
from . import warm
from .batch import PackBatch

__all__ = ["PackedDataset", "PackBatch", "IGNORE_INDEX", "PAD_DOC_ID", "INDEX_DTYPES", "FIELDS"]

#: Label value of positions that are not trained on (PyTorch's cross_entropy default).
IGNORE_INDEX = -100
#: ``doc_ids`` value of padding positions.
PAD_DOC_ID = -1
#: Per-token rows an item can carry; ``input_ids`` and ``labels`` are always there.
FIELDS = ("input_ids", "labels", "position_ids", "doc_ids")


class PackedDataset(Dataset):
    """One pack per item, with labels, per-segment positions and segment ids.

    Args:
        path_or_store: a dataset directory, a URL (``s3://...``: fetched into the cache, see ``packfmt.open``), or an open ``Store`` or ``Collection``.
        index: pack index name (default: the only index of the dataset) or an open ``PackIndex``.
        pad_to_capacity: pad every pack to ``capacity`` tokens (padding: ``pad`` token or 0,
            label -100, ``doc_ids`` -1, positions 0..pad_len-1 so it forms its own isolated run).
        image_transform: optional callable applied to each decoded image, a uint8 tensor
            ``(H, W, C)``; its result is returned in ``images`` instead. Must be picklable for workers.
            ``ImageProcessorTransform(processor)`` adapts a transformers image processor.
        index_dtype: ``torch.int64`` (default) or ``torch.int32``: dtype of ``input_ids``,
            ``position_ids`` and ``doc_ids`` (and of the same keys in every collate). int32 halves
            their bytes; ``labels`` stay int64 (``cross_entropy`` needs Long targets). int32
            requires ``vocab_size <= 2**31`` and ``capacity < 2**31``.
        fields: the per-token rows to produce, a subset of ``FIELDS`` that contains ``input_ids``
            and ``labels`` (default: all four). Leaving out ``position_ids`` / ``doc_ids`` saves
            their bytes when the consumer derives them from ``cu_seqlens`` on the device
            (``attention.position_ids_from_cu_seqlens``); the collates then omit them too.
        input_ids_dtype: ``None`` (= ``index_dtype``), ``torch.int64``, ``torch.int32`` or
            ``"native"``: the token store's own width, i.e. ``torch.uint16`` for a uint16 store
            and ``torch.int32`` for a uint32 store (its ids are ``< vocab_size <= 2**31``; a
            uint32 store with a larger vocabulary gives ``torch.uint32``). Native ids move 2 or 4
            bytes per token through workers and host-to-device copies; upcast them on the device
            (``ids.to(device).long()``: ``nn.Embedding`` does not take uint16). On a materialized
            index and without ``pad_to_capacity``, ``ds[i]["input_ids"]`` is then a zero-copy view
            of the index's ``tokens.bin`` (a private copy-on-write mapping, so writing into it never
            reaches the file); batches (``__getitems__``) copy the packs end to end as always.
        storage_options, cache_limit, cache_dir: for a URL (``packfmt.open``).
        stream: a remote collection read member by member (README "Remote data"): opening fetches its manifest
            and pack index only; each batch fetches the members it touches (verified as every cached file is),
            the node's cache folder within ``cache_limit`` bytes, shared by every rank and DataLoader worker of the
            node that reads it (README "Remote data"). ``packfmt.torch.prefetch.prefetch(ds, sampler, batch_size=B)`` fetches
            them ahead, following every iteration of the sampler (resumes included).

    Item (``ds[i]``), with ``n`` tokens in the pack (``capacity`` when padded) and ``k`` segments;
    all its tensors are views of one buffer (except a zero-copy ``input_ids``):
        input_ids: ``input_ids_dtype`` ``(n,)``.
        labels: int64 ``(n,)``: the next token of the same document, -100 where there is none or
            it is not a training target (spec/READER.md §2).
        position_ids: ``index_dtype`` ``(n,)``: 0-based offset within the segment (if in ``fields``).
        doc_ids: ``index_dtype`` ``(n,)``: segment index within the pack, ``0..k-1``; -1 for
            padding (if in ``fields``).
        seq_lens: int32 ``(k,)``: token count of each segment (padding excluded).
        document_ids: int64 ``(k,)``: global document id of each segment.
        num_label_tokens: int64 scalar: count of ``labels != -100``.
        pack_id: int64 scalar: ``i``.
        images / image_spans / image_ids (multimodal stores only): list of decoded images,
            int64 ``(m, 2)`` half-open token spans ``[begin, end)`` inside the pack, int64 ``(m,)``.
    """

    def __init__(
        self,
        path_or_store: str | os.PathLike | Source,
        index: str | PackIndex | None = None,
        *,
        pad_to_capacity: bool = False,
        image_transform: Callable[[torch.Tensor], Any] | None = None,
        index_dtype: torch.dtype = torch.int64,
        fields: tuple[str, ...] | list[str] = FIELDS,
        input_ids_dtype: torch.dtype | str | None = None,
        storage_options: dict | None = None,
        stream: bool = False,
        cache_limit: int | str | None = None,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        if index_dtype not in INDEX_DTYPES:
            raise ValueError(f"index_dtype: expected torch.int64 or torch.int32, found {index_dtype!r}")
        fields = tuple(fields)
        bad = [f for f in fields if f not in FIELDS]
        if bad or "input_ids" not in fields or "labels" not in fields:
            raise ValueError(f"fields: expected a subset of {FIELDS} containing 'input_ids' and 'labels', "
                             f"found {fields!r}")
        if input_ids_dtype is not None and input_ids_dtype != "native" and input_ids_dtype not in INDEX_DTYPES:
            raise ValueError(f"input_ids_dtype: expected None, torch.int64, torch.int32 or 'native', "
                             f"found {input_ids_dtype!r}")
        if isinstance(path_or_store, str) and "://" in path_or_store:
            warm.start()  # the sampler's kernels loaded while the open waits for the object store
        # stream=True: a remote collection's members fetched as batches need them (remote.members, prefetch)
        store = as_dataset(path_or_store, storage_options=storage_options, cache_dir=cache_dir,
                           cache_limit=cache_limit, stream=stream)
        self._stream_args = (store.url, storage_options, cache_dir, cache_limit) if store.streamed else None
        idx = index.for_reading(store) if isinstance(index, PackIndex) else store.pack_index(index)
        self.path = str(Path(store.path))
        self.index_name = idx.name
        self.pad_to_capacity = bool(pad_to_capacity)
        self.image_transform = image_transform
        self.index_dtype = index_dtype
        self.fields = tuple(f for f in FIELDS if f in fields)
        self.input_ids_dtype = input_ids_dtype
        int32_ids = index_dtype == torch.int32 or input_ids_dtype == torch.int32
        if int32_ids and (store.vocab_size > _INT32_LIMIT or idx.capacity >= _INT32_LIMIT):
            raise ValueError(f"index_dtype=torch.int32: expected vocab_size <= 2**31 and capacity < 2**31, "
                             f"found vocab_size {store.vocab_size}, capacity {idx.capacity} ({store.path})")
        if self.pad_to_capacity and idx.capacity >= _INT32_LIMIT:
            raise FormatError(f"{idx.path / 'index.json'}: capacity: expected < 2**31 to pad packs to it "
                              f"(pad_to_capacity=True; cu_seqlens are int32), found {idx.capacity}. Read this index "
                              "without pad_to_capacity, or pack again with a smaller --capacity.",
                              file=str(idx.path / "index.json"), field="capacity", expected="< 2**31", found=idx.capacity)
        self._store: Source | None = store
        self._index: PackIndex | None = idx
        self._arrays: dict[str, Any] | None = None  # ndarray views of the memmaps, per process
        self._hf_room = False  # reserve collate_hf's labels in batch buffers (set by collate_hf)

    # ------------------------------------------------------------------ pickling / lazy opening
    def __getstate__(self) -> dict:
        return {"path": self.path, "index_name": self.index_name, "pad_to_capacity": self.pad_to_capacity,
                "image_transform": self.image_transform, "index_dtype": self.index_dtype, "fields": self.fields,
                "input_ids_dtype": self.input_ids_dtype, "_stream_args": self._stream_args,
                "_stream_plan": getattr(self, "_stream_plan", None)}

    def __setstate__(self, state: dict) -> None:
        state.setdefault("index_dtype", torch.int64)
        state.setdefault("fields", FIELDS)
        state.setdefault("input_ids_dtype", None)
        state.setdefault("_stream_args", None)
        self.__dict__.update(state)
        self._store = None
        self._index = None
        self._arrays = None
        self._hf_room = False

    @property
    def store(self) -> Source:
        if self._store is None and self._stream_args is not None:  # a DataLoader worker: its own share of the limit
            from .prefetch import open_share

            self._store = open_share(*self._stream_args)
        if self._store is None:
            self._store = open_dataset(self.path)
        return self._store

    @property
    def index(self) -> PackIndex:
        if self._index is None:
            self._index = self.store.pack_index(self.index_name)  # a streamed collection fetches it (verified) first
        return self._index

    # ------------------------------------------------------------------ metadata
    def __len__(self) -> int:
        return self.index.num_packs

    @property
    def capacity(self) -> int:
        return self.index.capacity

    @property
    def pad_token_id(self) -> int:
        pad = self.store.special_tokens.get("pad")
        return 0 if pad is None else int(pad)

    @property
    def fingerprint(self) -> str:
        """Identity of the packing: index name, its segment/offset checksums and the token store's."""
        files = self.index.manifest.files
        binding = self.index.manifest.binding
        source = [binding["collection"]] if "collection" in binding else [binding["dataset"]["tokens.bin"],
                                                                          binding["dataset"]["doc_offsets.bin"]]
        return "|".join([self.index_name, files["pack_offsets.bin"].checksum, files["segments.bin"].checksum, *source])

    def pack_num_tokens(self) -> np.ndarray:
        """int64 ``(num_packs,)``: real (unpadded) tokens of every pack."""
        return np.asarray(self.index.pack_lengths, dtype=np.int64)  # (a layout read shard by shard: its uint32 file)

    def pack_groups(self) -> np.ndarray:
        """int64 ``(num_packs,)``: the member holding each pack's first segment's document (zeros for a store);
        the groups of the sampler's ``window`` shuffle."""
        return self.index.pack_members()  # (a layout read shard by shard: from its record, no segment read)

    def pack_num_images(self) -> np.ndarray:
        """int64 ``(num_packs,)``: images whose tokens lie in every pack (zeros for text-only stores)."""
        idx = self.index
        if not self.store.num_images:
            return np.zeros(len(self), dtype=np.int64)
        if self._stream_args is not None:
            raise ValueError(f"{self.store.url}: pack_num_images() (balance='images') reads every member's image "
                             "table, so stream=True would fetch every member: use balance='tokens', or open without "
                             "stream")
        segs = np.asarray(idx.segments)  # one pass at sampler construction, not on the read path
        counts = _ImageIndex(self.store).in_segments(segs[:, 0], segs[:, 1], segs[:, 2])[2]
        return _segment_sums(counts, np.asarray(idx.pack_offsets))

    # ------------------------------------------------------------------ items
    def _views(self) -> dict[str, Any]:
        """Plain ndarray views of the memmaps (no copy): numpy's memmap ``__getitem__`` is Python code."""
        if (self._stream_args is not None and self._store is not None
                and self._store.resident_members().pid != os.getpid()):
            self._store = self._index = self._arrays = None  # a forked DataLoader worker streams its own share
        if self._arrays is None:
            self._arrays = arrays_of(self)
            if self._arrays["members"] is not None and getattr(self, "_stream_plan", None) is not None:
                from .prefetch import start

                start(self)
        return self._arrays

    def __getitem__(self, i: int) -> dict[str, Any]:
        a = self._views()
        n_packs = a["num_packs"]
        if not -n_packs <= i < n_packs:
            raise IndexError(f"pack {i} out of range [0, {n_packs})")
        i = int(i) % n_packs
        self._follow(np.array([i], dtype=np.int64))
        with self._rows((i,)):
            return self._item(a, i)

    def _follow(self, packs: np.ndarray) -> None:
        """A streamed read planned from a sampler (``prefetch.prefetch(ds, sampler)``): its newest iteration planned
        before the batch ``packs`` is read, when it changed (one ``stat``)."""
        spec = getattr(self, "_stream_plan", None)
        if spec is not None and spec[4] is not None:
            from .prefetch import follow

            follow(self, packs)

    def _rows(self, packs):
        """An index read shard by shard (``remote.shard_index``): the shards of ``packs`` held, their rows
        checked, while the block plans and reads them; otherwise nothing to do (``PackIndex.held``)."""
        return self._arrays["held"](packs)

    def _item(self, a: dict, i: int) -> dict[str, Any]:
        po = a["pack_offsets"]
        lo, hi = int(po[i]), int(po[i + 1])
        if a["pack_token_offsets"] is not None:  # materialized: the pack's tokens are one contiguous run
            src, src_mask, src_start = a["packed_tokens"], a["packed_loss_mask"], int(a["pack_token_offsets"][i])
            n = int(a["pack_token_offsets"][i + 1]) - src_start
        else:
            src, src_mask, src_start = a["tokens"], a["loss_mask"], -1
            n = pack_length(a["segments"], lo, hi)
        width = max(n, a["capacity"]) if self.pad_to_capacity else n
        k = hi - lo
        # One buffer, one group of slots per dtype (each group 64-byte aligned), views made by one
        # split per group: int64 [labels, int64 rows, document_ids (k), scalars (2)], int32 [int32
        # rows, seq_lens (k)], then input_ids of a native width (uint16 / uint32) if any.
        g64, g32, r64, r32, native, rows, (gi, ri), (gp, rp), (gd, rd) = a["item_layout"]
        n64 = r64 * width + k + 2
        s32 = -(-n64 * 8 // _ALIGN) * _ALIGN // 4  # element offset of the int32 group
        n32 = r32 * width + k
        sJ = -(-(s32 + n32) * 4 // _ALIGN) * _ALIGN  # byte offset of a native input_ids group
        nbytes = -(-(sJ + width * native[2] if native else sJ) // _ALIGN) * _ALIGN
        buf = _alloc(nbytes)
        b8 = buf.numpy()
        b64, b32 = b8.view(np.int64), b8.view(np.int32)
        bJ = b8.view(native[0]) if native else b64 if a["ids_np"] is np.int64 else b32
        bI = b64 if a["index_np"] is np.int64 else b32
        starts = (0, s32, sJ // native[2] if native else 0)
        with self._hold(np.array([i], dtype=np.int64)):  # images too are read while the pack's members are held
            fill_item(a["tokens"], a["mask_or_dummy"], a["has_mask"], a["docs"], a["segments"], lo, hi, src,
                      a["mask_or_dummy"] if src_mask is None else src_mask, src_start, rows, b64, b32, bI, bJ, 0,
                      starts[gi] + ri * width, starts[gp] + rp * width, starts[gd] + rd * width, s32 + r32 * width,
                      r64 * width, r64 * width + k, width, i, a["pad_id"])
            p64 = buf.view(torch.int64).split_with_sizes([width] * r64 + [k, 2, nbytes // 8 - n64])
            p32 = buf.view(torch.int32).split_with_sizes([s32] + [width] * r32 + [k, nbytes // 4 - s32 - n32])
            t = dict(zip(g64, p64))
            t.update(zip(g32, p32[1:]))
            if a["zero_copy"] is not None:
                t["input_ids"] = a["zero_copy"][src_start:src_start + n]
            elif native:
                t["input_ids"] = buf.view(native[1])[sJ // native[2]:sJ // native[2] + width]
            num_label_tokens, pack_id = p64[r64 + 1].unbind(0)
            out = {"input_ids": t["input_ids"], "labels": t["labels"]}
            for name in ("position_ids", "doc_ids"):
                if name in t:
                    out[name] = t[name]
            out.update(seq_lens=p32[r32 + 1], document_ids=p64[r64], num_label_tokens=num_label_tokens,
                       pack_id=pack_id)
            if a["images"] is not None:
                segs = a["segments"][lo:hi]
                lens = out["seq_lens"].numpy().astype(np.int64)
                starts = np.zeros_like(lens)
                np.cumsum(lens[:-1], out=starts[1:])
                out.update(self._images(segs[:, 0], segs[:, 1], segs[:, 2], starts))
            return out

    def __getitems__(self, indices) -> "PackBatch":
        """Packs ``indices`` at once (what ``DataLoader`` calls for a batch): one kernel call.

        Returns a ``PackBatch``: a sequence of the same items ``ds[i]`` returns (built when first
        accessed), whose per-token tensors are views of one buffer in which the packs lie end to
        end, so the collates of this module assemble the batch without copying the tokens again.
        """
        a = self._views()
        ids = np.asarray(indices, dtype=np.int64).reshape(-1)
        self._follow(ids)
        with self._rows(ids):
            return self._items(a, ids, indices)

    def _items(self, a: dict, ids: np.ndarray, indices) -> "PackBatch":
        slots, plan_args, fill_args, dtypes = self._batch_recipe(a)
        plan, S, bad, layout, nbytes = plan_batch(ids, *plan_args)
        if bad >= 0:
            raise IndexError(f"pack {int(np.asarray(indices).reshape(-1)[bad])} out of range [0, {a['num_packs']})")
        ar = _Arena.placed(slots, layout[N_SLOTS:].tolist(), nbytes)  # after fill_packs' offsets
        typed = ar.typed
        with nullcontext() if a["members"] is None else self._hold(plan[PLAN_PACKS, :-1]):
            longest, kept = fill_packs(*fill_args, plan, *[typed(dt) for dt in dtypes], layout)
            batch = PackBatch(self, ar, plan, int(longest), int(kept), padded=self.pad_to_capacity)
            if a["members"] is not None and a["images"] is not None:
                list(batch)  # every item built now: its images read while the members are held (evicted after)
        return batch

    def _batch_recipe(self, a: dict) -> tuple:
        """What every batch of this reader (with or without ``collate_hf``'s room) hands its kernels, made once per
        process and kept with its arrays: ``(slots, plan_batch's arguments after the indices, fill_packs' before
        the plan, the dtypes of its four views of the buffer)``. A batch of short packs costs its Python more than
        its tokens (benchmarks/bench_batch.py)."""
        key = ("batch_recipe", self._hf_room)
        recipe = a.get(key)
        if recipe is None:
            materialized = a["pack_token_offsets"] is not None
            pto = a["pack_token_offsets"] if materialized else a["pack_offsets"]  # the latter unused
            slots, spec = batch_layout(a["index_np"], a["ids_np"], a["rows"], self._hf_room)
            src, src_mask = ((a["packed_tokens"], a["packed_loss_mask"]) if materialized
                             else (a["tokens"], a["loss_mask"]))
            rows, mask = a["rows"], a["mask_or_dummy"]
            # One doc-id row: the batch segment index (what collate_varlen returns) unless the packs are
            # padded to one width (then the items' own segment index, what collate_padded returns).
            item_rows = rows if self.pad_to_capacity else rows & ~ROW_DIDS
            batch_rows = 0 if self.pad_to_capacity else rows & ROW_DIDS
            recipe = a[key] = (
                slots, (a["num_packs"], a["pack_offsets"], pto, a["segments"], materialized, a["capacity"],
                        self.pad_to_capacity, spec),
                (a["tokens"], mask, a["loss_mask"] is not None, a["docs"], a["segments"], a["pack_offsets"], src,
                 mask if src_mask is None else src_mask, pto, materialized, item_rows, batch_rows, a["pad_id"]),
                (np.int64, np.int32, a["index_np"], a["ids_np"]))
        return recipe

    def _hold(self, packs: np.ndarray):
        """A streamed collection (``stream=True``), or a local one too large to map whole: the members ``packs``
        touch, local, mapped and pinned while the block runs (``remote.members``, ``collection.lazy_members``);
        otherwise nothing to do."""
        a = self._arrays
        if a["members"] is None:
            return nullcontext()
        return a["members"].hold(packs, a["pack_offsets"], a["segments"], str(self.index.path / "segments.bin"))

    def _images(self, docs, begins, ends, starts) -> dict[str, Any]:
        """Decoded images of the pack and their token spans inside the pack."""
        images = self._views()["images"]
        image_ids, image_spans, _ = images.in_segments(docs, begins, ends, starts)
        decoded = []
        for j in image_ids:
            arr = images.decode(int(j))
            img = torch.from_numpy(arr if arr.flags.writeable and arr.flags.c_contiguous else np.array(arr))
            decoded.append(self.image_transform(img) if self.image_transform is not None else img)
        return {"images": decoded, "image_spans": torch.from_numpy(image_spans.astype(np.int64)),
                "image_ids": torch.from_numpy(image_ids)}
