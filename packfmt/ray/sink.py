"""The Datasink of a Ray build: one member store per write task, in a per-attempt staging folder.

Each write task turns its blocks of record rows (``encode.EncodeUnits``) into one packfmt store
with the ordinary ``DatasetWriter`` (atomic publish inside the staging folder), applying the
local build's per-document rule (``packfmt.pipeline.write_doc``). Its folder is named
``<task_idx>-<attempt uuid>``: a task Ray retries (its process died) writes a new folder, never
into the dead attempt's, and only the folder a task *returns* is ever committed. What the task
returns (counts, its bad records in order) is all the driver needs to commit and to report:
the driver sorts returns by ``task_idx`` (Ray keeps input order with ``preserve_order``). A bad
record of a remote JSONL range is returned with its line relative to its unit and the unit's
``seq`` (``bad`` entries are ``(file, line, reason, message, cli, unit)``), and the line counts of
the units whose rows the task wrote (``newlines``): the driver makes the lines absolute
(``units.first_lines``).

With an output in object storage (``staging`` is ``s3://.../members``) the task writes its store
into a temporary folder of its own node (one that a killed attempt left there is removed by the
next write task on that node), reads back its member entry (``resolve_members``: counts
and the xxh3 of its manifest), uploads it to ``staging/<task_idx>-<attempt uuid>/`` with its
manifest last (``storage.upload.upload_tree``, spec/FORMAT.md §5.4) and removes the local copy. An
attempt that fails removes what it uploaded; what a killed attempt left is removed by the driver
before it writes the collection manifest (``remote.commit_remote``).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import uuid
from pathlib import Path

from ray.data import Datasink
from ray.data.block import BlockAccessor

from .encode import _fault_once, decode_row

__all__ = ["MemberSink"]


class MemberSink(Datasink):
    """Writes member stores under ``staging``; ``returns`` holds the write returns after the job."""

    def __init__(self, staging: str, writer_args: dict, fault: dict | None = None,
                 rows_per_write: int | None = None, storage_options: dict | None = None) -> None:
        self.staging = str(staging)
        self.storage_options = storage_options
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
        from ..storage import is_remote
        from ..writer import DatasetWriter

        name = f"{ctx.task_idx:06d}-{uuid.uuid4().hex[:8]}"
        remote = is_remote(self.staging)
        node_tmp = None
        if remote:  # a folder of this node's temp dir; what killed attempts left there is removed first
            from .._io import remove_stale_temps, temp_sibling

            target = Path(tempfile.gettempdir()) / "packfmt-ray-member"
            remove_stale_temps(target)
            node_tmp = temp_sibling(target)
        path = (node_tmp if remote else Path(self.staging)) / name
        writer = DatasetWriter(path, **self.writer_args)
        bad: list[tuple] = []
        newlines: dict[int, int] = {}  # seq -> lines of each remote JSONL range among the rows
        unit = None  # the seq of the unit the current row's line is relative to, or None (an absolute line)

        class Recorder(Tally):  # keeps each bad record raw, in order, for the driver's one Tally
            def bad(self, file, line, reason, message, cli=None):
                bad.append((file, line, reason, message, cli, unit))

        tally = Recorder("skip")
        try:
            for block in blocks:
                for row in BlockAccessor.for_block(block).to_arrow().to_pylist():
                    unit = row["unit"]
                    if row["newlines"] is not None:  # a unit's line count, no record
                        newlines[unit] = row["newlines"]
                        continue
                    file, line, out = decode_row(row)
                    tally.read += 1
                    if row["reason"] is not None:
                        tally.bad(file, line, *out)
                    else:  # empty tokens and ids out of range are skips here, as in a local build
                        write_doc(writer, tally, file, line, out)
                    if tally.read == 2:  # test hook: die with part of the store written
                        _fault_once(self.fault, "write", ctx.task_idx)
            member = None
            if tally.written:
                written = str(writer.finalize())
                if remote:
                    member, written = self._upload(Path(written), name), name
            else:
                writer.abort()  # every record of the block skipped: no member for it
                written = None
        except BaseException:
            writer.abort()
            if remote:
                self._remove_remote(name)
            raise
        finally:
            if node_tmp is not None:
                shutil.rmtree(node_tmp, ignore_errors=True)
        return {"task_idx": ctx.task_idx, "dir": written, "member": member, "read": tally.read,
                "written": tally.written, "tokens": tally.tokens, "images": tally.images, "bad": bad,
                "newlines": newlines}

    def _upload(self, local: Path, name: str) -> dict:
        """Upload the store (manifest last); its member entry (counts, manifest checksum), shared keys and its
        documents' lengths (the driver writes the collection's ``doc_lengths.bin`` from them: it reads no member)."""
        from ..collection.writer import local_member_lengths, resolve_members
        from ..storage.errors import storage_errors
        from ..storage.upload import upload_tree

        (member, _, shared), = resolve_members([(name, local)])  # opens the store: a reader's structural checks
        url = f"{self.staging}/{name}"
        with storage_errors(url, self.storage_options):
            upload_tree(local, url, self.storage_options)
        return {"documents": member.documents, "tokens": member.tokens, "images": member.images,
                "manifest": member.manifest, "shared": shared,
                "lengths": local_member_lengths([(member, local, shared)])}

    def _remove_remote(self, name: str) -> None:
        from ..storage.transport import remote

        try:
            fs, rpath = remote(f"{self.staging}/{name}", self.storage_options)
            if fs.exists(rpath):
                fs.rm(rpath, recursive=True)
        except Exception as exc:  # noqa: BLE001 - best effort; the driver removes unlisted prefixes before committing
            logging.getLogger(__name__).warning("%s/%s: not removed after a failed write (%s); the driver removes it "
                                                "before it commits", self.staging, name, exc)

    def on_write_complete(self, write_result) -> None:
        self.returns = list(write_result.write_returns)
