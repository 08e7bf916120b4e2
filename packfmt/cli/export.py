"""``packfmt export megatron|webdataset``: Megatron-Core ``PREFIX.bin/.idx``, or WebDataset shards of packs."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="export a dataset to another format (megatron .bin/.idx, webdataset shards of packs)")
    fmt = p.add_subparsers(dest="export_format", metavar="FORMAT")
    fmt.required = True
    m = fmt.add_parser("megatron", help="Megatron-Core IndexedDataset PREFIX.bin + PREFIX.idx")
    m.add_argument("dataset", help="packfmt dataset (or collection) directory")
    m.add_argument("prefix", help="output prefix (writes PREFIX.bin and PREFIX.idx, and PREFIX_loss_mask.bin/.idx "
                                  "for a dataset with a loss mask)")
    m.add_argument("--no-loss-mask", dest="loss_mask", action="store_false",
                   help="do not write the loss mask beside the tokens (Megatron's .bin/.idx cannot hold it)")
    m.set_defaults(func=run_megatron)
    w = fmt.add_parser("webdataset", help="WebDataset tar shards, one sample per pack (Megatron-Energon CrudeWebdataset)")
    w.add_argument("dataset", help="packfmt dataset (or collection) directory")
    w.add_argument("out", help="output folder (shard-000000.tar, ... and export.json; published atomically)")
    w.add_argument("--index", help="pack index to export (default: the dataset's only one; see packfmt inspect)")
    w.add_argument("--shard-bytes", type=int, default=1 << 30,
                   help="largest shard in bytes (default 1 GiB); a pack larger than it gets a shard of its own")
    w.add_argument("--overwrite", action="store_true", help="replace an existing OUT (atomically)")
    w.set_defaults(func=run_webdataset)


def run_megatron(args: argparse.Namespace) -> int:
    import sys

    from ..megatron import export_megatron, loss_mask_prefix
    from ..opening import open_dataset

    store = open_dataset(args.dataset)
    bin_path, idx_path = export_megatron(store, args.prefix, loss_mask=args.loss_mask)
    print(f"wrote {bin_path} ({bin_path.stat().st_size:,} bytes) and {idx_path} ({idx_path.stat().st_size:,} bytes)")
    if store.has_loss_mask:
        mask = loss_mask_prefix(args.prefix)
        if args.loss_mask:
            print(f"note: Megatron's .bin/.idx do not carry the loss mask; wrote it beside them as {mask}.bin + "
                  f"{mask}.idx (uint8, same documents: IndexedDataset({str(mask)!r})[i] is document i's mask)",
                  file=sys.stderr)
        else:
            print("note: Megatron's .bin/.idx do not carry the loss mask; it was not exported (--no-loss-mask)",
                  file=sys.stderr)
    return 0


def run_webdataset(args: argparse.Namespace) -> int:
    from ..export_webdataset import export_webdataset

    result = export_webdataset(args.dataset, args.out, index=args.index, shard_bytes=args.shard_bytes,
                               overwrite=args.overwrite)
    print(f"wrote {result.packs:,} packs in {len(result.shards)} shard(s), {result.bytes:,} bytes, to {result.path}")
    urls = str(result.path / f"shard-{{000000..{len(result.shards) - 1:06d}}}.tar")
    print(f"  read them with webdataset.WebDataset({urls!r}); for Megatron-Energon run `energon prepare "
          f"{result.path} --non-interactive --split-ratio 1,0,0 --sample-type CrudeWebdataset` and cook each sample "
          f"with packfmt.energon.sample_to_batch (spec/WEBDATASET.md §3)")
    return 0
