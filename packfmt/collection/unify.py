"""What members of a collection share, and what a collection unifies (spec/COLLECTION.md §2.3).

Members share ``vocab_size``, ``token_dtype``, the tokenizer identity (its hash when both hashes are
known, whatever the names; name and null hash otherwise) and every special token but ``image``, exactly. Two keys may differ, and the collection records which
members differ in its ``unified`` object: ``loss_mask`` (a member without a mask, in a collection
with one, reads as all-trained) and ``special_tokens.image`` (a member with a null image id, in a
collection whose image id is set). This module is the one place that rule is written: the writer
computes the collection's values and the record (``unify``), the manifest parser checks the
record's shape (``parse_unified``, C1), and the reader and ``validate`` check each member against
both (``member_differences``, C2).
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from ..errors import FormatError, PackfmtError, WriteError
from .versions import newer_minor

__all__ = ["SHARED_KEYS", "UNIFIABLE", "unify", "parse_unified", "member_differences", "same_identity", "ones_needed", "MEANING"]

#: Manifest keys every member shares with the collection (C2), some of them up to ``UNIFIABLE``.
SHARED_KEYS = ("vocab_size", "token_dtype", "tokenizer", "special_tokens", "loss_mask")
#: The keys of ``unified``: what a member may lack that the collection has.
UNIFIABLE = ("loss_mask", "special_tokens.image")
#: What being listed under each key means, in the words the CLI prints.
MEANING = {"loss_mask": "no loss mask of their own: read as all-trained",
           "special_tokens.image": "no image id of their own"}


def _value(shared: dict, key: str) -> Any:
    """The member's (or collection's) value of a ``UNIFIABLE`` key."""
    if key == "loss_mask":
        return shared.get("loss_mask")
    special = shared.get("special_tokens")
    return special.get("image") if isinstance(special, dict) else None


def _absent(value) -> bool:
    """The value a member lacking the thing has: no loss mask, no image id."""
    return value is False or value is None


def same_identity(key: str, a, b) -> bool:
    """Equality of a key that members share exactly; the tokenizer by identity (spec/COLLECTION.md §2.3): two
    non-null hashes equal, whatever the names (a name is what was typed: one folder reached through a link has
    two); without a hash, name and hash (both null) equal. Other keys of ``tokenizer`` (class, ...) may differ."""
    if key == "tokenizer":
        a, b = a or {}, b or {}
        if a.get("hash") is not None and b.get("hash") is not None:
            return a["hash"] == b["hash"]
        return a.get("name") == b.get("name") and a.get("hash") == b.get("hash")
    if key == "special_tokens":  # every special token but image, which is unified
        a, b = a or {}, b or {}
        return {k: v for k, v in a.items() if k != "image"} == {k: v for k, v in b.items() if k != "image"}
    return a == b


def _tok(shared: dict) -> str:
    t = shared.get("tokenizer") or {}
    return f"{t.get('name')!r} ({t.get('hash') or 'no hash'})"


#: ``build_report.command`` -> the ``packfmt build`` kind that rebuilds such a store.
_KINDS = {"text": "text", "chat": "chat", "multimodal": "llava", "easy-vqa": "easy-vqa"}


def _fix(label: str, path: str, mine: dict, ref: str, ref_path: str, shared: dict) -> str:
    """How to rebuild member ``label`` (at ``path``; ``mine``: its shared keys and ``build_report``) with the tokenizer
    of member ``ref`` (at ``ref_path``; ``shared``: its keys)."""
    return (f"rebuild {label} with {ref}'s tokenizer {_tok(shared)}: {_rebuild(label, path, mine, ref_path, shared)}, "
            "with the other options it was built with, then merge again")


def _rebuild(label: str, path: str, mine: dict, tok_store: str, tokenizer_of: dict, extra: str = "") -> str:
    """The ``packfmt build`` command that writes member ``label`` at ``path`` again with the tokenizer of the store at
    ``tok_store`` (``tokenizer_of``: its keys): its own kind and inputs (``mine``'s build report), and a tokenizer path
    a user can type (the one ``tokenizer_of``'s build report records, when it still holds that tokenizer);
    placeholders, said what they stand for, where those are not known here."""
    report = mine.get("build_report") if isinstance(mine.get("build_report"), dict) else {}
    kind = _KINDS.get(report.get("command"), "text|chat|llava")
    sources = [_here(s.get("path"), path) for s in report.get("sources") or [] if isinstance(s, dict)]
    known = sources and all(p is not None and ("://" in p or os.path.exists(p)) for p in sources)
    inputs = "" if kind == "easy-vqa" else (" ".join(shlex.quote(p) for p in sources) if known else "SRC") + " "
    tok = _tokenizer_path(tokenizer_of, tok_store)
    notes = [] if tok else [f"TOKENIZER: the folder holding tokenizer {_tok(tokenizer_of)}; no path a build report "
                            "records holds it on this machine"]
    if inputs == "SRC ":
        notes.append(f"SRC: the inputs {label} was built from")
    cmd = (f"`packfmt build {kind} {inputs}-o {shlex.quote(str(path))} --overwrite --tokenizer "
           f"{shlex.quote(tok) if tok else 'TOKENIZER'}{extra}`")
    return cmd + (f" ({'; '.join(notes)})" if notes else "")


def _here(recorded, store: str) -> str | None:
    """A path the build report of the store at ``store`` records (relative to it, or absolute; a URL as given), as a
    path on this machine; None when it is no string."""
    if not isinstance(recorded, str):
        return None
    if "://" in recorded or os.path.isabs(recorded):
        return recorded
    return os.path.normpath(os.path.join(str(store), recorded))


def _tokenizer_path(shared: dict, store: str) -> str | None:
    """The tokenizer path the build report of ``shared``'s store (at ``store``) records (``build.tokenizer_setting``),
    when it exists here and still hashes to the recorded hash; else None."""
    report = shared.get("build_report") if isinstance(shared.get("build_report"), dict) else {}
    settings = report.get("settings") if isinstance(report.get("settings"), dict) else {}
    path = _here(settings.get("tokenizer_path"), store)
    want = (shared.get("tokenizer") or {}).get("hash")
    if path is None or want is None or not os.path.exists(path):
        return None
    from ..tokenize import tokenizer_hash

    try:
        return path if tokenizer_hash(path) == want else None
    except (OSError, PackfmtError):
        return None


def unify(members: list[tuple[str, str, dict]]) -> tuple[dict, dict]:
    """The collection's shared keys and its ``unified`` record over ``(name, path, shared keys)`` of each member.

    Raises ``WriteError`` naming both members and the fix when two members cannot share a collection:
    another tokenizer (by hash: ``same_identity``), vocabulary or token dtype, other special tokens (image aside),
    or two different image ids. A member's shared keys may carry its ``build_report`` too (what the fix's
    command is made of; never compared).
    """
    first, first_path, ref = members[0]
    for name, path, shared in members:
        for key in SHARED_KEYS:
            if key == "loss_mask" or same_identity(key, shared[key], ref[key]):
                continue
            if key == "special_tokens":
                fix = (f"rebuild {name!r} with {first!r}'s tokenizer and options so that its special tokens "
                       f"(bos, eos, pad) are {first!r}'s")
            else:
                fix = _fix(repr(name), path, shared, repr(first), first_path, ref)
            shown = (f"{_tok(ref)} vs {_tok(shared)}" if key == "tokenizer" else f"{ref[key]!r} vs {shared[key]!r}")
            share = "one tokenizer (the same hash; names may differ)" if key == "tokenizer" else "it"
            raise WriteError(f"merge: members {first!r} ({first_path}) and {name!r} ({path}) differ in {key}: "
                             f"{shown}; a collection's members share {share}: {fix}",
                             field=key, expected=repr(ref[key]), found=repr(shared[key]))
    image = None
    for name, path, shared in members:
        value = _value(shared, "special_tokens.image")
        if value is None:
            continue
        if image is not None and value != image[0]:
            raise WriteError(f"merge: members {image[1]!r} ({image[2]}) and {name!r} ({path}) use different image "
                             f"placeholder ids (special_tokens.image {image[0]} vs {value}); a collection has one: "
                             f"rebuild {name!r} with the image marker {image[1]!r} was built with (the token of id "
                             f"{image[0]}): {_rebuild(repr(name), path, shared, path, shared, ' --image-token MARKER')}",
                             field="special_tokens.image", expected=image[0], found=value)
        image = image or (value, name, path)
    out = {key: ref[key] for key in SHARED_KEYS}
    out["loss_mask"] = any(bool(shared["loss_mask"]) for _, _, shared in members)
    out["special_tokens"] = {**ref["special_tokens"], "image": None if image is None else image[0]}
    unified = {}
    for key in UNIFIABLE:
        differ = [name for name, _, shared in members if _value(shared, key) != _value(out, key)]
        if differ:
            unified[key] = differ
    return out, unified


def parse_unified(obj: dict, names: list[str], shared: dict, version: tuple[int, int], *, file: str) -> dict:
    """C1 of ``unified``: ``{key of UNIFIABLE: [member names, in member order, not all of them]}``.

    Absent means empty. Each key needs the collection's own value set (``loss_mask`` true, an image
    id); a list names members, in their order, without repeats, and not every member (the
    collection's value comes from a member that has it). Another key is refused in a collection of
    this version and ignored in a newer minor one (its members are then compared exactly, C2).
    """
    if "unified" not in obj:
        return {}
    raw = obj["unified"]
    if version < (1, 2):
        raise FormatError(file=file, field="unified", expected="absent in a collection of format 1.1 (added in 1.2)",
                          found=repr(raw))
    if not isinstance(raw, dict) or not raw:
        raise FormatError(file=file, field="unified", expected="a non-empty object (absent when nothing is unified)",
                          found=repr(raw))
    order = {n: i for i, n in enumerate(names)}
    out = {}
    for key, listed in raw.items():
        if key not in UNIFIABLE:
            if newer_minor(version):  # 1.3 (layout, §9) and 2.0 (member table) added no key here
                continue
            raise FormatError(file=file, field=f"unified.{key}", expected=f"one of {list(UNIFIABLE)}", found=repr(key))
        field = f"unified.{key}"
        if _absent(_value(shared, key)):
            raise FormatError(file=file, field=field, expected=f"absent: the collection's {key} is "
                              f"{_value(shared, key)!r}, so no member lacks it", found=repr(listed))
        if not (isinstance(listed, list) and listed and all(isinstance(n, str) and n in order for n in listed)):
            raise FormatError(file=file, field=field, expected="a non-empty list of member names", found=repr(listed))
        pos = [order[n] for n in listed]
        if pos != sorted(set(pos)):
            raise FormatError(file=file, field=field, expected="member names in member order, each once",
                              found=repr(listed))
        if len(pos) == len(names):
            raise FormatError(file=file, field=field, expected=f"not every member (some member has the "
                              f"collection's {key})", found=repr(listed))
        out[key] = tuple(listed)
    return out


def member_differences(shared: dict, unified: dict, name: str, member: dict) -> list[tuple[str, Any, Any, str]]:
    """C2 of one member: ``(field, expected, found, why)`` for each shared key it breaks.

    ``shared`` and ``unified`` are the collection's; ``member`` is the member's own manifest
    (``loss_mask``, ``special_tokens``, ...). A member may lack what the collection has only when
    ``unified`` lists it, and ``unified`` may list it only when it lacks it.
    """
    out = []
    for key in SHARED_KEYS:
        if key != "loss_mask" and not same_identity(key, member.get(key), shared[key]):
            out.append((key, f"{shared[key]!r} (the collection's)", repr(member.get(key)), ""))
    for key in UNIFIABLE:
        mine, theirs, listed = _value(member, key), _value(shared, key), name in unified.get(key, ())
        if mine == theirs and listed:
            out.append((f"unified.{key}", f"not {name!r}: the member's {key} is the collection's ({theirs!r})",
                        f"{name!r} listed", "the collection's unified record lies"))
        elif mine != theirs and not (listed and _absent(mine)):
            why = "" if _absent(mine) else "only a member without it may sit in a collection with it"
            out.append((key, f"{theirs!r} (the collection's" + (", or absent when listed in unified)" if
                                                                    not _absent(theirs) else ")"), repr(mine), why))
    return out


def ones_needed(shared: dict, unified: dict, names: list[str]) -> list[bool]:
    """Per member: whether it reads as all-ones in the collection's loss mask (listed in ``unified.loss_mask``)."""
    listed = set(unified.get("loss_mask", ()))
    return [bool(shared["loss_mask"]) and n in listed for n in names]


