"""A Ray build with inputs or output in object storage: nothing passes through the driver's disk.

* Inputs: ``units.plan_units`` cuts remote JSONL objects into byte ranges by small ranged reads;
  the actors read each range once (one ranged GET) and number its lines from its first; the driver
  makes them absolute from the ranges' line counts the write tasks return (``units.first_lines``),
  so ``file:line`` in skip messages and ``--skip-log`` are a local build's. Each byte of a remote JSONL
  input is read once by the actors; the driver reads only what planning needs (its first 64 KiB, 64 KiB
  near each cut).
* Output (``-o s3://bucket/out``): ``remote_job`` refuses an existing dataset (unless
  ``overwrite``) and a missing bucket before any work; write tasks upload their members to
  ``out/members/<task_idx>-<attempt uuid>/`` (``sink.MemberSink``, manifest last); ``commit_remote``
  (driver, after every write task returned) deletes the manifest it replaces, deletes every object
  under ``out`` that is not a returned member (killed attempts, the replaced collection), and
  uploads the collection manifest last (spec/FORMAT.md §5.4, spec/COLLECTION.md). A failed build
  removes the members it uploaded; a killed driver leaves members without a collection manifest
  (nothing opens at ``out``; the next build at ``out`` removes them). Without ``overwrite`` only
  ``out/members/`` is swept: other objects under the prefix ``out`` are never touched.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

from ..errors import DatasetExistsError

__all__ = ["commit_remote", "remote_job"]

MEMBERS = "members"


def _listed_members(fs, rpath: str) -> set[str]:
    """The member paths the collection manifest at ``rpath`` lists (empty when there is none or it is no collection)."""
    from .. import format as F
    from ..errors import FormatError
    from ..storage.remote_json import read_json

    try:
        _, obj = read_json(fs, f"{rpath}/{F.MANIFEST}", fs.url(f"{rpath}/{F.MANIFEST}"))
    except (FileNotFoundError, FormatError):
        return set()
    from ..collection.member_table import NAMES_FILE, listed_paths

    def names() -> bytes | None:
        try:
            return fs.cat_file(f"{rpath}/{NAMES_FILE}")
        except FileNotFoundError:
            return None

    return set(listed_paths(obj.get("members"), names))


def _sweep(fs, rpath: str, keep: set[str], under: str = "") -> None:
    """Delete every object below ``rpath/under`` that is not inside one of the ``keep`` prefixes (relative paths)."""
    base = f"{rpath}/{under}".rstrip("/")
    fs.invalidate_cache(base)
    try:
        found = fs.find(base)
    except FileNotFoundError:
        return
    for key in found:
        rel = key[len(rpath) + 1:]
        if not any(rel.startswith(k.rstrip("/") + "/") for k in keep):
            fs.rm_file(key)
    fs.invalidate_cache(rpath)


@contextmanager
def remote_job(url: str, storage_options: dict | None, *, overwrite: bool, ray_address: str | None, progress: bool):
    """Refuse an existing dataset at ``url`` (unless ``overwrite``) and a missing bucket, join/start Ray.

    On an exception, the members this job's write tasks uploaded (and any other unlisted member
    prefix) are removed; a collection already at ``url`` is left as it was.
    """
    from ..storage.errors import require_bucket, storage_errors
    from ..storage.transport import remote
    from ..storage.upload import exists
    from .context import Job, ray_context

    with storage_errors(url, storage_options):
        taken = exists(url, storage_options)
        fs, rpath = remote(url, storage_options)
        if not taken:  # fail before the work, not at the upload
            require_bucket(fs, url, storage_options)
    if taken and not overwrite:
        raise DatasetExistsError(f"{url}: already exists (pass overwrite=True to replace it)", file=url,
                                 expected="no existing dataset", found="exists",
                                 cli=f"{url}: already exists (pass --overwrite to replace it)")
    with ray_context(ray_address, progress) as startup:
        job = Job(None, ray_address, startup, staging=f"{url}/{MEMBERS}")
        job.replacing = taken
        try:
            yield job
        except BaseException:
            try:
                with storage_errors(url, storage_options):
                    _sweep(fs, rpath, _listed_members(fs, rpath), under=MEMBERS)
            except Exception as exc:  # noqa: BLE001 - the build's own error is the one to report
                logging.getLogger(__name__).warning("%s/%s: members of the failed build not removed (%s); the next "
                                                    "build at %s removes them", url, MEMBERS, exc, url)
            raise


def commit_remote(url: str, storage_options: dict | None, returns: list[dict], report: dict, *,
                  replacing: bool) -> str:
    """The collection manifest over the uploaded members, in order; replaced objects removed; manifest uploaded last.

    ``replacing`` (a dataset was at ``url``, ``overwrite``): every object under ``url`` that is not a new
    member is deleted, as ``upload_tree`` does; otherwise only unlisted prefixes under ``url/members/``
    are (what killed attempts or a killed build left), never other objects that share the prefix.
    """
    from .. import format as F
    import numpy as np

    from ..collection.lengths import LENGTHS_FILE, lengths_record
    from ..collection.manifest import Member
    from ..collection.writer import check_members_agree, collection_manifest
    from ..storage.errors import storage_errors
    from ..storage.transport import remote

    members = []
    for i, r in enumerate(r for r in returns if r["dir"] is not None):
        m = r["member"]
        members.append((Member(f"{i:05d}", f"{url}/{MEMBERS}/{r['dir']}", m["documents"], m["tokens"], m["images"],
                               m["manifest"]), None, m["shared"]))
    check_members_agree(members)
    parts = [r["member"]["lengths"] for r in returns if r["dir"] is not None]  # each write task's own (sink._upload)
    lengths_bytes, files = lengths_record(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))
    manifest, own = collection_manifest(members, url, files=files)  # paths relative to url: members/<task>-<attempt>
    manifest["build_report"] = report
    keep = {f"{MEMBERS}/{r['dir']}" for r in returns if r["dir"] is not None}
    with storage_errors(url, storage_options):
        fs, rpath = remote(url, storage_options)
        fs.invalidate_cache(rpath)
        if fs.exists(f"{rpath}/{F.MANIFEST}"):
            fs.rm_file(f"{rpath}/{F.MANIFEST}")  # the replaced dataset stops existing first (§5.4)
        _sweep(fs, rpath, keep, under="" if replacing else MEMBERS)  # killed attempts; the replaced dataset
        fs.pipe_file(f"{rpath}/{LENGTHS_FILE}", lengths_bytes)  # before the manifest that lists it
        for name, data in own.items():  # the member table (§2.5), from 256 members on
            fs.pipe_file(f"{rpath}/{name}", data)
        fs.pipe_file(f"{rpath}/{F.MANIFEST}", F.canonical_json(manifest))
        fs.invalidate_cache(rpath)
    return url
