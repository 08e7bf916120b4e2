"""Mixtures by proportion (spec/COLLECTION.md §5.1): shares of a token total -> copies per document.

``proportions={"web": 0.6, "code": 0.4}, tokens=N`` asks for an index of N tokens of which 60%
come from the members of key ``web``. Each key ``k`` has a target ``T_k = round(p_k * N)`` of kept
tokens (what the oversize policy keeps of each document). Every document of the key's pool gets
``c_k = T_k // K_k`` copies (``K_k``: the pool's kept tokens); the remainder is taken from the pool
in the order of the seeded draw ``u(seed, d)`` (§5), cut where the running sum comes nearest to
it, so the key's tokens miss its target by at most half of one document. The copies then go
through the rounds of ``mixture.pack_rounds`` like a weighted mixture's.
"""

from __future__ import annotations

import math

import numpy as np

from .. import format as F
from ..errors import FormatError, PackfmtError, WriteError
from .mixture import MAX_WEIGHT, check_weights, extra_copy_draws, kept_tokens, member_keys
from .mixture_record import is_number_in

__all__ = ["SUM_TOLERANCE", "check_proportions", "check_tokens", "plan_proportions", "key_shares", "collection_kept",
           "copies_of_record"]

#: How far from 1 the shares may sum (they are not normalised: spec/COLLECTION.md §5.1).
SUM_TOLERANCE = 1e-6


def check_proportions(proportions) -> dict[str, float]:
    """``proportions=`` as a ``{key: p}`` dict of numbers in ``[0, 1]`` summing to 1 (within ``SUM_TOLERANCE``)."""
    if not isinstance(proportions, dict) or not proportions:
        raise WriteError(field="proportions=", expected="a non-empty dict {member or group name: share}",
                         found=repr(proportions))
    out = {}
    for key, p in proportions.items():
        if not (isinstance(key, str) and is_number_in(p, 0, 1)):
            raise WriteError(f"proportions: {key!r}: expected a share in [0, 1], found {p!r}",
                             field=f"proportions[{key!r}]", expected="a number in [0, 1]", found=repr(p),
                             cli=f"--proportions: {key}={p!r}: a share must be a number in [0, 1]")
        out[key] = float(p)
    total = math.fsum(out.values())
    if abs(total - 1) > SUM_TOLERANCE:
        fixed = ",".join(f"{k}={v / total:.4g}" for k, v in out.items()) if total > 0 else "web=0.6,code=0.4"
        raise WriteError(f"proportions: the shares sum to {total:.6g}, not 1; give shares that sum to 1, e.g. {fixed}",
                         field="proportions=", expected="shares summing to 1", found=f"{total:.6g}",
                         cli=f"--proportions: the shares sum to {total:.6g}, not 1; give shares that sum to 1, "
                             f"e.g. --proportions {fixed}")
    return out


def check_tokens(tokens) -> int | None:
    """``tokens=``: None (the largest total no key repeats for) or an integer in ``[1, 2^63)``."""
    if tokens is None:
        return None
    ok = isinstance(tokens, (int, np.integer)) and not isinstance(tokens, bool)
    if not ok or not 1 <= int(tokens) < F.SEED_LIMIT:
        raise WriteError(f"tokens: expected an integer in [1, 2**63), found {tokens!r}", field="tokens=",
                         expected="None or an integer in [1, 2**63)", found=repr(tokens),
                         cli=f"--tokens: expected a whole number of tokens >= 1 (e.g. --tokens 1000000000), "
                             f"found {tokens!r}")
    return int(tokens)


def plan_proportions(names: list[str], doc_start: np.ndarray, kept: np.ndarray, proportions: dict[str, float],
                     tokens: int | None, seed: int) -> tuple[np.ndarray, dict, list[dict]]:
    """Copies of every collection document for checked ``proportions`` and ``tokens`` (spec/COLLECTION.md §5.1).

    Args:
        kept: int64 ``(documents,)`` the tokens the oversize policy keeps of each document.
    Returns:
        ``copies`` (int64 per document), the record's ``target`` and ``plan`` (as ``{"target", "plan"}``),
        and per member ``{"key": key or None}``.
    """
    keys = list(proportions)
    mk = member_keys(names, keys, "proportions")
    doc_key = np.repeat(mk, np.diff(np.asarray(doc_start, dtype=np.int64)))
    pool_tokens = np.bincount(doc_key[doc_key >= 0], weights=kept[doc_key >= 0], minlength=len(keys)).astype(np.int64)
    for j, key in enumerate(keys):
        if proportions[key] > 0 and pool_tokens[j] == 0:
            own = [n for n, k in zip(names, mk) if k == j]
            why = (f"its members {own} keep no token (every document empty, or dropped by oversize='drop')" if own
                   else "every member it names belongs to a longer key")
            raise WriteError(f"proportions: {key!r} has share {proportions[key]:g} but {why}",
                             field=f"proportions[{key!r}]", expected="a key with tokens to take its share from",
                             found=why, cli=f"--proportions: {key!r} has share {proportions[key]:g} but {why}; "
                                            f"give it share 0 or leave it out")
    total = tokens if tokens is not None else math.floor(min(
        pool_tokens[j] / proportions[k] for j, k in enumerate(keys) if proportions[k] > 0))
    copies = np.zeros(kept.shape[0], dtype=np.int64)
    plan = {}
    for j, key in enumerate(keys):
        target = math.floor(proportions[key] * total + 0.5)
        whole, rest, extra = 0, 0, 0
        if target:
            whole, rest = divmod(target, int(pool_tokens[j]))
            pool = np.flatnonzero(doc_key == j)
            order = pool[np.lexsort((pool, extra_copy_draws(seed, pool)))]  # by u(seed, d), then d
            run = np.concatenate([[0], np.cumsum(kept[order])])
            extra = _nearest(run, rest)
            needed = whole + int(extra > 0)
            if needed > MAX_WEIGHT:
                raise WriteError(
                    f"proportions: {key!r} keeps {int(pool_tokens[j]):,} tokens; its share of {total:,} tokens "
                    f"({target:,}) needs {needed:,} copies of its documents, more than {MAX_WEIGHT}",
                    field=f"proportions[{key!r}]", expected=f"at most {MAX_WEIGHT} copies", found=needed,
                    cli=f"--proportions: {key!r} keeps {int(pool_tokens[j]):,} tokens; {proportions[key]:g} of "
                        f"{total:,} tokens needs {needed:,} copies of it, more than {MAX_WEIGHT}: "
                        f"lower --tokens or its share")
            copies[pool] = whole
            copies[order[:extra]] += 1
        plan[key] = {"tokens": int(target), "copies": int(whole), "extra_documents": int(extra)}
    if not copies.any():
        raise WriteError(f"tokens: {total:,} tokens at these shares round to no document: nothing to pack",
                         field="tokens=", expected="a total that gives some key a token", found=total,
                         cli=f"--tokens {total:,}: at these shares no key gets a token: give a larger --tokens")
    head = {"target": {"proportions": dict(proportions), "tokens": tokens, "total": int(total)}, "plan": plan}
    return copies, head, [{"key": keys[k] if k >= 0 else None} for k in mk]


def _nearest(run: np.ndarray, rest: int) -> int:
    """The smallest ``j`` with ``|run[j] - rest|`` least (``run``: non-decreasing, from 0)."""
    hi = int(np.searchsorted(run, rest, side="left"))  # first j with run[j] >= rest
    if hi == 0:
        return 0
    lo = int(np.searchsorted(run, run[hi - 1], side="left"))  # first j holding the last value below rest
    if hi == run.shape[0] or rest - int(run[lo]) <= int(run[hi]) - rest:
        return lo
    return hi


def key_shares(mixture: dict) -> dict:
    """``shares``: per key of ``target.proportions``, the tokens its members hold in the index and their share."""
    keys = mixture["target"]["proportions"]
    total = sum(m["tokens"] for m in mixture["members"])
    out = {}
    for key in keys:
        held = sum(m["tokens"] for m in mixture["members"] if m["key"] == key)
        out[key] = {"tokens": held, "share": held / total if total else 0.0}
    return out


def collection_kept(coll, capacity: int, oversize: str) -> np.ndarray:
    """int64 ``(documents,)``: the tokens ``oversize`` keeps of each collection document at ``capacity``."""
    from ..packing import segment_documents
    from .arrays import relative_image_spans

    lengths = np.asarray(coll.doc_lengths, dtype=np.int64)
    spans, doc_image_offsets = relative_image_spans(coll)
    seg = segment_documents(lengths, capacity, oversize, image_spans=spans, doc_image_offsets=doc_image_offsets)
    return kept_tokens(seg, lengths)[1]


def copies_of_record(coll, mixture: dict, capacity: int, oversize: str, *, file: str
                     ) -> tuple[np.ndarray, dict, list[dict]]:
    """``copies(d)`` of a recorded mixture, weights or proportions, recomputed from what it asked for.

    ``mixture``: a record whose keys and types ``mixture_record.check_mixture_record`` checked. Returns the copies
    and, recomputed, the record's head (``weights``, or ``target`` and ``plan``) and per member fields. Raises a
    FormatError naming ``file`` (the index's ``index.json``) and the ``mixture`` field that does not resolve (a key
    naming no member, shares not summing to 1, a plan past 1000 copies).
    """
    from .mixture import document_copies, member_weights

    names = [m.name for m in coll.members]
    seed = mixture["seed"]
    if "weights" in mixture:
        weights = _asked(check_weights, mixture["weights"], file=file, field="mixture.weights")
        resolved = _asked(member_weights, names, weights, file=file, field="mixture.weights")
        return (document_copies(coll.doc_start, resolved, seed), {"weights": weights},
                [{"weight": float(w)} for w in resolved])
    target = mixture["target"]
    proportions = _asked(check_proportions, target["proportions"], file=file, field="mixture.target.proportions")
    tokens = target["tokens"]
    kept = collection_kept(coll, capacity, oversize)
    return _asked(plan_proportions, names, coll.doc_start, kept, proportions, tokens, seed, file=file,
                  field="mixture.target")


def _asked(fn, *args, file: str, field: str):
    """``fn(*args)``, its WriteError (a writer's words for what a user asked) raised as a FormatError naming the
    record's ``file`` and ``field``."""
    try:
        return fn(*args)
    except PackfmtError as exc:
        raise FormatError(f"{file}: {field}: {exc}", file=file, field=field, expected=exc.expected,
                          found=exc.found) from None
