"""Write a collection manifest over existing stores and collections, copying no token byte (``packfmt merge``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import xxhash

from .. import format as F
from .._io import checksum_file, publish_dir, remove_stale_temps, staging, write_durably
from ..errors import DatasetExistsError, WriteError
from ..reader import Store
from ..version import __version__
from .lengths import LENGTHS_DTYPE, LENGTHS_FILE, lengths_record, store_lengths
from .manifest import (
    COLLECTION_FORMAT_NAME,
    Member,
    check_member_name,
    collection_reader,
    is_collection,
    parse_collection_manifest,
)
from .layout import refuse_laid_out
from .member_table import DEFAULT_TABLE_MIN, TABLE_VALUE, table_record
from .reader import Collection
from .versions import ARRAY_VERSION, TABLE_VERSION, version_str
from .unify import SHARED_KEYS, unify

__all__ = ["write_collection", "collection_manifest", "parse_source", "resolve_members", "check_members_agree",
           "write_lengths", "local_member_lengths", "write_own_files",
           "refuse_laid_out_sources"]


def parse_source(text: str) -> tuple[str | None, str]:
    """``NAME=PATH`` or ``PATH`` (a ``=`` inside an existing path is part of the path)."""
    name, sep, path = text.partition("=")
    if sep and name and not os.path.exists(text):
        return name, path
    return None, text


def resolve_members(sources: list[tuple[str | None, str | os.PathLike]], *,
                    opener=Store) -> list[tuple[Member, Path, dict]]:
    """Every member the sources contribute, in order: ``(member with an absolute path, its directory, shared keys)``.

    A store contributes itself (named ``NAME`` or its directory name); a collection contributes its
    members, named ``<NAME or its directory name>.<member name>``. ``opener(path)`` opens a store
    (``Store``; the physical merge passes one that reads the manifest only) and must give an object
    with ``path`` and ``manifest``; a collection's members are checked against its record (C2, C3).
    """
    out = []
    for name, path in sources:
        path = Path(path)
        obj = F.read_json(path / F.MANIFEST, file=str(path / F.MANIFEST))
        if is_collection(obj):
            coll = Collection(path)
            prefix = check_member_name(name or path.resolve().name, file=str(path), field="name")
            for m, member in enumerate(coll.members):
                store = coll._check_member(m, opener(coll.member_path(m)))
                out.append((Member(f"{prefix}.{member.name}", str(store.path.resolve()), member.documents,
                                   member.tokens, member.images, member.manifest), store.path, _shared(store)))
        else:
            store = opener(path)
            label = check_member_name(name or path.resolve().name, file=str(path), field="name")
            sm = store.manifest
            out.append((Member(label, str(path.resolve()), sm.num_documents, sm.num_tokens, sm.num_images,
                               checksum_file(path / F.MANIFEST)), path, _shared(store)))
    return out


def check_members_agree(members: list[tuple[Member, Path, dict]], *,
                        unique_names: bool = True) -> tuple[dict, dict]:
    """Members share token dtype, vocabulary, tokenizer identity and special tokens but ``image`` (C2);
    with ``unique_names``, no two have one name. Returns the collection's shared keys and its
    ``unified`` record (spec/COLLECTION.md §2.3: members without a loss mask or an image id)."""
    if not members:
        raise WriteError("merge: no sources given", field="sources", expected="at least one store or collection",
                         found="none")
    shared, unified = unify([(m.name, m.path, sh) for m, _, sh in members])
    seen: dict[str, Member] = {}
    for member, _, _ in members:
        if unique_names and member.name in seen:
            raise WriteError(f"merge: two members are named {member.name!r} ({seen[member.name].path} and "
                             f"{member.path}); name them with NAME=PATH", field="name", expected="unique member names",
                             found=member.name, cli=None)
        seen[member.name] = member
    return shared, unified


def prepare_destination(dst: Path, overwrite: bool) -> None:
    """Recover what an interrupted write left beside ``dst``; refuse an existing ``dst`` unless overwriting."""
    remove_stale_temps(dst)
    if (dst.exists() or dst.is_symlink()) and not overwrite:
        raise DatasetExistsError(f"{dst}: already exists (pass overwrite=True to replace it)", file=str(dst),
                                 expected="no existing path", found="exists",
                                 cli=f"{dst}: already exists (pass --overwrite to replace it)")
    dst.parent.mkdir(parents=True, exist_ok=True)


def _shared(store: Store) -> dict:
    """The member's ``SHARED_KEYS`` (compared, C2) and its ``build_report`` (never compared: what a refusal's fix
    command is made of, ``unify``)."""
    raw = store.manifest.raw
    return {**{key: raw.get(key) for key in SHARED_KEYS}, "build_report": raw.get("build_report")}


def local_member_lengths(members: list[tuple[Member, Path, dict]]) -> np.ndarray:
    """int64: every document's length, member after member, from the ``doc_offsets.bin`` of each (local, opened
    and checked already: V13) member store, for ``doc_lengths.bin``."""
    parts = [store_lengths(path, m.documents) for m, path, _ in members]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def write_lengths(directory: Path, lengths: np.ndarray) -> dict:
    """``doc_lengths.bin`` written (durably) into ``directory``, a collection being staged; its ``files`` table."""
    data, files = lengths_record(lengths)
    write_durably(Path(directory) / LENGTHS_FILE, data)
    return files


def collection_manifest(members: list[tuple[Member, Path, dict]], base: Path, *, files: dict,
                        table: bool | None = None) -> tuple[dict, dict[str, bytes]]:
    """The manifest (§2) of a collection at ``base`` over checked ``members`` (paths made relative to ``base``), and
    the files of its member table to write before it (``{}`` when the members are a JSON array).

    ``files``: the table listing its ``doc_lengths.bin`` (``write_lengths``, or ``lengths.lengths_record`` where it
    is uploaded), which every writer writes (§2.4). ``table``: keep the member list as a member table (§2.5,
    format 2.0; an array's collection says 1.3, which every 1.3 reader reads); None: from ``DEFAULT_TABLE_MIN``
    members on, when every path can be a line of it."""
    if set(files) != {LENGTHS_FILE} or files[LENGTHS_FILE]["bytes"] != LENGTHS_DTYPE.itemsize * sum(
            m.documents for m, _, _ in members):
        raise ValueError(f"collection_manifest: files must list {LENGTHS_FILE} of every member's documents")
    shared, unified = unify([(m.name, m.path, sh) for m, _, sh in members])
    entries = [Member(m.name, Path(os.path.relpath(m.path, base)).as_posix(), m.documents, m.tokens, m.images,
                      m.manifest) for m, _, _ in members]
    if table is None:
        table = len(entries) >= DEFAULT_TABLE_MIN and not any(c in e.path for e in entries for c in "\t\n\r")
    own = table_record(entries) if table else {}
    listed = dict(files)
    for name, data in own.items():
        listed[name] = {"bytes": len(data), "checksum": "xxh3_64:" + xxhash.xxh3_64_hexdigest(data)}
    manifest = {
        "format": COLLECTION_FORMAT_NAME,
        "format_version": version_str(TABLE_VERSION if table else ARRAY_VERSION),
        "producer": {"name": "packfmt", "version": __version__},
        **shared,
        "counts": {"members": len(entries), "documents": sum(e.documents for e in entries),
                   "tokens": sum(e.tokens for e in entries), "images": sum(e.images for e in entries)},
        "members": TABLE_VALUE if table else [e.to_json() for e in entries],
        "files": listed,
        **({"unified": {key: list(names) for key, names in unified.items()}} if unified else {}),
    }
    return manifest, own


def write_own_files(directory: Path, own: dict[str, bytes]) -> None:
    """The member table's files (``collection_manifest``) written durably into ``directory``, a collection being
    staged, before its manifest."""
    for name, data in own.items():
        write_durably(Path(directory) / name, data)


def refuse_laid_out_sources(sources, storage_options: dict | None = None) -> None:
    """``refuse_laid_out(merge=True)`` for every source of a merge (``(name, path)`` pairs or paths), before
    anything is read or written but their manifests: a store, or a collection without ``layout``, passes. A
    source in object storage is refused from its ``manifest.json`` alone (``storage.ranges.dataset_manifest``:
    no member is fetched), naming the URL the user gave, not the cache's copy."""
    from ..storage import is_remote, is_url, local_file

    for source in sources:
        path = source[1] if isinstance(source, tuple) else source
        if is_remote(str(path)):
            from ..storage.ranges import dataset_manifest

            where = str(path).rstrip("/")
            obj, read = dataset_manifest(where, storage_options)
        else:
            where = str(local_file(path) if is_url(str(path)) else path)
            file = str(Path(where) / F.MANIFEST)
            obj, read = F.read_json(Path(file), file=file), collection_reader(where)
        if is_collection(obj) and "layout" in obj:
            refuse_laid_out(parse_collection_manifest(obj, file=f"{where}/{F.MANIFEST}", read=read), where,
                            merge=True)


def write_collection(dst: str | os.PathLike, sources: list[tuple[str | None, str | os.PathLike]], *,
                     overwrite: bool = False, storage_options: dict | None = None,
                     member_table: bool | None = None) -> Collection:
    """Write a collection at ``dst`` listing the stores of ``sources`` in order; return it opened.

    Members must agree on token dtype, vocabulary, tokenizer identity (the hash; the name without one) and
    special tokens but ``image`` (spec/COLLECTION.md C2); members with and without a loss mask or an image
    id mix, recorded in ``unified`` (§2.3); names must be unique (give ``NAME=PATH``).
    Every document's length is recorded in ``doc_lengths.bin`` (§2.4), so that packing and opening it read
    no member. ``member_table``: keep the member list in ``members.bin`` and ``member_names.txt`` (§2.5, format
    2.0; read in vectorised passes, not as JSON); None: from ``DEFAULT_TABLE_MIN`` (256) members on. The
    manifest is written last, in a temporary sibling renamed into place: a killed merge leaves nothing that
    opens as a collection.
    """
    from ..storage import is_url

    if is_url(str(dst)) or any(is_url(str(p)) for _, p in sources):  # object storage: packfmt.storage
        from ..opening import open_dataset
        from ..remote.merge import merge_remote

        refuse_laid_out_sources(sources, storage_options)  # from the manifests, before any source is fetched (§9.2)

        done = merge_remote(lambda s, d, **kw: write_collection(d, s, member_table=member_table, **kw), sources, dst,
                            overwrite=overwrite,
                            physical=False, storage_options=storage_options)
        return done if done is not None else open_dataset(str(dst), storage_options=storage_options)
    dst = Path(dst)
    refuse_laid_out_sources(sources)  # its lookahead tokens would read as inputs (spec/COLLECTION.md §9.2)
    members = resolve_members(sources)
    check_members_agree(members)
    prepare_destination(dst, overwrite)
    lengths = local_member_lengths(members)
    with staging(dst) as tmp:
        manifest, own = collection_manifest(members, dst.resolve().parent / dst.name, files=write_lengths(tmp, lengths),
                                            table=member_table)
        write_own_files(tmp, own)
        write_durably(tmp / F.MANIFEST, F.canonical_json(manifest))
        publish_dir(tmp, dst, overwrite=overwrite)
    return Collection(dst)
