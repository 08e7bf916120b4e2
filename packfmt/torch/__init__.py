"""PyTorch reader for packfmt pack indexes (normative behaviour: spec/READER.md).

    >>> from packfmt.torch import PackedDataset, collate_varlen, DistributedPackSampler
    >>> ds = PackedDataset("data/ds", "ffd-4096")                        # doctest: +SKIP
    >>> loader = DataLoader(ds, batch_size=8, collate_fn=collate_varlen,
    ...                     sampler=DistributedPackSampler(ds), num_workers=2)  # doctest: +SKIP
"""

from .attention import (
    ATTENTION_PATHS,
    doc_ids_from_cu_seqlens,
    document_causal_mask,
    flash_varlen_attention,
    flex_document_block_mask,
    position_ids_from_cu_seqlens,
    sdpa_document_attention,
    select_attention,
)
from .collate import collate_hf, collate_padded, collate_varlen
from .dataset import FIELDS, IGNORE_INDEX, PAD_DOC_ID, PackBatch, PackedDataset
from .hf_attention import hf_attn_implementation
from .images import ImageProcessorTransform
from .sampler import (
    BALANCE_MODES,
    DistributedPackSampler,
    PackSampler,
    SamplerStateError,
    lockstep_state,
)

__all__ = [
    "PackedDataset",
    "PackBatch",
    "FIELDS",
    "IGNORE_INDEX",
    "PAD_DOC_ID",
    "ImageProcessorTransform",
    "collate_varlen",
    "collate_padded",
    "collate_hf",
    "document_causal_mask",
    "position_ids_from_cu_seqlens",
    "doc_ids_from_cu_seqlens",
    "flex_document_block_mask",
    "flash_varlen_attention",
    "sdpa_document_attention",
    "select_attention",
    "hf_attn_implementation",
    "ATTENTION_PATHS",
    "DistributedPackSampler",
    "PackSampler",
    "SamplerStateError",
    "lockstep_state",
    "BALANCE_MODES",
]
