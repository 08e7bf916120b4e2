"""Ranged reads of input files in object storage: plan work units without downloading the inputs.

A Ray build cuts its remote inputs on the driver and has each actor read only its own slice, so no
input file lands anywhere (no shared file system, no driver download). Everything here reads
through fsspec (``transport.remote``; credentials as the back end reads them, plus
``storage_options``) and only the bytes asked for:

* ``line_ranges``: byte ranges of a JSONL object cut just after a newline, found by small ranged
  reads near each cut (``WINDOW`` bytes at a time); the range size comes from the average line
  length of the file's first ``SAMPLE`` bytes, so the cuts are a function of the object alone.
* ``read_range``: one range (a unit's bytes, one ranged GET).
* ``row_groups``: the row count of each row group of a Parquet object, from its footer only.
* ``dataset_manifest``: a dataset's ``manifest.json`` alone (one GET), and ranged reads of its own files:
  what a caller checks before it mirrors the dataset (``packfmt merge`` refuses a pack-ordered layout so).

Every request is ``transport``'s (a deadline, retries, one ``StorageError`` when they are spent); other failures
are one-line ``StorageError``s naming the URL too (``errors.storage_errors``).
"""

from __future__ import annotations

import io

from .errors import StorageError, require_bucket, storage_errors
from .transport import Remote, remote

__all__ = ["dataset_manifest", "line_ranges", "open_object", "read_range", "row_groups"]

#: Bytes read to estimate the average line length of a JSONL object.
SAMPLE = 64 << 10  # enough lines for the average; an object of many small ones is not read whole
#: Bytes read at a time when looking for the newline after a cut.
WINDOW = 64 << 10


def _missing(fs, url: str, storage_options: dict | None) -> StorageError:
    require_bucket(fs, url, storage_options)
    return StorageError(f"{url}: no such object; check the URL (list it with `aws s3 ls` or fsspec)", file=url,
                        field="key", expected="an input file", found="missing")


def read_range(url: str, begin: int, end: int, storage_options: dict | None = None) -> bytes:
    """Bytes ``[begin, end)`` of the object at ``url`` (one ranged GET)."""
    with storage_errors(url, storage_options):
        fs, path = remote(url, storage_options)
        data = fs.cat_file(path, start=begin, end=end) if end > begin else b""
    if len(data) != end - begin:
        raise StorageError(f"{url}: bytes {begin}-{end}: expected {end - begin} bytes, found {len(data)} (the object "
                           "changed during the build; build again)", file=url, field="bytes",
                           expected=end - begin, found=len(data))
    return data


def _next_newline(fs, path: str, at: int, size: int) -> int:
    """The offset of the first newline at or after ``at``, or ``size`` when there is none."""
    while at < size:
        chunk = fs.cat_file(path, start=at, end=min(at + WINDOW, size))
        nl = chunk.find(b"\n")
        if nl >= 0:
            return at + nl
        at += len(chunk)
    return size


def line_ranges(url: str, records: int, storage_options: dict | None = None) -> list[tuple[int, int]]:
    """``[(begin, end), ...]`` covering the object, each ending just after a newline (the last: at the end),
    of about ``records`` lines each (estimated from the average line length of the first ``SAMPLE`` bytes)."""
    with storage_errors(url, storage_options):
        fs, path = remote(url, storage_options)
        try:
            size = int(fs.size(path))
        except FileNotFoundError:
            raise _missing(fs, url, storage_options) from None
        if size == 0:
            return []
        sample = fs.cat_file(path, start=0, end=min(SAMPLE, size))
        per_line = len(sample) / max(1, sample.count(b"\n"))
        step = max(1, int(records * per_line))
        out, begin = [], 0
        while begin < size:
            target = begin + step
            end = size if target >= size else min(size, _next_newline(fs, path, target - 1, size) + 1)
            out.append((begin, end))
            begin = end
    return out


def open_object(url: str, storage_options: dict | None = None):
    """A seekable binary file object reading ``url`` by ranged GETs (for a Parquet footer and row groups)."""
    with storage_errors(url, storage_options):
        fs, path = remote(url, storage_options)
        try:
            size = fs.size(path)
        except FileNotFoundError:
            raise _missing(fs, url, storage_options) from None
    return io.BufferedReader(_ObjectFile(fs, path, size, url, storage_options), buffer_size=1 << 20)


class _ObjectFile(io.RawIOBase):
    """The object ``path`` of ``size`` bytes, read by ranged GETs (``Remote.cat_file``) where the reader asks."""

    def __init__(self, fs: Remote, path: str, size: int, url: str, storage_options: dict | None) -> None:
        super().__init__()
        self.fs, self.path, self.size, self.url, self.so, self.pos = fs, path, size, url, storage_options, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = max(0, offset + (0, self.pos, self.size)[whence])
        return self.pos

    def readinto(self, buf) -> int:
        n = max(0, min(len(buf), self.size - self.pos))
        if not n:
            return 0
        with storage_errors(self.url, self.so):
            data = self.fs.cat_file(self.path, start=self.pos, end=self.pos + n)
        buf[:len(data)] = data
        self.pos += len(data)
        return len(data)


def row_groups(url: str, storage_options: dict | None = None) -> list[int]:
    """The row count of each row group of the Parquet object at ``url`` (reads its footer only)."""
    import pyarrow.parquet as pq

    with open_object(url, storage_options) as fh, storage_errors(url, storage_options):
        md = pq.ParquetFile(fh).metadata
        return [md.row_group(i).num_rows for i in range(md.num_row_groups)]


def dataset_manifest(url: str, storage_options: dict | None = None):
    """``(obj, read)``: the parsed ``manifest.json`` of the dataset at ``url`` (bounded and checked as
    ``format.read_json`` checks a local one: ``remote_json.read_json``) and ``read(name, at_most)``, the first bytes
    of one of its own files (a ranged GET; ``collection.manifest.collection_reader`` of a URL). Nothing is mirrored
    into the cache."""
    from .. import format as F
    from .remote_json import read_manifest

    url = url.rstrip("/")
    with storage_errors(url, storage_options):
        fs, rpath = remote(url, storage_options)
        _, obj = read_manifest(fs, f"{rpath}/{F.MANIFEST}", url, storage_options)

    def read(name: str, at_most: int) -> bytes:
        with storage_errors(f"{url}/{name}", storage_options):
            return fs.cat_file(f"{rpath}/{name}", start=0, end=at_most)  # FileNotFoundError: as the reader expects

    return obj, read
