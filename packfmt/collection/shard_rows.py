"""Shard ``k``'s rows of a pack-ordered layout's index (spec/COLLECTION.md §9.4): their digests, the packs' lengths,
and the checks a reader runs on them before it uses them.

A streamed read fetches one shard's rows of ``pack_offsets.bin`` and ``segments.bin`` when a batch first touches the
shard (``remote.shard_index``), not the whole index (24 bytes a document) before the first batch. The index of
format 1.2 lists ``shard_digests.bin`` (the xxh3_64 of each shard's rows of the two files) and ``pack_tokens.bin``
(each pack's length, what the token-balanced sampler weighs packs by). ``write_shards`` writes both with this module's
names and dtypes (hashing each shard's rows as it writes them), ``validate`` recomputes them here (``shard_rows``,
C6), and the streamed reader checks each shard's rows with ``check_rows``.

Shard ``k`` holds documents ``D_k .. D_(k+1) - 1`` and packs ``c_k .. c_(k+1) - 1``; its rows are rows
``c_k .. c_(k+1)`` of ``pack_offsets.bin`` (both included) and rows ``D_k .. D_(k+1) - 1`` of ``segments.bin``.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import xxhash

from .. import format as F
from ..errors import FormatError

__all__ = ["PACK_TOKENS", "PACK_TOKENS_DTYPE", "PACK_TOKENS_LIMIT", "ROWS_VERSION", "ROWS_VERSION_STR",
           "SHARD_DIGESTS", "DIGEST_DTYPE", "bounds", "check_rows", "listed", "matches", "rows_of", "shard_rows",
           "validate_rows"]

SHARD_DIGESTS = "shard_digests.bin"
PACK_TOKENS = "pack_tokens.bin"
DIGEST_DTYPE = np.dtype("<u8")  # (K, 2): pack_offsets rows, segments rows
PACK_TOKENS_DTYPE = np.dtype("<u4")
#: Pack index format that lists the two files (a 1.1 reader checks their sizes and ignores them).
ROWS_VERSION = (1, 2)
ROWS_VERSION_STR = "1.2"
#: ``pack_tokens.bin`` is ``u4``: written only for a capacity below this (then neither file is, §9.4).
PACK_TOKENS_LIMIT = 1 << 32
#: Rows hashed or summed at a time (bounded memory inside one shard, however large).
_CHUNK = 1 << 20


def bounds(member_packs, member_documents) -> tuple[np.ndarray, np.ndarray]:
    """``(c, D)``: int64 ``(K + 1,)`` each, the first pack and the first document of every shard, and the totals."""
    c = np.zeros(len(member_packs) + 1, dtype=np.int64)
    np.cumsum(np.asarray(member_packs, dtype=np.int64), out=c[1:])
    d = np.zeros(len(member_documents) + 1, dtype=np.int64)
    np.cumsum(np.asarray(member_documents, dtype=np.int64), out=d[1:])
    return c, d


def listed(files) -> bool:
    """Whether an index's files table lists the two files (then a streamed read fetches it shard by shard)."""
    return SHARD_DIGESTS in files and PACK_TOKENS in files


def _hash(arr: np.ndarray) -> int:
    h = xxhash.xxh3_64()
    for a in range(0, arr.shape[0], _CHUNK):
        h.update(np.ascontiguousarray(arr[a:a + _CHUNK]).data)
    return h.intdigest()


def _lengths(po: np.ndarray, segs: np.ndarray) -> np.ndarray:
    """int64 length of each pack of ``po`` (rows of pack_offsets, both ends included) over ``segs`` (the rows from
    ``po[0]``); packs are non-empty (V25, checked by the caller before or after)."""
    n = po.shape[0] - 1
    out = np.zeros(max(n, 0), dtype=np.int64)
    for a in range(0, n, _CHUNK):
        b = min(n, a + _CHUNK)
        lo, hi = int(po[a]) - int(po[0]), int(po[b]) - int(po[0])
        if hi > lo:
            seg = segs[lo:hi]
            out[a:b] = np.add.reduceat(np.asarray(seg[:, 2] - seg[:, 1], dtype=np.int64),
                                       np.asarray(po[a:b], dtype=np.int64) - int(po[a]))
    return out


def rows_of(k: int, c: np.ndarray, d: np.ndarray) -> tuple[int, int, int, int]:
    """``(c_k, c_(k+1), D_k, D_(k+1))`` as ints."""
    return int(c[k]), int(c[k + 1]), int(d[k]), int(d[k + 1])


def shard_rows(po: np.ndarray, segs: np.ndarray, c: np.ndarray, d: np.ndarray) -> Iterator[tuple[int, int, int, np.ndarray]]:
    """``(k, digest of its pack_offsets rows, digest of its segments rows, its packs' lengths)`` for every shard, in
    order: what ``write_shards`` writes and ``validate`` compares (one shard's rows read at a time)."""
    for k in range(c.shape[0] - 1):
        p0, p1, d0, d1 = rows_of(k, c, d)
        prow, srow = po[p0:p1 + 1], segs[d0:d1]
        yield k, _hash(prow), _hash(srow), _lengths(prow, srow)


def matches(k: int, po: np.ndarray, segs: np.ndarray, digests: np.ndarray) -> bool:
    """Whether shard ``k``'s rows ``po`` and ``segs`` hash to row ``k`` of ``shard_digests.bin``."""
    return _hash(po) == int(digests[k, 0]) and _hash(segs) == int(digests[k, 1])


def check_rows(k: int, po: np.ndarray, segs: np.ndarray, c: np.ndarray, d: np.ndarray, digests: np.ndarray,
               capacity: int, tokens_bound: int, pack_tokens: np.ndarray | None, label: str) -> None:
    """Shard ``k``'s rows ``po`` (``c_k .. c_(k+1)``) and ``segs`` (``D_k .. D_(k+1) - 1``) as §9.4 requires before a
    reader uses them: their digests, V25 (they start at ``D_k``, end at ``D_(k+1)``, strictly increasing), V27 as
    far as the shard's ``tokens_bound`` bounds a document (its real lengths are checked when it arrives), each pack
    at most ``capacity`` and, with ``pack_tokens``, the length recorded. FormatError naming the file, shard, rows."""
    p0, p1, d0, d1 = rows_of(k, c, d)
    where = f"shard {k} (packs {p0}..{p1 - 1}, documents {d0}..{d1 - 1})"
    for name, arr, col, rows in ((F.PACK_OFFSETS, po, 0, f"[{p0}:{p1 + 1}]"), (F.SEGMENTS, segs, 1, f"[{d0}:{d1}]")):
        found, want = _hash(arr), int(digests[k, col])
        if found != want:
            raise FormatError(f"{label}{name}: rows {rows} of {where}: xxh3_64 expected {want:016x} ({SHARD_DIGESTS} "
                              f"row {k}), found {found:016x}: the bytes are not the index's; nothing of them is used. "
                              "The object changed or was damaged: write the layout again (packfmt pack SRC --shards OUT)",
                              file=label + name, field=rows, expected=f"{want:016x}", found=f"{found:016x}")

    def bad(name: str, field: str, expected, found) -> FormatError:
        return FormatError(f"{label}{name}: {field}: expected {expected}, found {found} ({where}, spec/COLLECTION.md "
                           "§9.4)", file=label + name, field=field, expected=expected, found=found)

    if int(po[0]) != d0 or int(po[-1]) != d1:
        raise bad(F.PACK_OFFSETS, f"[{p0}], [{p1}]", f"{d0} and {d1} (the shard's first document and the next "
                  "shard's: V25)", f"{int(po[0])} and {int(po[-1])}")
    if po.shape[0] > 1 and not (np.diff(po) > 0).all():
        j = int(np.flatnonzero(np.diff(po) <= 0)[0])
        raise bad(F.PACK_OFFSETS, f"[{p0 + j + 1}]", "strictly increasing (every pack has >= 1 segment: V25)",
                  f"{int(po[j + 1])} after {int(po[j])}")
    docs = np.arange(d0, d1, dtype=np.int64)
    wrong = (segs[:, 0] != docs) | (segs[:, 1] != 0) | (segs[:, 2] < 1) | (segs[:, 2] > tokens_bound)
    if wrong.any():
        j = int(np.flatnonzero(wrong)[0])
        raise bad(F.SEGMENTS, f"[{d0 + j}]", f"segment {d0 + j} = ({d0 + j}, 0, e) with 1 <= e <= {tokens_bound} "
                  "(document s, from 0: §9.2; V27 within the shard's tokens)", tuple(int(x) for x in segs[j]))
    lengths = _lengths(po, segs)
    over = np.flatnonzero(lengths > capacity)
    if over.size:
        j = int(over[0])
        raise bad(F.SEGMENTS, f"pack {p0 + j}", f"at most capacity {capacity} tokens (V29)", int(lengths[j]))
    if pack_tokens is not None:
        rec = np.asarray(pack_tokens[p0:p1], dtype=np.int64)
        diff = np.flatnonzero(rec != lengths)
        if diff.size:
            j = int(diff[0])
            raise bad(PACK_TOKENS, f"[{p0 + j}]", f"{int(lengths[j])} (the length of pack {p0 + j} in its rows)",
                      int(rec[j]))


def validate_rows(out, label: str, po: np.ndarray, segs: np.ndarray, c: np.ndarray, d: np.ndarray,
                  digests: np.ndarray, pack_tokens: np.ndarray) -> None:
    """C6 (deep) of §9.4: every digest and pack length as the index's rows give them. ``out``: a validation
    collector (``add(file, field, expected, found)``); ``label``: ``packs/<name>/``. The shard bounds ``c`` and
    ``d`` must end at the index's packs and segments (C6 reports it otherwise, before this is called)."""
    bad_digest, bad_length = [], None
    for k, h_po, h_seg, lengths in shard_rows(po, segs, c, d):
        for col, (found, name) in enumerate(((h_po, F.PACK_OFFSETS), (h_seg, F.SEGMENTS))):
            if int(digests[k, col]) != found:
                bad_digest.append((k, col, name, found))
        if bad_length is None:
            p0 = int(c[k])
            diff = np.flatnonzero(np.asarray(pack_tokens[p0:p0 + lengths.shape[0]], dtype=np.int64) != lengths)
            if diff.size:
                bad_length = (p0 + int(diff[0]), int(lengths[diff[0]]), int(pack_tokens[p0 + diff[0]]), diff.size)
    if bad_digest:
        k, col, name, found = bad_digest[0]
        out.add(label + SHARD_DIGESTS, f"[{k}, {col}]", f"{found:016x} (the xxh3_64 of shard {k}'s rows of {name})",
                f"{int(digests[k, col]):016x} ({len(bad_digest)} digest(s) differ)")
    if bad_length is not None:
        p, want, have, n = bad_length
        out.add(label + PACK_TOKENS, f"[{p}]", f"{want} (the length of pack {p})", f"{have} (in the first shard with a "
                f"difference, {n} pack(s) differ)")
