"""The collection manifest (spec/COLLECTION.md §2): schema, parsing, and the member-list binding.

Floor 1 like ``packfmt.format``: plain JSON checked key by key, nothing read but the manifest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import xxhash

from .. import format as F
from ..errors import FormatError, UnsupportedVersionError
from .layout import parse_layout
from .lengths import parse_collection_files
from .member_entry import NAME_RE, Member, check_member_name, check_member_path
from .member_table import TABLE_FILES, TABLE_VALUE, MemberList, MemberTable, read_table
from .unify import SHARED_KEYS, parse_unified
from .versions import (
    ARRAY_VERSION,
    COLLECTION_FORMAT_NAME,
    COLLECTION_VERSION,
    OLDEST_COLLECTION_VERSION,
    TABLE_VERSION,
    is_collection,
    parse_collection_version,
    table_allowed,
    version_str,
)

__all__ = ["COLLECTION_FORMAT_NAME", "COLLECTION_VERSION", "COLLECTION_VERSION_STR", "Member", "CollectionManifest",
           "parse_collection_manifest", "member_list_checksum", "check_member_name", "check_member_path",
           "SHARED_KEYS", "is_collection", "OLDEST_COLLECTION_VERSION", "members_json", "collection_reader", "TABLE_FILES"]

#: What this writer writes for a collection whose member list is a JSON array (readable by every 1.3 reader); one
#: with a member table (§2.5) is written as ``versions.TABLE_VERSION`` (2.0). Versions: ``collection.versions``.
ARRAY_VERSION_STR = version_str(ARRAY_VERSION)
COLLECTION_VERSION_STR = ARRAY_VERSION_STR


@dataclass(frozen=True)
class CollectionManifest:
    version: tuple[int, int]
    shared: dict  # the SHARED_KEYS values
    unified: dict  # {key of unify.UNIFIABLE: tuple of member names} (spec/COLLECTION.md §2.3); {} when none
    #: The member entries: ``MemberList`` (a JSON array) or ``MemberTable`` (§2.5), with int64 columns.
    members: MemberList | MemberTable
    num_documents: int
    num_tokens: int
    num_images: int
    raw: dict
    #: The ``files`` table (§2.4): ``{"doc_lengths.bin": FileEntry}`` or {} (none recorded).
    files: dict = field(default_factory=dict)


def member_list_checksum(members) -> str:
    """What a collection's pack index binds to (§4): ``xxh3_64`` of the canonical JSON of the ``members`` array, or,
    for a member table (§2.5), of ``members.bin`` followed by ``member_names.txt``."""
    if isinstance(members, MemberTable):
        return members.binding
    if isinstance(members, MemberList) or all(type(m) is Member for m in members):
        return "xxh3_64:" + xxhash.xxh3_64(members_json(members)).hexdigest()
    raw = [m.to_json() if isinstance(m, Member) else m for m in members]
    return "xxh3_64:" + xxhash.xxh3_64(F.canonical_json(raw)).hexdigest()


def members_json(members: tuple[Member, ...] | list[Member]) -> bytes:
    """``F.canonical_json`` of ``[m.to_json() for m in members]``, byte for byte, written directly: the
    indenting encoder is pure Python, ~10 us a member (a second at 10^5 members); ``json``'s own C string
    escaping, ints as ``repr``, keys in sorted order (tests/test_member_checks.py compares the two)."""
    if not members:
        return b"[]\n"
    enc = json.encoder.encode_basestring  # what json.dumps(ensure_ascii=False) escapes a string with
    return ("[\n" + ",\n".join(
        f'  {{\n    "documents": {int.__repr__(m.documents)},\n    "images": {int.__repr__(m.images)},\n'
        f'    "manifest": {enc(m.manifest)},\n    "name": {enc(m.name)},\n    "path": {enc(m.path)},\n'
        f'    "tokens": {int.__repr__(m.tokens)}\n  }}' for m in members) + "\n]\n").encode("utf-8")


def _count(obj: dict, key: str, *, file: str, prefix: str) -> int:
    value = F.require(obj, key, int, file=file, prefix=prefix)
    return F.nonneg(value, file=file, field=prefix + key)


def _well_formed_member(entry: Any, names: set) -> Member | None:
    """The ``Member`` of an entry that passes every check ``parse_collection_manifest`` makes of one (a name well
    formed and not in ``names``, a path as ``check_member_path``, counts exactly ints in ``[0, 2^63)``, a checksum
    string), or None: the long checks then say what is wrong, with the same words as ever."""
    if entry.__class__ is not dict:
        return None
    name, path, digest = entry.get("name"), entry.get("path"), entry.get("manifest")
    d, t, n = entry.get("documents"), entry.get("tokens"), entry.get("images")
    if not (name.__class__ is str and path.__class__ is str and digest.__class__ is str and d.__class__ is int
            and t.__class__ is int and n.__class__ is int and 0 <= d <= F.INT64_MAX and 0 <= t <= F.INT64_MAX
            and 0 <= n <= F.INT64_MAX and name not in names and NAME_RE.match(name) and F.CHECKSUM_RE.match(digest)
            and path and path[0] != "/" and "\\" not in path and "\0" not in path):
        return None
    wrapped = f"/{path}/"  # an empty component makes "//", a "." one "/./" (check_member_path's split, without it)
    if "//" in wrapped or "/./" in wrapped:
        return None
    return Member(name, path, d, t, n, digest)


def parse_collection_manifest(obj: dict, *, file: str = F.MANIFEST, read=None) -> CollectionManifest:
    """Check C1 (spec/COLLECTION.md §3); raise ``FormatError`` naming the first bad field.

    ``read(name, at_most)``: the bytes of the collection's own file ``name`` (at most ``at_most``; raises
    ``FileNotFoundError``), needed when the member list is a table (§2.5; ``collection_reader(root)``)."""
    fmt = obj.get("format")
    if fmt != COLLECTION_FORMAT_NAME:
        raise UnsupportedVersionError(file=file, field="format", expected=repr(COLLECTION_FORMAT_NAME), found=repr(fmt))
    version = parse_collection_version(F.require(obj, "format_version", str, file=file), file=file)
    producer = F.require(obj, "producer", dict, file=file)
    F.require(producer, "name", str, file=file, prefix="producer.")
    F.require(producer, "version", str, file=file, prefix="producer.")
    vocab = F.require(obj, "vocab_size", int, file=file)
    if not 1 <= vocab <= F.MAX_VOCAB_SIZE:
        raise FormatError(file=file, field="vocab_size", expected=f"integer in [1, {F.MAX_VOCAB_SIZE}]", found=vocab)
    dtype = F.require(obj, "token_dtype", str, file=file)
    if dtype != F.token_dtype_for_vocab(vocab):
        raise FormatError(file=file, field="token_dtype", expected=repr(F.token_dtype_for_vocab(vocab)), found=repr(dtype))
    tokenizer = F.require(obj, "tokenizer", dict, file=file)
    F.require(tokenizer, "name", str, file=file, prefix="tokenizer.")
    F.require(tokenizer, "hash", (str, type(None)), file=file, prefix="tokenizer.")
    special = F.require(obj, "special_tokens", dict, file=file)
    F.require(special, "image", (int, type(None)), file=file, prefix="special_tokens.")
    loss_mask = F.require(obj, "loss_mask", bool, file=file)
    counts = F.require(obj, "counts", dict, file=file)
    totals = {k: _count(counts, k, file=file, prefix="counts.") for k in ("members", "documents", "tokens", "images")}
    documents = totals["documents"]
    raw_members = obj.get("members")
    if raw_members == TABLE_VALUE and table_allowed(version):  # §2.5: the member list is two files
        files = parse_collection_files(obj, version, documents, file=file, table=True)
        if read is None:
            raise FormatError(file=file, field="members", expected="an array (this caller reads no member table)",
                              found=repr(TABLE_VALUE))
        members = read_table(read, files, totals["members"], file=file)
        sums = {"members": len(members), "documents": _column_sum(members.documents),
                "tokens": _column_sum(members.tokens), "images": _column_sum(members.images)}
    else:
        if not isinstance(raw_members, list):
            expected = 'an array, or "table" (format 2.0, or the withdrawn 1.4; §2.5)' if table_allowed(version) else "list"
            raise FormatError(file=file, field="members", expected=expected, found=repr(raw_members)[:200])
        members = MemberList(_parse_member_array(raw_members, file))
        files = None  # after the sums: a wrong count is named as such, not as a wrong doc_lengths.bin size
        sums = {"members": len(members), "documents": sum(m.documents for m in members),
                "tokens": sum(m.tokens for m in members), "images": sum(m.images for m in members)}
    for key, value in sums.items():
        if totals[key] != value:
            raise FormatError(file=file, field=f"counts.{key}", expected=f"{value} (the sum over members)",
                              found=totals[key])
    shared = {"vocab_size": vocab, "token_dtype": dtype, "tokenizer": tokenizer, "special_tokens": special,
              "loss_mask": loss_mask}
    unified = parse_unified(obj, members.names if "unified" in obj else [], shared, version, file=file)
    parse_layout(obj, version, file=file)  # 1.3: a pack-ordered layout (spec/COLLECTION.md §9)
    if files is None:  # 1.3: doc_lengths.bin (§2.4); after the other keys, each named by its own error
        files = parse_collection_files(obj, version, documents, file=file, table=False)
    return CollectionManifest(version, shared, unified, members, sums["documents"], sums["tokens"], sums["images"],
                              obj, files)


def _column_sum(column) -> int:
    """The exact sum of a non-negative int64 column (Python ints past 2^63: C1 then reports the count)."""
    return int(column.sum()) if column.size and int(column.max()) <= F.INT64_MAX // column.size else sum(column.tolist())


def _parse_member_array(raw_members: list, file: str) -> list[Member]:
    """The entries of a JSON ``members`` array, each checked (§2.1, §2.2)."""
    members, names = [], set()
    for i, entry in enumerate(raw_members):
        member = _well_formed_member(entry, names)
        if member is not None:  # the checks below, inlined: a member entry costs ~2 us, not ~10 (10^5 members)
            names.add(member.name)
            members.append(member)
            continue
        where = f"members[{i}]."
        if not isinstance(entry, dict):
            raise FormatError(file=file, field=f"members[{i}]", expected="object", found=repr(entry))
        name = check_member_name(F.require(entry, "name", str, file=file, prefix=where), file=file, field=where + "name")
        if name in names:
            raise FormatError(file=file, field=where + "name", expected="a name no other member has", found=repr(name))
        names.add(name)
        path = check_member_path(F.require(entry, "path", str, file=file, prefix=where), file=file, field=where + "path")
        digest = F.require(entry, "manifest", str, file=file, prefix=where)
        if not F.CHECKSUM_RE.match(digest):
            raise FormatError(file=file, field=where + "manifest", expected='"xxh3_64:" + 16 lowercase hex digits',
                              found=repr(digest))
        members.append(Member(name, path, *(_count(entry, k, file=file, prefix=where)
                                            for k in ("documents", "tokens", "images")), digest))
    return members


def collection_reader(root):
    """``read`` for ``parse_collection_manifest`` of the collection directory ``root``."""
    import os

    def read(name: str, at_most: int) -> bytes:
        with open(os.path.join(os.fspath(root), name), "rb") as fh:
            # no more than the file holds: ``at_most`` comes from a files table, and read(n) allocates n bytes first
            return fh.read(min(at_most, os.fstat(fh.fileno()).st_size + 1))

    return read
