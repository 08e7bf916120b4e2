"""WebDataset tar shards: samples of ``{key.json, key.jpg|png|...}`` members (the AIAK pre-packing layout).

A sample is the run of consecutive members sharing a key (the WebDataset convention: the member
name up to the first dot of its base name; the rest is the member's *extension*, e.g. ``jpg``,
``0.png``, ``json``). Shards are read as a stream (``tarfile`` mode ``r|*``, ``.tar.gz`` too), one
sample in memory at a time. ``line`` is the 1-based sample number in the shard.

The record is the sample's ``json`` member (an object: ``messages`` + ``images`` for chat/LLaVA,
any fields for text), else ``{"text": <txt member>}``. Its images are members of the same sample:
each ``images`` entry names one, by extension (``"jpg"``, ``"0.png"``), by member name
(``"KEY.jpg"``) or by base name; without an ``images`` list, the sample's image members in order are
its images. Each becomes ``{"bytes": ..., "path": "SHARD:MEMBER"}``, so the multimodal converter
needs no image root. A sample without ``json``/``txt``, unparseable JSON, or an ``images`` entry
naming no member is one bad record (counted and skipped with ``on_error="skip"``, like any other).
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path
from typing import Iterator

from ..errors import InputError
from .record import Raw

#: Member extensions (last dot-part, lower case) that are images.
IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff"})


def split_name(name: str) -> tuple[str, str]:
    """``(key, extension)`` of a member name: ``"dir/abc.0.jpg" -> ("dir/abc", "0.jpg")``."""
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    return (name, "") if dot < 0 else (name[:dot], name[dot + 1:])


def iter_samples(path: str | os.PathLike) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, {extension: bytes})`` of every sample, in shard order (hidden/directory members skipped)."""
    key, members = None, {}
    with tarfile.open(path, "r|*") as tar:
        for info in tar:
            if not info.isfile():
                continue
            k, ext = split_name(info.name)
            if not ext or os.path.basename(k).startswith("."):
                continue
            if k != key and members:
                yield key, members
                members = {}
            key = k
            members[ext] = tar.extractfile(info).read()
    if members:
        yield key, members


def _bad(file: str, line: int, key: str, msg: str, reason: str, field: str, expected, found) -> InputError:
    return InputError(f"sample {key!r}: {msg}", reason=reason, file=file, line=line, field=field,
                      expected=expected, found=found)


def _find_member(entry: str, key: str, members: dict[str, bytes]) -> str | None:
    for cand in (entry, entry[len(key) + 1:] if entry.startswith(key + ".") else None,
                 split_name(os.path.basename(entry))[1]):
        if cand and cand in members:
            return cand
    return None


def sample_record(file: str, line: int, key: str, members: dict[str, bytes]) -> dict | InputError:
    """The record of one sample (module docstring), or the InputError saying why there is none."""
    if "json" in members:
        try:
            obj = json.loads(members["json"])
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            return _bad(file, line, key, f"{key}.json: malformed JSON ({exc})", "malformed_json", "json",
                        "a JSON object", "unparseable member")
        if not isinstance(obj, dict):
            return _bad(file, line, key, f"{key}.json: expected a JSON object, found {type(obj).__name__}",
                        "not_an_object", "json", "JSON object", type(obj).__name__)
    elif "txt" in members:
        try:
            obj = {"text": members["txt"].decode("utf-8")}
        except UnicodeDecodeError as exc:
            return _bad(file, line, key, f"{key}.txt: not valid UTF-8 ({exc})", "undecodable_text", "txt",
                        "UTF-8 text", "invalid bytes")
    else:
        return _bad(file, line, key, f"no json or txt member (members: {sorted(members)})", "missing_field", "json",
                    "a KEY.json or KEY.txt member", sorted(members))
    images = [ext for ext in members if ext.rsplit(".", 1)[-1].lower() in IMAGE_EXTS]
    listed = obj.get("images", obj.get("image"))
    if listed is None:
        names = images
    else:
        names = []
        for k, entry in enumerate(listed if isinstance(listed, list) else [listed]):
            entry = entry.get("path") if isinstance(entry, dict) else entry
            found = _find_member(entry, key, members) if isinstance(entry, str) else None
            if found is None:
                return _bad(file, line, key, f"images[{k}] {entry!r} is not a member of this sample; its images are "
                            f"{[f'{key}.{e}' for e in images]}", "missing_image", f"images[{k}]",
                            f"one of {images}", entry)
            names.append(found)
    if names:
        obj = {**obj, "images": [{"bytes": members[n], "path": f"{file}:{key}.{n}"} for n in names]}
    return obj


def iter_webdataset(path: str | os.PathLike) -> Iterator[Raw]:
    file = str(Path(path))
    line = 0
    try:
        for line, (key, members) in enumerate(iter_samples(path), start=1):
            yield Raw(file, line, sample_record(file, line, key, members))
    except (tarfile.TarError, EOFError, OSError) as exc:  # a truncated / corrupt shard ends it: one bad record
        yield Raw(file, line + 1, InputError(f"{file}: unreadable tar after sample {line} ({exc})",
                                             reason="unreadable_shard", file=file, line=line + 1,
                                             expected="a complete tar shard", found=type(exc).__name__))


def read(path: str | os.PathLike, opts) -> Iterator[Raw]:
    return iter_webdataset(path)


def count(path: str | os.PathLike, opts) -> None:
    return None  # known only by reading the shard
