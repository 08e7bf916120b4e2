"""Build inputs in object storage: remote files and folders downloaded into a fresh temp dir (``packfmt build``)."""

from __future__ import annotations

import posixpath
from pathlib import Path

from .errors import StorageError, require_bucket, storage_errors
from .transport import remote
from .uri import is_remote, local_file

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
                fs, rpath = remote(p, storage_options)
                parent = folders.setdefault(p.rstrip("/").rsplit("/", 1)[0], str(len(folders)))
                dst = tmp / parent / posixpath.basename(rpath)
                dst.parent.mkdir(parents=True, exist_ok=True)
                try:
                    _get(fs, rpath, dst)
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


def _get(fs, rpath: str, dst: Path) -> None:
    """The object ``rpath`` downloaded to ``dst``, or the folder ``rpath`` into ``dst`` (one request a file, each
    with the deadline of its size)."""
    if not fs.isdir(rpath):
        fs.get_file(rpath, str(dst), size=fs.size(rpath))
        return
    for key, info in sorted(fs.find(rpath, detail=True).items()):
        rel = key[len(rpath):].lstrip("/")
        if not rel or info.get("type") == "directory":
            continue
        if any(part in ("", ".", "..") for part in rel.split("/")):  # a key that would climb out of the temp dir
            raise StorageError(f"{fs.url(key)}: key: expected a path below {fs.url(rpath)} (no '..' or empty "
                               f"component), found {rel!r}; nothing was written for it. Rename the object, or give "
                               "the input files one by one", file=fs.url(key), field="key",
                               expected="a plain relative path", found=rel)
        local = dst / rel
        local.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(key, str(local), size=int(info.get("size") or 0))
    dst.mkdir(parents=True, exist_ok=True)
