"""``packfmt cp SRC DST``: a store (with its pack indexes) or a collection (with its members) copied, verified,
between local paths and object storage, either way (``packfmt.copying``)."""

from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    p = sub.add_parser("cp", help="copy a dataset between local paths and object storage (s3://...), verified",
                       description="Copy a store with its pack indexes, or a collection with its own files, its pack "
                                   "indexes and its member stores, from SRC to DST: local to object storage, back, or "
                                   "local to local and bucket to bucket. Every file is checked against its manifest "
                                   "(size and xxh3_64) as it is copied; the manifests are written last (uploaded "
                                   "last to object storage), so a copy that fails or is stopped leaves nothing that "
                                   "opens at DST. Only the files the manifests list are copied.")
    p.add_argument("src", metavar="SRC", help="a dataset directory or URL (s3://..., gs://...; fetched into the local "
                                              "cache first, verified)")
    p.add_argument("dst", metavar="DST", help="where the copy goes: a directory or URL that holds nothing yet "
                                              "(see --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a dataset, or other files or objects, at DST (and where --outside-members copy "
                        "puts members)")
    p.add_argument("--outside-members", choices=("refuse", "copy"), default="refuse",
                   help="members of a collection outside its folder (paths with .., as `packfmt merge` writes for "
                        "stores beside it): refuse (default; the error names where each would go), or copy each "
                        "where its path points from DST, next to DST rather than inside it, so that the collection's "
                        "manifest and pack indexes are copied unchanged (one already there with the recorded "
                        "manifest is kept)")
    p.add_argument("--json", action="store_true", help="print what was copied as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..copying import copy_dataset

    done = copy_dataset(args.src, args.dst, overwrite=args.overwrite, outside_members=args.outside_members)
    if args.json:
        print(json.dumps(asdict(done), indent=2))
        return 0
    print(f"copied {done.kind} {done.src} to {done.dst}: {done.files:,} files, {done.bytes:,} bytes, each checked "
          "against its manifest (size and xxh3_64)")
    if done.kind == "collection":
        inside = done.members - len(done.outside)
        print(f"  {done.members:,} member(s): {inside:,} inside {done.dst}" + (
            f", {len(done.outside):,} beside it" if done.outside else ""))
        for where in done.outside[:10]:
            print(f"    {where}" + (" (already there, kept)" if where in done.kept else ""))
    if done.pack_indexes:
        print("  pack indexes: " + ", ".join(done.pack_indexes))
    print(f"  open it with packfmt.open({done.dst!r}); check it with `packfmt validate {done.dst}`")
    return 0
