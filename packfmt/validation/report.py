"""What validate reports (``Problem``, ``Report``), how checks add to it, and the chunked helpers they share."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from .. import checks
from .. import format as F
from .._io import checksum_file
from ..errors import PackfmtError, UnsupportedVersionError

ERROR, WARNING = "error", "warning"
#: Elements per chunk when scanning offsets / tokens (bounded memory whatever the file size).
CHUNK_ELEMS = 1 << 22
#: Show a progress bar (when asked for) only if the deep pass reads more than this many bytes.
PROGRESS_MIN_BYTES = 256 << 20
#: At most this many individual documents / packs are listed in one message.
MAX_LISTED = 5


@dataclass(frozen=True)
class Problem:
    """One finding. ``file`` is relative to the dataset directory (``packs/<name>/segments.bin``)."""

    file: str
    field: str | None
    expected: str | None
    found: str | None
    message: str
    severity: str = ERROR

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return self.message


@dataclass
class Report:
    """Everything ``validate`` found. ``ok`` is True when there is no error (warnings allowed)."""

    path: str
    deep: bool
    problems: list[Problem] = field(default_factory=list)
    checked: dict = field(default_factory=dict)  # what was looked at: counts, index names, bytes hashed

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict:
        return {"path": self.path, "deep": self.deep, "ok": self.ok, "errors": len(self.errors),
                "warnings": len(self.warnings), "checked": self.checked,
                "problems": [p.to_dict() for p in self.problems]}

    def format(self) -> str:
        """Human report: one line per problem, then a verdict line."""
        level = "deep" if self.deep else "structural"
        lines = [f"{p.severity.upper():7s} {p.message}" for p in self.problems]
        if self.ok:
            what = ", ".join(f"{k.replace('_', ' ')} {v:,}" if isinstance(v, int) else f"{k.replace('_', ' ')} {v}"
                             for k, v in self.checked.items() if k in ("members", "documents", "tokens", "images", "pack_indexes"))
            lines.append(f"OK: {self.path} is a valid packfmt dataset ({level} check; {what})"
                         + (f", {len(self.warnings)} warning(s)" if self.warnings else ""))
        else:
            lines.append(f"INVALID: {self.path}: {len(self.errors)} error(s), {len(self.warnings)} warning(s) ({level} check)")
        return "\n".join(lines)


class _Collector:
    """Accumulates problems with one uniform message shape: ``file: field: expected X, found Y``."""

    def __init__(self, report: Report) -> None:
        self.report = report

    def add(self, file: str, field: str | None, expected=None, found=None, detail: str | None = None,
            severity: str = ERROR) -> None:
        where = ": ".join(str(x) for x in (file, field) if x)
        if detail is not None:
            message = f"{where}: {detail}"
        else:
            message = f"{where}: expected {expected}, found {found}"
        self.report.problems.append(Problem(file, field, None if expected is None else str(expected),
                                            None if found is None else str(found), message, severity))

    def findings(self, found: list[checks.Finding]) -> bool:
        """Add the findings of ``packfmt.checks``; True when there were none."""
        for f in found:
            self.add(f.file, f.field, f.expected, f.found)
        return not found

    def from_error(self, exc: PackfmtError, default_file: str) -> None:
        file = exc.file or default_file
        message = str(exc)
        if not message.startswith(file):
            message = f"{file}: {message}"
        self.report.problems.append(Problem(file, exc.field, None if exc.expected is None else str(exc.expected),
                                            None if exc.found is None else str(exc.found), message, ERROR))


def _version_problem(exc: UnsupportedVersionError, out: _Collector, file: str) -> None:
    """A clear message for a newer (or older) major version; other format mismatches as they are."""
    if exc.field == "format_version" and isinstance(exc.found, str):
        major = int(exc.found.split(".")[0])
        reads = exc.expected if isinstance(exc.expected, str) else f"{F.FORMAT_VERSION[0]}.x"  # a collection: 1.x or 2.x
        if major > max(int(x.split(".")[0]) for x in reads.split(" or ")):
            out.add(file, "format_version", reads, exc.found,
                    detail=f"written by a newer major version of the format ({exc.found}); this packfmt reads "
                           f"{reads}. Upgrade packfmt to read it.")
            return
    out.from_error(exc, file)


def parsed_or_reported(parse, out: _Collector, file: str):
    """``parse()``, or None after reporting why it failed (a newer major version named as such)."""
    try:
        return parse()
    except UnsupportedVersionError as exc:
        _version_problem(exc, out, file)
    except PackfmtError as exc:
        out.from_error(exc, file)
    return None


def _minor_version_note(version: tuple[int, int], file: str, out: _Collector,
                        known: tuple[int, int] = F.KNOWN_VERSION) -> None:
    if version > known:
        out.add(file, "format_version", severity=WARNING,
                detail=f"newer minor version {version[0]}.{version[1]} (this packfmt knows {known[0]}.{known[1]}); "
                       "readable, fields added since are not checked")


# ----------------------------------------------------------------------------- chunked helpers
def _chunks(n: int, size: int = CHUNK_ELEMS) -> Iterator[tuple[int, int]]:
    for start in range(0, n, size):
        yield start, min(n, start + size)


def _map_file(path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if F.nbytes_of(dtype, shape) == 0:
        return np.empty(shape, dtype=dtype)
    return np.memmap(os.fspath(path), dtype=dtype, mode="r", shape=shape)  # a str: np.memmap resolves a Path


def _check_offsets(out: _Collector, file: str, arr: np.ndarray, *, rule: str, last: int, last_what: str, strict: bool,
                   unit: str) -> bool:
    """Offsets array (``packfmt.checks.offsets``): findings go to ``out``; True when all hold."""
    return out.findings(checks.offsets(arr, rule=rule, file=file, last=last, last_what=last_what, strict=strict, unit=unit))


_listed = checks.listed


def _distinct(ids: np.ndarray, n: int) -> np.ndarray:
    """Sorted distinct values of ``ids`` (each in ``[0, n)``), in O(len(ids) + n) (no sort, no hash)."""
    seen = np.zeros(n, dtype=bool)
    seen[ids] = True
    return np.flatnonzero(seen)


def _hash(path: Path, bar) -> str:
    """xxh3_64 of a file, advancing the progress bar (if any) as bytes are read."""
    return checksum_file(path, on_bytes=None if bar is None else bar.update)
