"""A member manifest checked by one match against the bytes of one already checked (spec/COLLECTION.md C2, C3).

The members of a collection written by ``packfmt merge`` (or any one writer) hold canonical manifests
(FORMAT.md §2.1: sorted keys, 2-space indent) that differ only in their counts and their files' sizes and
checksums. Once one member's manifest has passed every check of ``F.parse_json`` (V1) and
``F.parse_manifest`` (V2-V9), its own bytes with those values cut out make a ``Template``: a byte pattern
whose literal parts are that manifest's, each cut value matched only as well formed (a decimal integer
without sign or leading zero; ``"xxh3_64:"`` and 16 lowercase hex digits). A manifest whose bytes match it
parses to that same object but for those values (same keys, none twice, the same UTF-8 text, every other
value equal), so it passes the same checks when its integers are below ``2^63`` (what ``match`` also checks);
C2's shared keys are the template's too (``differences``). What is left to check of the member is what the
cut values say: its counts against the collection's (C2), its files' sizes against the disk and the layout
(V10, V11). A manifest that does not match (written by another producer or by hand, not canonical, or with
anything else changed) is parsed as always, and may become a template itself.
"""

from __future__ import annotations

import re
import uuid

from .. import format as F
from .unify import UNIFIABLE, member_differences

__all__ = ["MAX_TEMPLATES", "Template", "listed_in"]

#: Templates kept per collection (members written by a few producers, or a few writer versions).
MAX_TEMPLATES = 8

_INT = rb"(0|[1-9][0-9]{0,18})"
_CHECKSUM = rb'"xxh3_64:([0-9a-f]{16})"'
_OFFSET_SIZE, _MAX = F.OFFSET_DTYPE.itemsize, F.INT64_MAX


class Template:
    """The byte pattern of one checked canonical store manifest without images (see the module doc).

    ``match(raw)``: ``(documents, tokens, {file: bytes})`` of a manifest whose bytes match, or None.
    ``sizes(raw, documents, tokens)``: ``match`` with C2's counts and V11 in one step (``member_checks``' hot path).
    """

    __slots__ = ("_core", "_differences", "_ints", "_prefix", "_sized", "_suffix", "bare", "files",
                 "has_loss_mask", "itemsize", "obj", "pattern", "slots", "stat", "stated")

    def __init__(self, parts: list, slots: list, sm: F.Manifest) -> None:
        """``parts``: the literal bytes before the first cut value, the pattern of each value and the literal bytes
        after it, in turn; ``slots``: what each value is."""
        self.pattern = re.compile(b"".join(re.escape(x) if k % 2 == 0 else x for k, x in enumerate(parts)))
        #: ``pattern`` without its first and last literal parts, which ``_fullmatch`` compares as bytes (the regex
        #: steps through a literal a byte at a time; the text after the files table is over half a manifest)
        self._prefix, self._suffix = parts[0], parts[-1]
        self._core = re.compile(b"".join(re.escape(x) if k % 2 == 0 else x for k, x in enumerate(parts[1:-1], 1)))
        self.slots = slots
        self.files = tuple(sm.files)
        #: the groups holding integers: counts.documents, .tokens, .images, then each file's bytes, in ``files`` order
        self._ints = [slots.index(what) for what in [("count", k) for k in ("documents", "tokens", "images")]
                      + [(name, "bytes") for name in self.files]]
        self.has_loss_mask, self.obj = sm.has_loss_mask, sm.raw
        self.itemsize = sm.np_token_dtype.itemsize
        #: a known version and the files the format requires, nothing else (``member_doc_lengths``' ``bare``)
        self.bare = sm.version <= F.KNOWN_VERSION and set(sm.files) == set(F.required_files(sm.has_loss_mask, False))
        self.stated = tuple(name for name in sm.files if name != F.DOC_OFFSETS)  # sized by ``stat`` (V10)
        #: ``(group of its bytes, "/" + name)`` of each of ``stated``: what ``sizes`` gives, what ``stat`` compares
        self.stat = tuple((self._ints[3 + self.files.index(name)], "/" + name) for name in self.stated)
        #: the groups of counts.documents, .tokens, .images and of the bytes of the files V11 sizes from the counts
        #: (tokens, doc offsets, and the loss mask when there is one: ``sizes_agree``), -1 for a mask not sized
        mask = self._ints[3 + self.files.index(F.LOSS_MASK)] if sm.has_loss_mask else -1
        self._sized = (*self._ints[:3], self._ints[3 + self.files.index(F.TOKENS)],
                       self._ints[3 + self.files.index(F.DOC_OFFSETS)], mask)
        self._differences: dict = {}

    @classmethod
    def of(cls, raw: bytes, sm: F.Manifest) -> Template | None:
        """The template of ``raw``, a manifest that passed ``parse_json`` and ``parse_manifest`` as ``sm``; None when
        it is not canonical JSON, has images, or is not matched back by its own pattern with its own values."""
        obj = sm.raw
        if sm.num_images or F.canonical_json(obj) != raw:
            return None
        tag = uuid.uuid4().hex
        if tag.encode() in raw:
            return None
        slots: list = []  # per cut value, in the order of the pattern's groups: ("count", key) or (file, field)

        def cut(what) -> str:
            slots.append(what)
            return f"packfmt-slot-{len(slots) - 1}-{tag}"

        cut_obj = dict(obj)
        cut_obj["counts"] = {**obj["counts"], **{k: cut(("count", k)) for k in ("documents", "tokens", "images")}}
        cut_obj["files"] = {name: {**entry, "bytes": cut((name, "bytes")), "checksum": cut((name, "checksum"))}
                            for name, entry in obj["files"].items()}
        text = F.canonical_json(cut_obj)
        parts = re.split(rb'"packfmt-slot-(\d+)-' + tag.encode() + rb'"', text)
        pattern, order = [parts[0]], []
        for i in range(1, len(parts), 2):
            slot = slots[int(parts[i])]
            order.append(slot)
            pattern += [_CHECKSUM if slot[1] == "checksum" else _INT, parts[i + 1]]
        if len(order) != len(slots):
            return None
        self = cls(pattern, order, sm)
        files = {name: e.bytes for name, e in sm.files.items()}
        if self.match(raw) != (sm.num_documents, sm.num_tokens, files):
            return None  # not read back as written: never used
        return self

    def _fullmatch(self, raw: bytes) -> re.Match | None:
        """``pattern.fullmatch(raw)``, its groups at the same places: the first and last literal parts compared as
        bytes, the rest matched by ``_core``."""
        a, b = len(self._prefix), len(raw) - len(self._suffix)
        if a >= b or not (raw.startswith(self._prefix) and raw.endswith(self._suffix)):
            return None
        return self._core.fullmatch(raw, a, b)

    def match(self, raw: bytes) -> tuple[int, int, dict] | None:
        found = self._fullmatch(raw)
        if found is None:
            return None
        groups = found.groups()  # a checksum is well formed by the pattern: all that V8 asks of it
        values = [int(groups[i]) for i in self._ints]
        if values[2] or max(values) > F.INT64_MAX:  # images: parsed as always; V7, V8: below 2^63
            return None
        return values[0], values[1], dict(zip(self.files, values[3:]))

    def sizes(self, raw: bytes, documents: int, tokens: int):
        """None when ``raw`` does not match (``match``); False when it does, but with other counts than ``documents``
        and ``tokens`` (C2), images, a file not of the size the counts give it (V11) or one of ``2^63`` bytes or more;
        else the groups of the match (``stat`` says which is the size of which of ``stated``, V10)."""
        a, b = len(self._prefix), len(raw) - len(self._suffix)  # ``_fullmatch``, inlined: one call per member
        if a >= b or not (raw.startswith(self._prefix) and raw.endswith(self._suffix)):
            return None
        found = self._core.fullmatch(raw, a, b)
        if found is None:
            return None
        g = found.groups()
        d, t, i, tok, off, mask = self._sized
        size, offsets = tokens * self.itemsize, (documents + 1) * _OFFSET_SIZE
        if (g[i] != b"0" or int(g[d]) != documents or int(g[t]) != tokens or int(g[tok]) != size
                or int(g[off]) != offsets or (mask >= 0 and int(g[mask]) != tokens) or size > _MAX or offsets > _MAX):
            return False  # the counts are the collection's (below 2^63, C1); the other sizes are checked by ``stat``
        return g

    def differences(self, shared: dict, unified: dict, name: str, listed: tuple) -> list:
        """``member_differences`` of a member whose manifest matched (C2's shared keys): the template's own, which
        depend on the member only through whether ``unified`` lists it under each key (``listed``)."""
        got = self._differences.get(listed)
        if got is None:
            got = self._differences[listed] = member_differences(shared, unified, name, self.obj)
        return got and member_differences(shared, unified, name, self.obj)  # a finding names this member

    def sizes_agree(self, documents: int, tokens: int, sizes: dict) -> bool:
        """V11 of a matched manifest: each file the counts give a size has it (``F.expected_layout`` without images)."""
        return (sizes[F.TOKENS] == tokens * self.itemsize
                and sizes[F.DOC_OFFSETS] == (documents + 1) * F.OFFSET_DTYPE.itemsize
                and (not self.has_loss_mask or sizes[F.LOSS_MASK] == tokens * F.MASK_DTYPE.itemsize))


def listed_in(unified: dict) -> tuple:
    """Per ``UNIFIABLE`` key, the set of member names ``unified`` lists (a member's ``listed`` flags in O(1))."""
    return tuple(frozenset(unified.get(key, ())) for key in UNIFIABLE)
