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

A shard must end with the tar end-of-archive block. One cut short (an interrupted copy or
download), at a member boundary, inside a header or inside a member's data, yields one bad record
``truncated_shard`` naming the shard and the byte offset, in place of the sample being read when
the bytes ran out (it may be incomplete; the samples after the cut are not in the file). ``tarfile``
alone ends such a shard silently: a sample would be lost uncounted, or read without its images.
Bytes that are not a tar header where one should be are ``unreadable_shard``.
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


class ShardError(Exception):
    """A shard that ends or breaks before its end-of-archive block; ``key``: the sample being read then."""

    def __init__(self, message: str, reason: str, key: str | None) -> None:
        super().__init__(message)
        self.reason, self.key = reason, key


class _EndAwareInfo(tarfile.TarInfo):
    """Keeps the header error that ended the member list: ``tarfile`` ends it silently at a missing or cut
    header (past offset 0), as it does at the end-of-archive block (``EOFHeaderError``)."""

    @classmethod
    def fromtarfile(cls, tar):
        try:
            return super().fromtarfile(tar)
        except tarfile.HeaderError as exc:
            tar.packfmt_end = exc
            raise


def iter_samples(path: str | os.PathLike) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, {extension: bytes})`` of every sample, in shard order (hidden/directory members skipped).

    Raises ``ShardError`` where the shard is cut short or corrupt (module docstring), after the samples before.
    """
    key, members, tar, info, last = None, {}, None, None, None
    with open(path, "rb") as raw:
        try:
            tar = tarfile.open(fileobj=raw, mode="r|*", tarinfo=_EndAwareInfo)
            for info in tar:  # ``info``: the member whose data (and padding) is being read
                k, ext = split_name(info.name)
                if not info.isfile() or not ext or os.path.basename(k).startswith("."):
                    continue
                if k != key and members:
                    yield key, members
                    members = {}
                key = k
                members[ext] = tar.extractfile(info).read()
                last = info
            end = getattr(tar, "packfmt_end", None)
            if end is not None and not isinstance(end, tarfile.EOFHeaderError):
                raise end
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise _cut(str(path), raw, tar, info, last, key, exc) from None
    if members:
        yield key, members


def _cut(file: str, raw, tar, info, last, key: str | None, exc: Exception) -> ShardError:
    """Why the shard at ``file`` stopped: cut short (its bytes ran out) or not a tar from some offset on."""
    size = os.fstat(raw.fileno()).st_size
    header = exc if isinstance(exc, tarfile.HeaderError) else exc.__context__  # tarfile raises ReadError from None
    packed = tar is not None and getattr(tar.fileobj, "comptype", "tar") != "tar"
    at = (lambda n: f"byte {n} of the decompressed tar") if packed else (lambda n: f"byte {n}")
    offset = tar.offset if tar is not None else 0
    after = f"after member {last.name!r}" if last is not None else "before any member"
    sample = f"sample {key!r} may be incomplete and" if key is not None else "the"
    ends = f"the compressed file ends ({size} bytes)" if packed else f"the file ends at byte {size}"
    if isinstance(header, tarfile.TruncatedHeaderError):
        where = f"{ends}, inside the header that starts at {at(offset)} ({after})"
    elif isinstance(header, tarfile.EmptyHeaderError):
        where = f"{ends}{f' at {at(offset)}' if packed else ''}, {after}, without the tar end-of-archive block"
    elif header is None and exc.__cause__ is None and raw.tell() >= size and info is not None:
        where = (f"{ends}, inside member {info.name!r}, whose data spans {at(info.offset_data)} to "
                 f"{at(info.offset_data + info.size)}")  # (or inside its padding to a 512-byte block)
    else:
        return ShardError(f"{file}: unreadable tar at {at(offset)}, {after} ({exc}): {sample} samples after it are "
                          "not read; the shard is corrupt: write or copy it again", "unreadable_shard", key)
    return ShardError(f"{file}: truncated shard: {where}: {sample} later samples are not in the file; copy or "
                      "download the shard again", "truncated_shard", key)


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
    except ShardError as exc:  # a truncated / corrupt shard ends it: one bad record, for the sample being read
        yield Raw(file, line + 1, InputError(str(exc), reason=exc.reason, file=file, line=line + 1, field="tar",
                                             expected="a complete tar shard (ending with the end-of-archive block)",
                                             found=exc.reason))


def read(path: str | os.PathLike, opts) -> Iterator[Raw]:
    return iter_webdataset(path)


def count(path: str | os.PathLike, opts) -> None:
    return None  # known only by reading the shard
