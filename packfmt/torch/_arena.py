"""One byte buffer holding named typed arrays (``_Arena``): how an item or a batch is laid out, so
that a batch crosses the DataLoader worker boundary as one shared-memory segment."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

_ALIGN = 64  # byte alignment of every slot of an arena (a cache line; any dtype's alignment)


def _alloc(nbytes: int) -> torch.Tensor:
    """A uint8 tensor of ``nbytes``: in shared memory inside a DataLoader worker, else ordinary memory."""
    if torch.utils.data.get_worker_info() is not None:
        return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes), 0, (nbytes,))
    return torch.empty(nbytes, dtype=torch.uint8)


class _Arena:
    """One byte buffer holding named typed arrays, each at a 64-byte aligned offset.

    ``array(name)`` is the numpy view (for the kernels), ``tensor(name)`` a torch view of the
    same bytes; every tensor view shares the single storage ``base``, which is what makes a batch
    cross the worker -> main process boundary as one shared-memory segment (torch's pickler
    memoizes the storage, see tests/test_torch_dataset.py::test_batch_is_one_storage).

    Args:
        slots: ``(name, numpy dtype, shape)`` in layout order.
    """

    __slots__ = ("base", "_np", "_slots", "_typed", "_typed_np")

    def __init__(self, slots) -> None:
        self._slots: dict[str, tuple[int, np.dtype, tuple[int, ...], int]] = {}
        pos = 0
        for name, dt, shape in slots:
            dt = _NP_DTYPES[dt]
            pos = -(-pos // _ALIGN) * _ALIGN
            n = math.prod(shape)
            self._slots[name] = (pos // dt.itemsize, dt, shape, n)  # offset in elements of dt
            pos += n * dt.itemsize
        self.base = _alloc(-(-max(pos, 1) // _ALIGN) * _ALIGN)
        self._np = self.base.numpy()
        self._typed: dict[Any, torch.Tensor] = {}
        self._typed_np: dict[Any, np.ndarray] = {}

    @classmethod
    def placed(cls, slots, place: list, nbytes: int) -> "_Arena":
        """An arena whose slots are already placed (``_plan.plan_batch``): ``slots`` ``(name, numpy dtype, 0-d)`` in
        buffer order (``_plan.batch_layout``), ``place`` their element offsets and lengths, in turn, ``nbytes``
        the buffer's size."""
        self = cls.__new__(cls)
        it = iter(place)
        self._slots = {name: (off, dt, () if zero_d else (n,), n) for (name, dt, zero_d), off, n in zip(slots, it, it)}
        self.base = _alloc(nbytes)
        self._np = self.base.numpy()
        self._typed, self._typed_np = {}, {}
        return self

    def __contains__(self, name: str) -> bool:
        return name in self._slots

    def __getstate__(self) -> dict:
        # the buffer and the layout only: numpy views of it would each pickle as a copy
        return {"base": self.base, "slots": self._slots}

    def __setstate__(self, state: dict) -> None:
        self.base, self._slots = state["base"], state["slots"]
        self._np = self.base.numpy()
        self._typed, self._typed_np = {}, {}

    def typed(self, dt) -> np.ndarray:
        """The whole buffer as a 1-D numpy array of ``dt`` (the kernels slice it themselves)."""
        dt = _NP_DTYPES[dt] if dt in _NP_DTYPES else dt
        typed = self._typed_np.get(dt)
        if typed is None:
            typed = self._typed_np[dt] = self._np.view(dt)
        return typed

    def array(self, name: str) -> np.ndarray:
        off, dt, shape, n = self._slots[name]
        typed = self.typed(dt)
        return typed[off:off + n] if len(shape) == 1 else typed[off:off + n].reshape(shape)  # 0-d: a view too

    def room(self, name: str) -> tuple[torch.Tensor, int, int]:
        """``(buffer, element offset, length)`` of a 1-D slot: a view can be made later (it pickles small)."""
        off, _, _, n = self._slots[name]
        return self.base, off, n

    def tensor(self, name: str, row: bool = False) -> torch.Tensor:
        """Torch view of slot ``name``; ``row=True``: a 1-D slot as a ``(1, n)`` row (one call, no unsqueeze)."""
        off, dt, shape, n = self._slots[name]
        typed = self._typed.get(dt)
        if typed is None:
            typed = self._typed[dt] = self.base.view(_TORCH_OF[dt.type])
        if row:
            return typed.as_strided((1, n), (n, 1), off)
        if len(shape) == 1:
            return typed[off:off + n]
        if not shape:
            return typed[off]
        return typed.as_strided(shape, _contiguous_strides(shape), off)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


_NP_DTYPES = {t: np.dtype(t) for t in (np.int64, np.int32, np.uint32, np.uint16, np.uint8)}
_TORCH_OF = {np.int64: torch.int64, np.int32: torch.int32, np.uint32: torch.uint32, np.uint16: torch.uint16,
             np.uint8: torch.uint8}
_NP_OF = {v: k for k, v in _TORCH_OF.items()}


def item_layout(rows: int, index_np, ids_np) -> tuple:
    """The layout of an item's buffer (``PackedDataset.__getitem__``): its rows (``_kernels.ROW_*`` bits) grouped by
    dtype, int64 first (``labels`` always), then int32, then ``input_ids`` of a native width (uint16 / uint32).
    Returns ``(g64, g32, len(g64), len(g32), native, rows, (group, rank) of input_ids, position_ids, doc_ids)``."""
    from ._kernels import ROW_DIDS, ROW_IDS, ROW_POS

    written = [(name, ids_np if name == "input_ids" else index_np) for name, bit in
               (("input_ids", ROW_IDS), ("position_ids", ROW_POS), ("doc_ids", ROW_DIDS)) if rows & bit]
    g64 = ["labels"] + [name for name, dt in written if dt is np.int64]
    g32 = [name for name, dt in written if dt is np.int32]
    native = None
    if rows & ROW_IDS and ids_np not in (np.int64, np.int32):
        native = (ids_np, _TORCH_OF[ids_np], np.dtype(ids_np).itemsize)
    where = {**{name: (0, r) for r, name in enumerate(g64)}, **{name: (1, r) for r, name in enumerate(g32)},
             **({"input_ids": (2, 0)} if native else {})}  # row -> (group, rank in its group)
    return (g64, g32, len(g64), len(g32), native, rows,
            *(where.get(name, (0, 0)) for name in ("input_ids", "position_ids", "doc_ids")))
