"""A member manifest checked by matching the bytes of one already checked (packfmt.collection.member_template):
whatever the pattern accepts, the full parse accepts with the same values; the rest is parsed as always. And
``validate`` of a collection still reports what is wrong with a member whose manifest matched (its files)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packfmt import format as F
from packfmt.collection.member_template import Template
from packfmt.collection.unify import member_differences
from packfmt.torch.testing import write_random_collection
from packfmt.validate import validate

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "golden_v1_0", F.MANIFEST)


def _manifest(mask: bool) -> tuple[bytes, F.Manifest]:
    """A canonical store manifest without images (the golden store's, with or without a loss mask)."""
    with open(GOLDEN, "rb") as fh:
        obj = json.loads(fh.read())
    obj["counts"]["images"] = 0
    obj["files"] = {k: v for k, v in obj["files"].items() if k in F.required_files(True, False)}
    if not mask:
        obj["loss_mask"] = False
        obj["files"].pop(F.LOSS_MASK, None)
    elif F.LOSS_MASK not in obj["files"]:
        obj["loss_mask"] = True
        obj["files"][F.LOSS_MASK] = {"bytes": obj["counts"]["tokens"], "checksum": "xxh3_64:0123456789abcdef"}
    raw = F.canonical_json(obj)
    return raw, F.parse_manifest(F.parse_json(raw, file=F.MANIFEST))


def _without_values(obj: dict) -> dict:
    return {**obj, "counts": sorted(obj["counts"]), "files": {k: sorted(v) for k, v in obj["files"].items()}}


_alphabet = st.one_of(st.sampled_from([bytes([c]) for c in b"0123456789abcdef"]),  # most edits keep a value's form
                      st.sampled_from([bytes([c]) for c in b'AF-+.eE" ,\n{}:x'] + [b"\xc3\xa9", b"\\u0030"]))


def _edited(raw: bytes, spans: list, edits) -> bytes:
    edited = bytearray(raw)
    for slot, offset, how, text in edits:  # edits at and around the values the pattern leaves open
        a, b = spans[slot % len(spans)]
        at = min(a + min(offset, b - a), len(edited))
        if how == "replace":
            edited[at:at + 1] = text
        elif how == "insert":
            edited[at:at] = text
        else:
            del edited[at:at + 1]
    return bytes(edited)


def _sound(t: Template, sm: F.Manifest, edited: bytes) -> bool:
    """What ``t`` makes of ``edited`` is what the full parse makes of it; True when it matched."""
    found = t.match(edited)
    if found is None:
        return False  # parsed as always (and refused, or accepted, by the ordinary checks)
    got = F.parse_manifest(F.parse_json(edited, file=F.MANIFEST))  # raises if the pattern let through a bad one
    assert (got.num_documents, got.num_tokens, {k: e.bytes for k, e in got.files.items()}) == found
    assert got.num_images == 0 and got.has_loss_mask == sm.has_loss_mask and got.version == sm.version
    assert _without_values(got.raw) == _without_values(sm.raw)
    for k in ("vocab_size", "token_dtype", "tokenizer", "special_tokens", "loss_mask", "producer"):
        assert got.raw[k] == sm.raw[k]
    shared = {k: sm.raw[k] for k in ("vocab_size", "token_dtype", "tokenizer", "special_tokens", "loss_mask")}
    assert member_differences(shared, {}, "m", got.raw) == t.differences(shared, {}, "m", (False, False)) == []
    return True


def _template(mask: bool):
    raw, sm = _manifest(mask)
    t = Template.of(raw, sm)
    assert t is not None
    return raw, sm, t, [t.pattern.fullmatch(raw).span(g + 1) for g in range(len(t.slots))]


@pytest.mark.parametrize("mask", [False, True])
def test_every_one_byte_edit_of_a_value_is_matched_only_as_the_parse_reads_it(mask):
    raw, sm, t, spans = _template(mask)
    texts = [bytes([c]) for c in b'0123456789abcdefAF-+.eE" ,\n{}:x'] + [b"\xc3\xa9", b"\\u0030", b"\x00"]
    matched = 0
    for slot in range(len(spans)):
        for offset in range(-1, spans[slot][1] - spans[slot][0] + 1):
            for how in ("replace", "insert", "delete"):
                for text in texts if how != "delete" else [b""]:
                    matched += _sound(t, sm, _edited(raw, spans, [(slot, offset, how, text)]))
    assert matched > 100  # the edits that keep a value well formed (a digit for a digit, ...)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mask=st.booleans(), edits=st.lists(st.tuples(st.integers(0, 40), st.integers(-1, 17),
                                                    st.sampled_from(["replace", "insert", "delete"]), _alphabet),
                                          min_size=2, max_size=4))
def test_what_the_pattern_matches_after_several_edits_parses_to_the_values_it_gives(mask, edits):
    raw, sm, t, spans = _template(mask)
    _sound(t, sm, _edited(raw, spans, edits))


def test_values_out_of_the_format_are_not_matched():
    raw, sm = _manifest(False)
    t = Template.of(raw, sm)
    tokens = f'"tokens": {sm.num_tokens}'.encode()
    assert t.match(raw) == (sm.num_documents, sm.num_tokens, {k: e.bytes for k, e in sm.files.items()})
    assert t.match(raw.replace(tokens, b'"tokens": 12')) == (sm.num_documents, 12, t.match(raw)[2])
    for bad in (b'"tokens": 012', b'"tokens": -1', b'"tokens": 1.0', b'"tokens": 1e3', b'"tokens": "1"',
                b'"tokens": 9223372036854775808', b'"tokens": 99999999999999999999', b'"tokens":  1'):
        assert t.match(raw.replace(tokens, bad)) is None, bad
    assert t.match(raw.replace(tokens, b'"tokens": 9223372036854775807'))[1] == 2**63 - 1
    checksum = sm.files[F.TOKENS].checksum.encode()
    for bad in (checksum.upper(), checksum[:-1], checksum + b"0", checksum.replace(b"xxh3_64", b"xxh3_65")):
        assert t.match(raw.replace(checksum, bad)) is None, bad
    assert t.match(raw.replace(b'"images": 0', b'"images": 1')) is None  # a member with images: parsed, as always
    assert t.match(raw + b" ") is None and t.match(raw.replace(b"\n", b"\r\n")) is None


def test_only_a_canonical_manifest_without_images_is_a_template():
    raw, sm = _manifest(True)
    assert Template.of(raw, sm) is not None
    assert Template.of(json.dumps(sm.raw).encode(), sm) is None  # not canonical: every member like it is parsed
    with open(GOLDEN, "rb") as fh:
        golden = fh.read()
    gm = F.parse_manifest(F.parse_json(golden, file=F.MANIFEST))
    assert gm.num_images and Template.of(golden, gm) is None


def _collection(tmp_path, n=8):
    coll, paths, _ = write_random_collection(tmp_path, [3] * n)
    assert validate(coll).ok
    return coll, paths


@pytest.mark.parametrize("member", [0, 5])  # the member the template is made of, and one matched
def test_a_matched_members_files_are_still_checked(tmp_path, member):
    coll, paths = _collection(tmp_path)
    tokens = paths[member] / F.TOKENS
    tokens.write_bytes(tokens.read_bytes()[:-2])
    offsets = paths[member + 1] / F.DOC_OFFSETS
    offsets.write_bytes(offsets.read_bytes() + bytes(8))
    report = validate(coll)
    got = {(p.file, p.field) for p in report.errors}
    assert (f"../stores/m{member:06d}/{F.TOKENS}", "size") in got, report.format()
    assert (f"../stores/m{member + 1:06d}/{F.DOC_OFFSETS}", "size") in got, report.format()
    assert {p.file.split("/")[2] for p in report.errors} == {f"m{member:06d}", f"m{member + 1:06d}"}


def test_a_fifo_in_place_of_a_members_offsets_is_reported_not_waited_on(tmp_path):
    coll, paths = _collection(tmp_path)
    where = paths[6] / F.DOC_OFFSETS
    where.unlink()
    os.mkfifo(where)
    report = validate(coll)
    assert [(p.file, p.field) for p in report.errors] == [(f"../stores/m000006/{F.DOC_OFFSETS}", "size")]


def test_a_member_with_a_file_besides_its_own_is_warned_of_by_deep_validate_after_a_template(tmp_path):
    coll, paths = _collection(tmp_path)
    (paths[3] / "notes.txt").write_text("x")
    assert validate(coll).warnings == []  # structural: no member's directory is listed (C2, C3)
    report = validate(coll, deep=True)
    assert report.ok and [p.file for p in report.warnings] == ["../stores/m000003/notes.txt"]


def test_members_with_manifests_not_canonical_are_parsed_and_checked_as_always(tmp_path):
    from packfmt.collection import write_collection
    from packfmt.torch.testing import write_split_stores

    rng = np.random.default_rng(0)
    offsets = np.concatenate([[0], np.cumsum(rng.integers(1, 9, 80))]).astype(np.int64)
    tokens = rng.integers(0, 1000, int(offsets[-1]), dtype=np.uint16)
    cuts = np.arange(0, 81, 2)
    paths = [Path(p) for p in write_split_stores(tmp_path / "stores", tokens, offsets, cuts, vocab_size=1000)]
    for p in paths:  # valid, and not the bytes canonical JSON writes: no template is made of any
        obj = json.loads((p / F.MANIFEST).read_text())
        (p / F.MANIFEST).write_text(json.dumps(obj))
    coll = write_collection(tmp_path / "coll", [(None, p) for p in paths]).path
    assert validate(coll).ok
    victim = paths[37] / F.TOKENS
    victim.write_bytes(victim.read_bytes()[:-2])
    assert [(p.file, p.field) for p in validate(coll).errors] == [(f"../stores/m000037/{F.TOKENS}", "size")]



def test_a_finding_shared_by_matched_members_names_each_of_them():
    """Members matched against one template share its C2 findings, but each finding names its own member: a
    ``unified`` record listing members whose own loss mask is the collection's (it lies about both)."""
    from packfmt.collection.member_template import listed_in

    _, sm, t, _ = _template(True)
    shared = {key: sm.raw[key] for key in ("vocab_size", "token_dtype", "tokenizer", "special_tokens", "loss_mask")}
    unified = {"loss_mask": ["a", "b"]}
    for name in ("a", "b"):
        listed = tuple(name in names for names in listed_in(unified))
        got = t.differences(shared, unified, name, listed)
        assert got == member_differences(shared, unified, name, sm.raw) and got and repr(name) in got[0][1]


@pytest.mark.parametrize("mask", [False, True])
def test_sizes_is_match_with_the_counts_and_the_sizes_they_give(mask):
    """``Template.sizes`` (what ``member_checks`` calls per member) says what ``match``, C2's counts and
    ``sizes_agree`` (V11) say together (None: not matched, parse it; False: refused), and its groups give ``match``'s
    size of each file ``stat`` compares."""
    raw, sm, t, spans = _template(mask)
    texts = [bytes([c]) for c in b"0123456789a,x"]
    tried = 0
    for slot in range(len(spans)):
        for offset in range(-1, spans[slot][1] - spans[slot][0] + 1):
            for how in ("replace", "insert", "delete"):
                for text in texts if how != "delete" else [b""]:
                    edited = _edited(raw, spans, [(slot, offset, how, text)])
                    found = t.match(edited)
                    for documents, tokens in ((sm.num_documents, sm.num_tokens), (sm.num_documents + 1, sm.num_tokens)):
                        got = t.sizes(edited, documents, tokens)
                        tried += 1
                        if found is None:  # not matched (None), or images or a value of 2^63 or more (False)
                            assert got is (None if t.pattern.fullmatch(edited) is None else False)
                        elif found[:2] != (documents, tokens) or not t.sizes_agree(*found):
                            assert got is False
                        else:
                            assert {name: int(got[g]) for g, name in t.stat} == {
                                "/" + name: found[2][name] for name in t.stated}
    assert tried > 1000
