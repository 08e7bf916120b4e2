#!/usr/bin/env python
"""A VLM training step on packed image+text packs: ``ffd`` against ``balanced`` indexes (issue 14), images per pack
and the spread of step time across simulated data-parallel ranks.

Data: ``--docs`` web-like documents (lognormal lengths, mean ~800 tokens, capacity ``--capacity``), 40% of them
carrying 1-3 images of ``--side`` x ``--side`` pixels (real PNG files), each image a run of ``(side / 4)^2`` image
tokens in its document (the image placeholder id). Two pack indexes with the same image budget
(``--max-images`` per pack): ``ffd`` (fill first) and ``balanced`` (spreads the images over the packs).

Model: a vision tower (4x4 patches, ``--vision-layers`` transformer layers of width ``--vision-width``, a
projection) whose outputs replace the embeddings of the image tokens, then a random Llama (``--hidden``,
``--layers``) over the packed row (``collate_varlen``: one row, ``cu_seqlens``; attention ``packfmt_varlen``, torch's
``varlen_attn``, on CUDA), bf16, AdamW. Loss on the text tokens (image tokens are not predicted).

Ranks: ``--ranks`` data-parallel ranks are simulated on one GPU: each step, each rank's batch
(``DistributedPackSampler(ds, ranks, r, balance=...)``, ``--batch-size`` packs) runs forward and backward alone,
timed; a synchronous step takes as long as its slowest rank, so the step is the max over ranks and the spread is
max / mean. Rows: ``ffd`` and ``balanced`` with ``balance="none"``, and ``ffd`` with ``balance="images"`` (the
sampler deals packs to ranks by image count).

    python benchmarks/bench_gpu_vlm.py [--steps 12] [--out benchmarks/results/bench_gpu_vlm.json]
    python benchmarks/bench_gpu_vlm.py --cpu-smoke --out /tmp/x.json ...   # the CPU, tiny (a test)
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from common import add_gpu_args, gpu_device, machine_info, print_table, write_json  # noqa: E402

PATCH = 4


def build(path: Path, n_docs: int, capacity: int, vocab: int, side: int, max_images: int) -> None:
    """The image+text store at ``path`` and its ``ffd`` and ``balanced`` indexes."""
    from PIL import Image

    import packfmt
    from packfmt.packindex import build_pack_index

    rng = np.random.default_rng(0)
    per_image = (side // PATCH) ** 2
    pngs = []
    for _ in range(8):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, format="PNG")
        pngs.append(buf.getvalue())
    sigma = 1.0
    lengths = np.clip(rng.lognormal(np.log(800) - sigma**2 / 2, sigma, n_docs).astype(np.int64), 16, capacity)
    images = np.where(rng.random(n_docs) < 0.4, rng.integers(1, 4, n_docs), 0)
    image_id = vocab - 1
    with packfmt.DatasetWriter(path, vocab_size=vocab, special_tokens={"image": image_id}) as w:
        for n, k in zip(lengths.tolist(), images.tolist()):
            n = min(max(n, 8 + (per_image + 4) * k + 8), capacity)
            tokens = rng.integers(0, vocab - 1, n)
            recs = []
            for i in range(k):
                b = 8 + (per_image + 4) * i
                tokens[b:b + per_image] = image_id
                recs.append(packfmt.ImageRecord(pngs[int(rng.integers(0, len(pngs)))], side, side, "png", b,
                                                b + per_image))
            w.add_document(tokens, images=recs)
    store = packfmt.open(path)
    for algorithm in ("ffd", "balanced"):
        build_pack_index(store, capacity=capacity, algorithm=algorithm, max_images_per_pack=max_images, name=algorithm)


class VLM:
    """A vision tower and a causal LM; ``loss(batch)`` is the summed text-token loss of one ``collate_varlen`` batch."""

    def __init__(self, vocab: int, args, device, dtype):
        import torch
        from torch import nn
        from transformers import LlamaConfig, LlamaForCausalLM

        from packfmt.torch.hf_attention import register_hf_varlen

        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                          num_hidden_layers=args.layers, num_attention_heads=args.heads,
                          num_key_value_heads=max(1, args.heads // 2), max_position_embeddings=2 * args.capacity)
        self.lm = LlamaForCausalLM._from_config(cfg, attn_implementation=register_hf_varlen(), dtype=dtype)
        width = args.vision_width
        layer = nn.TransformerEncoderLayer(width, max(1, width // 64), 4 * width, batch_first=True, norm_first=True)
        self.tower = nn.ModuleDict({
            "patch": nn.Conv2d(3, width, PATCH, stride=PATCH),
            "encoder": nn.TransformerEncoder(layer, args.vision_layers, enable_nested_tensor=False),
            "proj": nn.Linear(width, args.hidden),
        }).to(dtype)
        self.pos = nn.Parameter(torch.zeros(1, (args.side // PATCH) ** 2, width, dtype=dtype))
        self.lm.to(device).train()
        self.tower.to(device).train()
        self.pos.data = self.pos.data.to(device)
        self.params = [*self.lm.parameters(), *self.tower.parameters(), self.pos]
        self.device, self.dtype, self.image_id = device, dtype, vocab - 1

    def loss(self, batch):
        import torch
        import torch.nn.functional as F

        dev = self.device
        ids = batch["input_ids"].to(dev, non_blocking=True).long()
        emb = self.lm.get_input_embeddings()(ids)
        pixels = batch.get("pixel_values")
        if pixels is not None and pixels.shape[0]:
            x = pixels.to(dev, non_blocking=True).permute(0, 3, 1, 2).to(self.dtype) / 255
            f = self.tower["patch"](x).flatten(2).transpose(1, 2) + self.pos
            f = self.tower["proj"](self.tower["encoder"](f))  # (images, patches, hidden)
            spans = batch["image_spans"].to(dev)
            where = (spans[:, :1] + torch.arange(f.shape[1], device=dev)).reshape(-1)
            emb = emb.clone()
            emb[0, where] = f.reshape(-1, f.shape[-1])
        cu = batch["cu_seqlens"].to(dev, non_blocking=True)
        out = self.lm(inputs_embeds=emb, position_ids=batch["position_ids"].to(dev, non_blocking=True).long(),
                      cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=int(batch["max_seqlen"]),
                      max_length_k=int(batch["max_seqlen"]), use_cache=False)
        labels = batch["labels"].to(dev, non_blocking=True).long()
        labels = torch.where(labels == self.image_id, torch.full_like(labels, -100), labels)
        return F.cross_entropy(out.logits[0].float(), labels[0], ignore_index=-100, reduction="sum"), int(
            (labels != -100).sum())


def run(path: Path, index: str, balance: str, args, device, dtype) -> dict:
    """Steps of ``--ranks`` simulated ranks over ``index``: per-rank times, step (max) and spread."""
    import torch

    from packfmt.torch import DistributedPackSampler, PackedDataset, collate_varlen

    ds = PackedDataset(path, index)
    images = ds.pack_num_images()
    loaders = []
    for r in range(args.ranks):
        sampler = DistributedPackSampler(ds, num_replicas=args.ranks, rank=r, seed=0, balance=balance)
        sampler.set_epoch(0)
        loaders.append(iter(torch.utils.data.DataLoader(ds, batch_size=args.batch_size, sampler=sampler,
                                                        collate_fn=collate_varlen, num_workers=args.num_workers,
                                                        pin_memory=device.type == "cuda")))
    model = VLM(ds.store.vocab_size, args, device, dtype)
    opt = torch.optim.AdamW(model.params, lr=1e-4)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    steps, spreads, rank_images, tokens_total, seconds_total = [], [], [], 0, 0.0
    for step in range(args.warmup + args.steps):
        times, per_rank_images, tokens = [], [], 0
        for r in range(args.ranks):
            batch = next(loaders[r])
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss, n = model.loss(batch)
            (loss / max(n, 1)).backward()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            per_rank_images.append(int(batch["image_spans"].shape[0]) if "image_spans" in batch else 0)
            tokens += int(batch["input_ids"].numel())
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= args.warmup:
            steps.append(max(times))
            spreads.append(max(times) / statistics.mean(times))
            rank_images.append(per_rank_images)
            tokens_total += tokens
            seconds_total += max(times)
    ri = np.asarray(rank_images)
    return {"index": index, "balance": balance, "status": "ok",
            "images_per_pack_min": int(images.min()), "images_per_pack_max": int(images.max()),
            "images_per_pack_std": float(images.std()),
            "step_s": statistics.median(steps), "spread_max_over_mean": statistics.mean(spreads),
            "spread_worst": max(spreads), "images_per_rank_batch_std": float(ri.std(axis=1).mean()),
            "images_per_rank_batch_max_minus_min": float((ri.max(axis=1) - ri.min(axis=1)).mean()),
            "tokens_per_s_all_ranks": tokens_total / seconds_total,
            "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=6000)
    p.add_argument("--capacity", type=int, default=4096)
    p.add_argument("--side", type=int, default=64, help="image side in pixels ((side/4)^2 tokens an image)")
    p.add_argument("--max-images", type=int, default=8, help="image budget per pack (both indexes)")
    p.add_argument("--batch-size", type=int, default=4, help="packs per rank and step")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vision-width", type=int, default=1024)
    p.add_argument("--vision-layers", type=int, default=8)
    p.add_argument("--num-workers", type=int, default=2)
    add_gpu_args(p, "bench_gpu_vlm.json")
    args = p.parse_args(argv)
    import torch

    device = gpu_device(p, args, "bench_gpu_vlm")
    if device is None:
        return 0
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tmp = Path(tempfile.mkdtemp())
    t0 = time.perf_counter()
    build(tmp / "ds", args.docs, args.capacity, args.vocab, args.side, args.max_images)
    print(f"built {args.docs} documents + 2 indexes in {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for index, balance in (("ffd", "none"), ("balanced", "none"), ("ffd", "images")):
        try:
            rows.append(run(tmp / "ds", index, balance, args, device, dtype))
        except Exception as exc:  # a kernel without this dtype, out of memory: said, the other rows still run
            rows.append({"index": index, "balance": balance, "status": f"failed: {type(exc).__name__}: {str(exc)[:160]}"})
        print(rows[-1], flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu (smoke run, not a measurement)"
    print_table(rows, ["index", "balance", "images_per_pack_min", "images_per_pack_max", "images_per_pack_std",
                       "step_s", "spread_max_over_mean", "spread_worst", "images_per_rank_batch_max_minus_min",
                       "tokens_per_s_all_ranks", "peak_mem_gib", "status"],
                title=f"VLM step on {gpu}: {args.ranks} simulated ranks x {args.batch_size} packs of {args.capacity}")
    write_json(args.out, {"gpu": gpu, "torch": torch.__version__, "machine": machine_info(),
                          "args": vars(args) | {"out": str(args.out)}, "rows": rows})
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
