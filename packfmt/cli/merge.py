"""``packfmt merge SRC... -o DST``: many stores and collections as one collection, copying no token byte."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("merge", help="make a collection of stores / collections (no token byte copied)",
                       description="List stores and collections, in order, as one collection (spec/COLLECTION.md). "
                                   "Collection-wide document ids follow the order given.")
    p.add_argument("sources", nargs="+", metavar="[NAME=]SRC",
                   help="a store or collection directory; NAME names the member (default: the directory name); "
                        "a collection's members are named NAME.MEMBER")
    p.add_argument("-o", "--output", required=True, metavar="DST", help="the collection directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..collection import parse_source, write_collection

    coll = write_collection(args.output, [parse_source(s) for s in args.sources], overwrite=args.overwrite)
    print(f"wrote collection {coll.path}: {len(coll.members):,} members, {coll.num_documents:,} documents, "
          f"{coll.num_tokens:,} tokens")
    for m in coll.members[:10]:
        print(f"  {m.name}: {m.documents:,} documents, {m.tokens:,} tokens ({m.path})")
    if len(coll.members) > 10:
        print(f"  ... and {len(coll.members) - 10:,} more")
    return 0
