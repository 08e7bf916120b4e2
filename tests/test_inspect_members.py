"""``packfmt inspect`` of a collection: its members table, per-member statistics and group totals (built from the
member list's columns, vectorised) equal a plain per-member computation written here, text and ``--json``."""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest

import packfmt
from packfmt.cli import main
from packfmt.collection import write_collection
from packfmt.collection.inspect import SHOWN_MEMBERS, _group_lines
from packfmt.inspect import summarize
from packfmt.render import pct
from packfmt.summary import length_stats
from packfmt.torch.testing import write_split_stores

# groups interleaved (a group's first member decides its place), a name of two dots, one without a dot
GROUPS = ["web", "code", "web", "math", "code", "web"]


def _names(n: int) -> list[str]:
    names = [f"{GROUPS[i % len(GROUPS)]}.{i}" for i in range(n)]
    names[7] = "web.en.7"  # group "web": the part before the first dot
    names[11] = "books"  # its own group
    return names


def _reference(root) -> tuple[list[dict], list[str]]:
    """Every member's ``--json`` row and the text's members and groups lines, one member at a time: its entry
    (a ``Member``), its own store's document lengths, ``length_stats`` of them, and a loop summing the groups."""
    coll = packfmt.open(root)
    entries = [coll.members[m] for m in range(len(coll.members))]
    total = sum(e.tokens for e in entries)
    rows = []
    for m, e in enumerate(entries):
        lengths = np.asarray(coll.member(m).doc_lengths)
        rows.append({"name": e.name, "path": e.path, "documents": e.documents, "tokens": e.tokens,
                     "images": e.images, "share": e.tokens / total, "document_lengths": length_stats(lengths)})
    lines = ["members:", f"  {'name':24s} {'documents':>12s} {'tokens':>14s} {'share':>8s}  path"]
    for i, r in enumerate(rows):
        if SHOWN_MEMBERS <= i < len(rows) - 5:
            if i == SHOWN_MEMBERS:
                lines.append(f"  ... {len(rows) - SHOWN_MEMBERS - 5:,} more members (`packfmt inspect --json` lists "
                             "every one)")
            continue
        lines.append(f"  {r['name']:24s} {r['documents']:>12,} {r['tokens']:>14,} {pct(r['share']):>8s}  {r['path']}")
    groups: dict[str, list] = {}
    for r in rows:
        g = groups.setdefault(r["name"].split(".")[0], [0, 0, 0, 0.0])
        g[0], g[1], g[2], g[3] = g[0] + 1, g[1] + r["documents"], g[2] + r["tokens"], g[3] + r["share"]
    lines += ["groups:", f"  {'group':24s} {'members':>8s} {'documents':>12s} {'tokens':>14s} {'share':>8s}"]
    lines += [f"  {k:24s} {n:>8,} {d:>12,} {t:>14,} {pct(s):>8s}" for k, (n, d, t, s) in groups.items()]
    return rows, lines


@pytest.mark.parametrize("member_table", [False, True])
def test_inspect_members_and_groups_equal_a_per_member_reference(tmp_path, capsys, member_table):
    """53 members (more than the 35 the text shows) of 0-5 documents of 1-300 tokens, in four groups, as a JSON
    array and as a member table: ``--json``'s rows and the text's members and groups lines equal the reference."""
    n = SHOWN_MEMBERS + 23
    rng = np.random.default_rng(5)
    per_member = rng.integers(0, 6, n)
    per_member[0] = 3  # the first member's store is written by the writer: give it documents
    lengths = rng.integers(1, 301, int(per_member.sum()))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    cuts = np.concatenate([[0], np.cumsum(per_member)]).astype(np.int64)
    tokens = rng.integers(0, 1000, int(offsets[-1])).astype(np.uint16)
    paths = write_split_stores(tmp_path / "s", tokens, offsets, cuts, vocab_size=1000)
    root = tmp_path / "c"
    write_collection(root, list(zip(_names(n), paths)), member_table=member_table)
    assert (root / "members.bin").exists() == member_table
    rows, lines = _reference(root)
    assert any(r["documents"] == 0 for r in rows) and len({r["name"].split(".")[0] for r in rows}) == 4

    assert main(["inspect", "--json", str(root)]) == 0
    got = json.loads(capsys.readouterr().out)["members"]
    assert got == rows
    summary = summarize(root)["members"]
    assert summary == rows and gc.isenabled()  # paused while the rows are made, then on again
    gc.disable()
    try:
        assert summarize(root)["members"] == rows and not gc.isenabled()  # and left off when it was off
    finally:
        gc.enable()
    assert [list(r) for r in summary] == [list(r) for r in rows]  # keys in the same order
    assert [list(r["document_lengths"]) for r in summary] == [list(r["document_lengths"]) for r in rows]

    assert main(["inspect", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("members:")
    assert out[at:at + len(lines)] == lines
    assert not out[at + len(lines)].startswith("  ")  # no further group line


def test_group_share_sums_are_the_member_order_sums():
    """Each group's share is the float sum a loop over the members makes (in member order), to the last bit:
    10^4 shares of many magnitudes, where another order of summation gives another float."""
    rng = np.random.default_rng(9)
    n = 10_000
    shares = (rng.random(n) * 10.0 ** rng.integers(-12, 0, n)).tolist()
    names = [f"{'abcdefg'[int(k)]}.{i}" for i, k in enumerate(rng.integers(0, 7, n))]
    rows = [{"name": a, "documents": 2 * i, "tokens": 3 * i + 1, "share": s}
            for i, (a, s) in enumerate(zip(names, shares))]
    want: dict[str, list] = {}
    for r in rows:
        g = want.setdefault(r["name"][0], [0, 0, 0, 0.0])
        g[0], g[1], g[2], g[3] = g[0] + 1, g[1] + r["documents"], g[2] + r["tokens"], g[3] + r["share"]
    assert sum(shares) != sum(sorted(shares))  # the order of summation shows in the last bits here
    got = _group_lines(rows, repr)[2:]
    assert got == [f"  {k:24s} {c:>8,} {d:>12,} {t:>14,} {s!r:>8s}" for k, (c, d, t, s) in want.items()]
    assert _group_lines([{"name": f"x{i}", "documents": 1, "tokens": 1, "share": 0.5} for i in range(2)], repr) == []
    assert _group_lines([{"name": f"x.{i}", "documents": 1, "tokens": 1, "share": 0.5} for i in range(2)], repr) == []


@pytest.mark.parametrize("percentiles", [(10, 50, 75, 95), (50,)])
def test_member_length_stats_of_other_percentiles_equal_length_stats(monkeypatch, percentiles):
    """Rows of percentiles other than three (not the one-display path) are ``length_stats`` of each member too."""
    from packfmt import summary
    from packfmt.collection.inspect import member_length_stats

    monkeypatch.setattr(summary, "PERCENTILES", percentiles)
    members = [[5, 1, 9, 3], [], [7], [2, 2, 8, 40, 1, 6]]
    lengths = np.array([x for m in members for x in m], dtype=np.int32)
    doc_start = np.concatenate([[0], np.cumsum([len(m) for m in members])]).astype(np.int64)
    got = member_length_stats(lengths, doc_start)
    want = [summary.length_stats(np.array(m, dtype=np.int64)) for m in members]
    assert got == want and [list(r) for r in got] == [list(r) for r in want]
    assert list(got[0]) == ["count", "total", "min", "mean", *(f"p{q}" for q in percentiles), "max"]
