"""``packfmt merge SRC... -o DST``: many stores and collections as one collection, copying no token byte;
with ``--physical``, as one contiguous store."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("merge", help="make a collection of stores / collections (no token byte copied), "
                                     "or with --physical one contiguous store",
                       description="List stores and collections, in order, as one collection (spec/COLLECTION.md). "
                                   "Collection-wide document ids follow the order given. With --physical, copy "
                                   "them into one store instead (streamed, bounded memory).")
    p.add_argument("sources", nargs="+", metavar="[NAME=]SRC",
                   help="a store or collection directory; NAME names the member (default: the directory name); "
                        "a collection's members are named NAME.MEMBER")
    p.add_argument("-o", "--output", required=True, metavar="DST", help="the collection (or store) directory or URL (s3://...) to write")
    p.add_argument("--physical", action="store_true",
                   help="write one contiguous store (tokens, offsets, masks and images copied); the pack indexes "
                        "of a single source collection are carried, those of member stores are not")
    p.add_argument("--member-table", choices=("auto", "yes", "no"), default="auto",
                   help="keep the member list in members.bin + member_names.txt (collection format 2.0, "
                        "spec/COLLECTION.md §2.5: read in one pass, for many members) instead of the manifest's JSON "
                        "array (format 1.3, readable by 1.3 readers); auto: from 256 members on")
    p.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..collection import parse_source, write_collection

    # a pack-ordered layout source (its lookahead tokens are labels, COLLECTION §9.2) is refused by write_collection
    # and merge_physical from its manifest alone, before anything is fetched or written
    sources = [parse_source(s) for s in args.sources]
    if args.physical:
        if args.member_table != "auto":
            from ..errors import WriteError

            raise WriteError("--member-table lists the members of a collection; --physical writes one store: drop one "
                             "of them", field="member_table", expected="auto with --physical", found=args.member_table)
        return _physical(args, sources)
    table = {"auto": None, "yes": True, "no": False}[args.member_table]
    coll = write_collection(args.output, sources, overwrite=args.overwrite, member_table=table)
    listing = "member table" if coll.manifest.raw["members"] == "table" else "member array"
    print(f"wrote collection {coll.location}: {len(coll.members):,} members ({listing}, format "
          f"{coll.manifest.raw['format_version']}), {coll.num_documents:,} documents, {coll.num_tokens:,} tokens")
    for m in coll.members[:10]:
        print(f"  {m.name}: {m.documents:,} documents, {m.tokens:,} tokens ({m.path})")
    if len(coll.members) > 10:
        print(f"  ... and {len(coll.members) - 10:,} more")
    for key, names in coll.manifest.unified.items():  # spec/COLLECTION.md §2.3
        from ..collection.unify import MEANING

        shown = ", ".join(names[:10]) + (f" and {len(names) - 10:,} more" if len(names) > 10 else "")
        print(f"  unified {key}: {shown} ({MEANING[key]})")
    return 0


def _physical(args: argparse.Namespace, sources) -> int:
    from pathlib import Path

    from ..collection import merge_physical
    from ..index import list_pack_indexes

    store = merge_physical(sources, args.output, overwrite=args.overwrite)
    report = store.manifest.raw["build_report"]
    files = store.manifest.files
    print(f"wrote store {store.location}: {len(report['members']):,} members, {store.num_documents:,} documents, "
          f"{store.num_tokens:,} tokens, {store.num_images:,} images ({report['bytes_copied']:,} bytes copied)")
    print("  files: " + ", ".join(f"{name} ({files[name].bytes:,} bytes)" for name in sorted(files)))
    indexes = report["pack_indexes"]
    if indexes["carried"]:
        print("  pack indexes carried (rebound to the new store): " + ", ".join(indexes["carried"]))
    for name, why in indexes["not_carried"].items():
        print(f"  pack index {name} not carried: {why}")
    member_indexes = sum(len(list_pack_indexes(Path(store.path) / m["path"])) for m in report["members"])  # relative
    if member_indexes:
        print(f"  {member_indexes:,} pack index(es) of member stores not carried (their document ids are the "
              "member's own)")
    if not indexes["carried"]:
        print(f"  next: pack the merged store with `packfmt pack {store.location} --capacity N`")
    return 0
