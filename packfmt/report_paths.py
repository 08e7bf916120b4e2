"""How a report a writer stores names a file: never by a path of the writing host (spec/SECURITY.md A15).

A build report (``build_report``: the sources read, the image folder, the records skipped), a physical merge's
record of its members and an export's ``export.json`` name local files relative to the dataset they are written
into (``../data/train.jsonl``), so a dataset copied to another machine carries no path of this one; URLs stay as
given (they name the object, not a host). spec/FORMAT.md §2.2, §5.3.
"""

from __future__ import annotations

import os
from pathlib import Path

from .storage.uri import is_remote, is_url, local_file

__all__ = ["report_path", "build_report_paths", "shown_message"]


def report_path(path: str | os.PathLike, dataset: str | os.PathLike, *, links: bool = False) -> str:
    """``path`` as a report written into ``dataset`` names it: a URL as given; a local path relative to the dataset
    directory (POSIX, with ``..`` as needed) when the two share a folder below the root; otherwise (a path that would
    climb to the root and down again), and for a dataset at a URL, a local path's last component only. ``links``: keep
    the links on the way (the name a user typed, e.g. of a tokenizer folder), else resolve them."""
    path = str(path)
    if is_remote(path):
        return path
    dataset = str(dataset)
    full = (lambda p: Path(os.path.abspath(p))) if links else (lambda p: Path(p).resolve())
    local = full(local_file(path) if is_url(path) else path)
    if is_remote(dataset):
        return local.name
    base = full(local_file(dataset) if is_url(dataset) else dataset)
    if Path(os.path.commonpath([local, base])) == Path(local.anchor):  # only the root in common: a path up to the root
        return local.name  # and down again would spell this host's layout out in full
    return Path(os.path.relpath(local, base)).as_posix()


def build_report_paths(report: dict, dataset: str | os.PathLike) -> dict:
    """A build report (``pipeline.run_build``, the Ray engine) with every local path it holds named by ``report_path``:
    each source's ``path`` (a Hugging Face dataset's name stays), ``settings.image_root``, and each skipped record's
    ``file`` and its mention in the example's ``message``."""
    out = dict(report)
    if isinstance(report.get("sources"), list):
        out["sources"] = [s if not isinstance(s, dict) or s.get("format") == "hf" or not isinstance(s.get("path"), str)
                          else {**s, "path": report_path(s["path"], dataset)} for s in report["sources"]]
    settings = report.get("settings")
    if isinstance(settings, dict) and isinstance(settings.get("image_root"), str):
        out["settings"] = {**settings, "image_root": report_path(settings["image_root"], dataset)}
    if isinstance(report.get("skipped_examples"), list):
        out["skipped_examples"] = [_example(e, dataset) for e in report["skipped_examples"]]
    return out


def _example(example: dict, dataset) -> dict:
    file = example.get("file")
    if not isinstance(file, str) or not file or is_remote(file):
        return example
    named = report_path(file, dataset)
    return {**example, "file": named, "message": str(example.get("message", "")).replace(file, named)}


def shown_message(example: dict, dataset: str | os.PathLike) -> str:
    """A skipped record's ``message`` as this host shows it: the ``file`` a report named relative to the local
    ``dataset`` (``build_report_paths``) shown as the path it names here."""
    file, message = example.get("file"), str(example.get("message", ""))
    if not isinstance(file, str) or not file or is_url(file) or is_remote(str(dataset)) or Path(file).is_absolute():
        return message
    return message.replace(file, os.path.normpath(Path(str(dataset)).resolve() / file), 1)
