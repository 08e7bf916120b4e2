"""``packfmt build ... --engine ray``: the build on Ray Data, written as a collection.

The pipeline (driver, then the cluster, then the driver)::

    plan_units (driver) ──from_items──► EncodeUnits actors (read + tokenize) ──► MemberSink (one store per task)
                                                                        └──► commit (driver): members/, manifest last

* Inputs are cut into units on the driver (``units.plan_units``), so a unit's identity depends on
  the input only; each unit is one Ray block, read and converted in an actor of a pool that loads
  the tokenizer once per actor, which yields its rows in tables of ``encode.CHUNK_ROWS`` (bounded
  memory); the sink has Ray bundle them, in order, into writes of ``records_per_member`` rows. The pool is capped below the cluster's CPUs: a pool holding every
  CPU starves Ray's other tasks and hangs (ray-project/ray#44687).
* ``preserve_order`` is set, so write tasks follow input order; the members listed in
  ``task_idx`` order hold the input records in input order, and ``merge_physical`` of the result is
  byte-identical to a local build (tokens, offsets, masks, images).
* Everything is written inside one temporary sibling of ``out`` (``.<out>.packfmt-tmp-<pid>-*``):
  write tasks publish stores into its ``staging/`` under per-attempt names; the driver renames the
  returned ones to ``members/00000...``, deletes the rest (attempts of tasks that died), writes the
  collection manifest last and renames the folder onto ``out``. A killed driver leaves only the
  temporary folder, which the next build removes (its pid is gone): nothing opens as a collection.
* Inputs and ``out`` in object storage: see ``packfmt.ray.remote`` (units planned by ranged reads,
  read by the actors; members uploaded by the write tasks, the collection manifest by the driver).
* Counts and the skip policy are the local build's: each task returns its counts and its bad
  records in order; the driver sums them into one ``Tally`` (``read = written + skipped``) and
  applies ``on_error`` before committing anything. A remote JSONL range's bad records come back
  numbered from its first line, with the line counts of the ranges: the driver makes them
  ``file:LINE`` of the object (``units.first_lines``), so each input byte is read once.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Sequence

from .._io import publish_dir, remove_stale_temps, temp_sibling
from ..engines import register
from ..errors import DatasetExistsError, InputError
from ..report_paths import build_report_paths
from ..skips import Tally
from ..storage.uri import is_remote, local_file
from .context import Job, ray_context
from .encode import _fault_once
from .units import absolute, first_lines, plan_units

__all__ = ["run_ray_build", "DEFAULT_RECORDS_PER_MEMBER", "pool_size", "staged_job", "commit"]

#: Records (lines, rows) per work unit, hence about per member store.
DEFAULT_RECORDS_PER_MEMBER = 100_000


def pool_size(cpus: float, workers: int | None) -> int:
    """Tokenizer actors: ``workers`` when given (> 1), else every CPU but one; always below the CPU count."""
    cap = max(1, int(cpus) - 1)
    return min(cap, workers) if workers and workers > 1 else cap


@contextmanager
def staged_job(out: Path, *, overwrite: bool, ray_address: str | None, progress: bool):
    """Refuse an existing ``out``, join/start Ray, make the temporary sibling (+ ``staging/``), keep order.

    On any exception the temporary folder is removed; Ray is shut down if this call started it.
    """
    out = Path(out)
    remove_stale_temps(out)  # what a killed earlier build left (its pid is gone)
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise DatasetExistsError(f"{out}: already exists (pass overwrite=True to replace it)", file=str(out),
                                 expected="no existing path", found="exists",
                                 cli=f"{out}: already exists (pass --overwrite to replace it)")
    with ray_context(ray_address, progress) as startup:
        tmp = None
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = temp_sibling(out)
            (tmp / "staging").mkdir()
            yield Job(tmp, ray_address, startup)
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise


def commit(tmp: Path, out: Path, returns: list[dict], report: dict, overwrite: bool, fault: dict | None = None) -> Path:
    """Rename the returned stores to ``members/``, drop staging, write the manifest last, publish."""
    from .. import format as F
    from ..collection.writer import (
        check_members_agree,
        collection_manifest,
        local_member_lengths,
        resolve_members,
        write_lengths,
        write_own_files,
    )

    members_dir = tmp / "members"
    members_dir.mkdir()
    sources = []
    for i, r in enumerate(r for r in returns if r["dir"] is not None):
        dst = members_dir / f"{i:05d}"
        os.rename(r["dir"], dst)
        sources.append((dst.name, dst))
        _fault_once(fault, "commit", i)  # test hook: the driver dies with k members renamed
    shutil.rmtree(tmp / "staging")  # dead attempts' folders, stores of 0 documents
    members = resolve_members(sources)  # opens each store: the structural checks of a reader
    check_members_agree(members)
    manifest, own = collection_manifest(members, tmp, files=write_lengths(tmp, local_member_lengths(members)))
    write_own_files(tmp, own)  # a member table (§2.5) from 256 members on: before the manifest
    manifest["build_report"] = report
    with open(tmp / F.MANIFEST, "wb") as fh:
        fh.write(F.canonical_json(manifest))
        fh.flush()
        os.fsync(fh.fileno())
    publish_dir(tmp, out, overwrite=overwrite)
    return out


def run_ray_build(
    inputs: Sequence[str],
    converter,
    factory: Callable[[], Any],
    out: str | os.PathLike,
    *,
    fmt: str | None,
    split: str | None,
    glob: str,
    report_base: dict,
    vocab_size: int | None = None,
    on_error: str = "fail",
    workers: int = 1,
    batch_size: int = 256,
    overwrite: bool = False,
    progress: bool = False,
    limit: int | None = None,
    skip_log: str | os.PathLike | None = None,
    ray_address: str | None = None,
    records_per_member: int = DEFAULT_RECORDS_PER_MEMBER,
    storage_options: dict | None = None,
    _fault: dict | None = None,
):
    """Build ``inputs`` on Ray Data into a collection at ``out``; same arguments as ``run_build`` plus
    ``ray_address`` (``None``: join the running Ray of this process or start a local one; ``"auto"``
    or ``ray://host:10001``: a cluster) and ``records_per_member``. ``_fault`` is a test hook.

    Inputs and ``out`` may be URLs (``storage_options`` go to fsspec in the driver, the actors and the
    write tasks): the actors read remote inputs by ranges, the write tasks upload their members and the
    driver uploads the collection manifest last (``packfmt.ray.remote``).
    """
    import ray
    from ray.data import ActorPoolStrategy

    from ..pipeline import ON_ERROR_POLICIES, BuildResult, writer_args
    from .encode import EncodeUnits
    from .remote import commit_remote, remote_job
    from .sink import MemberSink

    if on_error not in ON_ERROR_POLICIES:
        raise ValueError(f"on_error: expected one of {ON_ERROR_POLICIES}, found {on_error!r}")
    if limit is not None:
        raise InputError("limit= is not supported with engine='ray' (build a slice of the input instead)",
                         reason="unsupported_option", field="limit", expected="None", found=limit,
                         cli="--limit is not supported with --engine ray (build a slice of the input instead)")
    if records_per_member < 1:
        raise ValueError(f"records_per_member: expected >= 1, found {records_per_member}")
    wargs = writer_args(converter, vocab_size)
    units = [{**u, "seq": i} for i, u in enumerate(plan_units(list(inputs), fmt, records_per_member,
                                                                 storage_options))]
    remote_out = is_remote(str(out))
    if remote_out:
        out = str(out).rstrip("/")
        job_cm = remote_job(out, storage_options, overwrite=overwrite, ray_address=ray_address, progress=progress)
    else:
        job_cm = staged_job(Path(local_file(out)), overwrite=overwrite, ray_address=ray_address, progress=progress)
    log_file = None
    try:
        with job_cm as job:
            pool = pool_size(ray.cluster_resources().get("CPU", 1), workers)
            t0 = time.perf_counter()
            returns: list[dict] = []
            if units:
                items = [{"unit": json.dumps(u)} for u in units]
                ds = ray.data.from_items(items, override_num_blocks=len(units))
                ds = ds.map_batches(EncodeUnits, fn_constructor_args=(factory, converter.columns, split, glob,
                                                                      batch_size, _fault, storage_options),
                                    batch_size=1, batch_format="pyarrow", num_cpus=1,
                                    compute=ActorPoolStrategy(min_size=1, max_size=pool))
                sink = MemberSink(str(job.staging), wargs, _fault, rows_per_write=records_per_member,
                                  storage_options=storage_options)
                ds.write_datasink(sink)
                returns = sorted(sink.returns, key=lambda r: r["task_idx"])
            seconds = time.perf_counter() - t0
            log_file = open(skip_log, "w", encoding="utf-8") if skip_log else None
            tally = Tally(on_error, log_file)
            first = first_lines(units, {seq: n for r in returns for seq, n in r["newlines"].items()})
            for r in returns:
                tally.read += r["read"]
                tally.written += r["written"]
                tally.tokens += r["tokens"]
                tally.images += r["images"]
                for *bad, unit in r["bad"]:  # a remote JSONL range's lines count from its first line
                    tally.bad(*(bad if unit is None else absolute(tuple(bad), first[unit])))
            tally.end_batch()  # on_error="fail": the first bad record in input order stops the build
            if tally.written == 0:
                raise tally.nothing_written(str(out), report_base.get("sources", []))
            report = build_report_paths({  # no path of this host in the manifest (SECURITY A15)
                **report_base,
                "records_read": tally.read, "documents_written": tally.written,
                "skipped": dict(sorted(tally.skipped.items())), "skipped_examples": tally.examples,
                "tokens": tally.tokens, "images": tally.images, "seconds": round(seconds, 3),
                "tokens_per_second": round(tally.tokens / max(seconds, 1e-9), 1),
                "tokenizer": converter.encoder.identity, "on_error": on_error, "workers": pool,
                "engine": "ray",
                "ray": {**job.describe(), "units": len(units), "records_per_member": records_per_member,
                        "actor_pool": pool},
            }, out)
            if remote_out:
                path = commit_remote(out, storage_options, returns, report, replacing=job.replacing)
            else:
                path = commit(job.tmp, out, returns, report, overwrite, _fault)
    finally:
        if log_file is not None:
            log_file.close()
    return BuildResult(path, report)


register("ray", run_ray_build)  # build_text(..., engine="ray") finds it by name (packfmt.engines)
