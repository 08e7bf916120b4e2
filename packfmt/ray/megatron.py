"""``packfmt build megatron ... --engine ray``: a Megatron ``PREFIX.bin/.idx`` pair as a collection.

The tokens exist already, so there is no tokenizer stage: the driver cuts the documents into
ranges of ``records_per_member``, each write task copies its range into one member store
(``MegatronSource.documents``, the local importer's own reader, so empty documents are skipped
and counted the same way and ids >= ``vocab_size`` are refused), and the driver commits the
collection as a text build does (``build.staged_job`` / ``build.commit``). The members in order
hold the documents in order: ``merge_physical`` of the result equals ``import_megatron``'s store.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from ray.data import Datasink
from ray.data.block import BlockAccessor

from .build import DEFAULT_RECORDS_PER_MEMBER, commit, staged_job

__all__ = ["run_ray_megatron"]


class MegatronSink(Datasink):
    """One member store per write task from the document ranges of its blocks."""

    def __init__(self, prefix: str, staging: str, writer_args: dict) -> None:
        self.prefix, self.staging, self.writer_args = prefix, staging, writer_args
        self.returns: list[dict] = []

    def write(self, blocks, ctx) -> dict:
        from ..megatron import open_megatron
        from ..writer import DatasetWriter

        src = open_megatron(self.prefix)
        path = Path(self.staging) / f"{ctx.task_idx:06d}-{uuid.uuid4().hex[:8]}"
        read = written = tokens = empty = 0
        with DatasetWriter(path, **self.writer_args, extra=src.extra) as w:
            for block in blocks:
                for unit in BlockAccessor.for_block(block).to_arrow().to_pylist():
                    for toks in src.documents(unit["begin"], unit["end"]):
                        read += 1
                        if toks is None:
                            empty += 1
                            continue
                        w.add_document(toks)
                        written += 1
                        tokens += int(toks.size)
            if not written:
                w.abort()
        return {"task_idx": ctx.task_idx, "dir": str(path) if written else None, "read": read, "written": written,
                "tokens": tokens, "images": 0, "empty": empty}

    def on_write_complete(self, write_result) -> None:
        self.returns = list(write_result.write_returns)


def run_ray_megatron(prefix: str | os.PathLike, out: str | os.PathLike, *, vocab_size: int,
                     tokenizer: dict | None = None, special_tokens: dict | None = None, overwrite: bool = False,
                     ray_address: str | None = None, records_per_member: int = DEFAULT_RECORDS_PER_MEMBER,
                     progress: bool = False) -> Path:
    """As ``packfmt.megatron.import_megatron`` (same arguments), on Ray; writes a collection at ``out``."""
    import ray

    from ..megatron import open_megatron

    if records_per_member < 1:
        raise ValueError(f"records_per_member: expected >= 1, found {records_per_member}")
    prefix = str(prefix)
    n = open_megatron(prefix).num_documents  # checks the pair before anything starts
    wargs = {"vocab_size": vocab_size, "tokenizer": dict(tokenizer or {"name": f"megatron:{Path(prefix).name}",
                                                                        "hash": None}),
             "special_tokens": special_tokens}
    units = [{"begin": b, "end": min(b + records_per_member, n)} for b in range(0, n, records_per_member)]
    with staged_job(Path(out), overwrite=overwrite, ray_address=ray_address, progress=progress) as job:
        t0 = time.perf_counter()
        sink = MegatronSink(prefix, str(job.staging), wargs)
        if units:
            ray.data.from_items(units, override_num_blocks=len(units)).write_datasink(sink)
        returns = sorted(sink.returns, key=lambda r: r["task_idx"])
        empty = sum(r["empty"] for r in returns)
        report = {"source": "megatron", "records_read": sum(r["read"] for r in returns),
                  "documents_written": sum(r["written"] for r in returns),
                  "skipped": {"empty_document": empty} if empty else {}, "tokens": sum(r["tokens"] for r in returns),
                  "seconds": round(time.perf_counter() - t0, 3), "engine": "ray",
                  "ray": {**job.describe(), "units": len(units), "records_per_member": records_per_member}}
        if not any(r["dir"] for r in returns):
            from ..errors import InputError

            raise InputError(f"{prefix}: no documents (every one is empty)", reason="nothing_written", file=prefix,
                             expected=">= 1 document", found=0)
        return commit(job.tmp, Path(out), returns, report, overwrite)
