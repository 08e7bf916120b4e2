"""Attention path selection and the flash-attn varlen call contract, on the CPU.

flash-attn cannot be built here, so its call is checked against a stand-in module that follows
flash-attn 2's documented contract: ``flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k,
max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None, causal=False, ...)`` with q/k/v
``(total_tokens, heads, head_dim)``, int32 cu_seqlens and Python int max_seqlen. The stand-in
refuses anything else and computes each segment's causal attention alone; the real batch's
cu_seqlens/max_seqlen fed through ``flash_varlen_attention`` must equal the SDPA document-mask path.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_torch_dataset import make_store

from packfmt.packindex import build_pack_index
from packfmt.torch import (
    ATTENTION_PATHS,
    PackedDataset,
    collate_varlen,
    flash_varlen_attention,
    hf_attn_implementation,
    sdpa_document_attention,
    select_attention,
)

TOL = 1e-5


def _stand_in_flash_attn(calls: list):
    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, **kwargs):
        assert q.dim() == 3 and q.shape == k.shape == v.shape, "q/k/v must be (total_tokens, heads, head_dim)"
        for cu in (cu_seqlens_q, cu_seqlens_k):
            assert cu.dtype == torch.int32 and cu.dim() == 1 and cu.device == q.device
            assert int(cu[0]) == 0 and int(cu[-1]) == q.shape[0]
        for m in (max_seqlen_q, max_seqlen_k):
            assert type(m) is int, f"max_seqlen must be a Python int, found {type(m).__name__}"
        lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).tolist()
        assert min(lens) > 0 and max(lens) <= max_seqlen_q
        calls.append({"causal": causal, "max_seqlen": max_seqlen_q, "segments": len(lens)})
        out = torch.empty_like(q)
        for b, e in zip(cu_seqlens_q[:-1].tolist(), cu_seqlens_q[1:].tolist()):
            seg = [t[b:e].transpose(0, 1) for t in (q, k, v)]  # (heads, len, head_dim)
            out[b:e] = F.scaled_dot_product_attention(*seg, is_causal=causal, scale=softmax_scale).transpose(0, 1)
        return out

    mod = types.ModuleType("flash_attn")
    mod.flash_attn_varlen_func = flash_attn_varlen_func
    return mod


@pytest.fixture()
def batch(tmp_path):
    rng = np.random.default_rng(2)
    docs = [rng.integers(0, 200, n).tolist() for n in rng.integers(1, 40, 30)]
    store = make_store(tmp_path, docs, [None] * len(docs), 200)
    build_pack_index(store, capacity=64, algorithm="ffd", name="p")
    return collate_varlen(PackedDataset(store, "p").__getitems__(range(4)))


def test_flash_varlen_call_follows_the_flash_attn_contract(batch, monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "flash_attn", _stand_in_flash_attn(calls))
    T, H, D = batch["input_ids"].shape[1], 4, 8
    torch.manual_seed(0)
    q, k, v = (torch.randn(T, H, D) for _ in range(3))
    got = flash_varlen_attention(q, k, v, batch["cu_seqlens"], batch["max_seqlen"])
    assert calls == [{"causal": True, "max_seqlen": batch["max_seqlen"], "segments": batch["cu_seqlens"].numel() - 1}]
    # the same attention through the SDPA document mask, (B, H, L, D) layout
    ref = sdpa_document_attention(*(t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)), batch["doc_ids"])
    assert (got - ref[0].transpose(0, 1)).abs().max().item() <= TOL
    # and not the same as attending across the whole row (the batch holds several documents)
    plain = F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, k, v)), is_causal=True).transpose(0, 1)
    assert (got - plain).abs().max().item() > 1e-2


def test_flash_varlen_without_flash_attn_on_cpu_raises(batch, monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import fails
    q = torch.randn(batch["input_ids"].shape[1], 2, 4)
    with pytest.raises(RuntimeError, match="flash"):
        flash_varlen_attention(q, q, q, batch["cu_seqlens"], batch["max_seqlen"])


def test_select_attention_order_and_overrides(monkeypatch):
    monkeypatch.delenv("PACKFMT_ATTENTION", raising=False)
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    assert select_attention("cpu") == "sdpa"
    monkeypatch.setitem(sys.modules, "flash_attn", _stand_in_flash_attn([]))
    assert select_attention("cpu") == "sdpa"  # flash kernels are CUDA-only
    assert select_attention("cuda") == "flash_varlen"
    assert select_attention("cpu", prefer="flex") == "flex"
    monkeypatch.setenv("PACKFMT_ATTENTION", "flex")
    assert select_attention("cuda") == "flex"
    with pytest.raises(ValueError, match="attention path"):
        select_attention("cpu", prefer="xformers")
    # with flash-attn (here a stand-in), flash_varlen is transformers' own flash_attention_2
    assert [hf_attn_implementation(p) for p in ATTENTION_PATHS] == ["flash_attention_2", "flex_attention", "sdpa"]


def test_flash_varlen_without_flash_attn_is_torch_varlen_registered(monkeypatch):
    """Without flash-attn, flash_varlen maps to ``packfmt_varlen`` (torch's varlen_attn), registered with transformers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    monkeypatch.setitem(sys.modules, "flash_attn", None)  # an import of it fails, as where it is not installed
    assert [hf_attn_implementation(p) for p in ATTENTION_PATHS] == ["packfmt_varlen", "flex_attention", "sdpa"]
    assert "packfmt_varlen" in AttentionInterface._global_mapping
    assert AttentionMaskInterface._global_mapping["packfmt_varlen"]() is None  # bounds travel as cu_seq_lens_q
