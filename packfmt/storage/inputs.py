"""Build inputs in object storage: remote files and folders downloaded into a fresh temp dir (``packfmt build``)."""

from __future__ import annotations

import posixpath
from pathlib import Path

from .errors import StorageError, require_bucket, storage_errors
from .uri import filesystem, is_remote, local_file

__all__ = ["download_inputs"]


def download_inputs(paths, storage_options: dict | None = None):
    """``(local paths, temp dir or None)``: each remote URL in ``paths`` downloaded (a folder recursively) into a
    fresh temp dir, under its own base name, files of one remote folder side by side (``PREFIX.bin`` beside
    ``PREFIX.idx``); local paths and ``file://`` URLs are passed through."""
    import tempfile

    if not any(is_remote(p) for p in paths):
        return [str(local_file(p)) for p in paths], None
    tmp = Path(tempfile.mkdtemp(prefix="packfmt-inputs-"))
    out, folders = [], {}
    try:
        for p in paths:
            if not is_remote(p):
                out.append(str(local_file(p)))
                continue
            with storage_errors(p, storage_options):
                fs, rpath = filesystem(p, storage_options)
                parent = folders.setdefault(p.rstrip("/").rsplit("/", 1)[0], str(len(folders)))
                dst = tmp / parent / posixpath.basename(rpath)
                dst.parent.mkdir(parents=True, exist_ok=True)
                try:
                    if fs.isdir(rpath):
                        fs.get(rpath + "/", str(dst) + "/", recursive=True)
                    else:
                        fs.get_file(rpath, str(dst))
                except FileNotFoundError:
                    require_bucket(fs, p, storage_options)
                    raise StorageError(f"{p}: no such object or folder; check the URL (list it with "
                                       "`aws s3 ls` or fsspec)", file=p, field="key", expected="an input file",
                                       found="missing") from None
            out.append(str(dst))
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)  # a failed download leaves no temp dir behind
        raise
    return out, tmp
