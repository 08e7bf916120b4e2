"""Mixtures by proportion (spec/COLLECTION.md §5.1): ``--proportions web=0.6,... --tokens N``.

The collection is three real stores of different sizes built with the sample tokenizer from the
bundled sample text. Every expectation is recomputed here from the spec's words in plain Python
(``reference_plan``) and from the index's own segments, never from the module under test.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import packfmt
from packfmt import format as F
from packfmt.build import build_text
from packfmt.cli import main
from packfmt.collection import write_collection
from packfmt.errors import WriteError
from packfmt.packindex import build_pack_index
from packfmt.validate import validate

from test_collection_pack import reference_u  # u(seed, d) of spec/COLLECTION.md §5, written once

SAMPLE = Path(packfmt.__file__).parent / "sample_data"
SHARES = {"web": 0.6, "code": 0.3, "books": 0.1}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    """Three stores of different sizes: web 20 documents, code 15, books 5."""
    root = tmp_path_factory.mktemp("sources")
    with open(SAMPLE / "text.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    for name, part in (("web", records[:20]), ("code", records[20:35]), ("books", records[35:40])):
        with open(root / f"{name}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in part)
        build_text([root / f"{name}.jsonl"], root / name, SAMPLE / "tokenizer")
    return root


@pytest.fixture
def coll(sources, tmp_path):
    return write_collection(tmp_path / "mix", [(None, sources / n) for n in ("web", "code", "books")])


def reference_kept(length: int, capacity: int, oversize: str) -> int:
    """Tokens the oversize policy keeps of a text document (no images)."""
    if length <= capacity or oversize == "split":
        return length
    return capacity if oversize == "truncate" else 0


def reference_plan(coll, shares: dict, tokens, seed: int, capacity: int, oversize: str):
    """copies per document, total and per key (T_k, c_k, j_k, A_k), as spec/COLLECTION.md §5.1 words them."""
    names = [m.name for m in coll.members]
    lengths = [int(x) for x in coll.doc_lengths]
    kept = [reference_kept(n, capacity, oversize) for n in lengths]
    start = [int(x) for x in coll.doc_start]

    def key_of(name):
        hits = [k for k in shares if name == k or name.startswith(k + ".")]
        return max(hits, key=len) if hits else None

    pool = {k: [d for m, n in enumerate(names) if key_of(n) == k for d in range(start[m], start[m + 1])]
            for k in shares}
    K = {k: sum(kept[d] for d in pool[k]) for k in shares}
    total = tokens if tokens is not None else math.floor(min(K[k] / p for k, p in shares.items() if p > 0))
    copies, plan = [0] * len(lengths), {}
    for k, p in shares.items():
        T = math.floor(p * total + 0.5)
        c, R = divmod(T, K[k]) if T else (0, 0)
        order = sorted(pool[k], key=lambda d: (reference_u(seed, d), d))
        S = [0]
        for d in order:
            S.append(S[-1] + kept[d])
        j = min(range(len(S)), key=lambda i: (abs(S[i] - R), i)) if T else 0
        for i, d in enumerate(order):
            copies[d] = c + (i < j) if T else 0
        plan[k] = {"T": T, "c": c, "j": j, "A": c * K[k] + S[j], "half_doc": max(kept[d] for d in pool[k]) / 2}
    return copies, total, plan


def segments_by(index, coll):
    """Copies of each document (its segments starting at 0) and tokens of each member, from the segments."""
    copies, tokens = Counter(), Counter()
    for p in range(index.num_packs):
        for d, b, e in index.pack_segments(p):
            copies[int(d)] += int(b) == 0
            tokens[int(np.searchsorted(coll.doc_start, d, side="right") - 1)] += int(e - b)
    return copies, tokens


@pytest.mark.filterwarnings("ignore::packfmt.packindex.LostTokensWarning")  # truncate/drop lose tokens on purpose
@pytest.mark.parametrize("oversize", ["split", "truncate", "drop"])
def test_shares_of_a_token_total_are_exact_to_half_a_document(coll, oversize):
    cap = int(np.percentile(coll.doc_lengths, 80))  # some documents longer: split, cut or dropped
    total = 3 * int(coll.doc_lengths.sum())  # books (1/10 of the documents' tokens) needs whole repeats
    index = build_pack_index(coll, capacity=cap, oversize=oversize, proportions=SHARES, tokens=total, seed=7)
    mix = index.manifest.raw["mixture"]
    copies, total_used, plan = reference_plan(coll, SHARES, total, 7, cap, oversize)
    seg_copies, seg_tokens = segments_by(index, coll)
    assert [seg_copies[d] for d in range(coll.num_documents)] == [
        c if reference_kept(int(n), cap, oversize) else 0 for c, n in zip(copies, coll.doc_lengths)]
    assert mix["target"] == {"proportions": SHARES, "tokens": total, "total": total}
    assert mix["plan"] == {k: {"tokens": v["T"], "copies": v["c"], "extra_documents": v["j"]} for k, v in plan.items()}
    assert plan["books"]["c"] >= 2  # too few tokens of its own: repeated in whole rounds, then the remainder
    assert len(mix["rounds"]) == max(copies) and sum(mix["rounds"]) == index.num_packs
    packed = index.manifest.raw["counts"]["packed_tokens"]
    assert packed == sum(seg_tokens.values())  # shares are of the tokens after oversize losses
    for m, (name, key) in enumerate(zip(("web", "code", "books"), ("web", "code", "books"))):
        member = mix["members"][m]
        assert member == {"name": name, "key": key, "documents": member["documents"], "tokens": seg_tokens[m]}
        assert mix["shares"][key] == {"tokens": seg_tokens[m], "share": pytest.approx(seg_tokens[m] / packed)}
        assert seg_tokens[m] == plan[key]["A"]
        assert abs(seg_tokens[m] - SHARES[key] * total) <= plan[key]["half_doc"] + 0.5  # T_k is p*N rounded
    assert abs(packed - total) <= sum(v["half_doc"] for v in plan.values()) + 1.5
    report = validate(coll.path, deep=True)
    assert report.ok, report.format()


def test_without_tokens_the_key_that_runs_out_first_is_packed_once_whole(coll):
    cap = int(coll.doc_lengths.max())
    index = build_pack_index(coll, capacity=cap, proportions=SHARES, seed=3)
    mix = index.manifest.raw["mixture"]
    copies, total, plan = reference_plan(coll, SHARES, None, 3, cap, "split")
    tokens = [int(coll.doc_lengths[int(a):int(b)].sum()) for a, b in zip(coll.doc_start[:-1], coll.doc_start[1:])]
    assert total == math.floor(min(t / p for t, p in zip(tokens, SHARES.values())))
    assert mix["target"] == {"proportions": SHARES, "tokens": None, "total": total}
    seg_copies, seg_tokens = segments_by(index, coll)
    assert max(seg_copies.values()) == 1 and len(mix["rounds"]) == 1  # nothing repeated
    limiting = min(range(3), key=lambda m: tokens[m] / list(SHARES.values())[m])
    assert seg_tokens[limiting] == tokens[limiting]  # the member that runs out first is used whole
    assert [seg_copies[d] for d in range(coll.num_documents)] == copies
    assert validate(coll.path, deep=True).ok


def test_the_seed_chooses_the_remainder_documents(coll):
    cap = int(coll.doc_lengths.max())

    def extra(seed):
        index = build_pack_index(coll, capacity=cap, proportions=SHARES, tokens=10_000, seed=seed, name=f"s{seed}",
                                 overwrite=True)
        return {d for d, c in segments_by(index, coll)[0].items() if c == 1}

    a, b, a2 = extra(1), extra(2), extra(1)
    assert a == a2 and a != b
    assert a == {d for d, c in enumerate(reference_plan(coll, SHARES, 10_000, 1, cap, "split")[0]) if c}


def test_groups_pool_their_members_and_unnamed_members_are_left_out(sources, tmp_path):
    coll = write_collection(tmp_path / "g", [("web.a", sources / "web"), ("web.b", sources / "books"),
                                             ("code", sources / "code")])
    shares = {"web": 0.75, "web.b": 0.25}  # code: no key, left out
    cap = int(coll.doc_lengths.max())
    index = build_pack_index(coll, capacity=cap, proportions=shares, tokens=8000)
    mix = index.manifest.raw["mixture"]
    assert [(m["name"], m["key"]) for m in mix["members"]] == [("web.a", "web"), ("web.b", "web.b"), ("code", None)]
    assert mix["members"][2]["tokens"] == 0 and mix["proportions"]["code"] == 0.0
    _, seg_tokens = segments_by(index, coll)
    assert mix["shares"]["web"]["tokens"] == seg_tokens[0] == reference_plan(coll, shares, 8000, 0, cap, "split")[2]["web"]["A"]
    assert validate(coll.path, deep=True).ok


def test_validate_deep_refuses_a_hand_edited_record(coll):
    index = build_pack_index(coll, capacity=64, proportions=SHARES, tokens=20_000)
    path = index.path / F.PACK_INDEX_JSON
    good = json.loads(path.read_text())
    edits = {
        "mixture.shares": lambda m: m["shares"]["web"].update(tokens=m["shares"]["web"]["tokens"] + 1),
        "mixture.members": lambda m: m["members"][2].update(tokens=m["members"][2]["tokens"] - 5),
        "mixture.target": lambda m: m["target"].update(total=19_000),
        "mixture.plan": lambda m: m["plan"]["code"].update(extra_documents=0),
        "mixture.proportions": lambda m: m["proportions"].update(web=0.5),
        "mixture.target.proportions": lambda m: m["target"]["proportions"].update(web=0.7),
    }
    for field, edit in edits.items():
        raw = json.loads(json.dumps(good))
        edit(raw["mixture"])
        path.write_bytes(F.canonical_json(raw))
        report = validate(coll.path, deep=True)
        assert [p.field for p in report.errors] == [field], (field, report.format())
        # the record's agreement with the segments is a deep check; what it asked for (shares summing to 1) is
        # structural: inspect plans the copies from it (spec/COLLECTION.md C5)
        assert validate(coll.path).ok == (field != "mixture.target.proportions")
    raw = json.loads(json.dumps(good))
    raw["mixture"]["target"]["tokens"] = 40_000  # asks for twice the tokens the segments hold
    path.write_bytes(F.canonical_json(raw))
    report = validate(coll.path, deep=True)
    assert not report.ok and {p.field for p in report.errors} & {"mixture.rounds", "coverage"}, report.format()
    raw = json.loads(json.dumps(good))
    raw["mixture"]["weights"] = {"web": 1.0}  # both ways at once
    path.write_bytes(F.canonical_json(raw))
    assert [p.field for p in validate(coll.path, deep=True).errors] == ["mixture"]
    path.write_bytes(F.canonical_json(good))
    assert validate(coll.path, deep=True).ok


def test_api_errors_name_the_fix(sources, coll):
    cases = [
        (dict(proportions={"web": 0.6, "code": 0.3}), r"the shares sum to 0\.9, not 1; give shares that sum to 1, "
                                                      r"e\.g\. web=0\.6667,code=0\.3333"),
        (dict(proportions={"news": 1.0}), r"proportions: 'news' names no member; the members are \['web', 'code', 'books'\]"),
        (dict(proportions={"web": 1.5, "code": -0.5}), r"proportions: 'web': expected a share in \[0, 1\]"),
        (dict(proportions=SHARES, weights={"web": 2}), "weights= and proportions= are two ways to mix; give one"),
        (dict(tokens=1000), "tokens= is the total of a mixture by proportion; give proportions= with it"),
        (dict(proportions=SHARES, tokens=0), r"tokens: expected an integer in \[1, 2\*\*63\)"),
        (dict(proportions=SHARES, tokens=10 ** 9), r"proportions: 'web' keeps [\d,]+ tokens; its share of "
                                                   r"1,000,000,000 tokens \(600,000,000\) needs [\d,]+ copies of its "
                                                   r"documents, more than 1000"),
    ]
    for kwargs, message in cases:
        with pytest.raises(WriteError, match=message):
            build_pack_index(coll, capacity=64, **kwargs)
    with pytest.raises(WriteError, match="proportions= mixes the members of a collection; this is a single store"):
        build_pack_index(sources / "web", capacity=64, proportions={"web": 1.0})
    books = coll.doc_lengths[int(coll.doc_start[2]):]
    with pytest.raises(WriteError, match=r"'books' has share 0.1 but its members \['books'\] keep no token"):
        build_pack_index(coll, capacity=int(books.min()) - 1, oversize="drop", proportions=SHARES)
    assert not (coll.path / F.PACKS_DIR).exists() or not any((coll.path / F.PACKS_DIR).iterdir())  # nothing written


def test_cli_proportions_pack_inspect_and_one_line_errors(coll, capsys):
    assert main(["pack", str(coll.path), "--capacity", "64", "--proportions", "web=0.6,code=0.3,books=0.1",
                 "--tokens", "2e4", "--name", "blend", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mixture"]["target"] == {"proportions": SHARES, "tokens": 20_000, "total": 20_000}
    assert sum(s["tokens"] for s in out["mixture"]["shares"].values()) == out["stats"]["tokens"]
    assert main(["validate", str(coll.path), "--deep"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(coll.path)]) == 0
    text = capsys.readouterr().out
    assert "mixture proportions books=0.1, code=0.3, web=0.6 of 20,000 tokens" in text
    assert f"books: {out['mixture']['shares']['books']['tokens']:,} tokens" in text
    errors = [
        (["--weights", "web=2", "--proportions", "web=1"], 2,
         "--weights and --proportions are two ways to mix; give one"),
        (["--tokens", "1000"], 2, "--tokens is the total of a mixture by proportion; give --proportions"),
        (["--proportions", "web=0.5,code=0.3"], 1,
         "--proportions: the shares sum to 0.8, not 1; give shares that sum to 1, e.g. --proportions web=0.625,code=0.375"),
        (["--proportions", "news=1"], 1, "--proportions: 'news' names no member; the members are ['web', 'code', 'books']"),
        (["--proportions", "web"], 1, "--proportions: 'web' is not NAME=SHARE (e.g. --proportions web=0.6,code=0.3,books=0.1)"),
        (["--proportions", "web=0.6,code=0.3,books=0.1", "--tokens", "1e9"], 1, "lower --tokens or its share"),
    ]
    for extra, code, message in errors:
        assert main(["pack", str(coll.path), "--capacity", "64", *extra]) == code, extra
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    # argparse's own usage error (usage, then one error line)
    assert main(["pack", str(coll.path), "--capacity", "64", "--proportions", "web=1", "--tokens", "1.5"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == ("packfmt pack: error: argument --tokens: expected a whole number of tokens >= 1 "
                                    "(e.g. 1000000000 or 1e9), got '1.5'")
