"""The Datasink of a Ray build: one member store per write task, in a per-attempt staging folder.

Each write task turns its blocks of record rows (``encode.EncodeUnits``) into one packfmt store
with the ordinary ``DatasetWriter`` (atomic publish inside the staging folder), applying the
local build's per-document rule (``packfmt.pipeline.write_doc``). Its folder is named
``<task_idx>-<attempt uuid>``: a task Ray retries (its process died) writes a new folder, never
into the dead attempt's, and only the folder a task *returns* is ever committed. What the task
returns (counts, its bad records in order) is all the driver needs to commit and to report:
the driver sorts returns by ``task_idx`` (Ray keeps input order with ``preserve_order``).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from ray.data import Datasink
from ray.data.block import BlockAccessor

from .encode import _fault_once, decode_row

__all__ = ["MemberSink"]


class MemberSink(Datasink):
    """Writes member stores under ``staging``; ``returns`` holds the write returns after the job."""

    def __init__(self, staging: str, writer_args: dict, fault: dict | None = None,
                 rows_per_write: int | None = None) -> None:
        self.staging = str(staging)
        self.rows_per_write = rows_per_write
        self.writer_args = writer_args
        self.fault = fault
        self.returns: list[dict] = []

    @property
    def min_rows_per_write(self) -> int | None:
        """Ray bundles blocks (in order) until a write task has this many record rows: one member each."""
        return self.rows_per_write

    def write(self, blocks, ctx) -> dict:
        from ..pipeline import write_doc
        from ..skips import Tally
        from ..writer import DatasetWriter

        path = Path(self.staging) / f"{ctx.task_idx:06d}-{uuid.uuid4().hex[:8]}"
        writer = DatasetWriter(path, **self.writer_args)
        bad: list[tuple] = []

        class Recorder(Tally):  # keeps each bad record raw, in order, for the driver's one Tally
            def bad(self, file, line, reason, message, cli=None):
                bad.append((file, line, reason, message, cli))

        tally = Recorder("skip")
        try:
            for block in blocks:
                for row in BlockAccessor.for_block(block).to_arrow().to_pylist():
                    file, line, out = decode_row(row)
                    tally.read += 1
                    if row["reason"] is not None:
                        tally.bad(file, line, *out)
                    else:  # empty tokens and ids out of range are skips here, as in a local build
                        write_doc(writer, tally, file, line, out)
                    if tally.read == 2:  # test hook: die with part of the store written
                        _fault_once(self.fault, "write", ctx.task_idx)
            if tally.written:
                written = str(writer.finalize())
            else:
                writer.abort()  # every record of the block skipped: no member for it
                written = None
        except BaseException:
            writer.abort()
            raise
        return {"task_idx": ctx.task_idx, "dir": written, "read": tally.read, "written": tally.written,
                "tokens": tally.tokens, "images": tally.images, "bad": bad}

    def on_write_complete(self, write_result) -> None:
        self.returns = list(write_result.write_returns)
