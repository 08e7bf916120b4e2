"""Packs as a Ray Dataset: the rows are ``PackedDataset``'s items, for Ray Train and ``streaming_split``.

``read_packs(path, index)`` cuts the pack ids of a store's or collection's pack index into ranges
(one Ray block each); each range is gathered by ``PackedDataset`` itself (the same numba kernel, so
a row is exactly ``ds[pack_id]`` as numpy arrays). For a multimodal index, images are decoded and
run through the image transform (``image_processor=``: a transformers image processor) in a pool
of CPU actors that build the processor once: GPU workers receive ready ``pixel_values``, the
disaggregated part of issue 12. ``dataset.streaming_split(n)`` then hands each training worker a
disjoint share of the packs. For plain text on one node, ``PackedDataset`` with a DataLoader
stays the faster path (memmap, zero copy): rows here travel through Ray's object store. Rows come
in Ray's completion order unless ``DataContext.get_current().execution_options.preserve_order``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

__all__ = ["read_packs", "ROW_KEYS"]

#: Row keys of every pack row (plus ``pixel_values``, ``image_spans``, ``image_ids`` for images).
ROW_KEYS = ("input_ids", "labels", "position_ids", "doc_ids", "seq_lens", "document_ids", "num_label_tokens",
            "pack_id")


def _rows(ds, begin: int, end: int) -> dict[str, Any]:
    """Items ``begin..end-1`` of ``ds`` as a columnar batch (ragged columns as object arrays of arrays)."""
    cols: dict[str, list] = {}
    for i in range(begin, end):
        item = ds[i]
        for key, value in item.items():
            if key == "images":
                key = "pixel_values"
                value = (np.stack([v.numpy() for v in value]) if value
                         else np.zeros((0, 0, 0, 0), dtype=np.float32))
            elif hasattr(value, "numpy"):
                value = value.numpy()
            cols.setdefault(key, []).append(value)
    out = {}
    for key, values in cols.items():
        if values and np.ndim(values[0]) == 0:
            out[key] = np.asarray(values)
        else:
            arr = np.empty(len(values), dtype=object)
            arr[:] = values
            out[key] = arr
    return out


class _Gather:
    """``map_batches`` callable: pack-id ranges in, pack rows out (one ``PackedDataset`` per actor/task)."""

    def __init__(self, path: str, index: str, dataset_kwargs: dict) -> None:
        from ..torch.dataset import PackedDataset

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.ds = PackedDataset(path, index, **dataset_kwargs)

    def __call__(self, batch: dict) -> dict:
        parts = [_rows(self.ds, int(b), int(e)) for b, e in zip(batch["begin"], batch["end"])]
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def read_packs(path: str | os.PathLike, index: str | None = None, *, packs_per_block: int = 64,
               image_processor: Any = None, image_transform: Any = None, image_actors: int = 1,
               **dataset_kwargs: Any):
    """A ``ray.data.Dataset`` of the packs of ``index`` over the store or collection at ``path``.

    Args:
        packs_per_block: packs per Ray block (the unit of parallelism and of ``streaming_split``).
        image_processor: a transformers image processor (wrapped in ``ImageProcessorTransform``);
            or ``image_transform=``, any picklable callable as ``PackedDataset`` takes. Required for
            a multimodal index: rows carry ``pixel_values`` ``(m, ...)``, one entry per image.
        image_actors: CPU actors running the image transform (keep it below the cluster's CPUs:
            a pool holding every CPU starves the read tasks, ray-project/ray#44687).
        **dataset_kwargs: as ``PackedDataset`` (``pad_to_capacity``, ``fields``, ``index_dtype``...).
    """
    import ray
    from ray.data import ActorPoolStrategy

    from ..torch.dataset import PackedDataset
    from ..torch.images import ImageProcessorTransform

    if packs_per_block < 1:
        raise ValueError(f"packs_per_block: expected >= 1, found {packs_per_block}")
    if image_processor is not None:
        if image_transform is not None:
            raise ValueError("pass image_processor= or image_transform=, not both")
        image_transform = ImageProcessorTransform(image_processor)
    probe = PackedDataset(path, index, image_transform=image_transform, **dataset_kwargs)
    has_images = probe.store.num_images > 0
    if has_images and image_transform is None:
        raise ValueError(f"{path}: the index has images: pass image_processor= (a transformers image processor) or "
                         "image_transform= so that rows carry same-shape pixel_values")
    n = len(probe)
    ranges = [{"begin": b, "end": min(b + packs_per_block, n)} for b in range(0, n, packs_per_block)]
    kwargs = {**dataset_kwargs, "image_transform": image_transform}
    args = (str(probe.path), probe.index_name, kwargs)
    data = ray.data.from_items(ranges, override_num_blocks=max(1, len(ranges)))
    if has_images:
        return data.map_batches(_Gather, fn_constructor_args=args, batch_size=1, batch_format="numpy", num_cpus=1,
                                compute=ActorPoolStrategy(min_size=1, max_size=max(1, image_actors)))
    return data.map_batches(_gather_task, fn_kwargs={"args": args}, batch_size=1, batch_format="numpy")


def _gather_task(batch: dict, *, args: tuple) -> dict:
    """Text packs: a stateless task per range (opening the memmaps is cheap; no actor held)."""
    return _Gather(*args)(batch)
