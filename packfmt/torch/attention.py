"""Document-masked causal attention for packed batches (spec/READER.md §5).

Three paths, one rule: query ``q`` attends key ``k`` only when both belong to the same segment
and ``k <= q``.

* ``sdpa``: a boolean block-diagonal causal mask for ``F.scaled_dot_product_attention`` (CPU
  and GPU; O(L^2) memory, the portable fallback and the CPU training path).
* ``flex``: a FlexAttention ``BlockMask`` (forward on CPU, training on GPU).
* ``flash_varlen``: ``flash_attn_varlen_func`` over ``cu_seqlens`` (GPU; imported lazily).

``select_attention()`` picks the fastest available; pass ``prefer=`` or set
``PACKFMT_ATTENTION`` to override.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

__all__ = ["position_ids_from_cu_seqlens", "doc_ids_from_cu_seqlens", "document_causal_mask", "flex_document_block_mask", "flash_varlen_attention", "sdpa_document_attention",
           "select_attention", "torch_varlen_attention", "ATTENTION_PATHS"]

ATTENTION_PATHS = ("flash_varlen", "flex", "sdpa")


def doc_ids_from_cu_seqlens(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """``doc_ids`` of a varlen row, rebuilt from ``cu_seqlens`` on its device (no host sync).

    For batches of a ``PackedDataset(fields=("input_ids", "labels"))``: the rows left out of the
    batch are derived where they are used instead of crossing worker queues and PCIe.

    Args:
        cu_seqlens: int32/int64 ``(S + 1,)``, ``cu_seqlens[0] = 0``, strictly increasing.
        total: ``T = cu_seqlens[-1]`` as a Python int (e.g. ``input_ids.shape[-1]``), so the
            output size is known without reading the device tensor.
    Returns:
        int64 ``(1, T)``: segment index ``0..S-1`` of every position.
    """
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    seg = torch.arange(lens.shape[0], device=cu_seqlens.device)
    return seg.repeat_interleave(lens, output_size=total).unsqueeze(0)


def position_ids_from_cu_seqlens(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """``position_ids`` of a varlen row (0 at every segment start), rebuilt from ``cu_seqlens`` on its device.

    Equal to ``collate_varlen``'s ``position_ids`` (spec/READER.md §3); see ``doc_ids_from_cu_seqlens``.

    Returns:
        int64 ``(1, T)``.
    """
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    starts = cu_seqlens[:-1].long().repeat_interleave(lens, output_size=total)
    return (torch.arange(total, device=cu_seqlens.device) - starts).unsqueeze(0)


def document_causal_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """Boolean ``(B, 1, L, L)`` mask, True where attention is allowed.

    Args:
        doc_ids: int ``(L,)`` or ``(B, L)``: segment id per token, -1 for padding.
    Returns:
        ``mask[b, 0, q, k] = doc[b, q] == doc[b, k] and k <= q and doc[b, q] >= 0``; a padding
        query attends only to itself, so no row is empty (an all-False row makes SDPA return NaN).
    """
    if doc_ids.dim() == 1:
        doc_ids = doc_ids.unsqueeze(0)
    L = doc_ids.shape[-1]
    same = doc_ids.unsqueeze(-1) == doc_ids.unsqueeze(-2)
    causal = torch.ones(L, L, dtype=torch.bool, device=doc_ids.device).tril_()
    real = (doc_ids >= 0).unsqueeze(-1)
    eye = torch.eye(L, dtype=torch.bool, device=doc_ids.device)
    mask = (same & causal & real) | (eye & ~real)
    return mask.unsqueeze(1)


def sdpa_document_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc_ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with the document causal mask; q/k/v ``(B, H, L, D)``."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=document_causal_mask(doc_ids), **kwargs)


def flex_document_block_mask(doc_ids: torch.Tensor, *, num_heads: int | None = None, block_size: int = 128):
    """FlexAttention ``BlockMask`` of the document causal rule (padding attends to padding only).

    Args:
        doc_ids: int ``(B, L)`` (or ``(L,)``), -1 for padding.
    Returns:
        a ``torch.nn.attention.flex_attention.BlockMask`` for ``flex_attention(q, k, v, block_mask=...)``.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    if doc_ids.dim() == 1:
        doc_ids = doc_ids.unsqueeze(0)
    docs = doc_ids

    def mask_mod(b, h, q_idx, kv_idx):
        return (docs[b, q_idx] == docs[b, kv_idx]) & (kv_idx <= q_idx)

    B, L = docs.shape
    return create_block_mask(mask_mod, B, num_heads, L, L, device=docs.device, BLOCK_SIZE=block_size)


def flex_document_attention(q, k, v, doc_ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """``flex_attention`` with the document block mask; q/k/v ``(B, H, L, D)``."""
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=flex_document_block_mask(doc_ids), **kwargs)


def flash_varlen_attention(q, k, v, cu_seqlens: torch.Tensor, max_seqlen: int, *, causal: bool = True, **kwargs):
    """Causal varlen attention over packed rows; q/k/v ``(T, H, D)``, ``cu_seqlens`` int32 ``(S+1,)``.

    Uses ``flash_attn.flash_attn_varlen_func`` (imported lazily), else PyTorch's CUDA
    ``varlen_attn``. Raises ``RuntimeError`` when neither is usable (e.g. on CPU).
    """
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        flash_attn_varlen_func = None
    if flash_attn_varlen_func is not None:
        return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=causal, **kwargs)
    if q.is_cuda:
        return torch_varlen_attention(q, k, v, cu_seqlens, max_seqlen, causal=causal, scale=kwargs.get("softmax_scale"))
    raise RuntimeError("flash_varlen: needs CUDA tensors and flash_attn (pip install flash-attn) or torch varlen_attn")


def torch_varlen_attention(q, k, v, cu_seqlens: torch.Tensor, max_seqlen: int, *, causal: bool = True,
                           scale: float | None = None) -> torch.Tensor:
    """PyTorch's own ``torch.nn.attention.varlen.varlen_attn`` (CUDA, bf16/fp16) over packed rows; q ``(T, H, D)``,
    k/v ``(T, H_kv, D)`` with ``H_kv`` dividing ``H`` (grouped-query attention), ``cu_seqlens`` ``(S+1,)``.

    Its keywords changed between releases: a causal flag (``is_causal``) in the first ones, ``window_size``
    (``(-1, 0)``: causal) later; grouped-query attention by ``enable_gqa`` where it has it, else by repeating
    the key/value heads. Raises ``RuntimeError`` naming what is missing when this torch has no ``varlen_attn``."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as exc:
        raise RuntimeError(f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn (added in 2.9): "
                           "install flash-attn, or use attention path 'flex' or 'sdpa'") from exc
    params = _varlen_params(varlen_attn)
    kw = {}
    if "window_size" in params:
        kw["window_size"] = (-1, 0) if causal else (-1, -1)
    elif "is_causal" in params:
        kw["is_causal"] = causal
    elif causal:
        raise RuntimeError(f"torch {torch.__version__}: varlen_attn takes neither window_size nor is_causal; "
                           "cannot ask it for causal attention")
    if scale is not None and "scale" in params:
        kw["scale"] = scale
    if k.shape[-2] != q.shape[-2]:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:
            k = k.repeat_interleave(q.shape[-2] // k.shape[-2], dim=-2)
            v = v.repeat_interleave(q.shape[-2] // v.shape[-2], dim=-2)
    cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
    return varlen_attn(q, k, v, cu, cu, int(max_seqlen), int(max_seqlen), **kw)


def _varlen_params(fn) -> frozenset:
    import inspect

    try:
        return frozenset(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: the newest keywords
        return frozenset({"window_size", "scale", "enable_gqa"})


def _flash_available(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        import flash_attn  # noqa: F401
        return True
    except ImportError:
        try:
            from torch.nn.attention.varlen import varlen_attn  # noqa: F401
            return True
        except ImportError:
            return False


def select_attention(device: torch.device | str | None = None, *, prefer: str | None = None) -> str:
    """Pick an attention path: ``"flash_varlen"``, ``"flex"`` or ``"sdpa"``.

    Order: ``prefer`` (or env ``PACKFMT_ATTENTION``) when given; else flash_varlen on CUDA when
    flash-attn or torch varlen is usable; else flex on CUDA; else sdpa (the CPU path:
    FlexAttention has no CPU backward and its eager CPU forward is slow).
    """
    choice = prefer or os.environ.get("PACKFMT_ATTENTION") or None
    if choice is not None:
        if choice not in ATTENTION_PATHS:
            raise ValueError(f"attention path: expected one of {ATTENTION_PATHS}, found {choice!r}")
        return choice
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if _flash_available(dev):
        return "flash_varlen"
    if dev.type == "cuda":
        return "flex"
    return "sdpa"
