"""``packfmt pack DATASET --capacity N --algorithm ALG ...``: add a pack index beside the token store."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from .. import format as F
from .. import index_format as IF


def add_parser(sub) -> None:
    p = sub.add_parser("pack", help="compute a pack index over a dataset (offline, global)",
                       description="Pack every document into packs of at most --capacity tokens and store the index "
                                   "under DATASET/packs/NAME (atomic; other indexes are untouched).")
    p.add_argument("dataset", help="dataset directory or URL (s3://...; the index is uploaded, index.json last) (a store or a collection: a collection packs every document "
                                   "of every member in one run)")
    p.add_argument("--capacity", type=int, required=True, help="tokens per pack (training sequence length)")
    p.add_argument("--algorithm", default="ffd", choices=IF.ALGORITHM_NAMES, help="packing algorithm (default: ffd)")
    p.add_argument("--name", help="index name (default: ALGORITHM-CAPACITY, plus -sSEED for first_fit_shuffle and "
                                  "shuffle_and_pack, plus -weights or -proportions for a mixture: ffd-4096, "
                                  "ffd-4096-weights; a second mixture of one kind needs its own --name, or --overwrite "
                                  "to replace the first); printed, and what PackedDataset(DATASET, NAME) reads "
                                  "(PackedDataset(DATASET) alone reads the only index there is)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffled algorithms and of the documents "
                                                        "--weights' fractions and --proportions' remainders draw (default: 0)")
    p.add_argument("--weights", metavar="NAME=W,...",
                   help="a collection only: weighted mixture, e.g. web=1,code=2.5,books=0.3 (NAME: a member or a dotted "
                        "group; others weigh 1; 0 drops a member): each document packed floor(W) times plus a "
                        "--seed-chosen fraction, two copies never in one pack (spec/COLLECTION.md §5)")
    p.add_argument("--proportions", metavar="NAME=P,...",
                   help="a collection only, instead of --weights: shares of the packed tokens, e.g. "
                        "web=0.6,code=0.3,books=0.1 (summing to 1; members no NAME names are left out): each share "
                        "met to within half a document, a member repeated in rounds when it holds too few "
                        "(spec/COLLECTION.md §5.1)")
    p.add_argument("--tokens", metavar="N", type=_token_count,
                   help="with --proportions: tokens the index holds (e.g. 1000000000 or 1e9; default: the most "
                        "that repeat no member)")
    p.add_argument("--max-docs-per-pack", type=int, help="at most K documents (segments) per pack")
    p.add_argument("--max-images-per-pack", type=int, help="at most M images per pack (image budget)")
    p.add_argument("--oversize", default="split", choices=IF.OVERSIZE_POLICIES,
                   help="documents longer than capacity: split into segments (default), truncate, or drop")
    p.add_argument("--max-lost-fraction", type=float, default=0.01, metavar="F",
                   help="warn when --oversize truncate/drop leaves out more than this share of the tokens (default 0.01)")
    p.add_argument("--materialize", action="store_true", help="also write tokens in pack order (contiguous packs)")
    p.add_argument("--shards", metavar="OUT",
                   help="then also write the packs in pack order as the collection OUT (members shards/00000, ... of "
                        "about --shard-size each, cut at pack boundaries; OUT/packs/NAME reads exactly as this index; "
                        "OUT may be s3://..., uploaded manifest last): "
                        "what a streamed collection shuffles shard by shard (spec/COLLECTION.md §9)")
    p.add_argument("--shard-size", metavar="SIZE", type=_size,  # no default to convert: argparse would import it
                   help="with --shards: bytes of tokens, loss mask and images per shard (default 256MiB)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing index of the same name (and OUT)")
    p.add_argument("--json", action="store_true", help="print the index statistics as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..collection.mixture import parse_weights
    from ..packindex import LostTokensWarning, build_pack_index, lost_tokens

    if not 0 <= args.max_lost_fraction <= 1:
        print(f"packfmt pack: error: --max-lost-fraction must be in [0, 1], got {args.max_lost_fraction}", file=sys.stderr)
        return 2
    for flag in ("capacity", "max_docs_per_pack", "max_images_per_pack"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            print(f"packfmt pack: error: --{flag.replace('_', '-')} must be >= 1, got {value}", file=sys.stderr)
            return 2
    if not 0 <= args.seed < F.SEED_LIMIT:  # the range index.json can hold (spec §4.1)
        print(f"packfmt pack: error: --seed must be in [0, 2**63), got {args.seed}", file=sys.stderr)
        return 2
    if args.weights is not None and args.proportions is not None:
        print("packfmt pack: error: --weights and --proportions are two ways to mix; give one (--weights: copies of "
              "each document; --proportions with --tokens: shares of the packed tokens)", file=sys.stderr)
        return 2
    if args.tokens is not None and args.proportions is None:
        print("packfmt pack: error: --tokens is the total of a mixture by proportion; give --proportions "
              "NAME=SHARE,... with it", file=sys.stderr)
        return 2
    if args.shards is None and args.shard_size is not None:
        print("packfmt pack: error: --shard-size is the size of the shards --shards OUT writes; give --shards with it",
              file=sys.stderr)
        return 2
    if args.shards is not None and not args.overwrite:  # refused before packing, not after
        from pathlib import Path

        from ..errors import DatasetExistsError

        if Path(args.shards).exists():
            raise DatasetExistsError(file=args.shards, expected="no existing path", found="exists",
                                     cli=f"--shards {args.shards}: already exists (pass --overwrite to replace it)")
    weights = parse_weights(args.weights) if args.weights is not None else None
    proportions = None if args.proportions is None else parse_weights(
        args.proportions, "--proportions", "SHARE", "web=0.6,code=0.3,books=0.1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LostTokensWarning)  # said below in CLI words
        index = build_pack_index(
            args.dataset, capacity=args.capacity, algorithm=args.algorithm, name=args.name, seed=args.seed,
            max_docs_per_pack=args.max_docs_per_pack, max_images_per_pack=args.max_images_per_pack,
            oversize=args.oversize, materialize=args.materialize, overwrite=args.overwrite,
            max_lost_fraction=args.max_lost_fraction, weights=weights,
            proportions=proportions, tokens=args.tokens)
    stats = index.stats
    store = index.store
    mixture = index.manifest.raw.get("mixture")
    num_tokens = store.num_tokens if mixture is None else sum(m["tokens"] for m in mixture["members"]) + (
        int(stats.get("truncated_tokens", 0)) + int(stats.get("dropped_tokens", 0)))  # the mixture's copies
    lost = lost_tokens(stats, num_tokens, args.max_lost_fraction)
    if lost["exceeded"]:
        longest = int(store.doc_lengths.max())
        print(f"packfmt pack: WARNING: --oversize {args.oversize} left out {lost['tokens']:,} of {num_tokens:,} "
              f"tokens ({lost['fraction']:.2%}), more than --max-lost-fraction {args.max_lost_fraction}; keep them "
              f"with --oversize split, or a larger --capacity (longest document: {longest:,} tokens)", file=sys.stderr)
    where = f"{store.location}/{F.PACKS_DIR}/{index.name}"  # the URL given, not the cache's mirror
    if args.json:
        shards = None if args.shards is None else _write_shards(args, index)
        print(json.dumps({"name": index.name, "path": where, "stats": stats, "lost_tokens": lost,
                          "mixture": mixture, **({"shards": shards} if shards else {})}, indent=2))
        return 0
    print(f"wrote pack index {index.name!r} to {where}")
    print(f"  read it with PackedDataset({store.location!r}, {index.name!r})")
    print(f"  {stats['packs']:,} packs of capacity {index.capacity:,} from {stats['documents']:,} "
          f"{'document copies' if mixture else 'documents'} "
          f"({stats['segments']:,} segments), algorithm {index.algorithm}")
    print(f"  fill efficiency {stats['fill_efficiency']:.2%} (one document per pack: {stats['padding_baseline_efficiency']:.2%}); "
          f"packs / lower bound {stats['packs_per_lower_bound']:.4f} "
          f"(lower bound ceil(tokens / capacity) = {stats['lower_bound']:,})")
    if stats["split_documents"] or stats["truncated_documents"] or stats["dropped_documents"]:
        print(f"  oversize: {stats['split_documents']:,} split, {stats['truncated_documents']:,} truncated "
              f"({stats['truncated_tokens']:,} tokens), {stats['dropped_documents']:,} dropped ({stats['dropped_tokens']:,} tokens)"
              f"; {lost['fraction']:.2%} of the tokens left out")
    if mixture is not None:
        from ..collection.inspect import format_mixture

        print("\n".join("  " + line for line in format_mixture(mixture)))
    print(f"  took {stats['seconds']:.3f} s")
    if args.shards is not None:
        shards = _write_shards(args, index)
        print(f"wrote {shards['members']:,} shard(s) of about {args.shard_size:,} bytes to {shards['path']} "
              f"({shards['documents']:,} documents: one per segment, {shards['lookahead_tokens']:,} with a lookahead "
              f"token); its index {index.name!r} reads as this one")
    return 0


def _write_shards(args: argparse.Namespace, index) -> dict:
    """``--shards OUT``: the packs of the index just written, in pack order, as the collection OUT."""
    from ..collection.shards import DEFAULT_SHARD_BYTES, write_shards

    if args.shard_size is None:
        args.shard_size = DEFAULT_SHARD_BYTES
    out = write_shards(index.store, index.name, args.shards, shard_bytes=args.shard_size, overwrite=args.overwrite)
    return {"path": out.location, "members": len(out.members), "documents": out.num_documents,
            "tokens": out.num_tokens, "lookahead_tokens": out.manifest.raw["layout"]["lookahead_tokens"]}


def _size(text: str) -> int:
    """``--shard-size``: bytes, with an optional unit (256MiB, 1GiB, 500MB)."""
    from ..collection.shards import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _token_count(text: str) -> int:
    """``--tokens``: a whole number, written out or as ``1e9``."""
    try:
        value = float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        value = None
    if value is None or value != value or value < 1 or value != int(value) or value >= F.SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"expected a whole number of tokens >= 1 (e.g. 1000000000 or 1e9), got {text!r}")
    return int(value)
