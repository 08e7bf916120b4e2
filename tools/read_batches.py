#!/usr/bin/env python
"""Read a few training batches from a packed dataset and print them, as a trainer would see them.

    python tools/read_batches.py DATASET [--index NAME] [--batch-size 4] [--batches 2] [--tokenizer DIR]

Uses ``PackedDataset`` + ``collate_varlen`` through a real ``DataLoader`` with 2 workers and a
``DistributedSampler`` (one replica), and prints shapes, ``cu_seqlens``/``max_seqlen`` and the
first tokens of every document of the first pack, decoded when a tokenizer is given.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.utils.data import DataLoader, DistributedSampler

from packfmt.torch import PackedDataset, collate_varlen


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset")
    p.add_argument("--index", default=None)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--tokenizer", default=None, help="tokenizer directory, to print decoded text")
    args = p.parse_args(argv)
    ds = PackedDataset(args.dataset, args.index)
    tok = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.tokenizer)
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, collate_fn=collate_varlen, num_workers=2)
    print(f"{args.dataset}: {len(ds):,} packs of capacity {ds.capacity:,}")
    for b, batch in enumerate(loader):
        if b >= args.batches:
            break
        cu = batch["cu_seqlens"]
        n_label = int(batch["num_label_tokens"])
        print(f"batch {b}: packs {batch['pack_ids'].tolist()}  input_ids {tuple(batch['input_ids'].shape)}  "
              f"documents {cu.numel() - 1}  max_seqlen {batch['max_seqlen']} ({type(batch['max_seqlen']).__name__})  "
              f"label tokens {n_label:,}")
        print(f"  cu_seqlens[:8] = {cu[:8].tolist()}{' ...' if cu.numel() > 8 else ''}")
        ids, labels, pos = batch["input_ids"][0], batch["labels"][0], batch["position_ids"][0]
        for s in range(min(3, cu.numel() - 1)):
            a, e = int(cu[s]), int(cu[s + 1])
            head = ids[a:min(e, a + 12)].tolist()
            text = tok.decode(head) if tok is not None else head
            masked = int((labels[a:e] == -100).sum())
            print(f"  doc {s}: tokens [{a}:{e}) positions {pos[a].item()}..{pos[e - 1].item()}  "
                  f"labels -100: {masked}/{e - a}  starts: {text!r}")
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
