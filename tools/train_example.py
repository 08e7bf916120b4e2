#!/usr/bin/env python
"""Train a tiny transformers causal LM on a packfmt pack index (CPU/gloo or GPU/NCCL).

    torchrun --nproc_per_node=2 tools/train_example.py --data DIR [--index NAME] --steps 20
    python tools/train_example.py --demo-data /tmp/demo --steps 5      # builds a synthetic dataset first

The loss of one optimizer step is ``sum of per-token losses over all micro-batches and ranks /
global count of supervised tokens`` (``num_label_tokens`` all-reduced), not a mean of per-batch
means: packs hold different numbers of supervised tokens, and averaging means would weight the
tokens of sparse batches more (the usual silent bug of packed training). Under DDP the gradients
are averaged over ranks, so each rank scales its sum by ``world_size / global_count``.
Logs one JSON line per step on rank 0: loss, tokens/s (real tokens, all ranks), padding fraction, step time, the
time the step waited for the loader (``data_wait_s``) and the peak GPU memory so far.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

import packfmt
from packfmt.torch import IGNORE_INDEX, PackedDataset, collate_hf, collate_padded, document_causal_mask


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, help="packfmt dataset directory")
    p.add_argument("--index", default=None, help="pack index name (default: the only one)")
    p.add_argument("--demo-data", type=Path, default=None, help="build a synthetic dataset + index here first")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=4, help="packs per micro-batch")
    p.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--layout", choices=["varlen", "padded"], default="varlen",
                   help="varlen: one flattened row (position_ids packing); padded: B x capacity + 4-D document mask")
    p.add_argument("--pad-to", choices=["capacity", "longest"], default="capacity",
                   help="padded layout: pad every row to the capacity, or to the longest row of the batch")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--attn", default="auto", choices=["auto", "sdpa", "eager", "flex_attention", "flash_attention_2",
                                                      "packfmt_varlen"],
                   help="transformers attention implementation (auto: for varlen on a GPU, flash_attention_2 when "
                        "flash-attn is installed, else packfmt_varlen: torch's own varlen_attn; sdpa otherwise)")
    p.add_argument("--warmup-steps", type=int, default=0, help="steps left out of the summary throughput")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", type=Path, default=None, help="also write the step logs here (rank 0)")
    return p.parse_args(argv)


def setup_distributed() -> tuple[int, int, torch.device]:
    """Init the process group when launched by torchrun; return (rank, world_size, device)."""
    if "RANK" not in os.environ:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local)
    return rank, world, torch.device("cpu")


def build_demo(path: Path, rank: int) -> None:
    """Synthetic chat-like data (loss mask) with an FFD pack index, written by rank 0."""
    if rank == 0 and not path.exists():
        rng = np.random.default_rng(0)
        with packfmt.DatasetWriter(path, vocab_size=512, loss_mask=True) as w:
            for n in rng.integers(4, 200, 400):
                w.add_document(rng.integers(0, 512, n), (np.arange(n) >= n // 3).astype(np.uint8))
        from packfmt.packindex import build_pack_index

        build_pack_index(packfmt.open(path), capacity=256, algorithm="ffd", name="demo")
    if dist.is_initialized():
        dist.barrier()


def attn_implementation(device: torch.device, layout: str, requested: str = "auto") -> str:
    from packfmt.torch.hf_attention import HF_VARLEN, hf_attn_implementation, register_hf_varlen

    if requested == HF_VARLEN:
        return register_hf_varlen()
    if requested != "auto":
        return requested
    if layout == "varlen" and device.type == "cuda":
        return hf_attn_implementation("flash_varlen")  # flash-attn when installed, else torch's varlen_attn
    return "sdpa"


def build_model(vocab: int, args, device: torch.device, world: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=max(1, args.heads // 2),
                      max_position_embeddings=8192)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = LlamaForCausalLM._from_config(cfg, attn_implementation=attn_implementation(device, args.layout, args.attn), dtype=dtype)
    model.to(device).train()
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model


def forward_sum(model, batch: dict, layout: str, device: torch.device) -> torch.Tensor:
    """Sum of per-token cross-entropy losses of one micro-batch (no normalisation)."""
    if layout == "varlen":
        inputs = {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()
                  if k not in ("labels", "shift_labels", "num_label_tokens")}
        targets = batch["shift_labels"].to(device)
    else:
        inputs = {"input_ids": batch["input_ids"].to(device), "position_ids": batch["position_ids"].to(device),
                  "attention_mask": document_causal_mask(batch["doc_ids"].to(device)), "use_cache": False}
        targets = batch["labels"].to(device)
    logits = model(**inputs).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")


def train(args) -> list[dict]:
    rank, world, device = setup_distributed()
    data = args.data
    if args.demo_data is not None:
        build_demo(args.demo_data, rank)
        data = args.demo_data
    ds = PackedDataset(data, args.index)
    pad_len = ds.capacity if args.pad_to == "capacity" else None
    collate = collate_hf if args.layout == "varlen" else functools.partial(collate_padded, length=pad_len)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, collate_fn=collate, num_workers=args.num_workers,
                        pin_memory=device.type == "cuda", persistent_workers=args.num_workers > 0, drop_last=True)
    model = build_model(ds.store.vocab_size, args, device, world)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    n_params = sum(t.numel() for t in model.parameters())
    logs, epoch, it = [], 0, None
    sampler.set_epoch(epoch)
    it = iter(loader)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for step in range(args.steps):
        t0 = time.perf_counter()
        micro = []
        data_wait = 0.0  # time this step spent waiting for the loader (the GPU idles meanwhile unless work is queued)
        while len(micro) < args.grad_accum:
            t_data = time.perf_counter()
            try:
                micro.append(next(it))
            except StopIteration:
                epoch += 1
                sampler.set_epoch(epoch)
                it = iter(loader)
            data_wait += time.perf_counter() - t_data
        # global count of supervised tokens across micro-batches and ranks
        counts = torch.tensor([sum(int(b["num_label_tokens"]) for b in micro),
                               sum(int((b["doc_ids"] >= 0).sum()) if "doc_ids" in b else b["input_ids"].numel() for b in micro),
                               sum(b["input_ids"].numel() for b in micro)], dtype=torch.float64, device=device)
        if world > 1:
            dist.all_reduce(counts)
        n_label, n_real, n_slots = counts.tolist()
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        for b in micro:
            s = forward_sum(model, b, args.layout, device)
            (s * (world / n_label)).backward()  # DDP averages over ranks: world/global == 1/global overall
            loss_sum += s.detach().double()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if world > 1:
            dist.all_reduce(loss_sum)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rec = {"step": step, "loss": loss_sum.item() / n_label, "label_tokens": int(n_label),
               "tokens_per_s": n_real / dt, "padding_fraction": 1.0 - n_real / n_slots, "world_size": world,
               "layout": args.layout, "device": str(device), "step_s": dt, "data_wait_s": data_wait, "parameters": n_params,
               "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}
        logs.append(rec)
        if rank == 0:
            print(json.dumps(rec), flush=True)
    if rank == 0 and args.json_out is not None:
        args.json_out.write_text(json.dumps(logs, indent=2) + "\n")
    if dist.is_initialized():
        dist.destroy_process_group()
    return logs


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.data is None and args.demo_data is None:
        print("train_example: give --data DIR or --demo-data DIR", file=sys.stderr)
        return 2
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
