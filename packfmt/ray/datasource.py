"""Packs as a Ray Dataset: the rows are ``PackedDataset``'s items, one epoch's deal, for Ray Train.

``read_packs(path, index, num_replicas=N)`` lays out the rows of one epoch as spec/READER.md §6
deals them to ``N`` ranks (``DistributedPackSampler.assignment``, the same rule, not a copy): the
epoch's global order of ``(seed, epoch)``, every pack once, padded with the epoch's first packs
up to a multiple of ``N`` (or its last ``N_packs mod N`` dropped with ``drop_last``). Ray Train
splits a dataset with ``streaming_split(N, equal=True)``, which gives every worker the same number
of rows by truncating the last ``rows mod N`` (ray-project/ray#63285): over a multiple of ``N``
it truncates nothing, so every worker steps the same number of times and no pack is lost. Which
worker receives which pack is Ray's dispatch (blocks go to the consumer with the fewest rows).
``rank=r`` instead gives rank ``r``'s own packs of that deal, in the deal's order (the packs
``DistributedPackSampler(rank=r)`` yields, ``balance`` included): a dataset a training worker
builds for itself each epoch, assigned by the rule rather than by Ray.

Pack ids travel in blocks of ``packs_per_block``; each block is gathered by ``PackedDataset``
itself (the same numba kernel, so a row is exactly ``ds[pack_id]`` as numpy arrays). For a
multimodal index, images are decoded and run through the image transform (``image_processor=``:
a transformers image processor) in a pool of CPU actors that build the processor once: GPU
workers receive ready ``pixel_values``, the disaggregated part of issue 12. For plain text on one
node, ``PackedDataset`` with a DataLoader stays the faster path (memmap, zero copy): rows here
travel through Ray's object store.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

__all__ = ["read_packs", "deal_packs", "ROW_KEYS"]

#: Row keys of every pack row (plus ``pixel_values``, ``image_spans``, ``image_ids`` for images).
ROW_KEYS = ("input_ids", "labels", "position_ids", "doc_ids", "seq_lens", "document_ids", "num_label_tokens",
            "pack_id")


def _rows(ds, ids) -> dict[str, Any]:
    """Items ``ds[i]`` for ``i`` in ``ids`` as a columnar batch (ragged columns as object arrays of arrays)."""
    cols: dict[str, list] = {}
    for i in ids:
        item = ds[int(i)]
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
    """``map_batches`` callable: blocks of pack ids in, pack rows out (one ``PackedDataset`` per actor/task)."""

    def __init__(self, path: str, index: str, dataset_kwargs: dict) -> None:
        from ..torch.dataset import PackedDataset

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.ds = PackedDataset(path, index, **dataset_kwargs)

    def __call__(self, batch: dict) -> dict:
        parts = [_rows(self.ds, ids) for ids in batch["ids"]]
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def deal_packs(dataset, *, num_replicas: int = 1, rank: int | None = None, seed: int = 0, epoch: int = 0,
               shuffle: bool = True, drop_last: bool = False, balance: str = "none",
               window: int | None = None) -> np.ndarray:
    """int64: the pack ids ``read_packs`` lays out as rows, in order (spec/READER.md §6).

    ``rank=None``: the whole deal of ``epoch`` over ``num_replicas`` ranks, round by round
    (a multiple of ``num_replicas`` entries: the padding, if any, last); ``rank=r``: rank ``r``'s
    column of it. ``dataset``: a ``PackedDataset``.
    """
    from ..torch.sampler import DistributedPackSampler

    if rank is None and balance != "none":
        raise ValueError(f"balance={balance!r} needs rank=: without it Ray's streaming_split decides which worker "
                         f"receives a pack, so a balanced deal would not reach its ranks; pass rank= (each worker "
                         f"reads its own packs) or balance='none'")
    sampler = DistributedPackSampler(dataset, num_replicas, 0 if rank is None else rank, shuffle=shuffle, seed=seed,
                                     drop_last=drop_last, balance=balance, window=window)
    deal = sampler.assignment(epoch)
    return deal.reshape(-1) if rank is None else deal[:, rank]


def read_packs(path: str | os.PathLike, index: str | None = None, *, num_replicas: int = 1, rank: int | None = None,
               seed: int = 0, epoch: int = 0, shuffle: bool = True, drop_last: bool = False, balance: str = "none",
               window: int | None = None, packs_per_block: int = 64, image_processor: Any = None,
               image_transform: Any = None, image_actors: int = 1, **dataset_kwargs: Any):
    """A ``ray.data.Dataset`` of epoch ``epoch``'s packs of ``index`` over the store or collection at ``path``.

    Rows: the deal of ``deal_packs`` (spec/READER.md §6): with ``num_replicas=N`` (Ray Train's
    ``num_workers``) a multiple of ``N`` rows, so that ``streaming_split(N, equal=True)`` (what
    Ray Train does with ``datasets={...}``) hands every worker ``rows / N`` of them and drops none.
    A dataset is one epoch: build one per epoch (``datasets={f"epoch{e}": read_packs(..., epoch=e)}``)
    or, with ``rank=``, let each worker build its own share in its loop.

    Args:
        num_replicas, rank, seed, epoch, shuffle, drop_last, balance, window: as
            ``DistributedPackSampler`` (``balance`` only with ``rank``). ``rank=r`` keeps the
            deal's order (``preserve_order`` on this dataset's context).
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
    ids = deal_packs(probe, num_replicas=num_replicas, rank=rank, seed=seed, epoch=epoch, shuffle=shuffle,
                     drop_last=drop_last, balance=balance, window=window)
    blocks = [{"ids": ids[b:b + packs_per_block]} for b in range(0, ids.shape[0], packs_per_block)]
    kwargs = {**dataset_kwargs, "image_transform": image_transform}
    args = (str(probe.path), probe.index_name, kwargs)
    data = ray.data.from_items(blocks, override_num_blocks=max(1, len(blocks)))
    if has_images:
        data = data.map_batches(_Gather, fn_constructor_args=args, batch_size=1, batch_format="numpy", num_cpus=1,
                                compute=ActorPoolStrategy(min_size=1, max_size=max(1, image_actors)))
    else:
        data = data.map_batches(_gather_task, fn_kwargs={"args": args}, batch_size=1, batch_format="numpy")
    if rank is not None:
        data.context.execution_options.preserve_order = True  # the rank's packs in the deal's order
    return data


def _gather_task(batch: dict, *, args: tuple) -> dict:
    """Text packs: a stateless task per block (opening the memmaps is cheap; no actor held)."""
    return _Gather(*args)(batch)
