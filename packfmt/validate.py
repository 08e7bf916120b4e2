"""Check a dataset directory (and its pack indexes) against spec/: ``packfmt validate``.

Two levels:

* **structural** (default): the manifest parses; every listed file exists with its recorded size
  and the size the counts imply; offsets arrays start at 0, end at the right total and are
  monotonic (read in bounded chunks, the only data read); each pack index's ``index.json``
  parses, matches the token store's checksums and lists correctly sized files. Reads no token.
* **deep** (``deep=True``): also every file's xxh3_64 checksum, token ids < vocab_size, loss
  mask values in {0, 1}, image metadata and token spans, and for each pack index the segments
  (inside their documents, packs within capacity and parameters, every document covered as the
  recorded ``oversize`` policy says), the stats in ``index.json``, and materialized tokens.

Every finding is collected (validation does not stop at the first, except when the manifest
itself is unreadable) as a :class:`Problem` naming the file, the field, what was expected and
what was found::

    report = validate("data/ds", deep=True)
    if not report.ok:
        print(report.format())
"""

from __future__ import annotations

import os
from pathlib import Path

from . import format as F
from .errors import PackfmtError
from .validation.directory import validate_store
from .validation.report import ERROR, WARNING, Problem, Report, _Collector

__all__ = ["Problem", "Report", "validate", "ERROR", "WARNING"]


def validate(path: str | os.PathLike, deep: bool = False, progress: bool = False, decode_images: bool = True,
             *, storage_options: dict | None = None) -> Report:
    """Validate the dataset at ``path``; return a :class:`Report` with every problem found.

    Args:
        path: dataset directory.
        deep: also read every byte (checksums, token range, mask values, pack coverage).
        progress: show tqdm progress bars on stderr for a deep pass over more than 256 MiB.
        decode_images: with ``deep``, decode every image and compare its size with image_meta (V20);
            the one deep check whose cost grows with pixels rather than bytes.
    """
    from .storage import is_remote, local_file

    if is_remote(path):  # fetched whole into the cache; a file that fails the cache's check is reported, not served
        from .errors import PackfmtError
        from .remote import fetch_dataset

        try:
            fetched = fetch_dataset(path, storage_options)
        except PackfmtError as exc:
            report = Report(str(path), deep)
            where, msg = exc.file or str(path), str(exc)
            _Collector(report).add(where, None, detail=msg.removeprefix(f"{where}: "))
            return report
        obj = _collection_manifest(Path(fetched.path))
        if obj is not None:  # a doc_lengths.bin the mirror lacks is looked for in the bucket
            from .collection.validate import validate_collection

            report = validate_collection(Path(fetched.path), Report(str(fetched.path), deep), deep=deep,
                                         progress=progress, decode_images=decode_images, obj=obj,
                                         record=lambda size: _remote_record(str(path), storage_options, size))
        else:
            report = validate(fetched.path, deep=deep, progress=progress, decode_images=decode_images)
        report.path = str(path)
        return report
    root = Path(local_file(path))
    obj = _collection_manifest(root) if root.is_dir() else None
    if obj is not None:  # spec/COLLECTION.md §3: C1-C5, each member as a store
        from .collection.validate import validate_collection

        return validate_collection(root, Report(str(root), deep), deep=deep, progress=progress,
                                   decode_images=decode_images, obj=obj)
    return validate_store(root, deep=deep, progress=progress, decode_images=decode_images)


def _remote_record(url: str, storage_options: dict | None, size: int) -> bytes | None:
    """The first ``size`` bytes of the collection's ``doc_lengths.bin`` at ``url`` (spec/COLLECTION.md §2.4), or None."""
    from .collection.lengths import LENGTHS_FILE
    from .storage.errors import storage_errors
    from .storage.transport import remote

    with storage_errors(url, storage_options):
        fs, rpath = remote(url.rstrip("/"), storage_options)
        try:
            return fs.cat_file(f"{rpath}/{LENGTHS_FILE}", start=0, end=size)
        except FileNotFoundError:
            return None


def _collection_manifest(root: Path) -> dict | None:
    """The parsed JSON of ``root``'s manifest when it is a collection's (read once: ``validate_collection`` checks it)."""
    from .collection.versions import is_collection  # (not manifest: a store needs none of the collection code)

    try:
        obj = F.read_json(root / F.MANIFEST, file=F.MANIFEST)
    except PackfmtError:
        return None  # _load_manifest reports it
    return obj if is_collection(obj) else None
