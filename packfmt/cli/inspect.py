"""``packfmt inspect PATH [--json] [--plot FILE.png] [--show-pack N] [--index NAME] [--tokenizer DIR]``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser(
        "inspect", help="summarize a dataset and its pack indexes (numbers, plots, one pack's text)",
        description="Counts, document length distribution, images, loss mask, build report, and for each pack "
                    "index its fill efficiency next to what naive padding would cost on the same data.")
    p.add_argument("path", help="dataset directory or URL (s3://...: read through the local cache)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="write length / fill histograms and token grids of one batch of packs drawn "
                                                     "at random, with batch boundaries (see --batch-size)")
    p.add_argument("--show-pack", metavar="N", type=int, help="print pack N's segments and text (or token ids)")
    p.add_argument("--index", metavar="NAME", help="pack index for --show-pack / --plot (default: the only or first one)")
    p.add_argument("--tokenizer", metavar="DIR", help="tokenizer directory or tokenizer.json for decoding "
                                                     "(without it, token ids are printed)")
    p.add_argument("--batch-size", type=int, default=8, help="rows per batch of the pad-to-longest baseline and of the --plot batch "
                                                               "(default 8)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..collection import Collection
    from ..inspect import format_summary, summarize, tokenizer_mismatch
    from ..opening import open_dataset
    from ..plot import plot_summary
    from ..render import format_pack

    if args.batch_size < 1:
        print(f"packfmt inspect: error: --batch-size must be >= 1, got {args.batch_size}", file=sys.stderr)
        return 2
    if args.plot and (problem := _unwritable(args.plot)):
        print(f"packfmt inspect: error: --plot {args.plot}: {problem}; pass a file path in a folder you can write to",
              file=sys.stderr)
        return 2
    store = open_dataset(args.path)
    if args.plot and isinstance(store, Collection):
        print(f"packfmt inspect: error: --plot draws a single store; {args.path} is a collection: inspect it without "
              "--plot, or plot one of its members (listed by `packfmt inspect` without --plot)", file=sys.stderr)
        return 2
    names = store.pack_index_names()
    if args.index is not None:
        store.pack_index(args.index)  # a FormatError listing the indexes there are (or how to create one)
    summary = summarize(store, progress=sys.stderr.isatty(), batch_size=args.batch_size)
    if args.tokenizer and (problem := tokenizer_mismatch(summary["tokenizer"], args.tokenizer)):
        print(f"packfmt inspect: warning: --tokenizer: {problem}; pass the tokenizer the dataset was built with",
              file=sys.stderr)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print(format_summary(summary))
    if args.plot:
        try:
            out = plot_summary(store, summary, args.plot, index_name=args.index, batch_size=args.batch_size)
        except OSError as exc:
            print(f"packfmt inspect: error: --plot {args.plot}: cannot write it ({exc.strerror or exc}); "
                  f"pass a file path in a folder you can write to", file=sys.stderr)
            return 1
        print(f"wrote {out}", file=sys.stderr if args.json else sys.stdout)
    if args.show_pack is not None:
        return _show_pack(store, names, args, format_pack)
    return 0


def _unwritable(path: str) -> str | None:
    """Why ``path`` cannot be written (checked before the summary's work), or None."""
    p = Path(path)
    if p.is_dir():
        return "is a folder"
    parent = p.parent
    if not parent.is_dir():
        return f"folder {parent} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        return "permission denied"
    return None


def _show_pack(store, names: list[str], args: argparse.Namespace, format_pack) -> int:
    index = store.pack_index(args.index or (names[0] if names else None))
    if not 0 <= args.show_pack < index.num_packs:
        print(f"packfmt inspect: error: --show-pack {args.show_pack}: index {index.name!r} has packs "
              f"0..{index.num_packs - 1}", file=sys.stderr)
        return 1
    decode = _decoder(args.tokenizer)
    stream = sys.stderr if args.json else sys.stdout
    print(format_pack(index, args.show_pack, decode), file=stream)
    return 0


def _decoder(tokenizer_arg: str | None):
    """--tokenizer, else None (token ids). A manifest's tokenizer.path is never opened (spec §2.2)."""
    from ..inspect import load_decoder

    if not tokenizer_arg:
        return None
    if not Path(tokenizer_arg).exists():
        print(f"packfmt inspect: warning: --tokenizer {tokenizer_arg}: not found; printing token ids", file=sys.stderr)
        return None
    return load_decoder(tokenizer_arg)
