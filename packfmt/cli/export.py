"""``packfmt export megatron DATASET PREFIX``: write Megatron-Core ``PREFIX.bin/.idx``."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="export a dataset to another format (megatron .bin/.idx)")
    fmt = p.add_subparsers(dest="export_format", metavar="FORMAT")
    fmt.required = True
    m = fmt.add_parser("megatron", help="Megatron-Core IndexedDataset PREFIX.bin + PREFIX.idx")
    m.add_argument("dataset", help="packfmt dataset directory")
    m.add_argument("prefix", help="output prefix (writes PREFIX.bin and PREFIX.idx)")
    m.set_defaults(func=run_megatron)


def run_megatron(args: argparse.Namespace) -> int:
    from ..megatron import export_megatron

    bin_path, idx_path = export_megatron(args.dataset, args.prefix)
    print(f"wrote {bin_path} ({bin_path.stat().st_size:,} bytes) and {idx_path} ({idx_path.stat().st_size:,} bytes)")
    return 0
