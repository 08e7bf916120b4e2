"""A collection written where a source or the destination is a URL (spec/COLLECTION.md §2; spec/SECURITY.md A17).

Remote sources are fetched whole into the cache (``mirror.fetch_dataset``) and written from there; a remote
destination is written where the cache mirrors it and uploaded with its manifest last (``storage.upload``).
"""

from __future__ import annotations

from ..errors import WriteError
from ..storage import uri
from ..storage.upload import remote_output
from .mirror import fetch_dataset

__all__ = ["merge_remote"]


def merge_remote(write, sources, dst, *, overwrite: bool, physical: bool, storage_options: dict | None = None, **kw):
    """``write_collection`` / ``merge_physical`` where a source or ``dst`` is a URL.

    Remote sources are fetched into the cache; a remote ``dst`` is written where the cache mirrors it and
    uploaded (manifest last), and None is returned (the caller opens ``dst``); a local ``dst`` returns what
    ``write`` returned. A collection records member paths relative to itself, so a collection in
    object storage lists only members on the same file system, and a local one lists no remote member.
    """
    dst_remote = uri.is_remote(str(dst))
    local_sources, pins = [], []
    for name, path in sources:
        if uri.is_remote(str(path)):
            if not physical and not dst_remote:
                raise WriteError(f"{path}: a local collection cannot list a member in object storage (its files live in "
                                 "a cache that may be evicted); write the collection to object storage too, or copy "
                                 "the members with merge_physical", file=str(path), expected="a local member",
                                 found="a URL", cli=f"{path}: a local collection cannot list a member in object storage; "
                                 "write it to object storage too (-o s3://...), or copy the members with --physical")
            if not physical and (uri.root_key(str(path), storage_options) != uri.root_key(str(dst), storage_options)
                                 or uri.bucket_of(str(path)) != uri.bucket_of(str(dst))):
                raise WriteError(f"{path}: not in the bucket of {dst} (another bucket, scheme or endpoint); a collection "
                                 "in object storage lists members in its own bucket (readers refuse others, "
                                 "spec/SECURITY.md A17): write it in the members' bucket, or copy them with "
                                 "merge_physical", file=str(path), expected=f"a member in bucket {uri.bucket_of(str(dst))}",
                                 found=str(path), cli=f"{path}: not in the bucket of {dst}; write the collection in "
                                 "the members' bucket, or copy the members with --physical")
            fetched = fetch_dataset(str(path), storage_options)
            pins += fetched.pins
            local_sources.append((name, fetched.path))
        else:
            if dst_remote and not physical:
                raise WriteError(f"{path}: a collection in object storage cannot list a local member; upload it first "
                                 "(packfmt merge --physical SRC -o s3://..., or build it there)", file=str(path),
                                 expected="a URL", found="a local path")
            local_sources.append((name, uri.local_file(path)))
    if not dst_remote:
        return write(local_sources, uri.local_file(dst), overwrite=overwrite, **kw)
    with remote_output(str(dst), storage_options, overwrite=overwrite) as local:
        write(local_sources, local, overwrite=False, **kw)
    return None  # written to the URL ``dst``: the caller opens it (packfmt.opening)
