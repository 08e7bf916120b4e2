"""A transformers attention implementation over packed rows without flash-attn: ``"packfmt_varlen"``.

transformers' padding-free path (``collate_hf``: one row, ``position_ids`` restarting at every
document, ``cu_seq_lens_q``/``max_length_q`` passed through to the attention function) needs
``attn_implementation="flash_attention_2"``, hence the flash-attn package, which has no wheel for
most torch builds. ``register_hf_varlen()`` registers ``"packfmt_varlen"`` instead:

* on CUDA, PyTorch's own ``torch.nn.attention.varlen.varlen_attn`` (bf16/fp16; torch >= 2.9), through
  ``attention.torch_varlen_attention``;
* elsewhere (a CPU test, fp32), SDPA with the block-diagonal causal mask built from the same
  ``cu_seq_lens_q`` (``attention.document_causal_mask``): slow, exact, the same rule (spec/READER.md §5).

Its mask function returns no mask: the documents' bounds travel as ``cu_seq_lens_q``, as for
flash-attn. A call without them is refused (a row without bounds would attend across documents).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention import (
    doc_ids_from_cu_seqlens,
    document_causal_mask,
    torch_varlen_attention,
)

__all__ = ["HF_VARLEN", "register_hf_varlen", "hf_varlen_attention", "hf_attn_implementation"]

#: The ``attn_implementation`` name ``register_hf_varlen`` registers.
HF_VARLEN = "packfmt_varlen"


def hf_varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A transformers attention function (``AttentionInterface``): ``query`` ``(1, H, T, D)``, ``key``/``value``
    ``(1, H_kv, T, D)``, the documents' bounds in ``kwargs["cu_seq_lens_q"]`` (``collate_hf``); returns
    ``(output (1, T, H, D), None)``."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        raise ValueError(f"attn_implementation={HF_VARLEN!r}: the model was called without cu_seq_lens_q, so the "
                         "documents' bounds are unknown; feed batches of packfmt.torch.collate_hf (one row, "
                         "cu_seq_lens_q and max_length_q), or use attn_implementation='sdpa' with a 4-D mask")
    if query.shape[0] != 1:
        raise ValueError(f"attn_implementation={HF_VARLEN!r}: expected one packed row (batch 1, collate_hf), "
                         f"found batch {query.shape[0]}")
    total = query.shape[2]
    if dropout:
        raise ValueError(f"attn_implementation={HF_VARLEN!r}: attention dropout {dropout} is not supported")
    if query.is_cuda and query.dtype in (torch.float16, torch.bfloat16):
        max_len = kwargs.get("max_length_q")
        if max_len is None:
            max_len = int((cu[1:] - cu[:-1]).max())  # a host sync: collate_hf gives it as an int
        out = torch_varlen_attention(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                                     cu, int(max_len), causal=True, scale=scaling)
        return out.unsqueeze(0), None
    mask = document_causal_mask(doc_ids_from_cu_seqlens(cu.to(query.device), total))
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args, **kwargs):
    """The mask function of ``HF_VARLEN``: none (the bounds are ``cu_seq_lens_q``, as for flash-attn)."""
    return None


def register_hf_varlen() -> str:
    """Register ``HF_VARLEN`` with transformers (attention and mask functions; idempotent) and return the name to
    pass as ``attn_implementation``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(HF_VARLEN, hf_varlen_attention)
    AttentionMaskInterface.register(HF_VARLEN, _no_mask)
    return HF_VARLEN


def hf_attn_implementation(path: str) -> str:
    """The transformers ``attn_implementation`` matching an attention path (``attention.ATTENTION_PATHS``): for
    ``flash_varlen``, ``flash_attention_2`` when flash-attn is installed, else ``HF_VARLEN`` (registered here:
    PyTorch's own ``varlen_attn`` over ``collate_hf``'s ``cu_seq_lens_q``)."""
    if path == "flash_varlen":
        try:
            import flash_attn  # noqa: F401
            return "flash_attention_2"
        except ImportError:
            return register_hf_varlen()
    return {"flex": "flex_attention", "sdpa": "sdpa"}[path]
