"""The keys and types of a ``mixture`` record (spec/COLLECTION.md §5, §5.1): C5's structural check of it.

Floor 0 like ``collection.layout``: plain JSON checked key by key, before anything reads the record. The
reader checks it when it opens a collection's pack index (``PackIndex``), ``validate`` reports it, and the
``layout.source.mixture`` a pack-ordered layout copies from its source (§9.3) is checked the same way
(without the source's member names and packs, which the layout does not hold). Whether the record agrees
with the segments and what it asked for is ``collection.validate``'s (C5 deep); whether what it asked for
resolves (its keys name members, its shares plan an index) its structural part, through
``proportions.copies_of_record``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

from .. import format as F
from ..errors import FormatError

__all__ = ["MAX_WEIGHT", "check_mixture_record", "is_number_in"]

#: Largest weight a member may have (spec/COLLECTION.md §5): bounds the number of rounds.
MAX_WEIGHT = 1000


def is_number_in(value: Any, low: float, high: float) -> bool:
    """``value`` is a finite real number (an int or a float, numpy's too; not a bool) in ``[low, high]``."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    return low <= value <= high and math.isfinite(value)  # compared first: an int past a float's range is out of it


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < F.SEED_LIMIT


class _Record:
    """The checks of one record, each error naming ``file`` and the record's ``field`` (``mixture.rounds``)."""

    def __init__(self, file: str, field: str) -> None:
        self.file, self.field = file, field

    def fail(self, key: str, expected: str, found: Any) -> FormatError:
        return FormatError(file=self.file, field=f"{self.field}.{key}" if key else self.field, expected=expected,
                           found=repr(found)[:200])

    def get(self, obj: dict, key: str, types, expected: str, where: str = "") -> Any:
        """``obj[key]``, of one of ``types`` (a bool is not an int), else FormatError."""
        if key not in obj:
            raise FormatError(file=self.file, field=f"{self.field}.{where}{key}", expected=expected, found="missing")
        value = obj[key]
        types = types if isinstance(types, tuple) else (types,)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise self.fail(f"{where}{key}", expected, value)
        return value

    def numbers(self, obj: dict, key: str, low: float, high: float, what: str) -> dict:
        table = self.get(obj, key, dict, f"an object {{{what}: a number in [{low:g}, {high:g}]}}")
        for k, v in table.items():
            if not is_number_in(v, low, high):
                raise self.fail(f"{key}.{k}", f"a number in [{low:g}, {high:g}]", v)
        return table

    def counts(self, obj: dict, keys: Sequence[str], where: str) -> None:
        for key in keys:
            if not _count(self.get(obj, key, int, "an integer in [0, 2**63)", where)):
                raise self.fail(f"{where}{key}", "an integer in [0, 2**63)", obj[key])


def check_mixture_record(mixture: Any, *, file: str, field: str = "mixture", names: Sequence[str] | None = None,
                         packs: int | None = None) -> dict:
    """C5 (structural) of a ``mixture`` record: its keys and types as §5 (by weights) or §5.1 (by proportions) says,
    each count an integer in ``[0, 2^63)``, each weight in ``[0, 1000]`` and share in ``[0, 1]``, ``plan`` and
    ``shares`` keyed as ``target.proportions``. ``names``: the collection's member names, which ``members`` lists
    in order (None: not known, a layout's source's); ``packs``: ``counts.packs``, which ``rounds`` sums to. Returns
    the record; raises FormatError naming ``file`` and the field."""
    r = _Record(file, field)
    if not isinstance(mixture, dict):
        raise r.fail("", "an object (spec/COLLECTION.md §5)", mixture)
    if ("weights" in mixture) == ("target" in mixture):
        raise r.fail("", "exactly one of the keys 'weights' (a mixture by weights) and 'target' (by proportions)",
                     sorted(k for k in ("weights", "target") if k in mixture))
    by_weights = "weights" in mixture
    if not _count(r.get(mixture, "seed", int, "an integer in [0, 2**63)")):
        raise r.fail("seed", "an integer in [0, 2**63)", mixture["seed"])
    rounds = r.get(mixture, "rounds", list, "a list of pack counts, one per round")
    if not all(_count(x) for x in rounds) or (packs is not None and sum(rounds) != packs):
        total = "" if packs is None else f" summing to counts.packs={packs}"
        raise r.fail("rounds", f"a list of integers >= 0 (the packs of each round){total}", rounds)
    if by_weights:
        weights = r.numbers(mixture, "weights", 0, MAX_WEIGHT, "key")
        if not weights:
            raise r.fail("weights", "a non-empty object {member or group name: weight}", weights)
        keys = None
    else:
        keys = _target(r, mixture)
    members = r.get(mixture, "members", list, "a list of one object per member, in order")
    if names is not None and len(members) != len(names):
        raise r.fail("members", f"one entry per member ({len(names)})", f"{len(members)} entries")
    for m, entry in enumerate(members):
        _member(r, m, entry, None if names is None else names[m], keys)
    r.numbers(mixture, "proportions", 0, 1, "member name")
    return mixture


def _target(r: _Record, mixture: dict) -> list[str]:
    """``target``, ``plan`` and ``shares`` of a mixture by proportions (§5.1); the keys of ``target.proportions``."""
    target = r.get(mixture, "target", dict, "an object {proportions, tokens, total}")
    sub = _Record(r.file, f"{r.field}.target")
    keys = list(sub.numbers(target, "proportions", 0, 1, "key"))
    if not keys:
        raise sub.fail("proportions", "a non-empty object {member or group name: share}", {})
    tokens = sub.get(target, "tokens", (int, type(None)), "null or an integer in [1, 2**63)")
    if tokens is not None and not (_count(tokens) and tokens >= 1):
        raise sub.fail("tokens", "null or an integer in [1, 2**63)", tokens)
    sub.counts(target, ["total"], "")
    for key, fields in (("plan", ("tokens", "copies", "extra_documents")), ("shares", ("tokens",))):
        table = r.get(mixture, key, dict, f"an object with one entry per key of target.proportions {keys}")
        if sorted(table) != sorted(keys):
            raise r.fail(key, f"one entry per key of target.proportions {sorted(keys)}", sorted(table))
        for k, entry in table.items():
            if not isinstance(entry, dict):
                raise r.fail(f"{key}.{k}", f"an object {{{', '.join(fields)}{', share' if key == 'shares' else ''}}}",
                             entry)
            r.counts(entry, fields, f"{key}.{k}.")
            if key == "shares" and not is_number_in(r.get(entry, "share", (int, float), "a number in [0, 1]",
                                                          f"{key}.{k}."), 0, 1):
                raise r.fail(f"{key}.{k}.share", "a number in [0, 1]", entry["share"])
    return keys


def _member(r: _Record, m: int, entry: Any, name: str | None, keys: list[str] | None) -> None:
    """``members[m]``: ``name`` (the member's), ``documents`` and ``tokens``, and ``weight`` or ``key``."""
    where = f"members[{m}]."
    if not isinstance(entry, dict):
        raise r.fail(f"members[{m}]", "an object {name, documents, tokens, " + ("weight}" if keys is None else "key}"),
                     entry)
    got = r.get(entry, "name", str, "the member's name", where)
    if name is not None and got != name:
        raise r.fail(f"{where}name", f"{name!r} (member {m}'s name)", got)
    r.counts(entry, ("documents", "tokens"), where)
    if keys is None:
        if not is_number_in(r.get(entry, "weight", (int, float), f"a number in [0, {MAX_WEIGHT}]", where),
                            0, MAX_WEIGHT):
            raise r.fail(f"{where}weight", f"a number in [0, {MAX_WEIGHT}]", entry["weight"])
    else:
        key = r.get(entry, "key", (str, type(None)), f"null or one of {keys}", where)
        if key is not None and key not in keys:
            raise r.fail(f"{where}key", f"null or one of {keys} (the keys of target.proportions)", key)
