"""Global packing over a collection, weighted mixtures, validate and inspect of collections (spec/COLLECTION.md §3-§5).

The collection is three real stores built from three kinds of source (JSONL, Parquet, a folder of
.txt files) with the sample tokenizer; every assertion compares with the member stores' own tokens.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import packfmt
from packfmt import format as F
from packfmt.build import build_text
from packfmt.cli import main
from packfmt.collection import write_collection
from packfmt.errors import FormatError, WriteError
from packfmt.packindex import build_pack_index
from packfmt.index import PackIndex
from packfmt.validate import validate

os.environ["HF_HUB_OFFLINE"] = "1"
SAMPLE = Path(packfmt.__file__).parent / "sample_data"
SAMPLE_TOK = SAMPLE / "tokenizer"
MASK64 = (1 << 64) - 1


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    """Three stores (web: JSONL, code: Parquet, books: .txt folder) built once for the module."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("sources")
    with open(SAMPLE / "text.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    with open(root / "web.jsonl", "w", encoding="utf-8") as f:
        for r in records[:20]:
            f.write(json.dumps(r) + "\n")
    build_text([root / "web.jsonl"], root / "web", SAMPLE_TOK)
    pq.write_table(pa.Table.from_pylist(records[20:35]), root / "code.parquet", row_group_size=4)
    build_text([root / "code.parquet"], root / "code", SAMPLE_TOK)
    (root / "txt").mkdir()
    for i, r in enumerate(records[35:47]):
        (root / "txt" / f"{i:03d}.txt").write_text(r["text"], encoding="utf-8")
    build_text([root / "txt"], root / "books", SAMPLE_TOK)
    return root


@pytest.fixture
def coll(sources, tmp_path):
    """A fresh collection (its own packs/) over the module's three stores."""
    return write_collection(tmp_path / "mix", [(None, sources / n) for n in ("web", "code", "books")])


def member_document(coll, g: int) -> list[int]:
    """Collection document ``g`` read from its member store directly (not through the collection)."""
    m = int(np.searchsorted(coll.doc_start, g, side="right") - 1)
    store = packfmt.open(coll.path / coll.members[m].path)
    return store.document(g - int(coll.doc_start[m])).tolist()


def all_segments(index) -> list[tuple[int, int, int, int]]:
    """``(pack, doc, begin, end)`` of every segment."""
    return [(p, int(d), int(b), int(e)) for p in range(index.num_packs) for d, b, e in index.pack_segments(p)]


def tiles_once(pieces: list[tuple[int, int]], length: int) -> bool:
    pos = 0
    for b, e in sorted(pieces):
        if b != pos:
            return False
        pos = e
    return pos == length


def reference_u(seed: int, d: int) -> float:
    """u(seed, d) written from spec/COLLECTION.md §5 in plain Python integers."""
    def splitmix64(x: int) -> int:
        z = (x + 0x9E3779B97F4A7C15) & MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    return (splitmix64(splitmix64(seed) ^ d) >> 11) * 2.0 ** -53


def test_global_pack_covers_every_document_of_every_member_once(coll):
    lengths = coll.doc_lengths
    cap = int(np.percentile(lengths, 75))  # some documents are split
    assert lengths.max() > cap
    index = build_pack_index(coll, capacity=cap, algorithm="bfd", materialize=True)
    raw = json.loads((index.path / F.PACK_INDEX_JSON).read_text())
    assert raw["format_version"] == "1.1" and "dataset" not in raw
    assert raw["collection"] == coll.index_binding()["collection"]
    segs = all_segments(index)
    by_doc: dict[int, list] = {}
    for _, d, b, e in segs:
        by_doc.setdefault(d, []).append((b, e))
    assert sorted(by_doc) == list(range(coll.num_documents)) == list(range(20 + 15 + 12))
    assert all(tiles_once(by_doc[d], int(lengths[d])) for d in by_doc)
    assert index.stats["split_documents"] > 0
    members_per_pack = [{int(coll.member_of(d)) for p2, d, _, _ in segs if p2 == p} for p in range(index.num_packs)]
    assert any(len(ms) > 1 for ms in members_per_pack)  # documents of different members share packs
    for p in range(index.num_packs):
        want = [t for _, d, b, e in (s for s in segs if s[0] == p) for t in member_document(coll, d)[b:e]]
        assert index.pack_tokens(p).tolist() == want  # materialized: gathered across members
    unmat = build_pack_index(coll, capacity=cap, algorithm="bfd", name="plain")
    assert [unmat.pack_tokens(p).tolist() for p in range(unmat.num_packs)] == \
        [index.pack_tokens(p).tolist() for p in range(index.num_packs)]
    assert validate(coll.path, deep=True).ok


def test_weight_two_packs_each_document_twice_never_twice_in_one_pack(coll):
    cap = int(coll.doc_lengths.max())  # nothing split: a document id twice in a pack would be two copies
    index = build_pack_index(coll, capacity=cap, weights={"web": 2, "code": 1})
    mixture = index.manifest.raw["mixture"]
    segs = all_segments(index)
    count = Counter(d for _, d, _, _ in segs)
    web = range(int(coll.doc_start[0]), int(coll.doc_start[1]))
    assert all(count[d] == 2 for d in web)
    assert all(count[d] == 1 for d in range(int(coll.doc_start[1]), coll.num_documents))
    for p in range(index.num_packs):
        docs = [d for p2, d, _, _ in segs if p2 == p]
        assert len(docs) == len(set(docs)), f"pack {p} holds two copies of a document"
    assert len(mixture["rounds"]) == 2 and sum(mixture["rounds"]) == index.num_packs
    assert [m["weight"] for m in mixture["members"]] == [2.0, 1.0, 1.0]  # books: no key, weight 1
    tokens = [int(sum(coll.doc_lengths[a:b])) for a, b in zip(coll.doc_start[:-1], coll.doc_start[1:])]
    assert [m["tokens"] for m in mixture["members"]] == [2 * tokens[0], tokens[1], tokens[2]]
    assert mixture["proportions"]["web"] == pytest.approx(2 * tokens[0] / (2 * tokens[0] + tokens[1] + tokens[2]))
    assert index.stats["documents"] == coll.num_documents + len(web)
    report = validate(coll.path, deep=True)
    assert report.ok, report.format()


def test_split_documents_under_weight_two_tile_each_copy_in_its_own_round(coll):
    cap = int(np.percentile(coll.doc_lengths, 50))
    index = build_pack_index(coll, capacity=cap, algorithm="first_fit_shuffle", seed=5, weights={"books": 2})
    rounds = index.manifest.raw["mixture"]["rounds"]
    first = [s for s in all_segments(index) if s[0] < rounds[0]]
    second = [s for s in all_segments(index) if s[0] >= rounds[0]]
    books = range(int(coll.doc_start[2]), coll.num_documents)
    assert {d for _, d, _, _ in second} == set(books)
    for part in (first, second):
        for d in books:
            assert tiles_once([(b, e) for _, d2, b, e in part if d2 == d], int(coll.doc_lengths[d]))
    assert validate(coll.path, deep=True).ok


def test_fractional_weight_is_floor_plus_seeded_fraction(coll):
    cap = int(coll.doc_lengths.max())
    code = range(int(coll.doc_start[1]), int(coll.doc_start[2]))

    def copies(seed):
        index = build_pack_index(coll, capacity=cap, seed=seed, weights={"code": 1.5, "books": 0.25},
                                 name=f"frac-{seed}")
        count = Counter(d for _, d, _, _ in all_segments(index))
        return index, count

    a, count_a = copies(1)
    _, count_b = copies(2)
    for seed, count in ((1, count_a), (2, count_b)):
        for d in code:
            assert count[d] == 1 + (reference_u(seed, d) < 0.5)
        for d in range(int(coll.doc_start[2]), coll.num_documents):
            assert count[d] == (reference_u(seed, d) < 0.25)
    extra_a = {d for d in code if count_a[d] == 2}
    extra_b = {d for d in code if count_b[d] == 2}
    assert extra_a and extra_b and extra_a != extra_b  # another seed chooses other documents
    rebuilt = build_pack_index(coll, capacity=cap, seed=1, weights={"code": 1.5, "books": 0.25}, name="frac-1b")
    assert Counter(d for _, d, _, _ in all_segments(rebuilt)) == count_a  # same seed, same copies
    mixture = a.manifest.raw["mixture"]
    assert mixture["members"][1]["documents"] == len(code) + len(extra_a)
    assert validate(coll.path, deep=True).ok


def test_weight_zero_drops_a_member_and_groups_take_the_longest_key(sources, tmp_path):
    coll = write_collection(tmp_path / "g", [("web.a", sources / "web"), ("web.b", sources / "code"),
                                             ("books", sources / "books")])
    index = build_pack_index(coll, capacity=int(coll.doc_lengths.max()), weights={"web": 2, "web.b": 0})
    count = Counter(d for _, d, _, _ in all_segments(index))
    a, b = (range(int(coll.doc_start[m]), int(coll.doc_start[m + 1])) for m in (0, 1))
    assert all(count[d] == 2 for d in a) and not any(count[d] for d in b)
    assert [m["weight"] for m in index.manifest.raw["mixture"]["members"]] == [2.0, 0.0, 1.0]
    assert index.manifest.raw["mixture"]["proportions"]["web.b"] == 0.0
    assert validate(coll.path, deep=True).ok
    with pytest.raises(WriteError, match=r"'news' names no member; the members are \['web.a', 'web.b', 'books'\] "
                                         r"and the groups \['web'\]"):
        build_pack_index(coll, capacity=64, weights={"news": 1})
    with pytest.raises(WriteError, match="every member has weight 0"):
        build_pack_index(coll, capacity=64, weights={"web": 0, "books": 0})
    with pytest.raises(WriteError, match=r"weights: 'books': expected a number in \[0, 1000\]"):
        build_pack_index(coll, capacity=64, weights={"books": -1})
    with pytest.raises(WriteError, match="weights= mixes the members of a collection; this is a single store"):
        build_pack_index(sources / "web", capacity=64, weights={"web": 1})


def test_index_of_another_member_list_is_refused(sources, coll, tmp_path):
    index = build_pack_index(coll, capacity=64)
    other = write_collection(tmp_path / "other", [(None, sources / n) for n in ("code", "web", "books")])
    shutil.copytree(index.path, other.path / F.PACKS_DIR / index.name)
    with pytest.raises(FormatError, match="built for another member list"):
        PackIndex(other, index.name)
    report = validate(other.path)
    assert not report.ok and any(p.field == "collection" for p in report.errors)
    store_index = build_pack_index(sources / "web", capacity=64, name="web-only")
    shutil.copytree(store_index.path, coll.path / F.PACKS_DIR / "web-only")
    with pytest.raises(FormatError, match="built for a single store"):
        PackIndex(coll, "web-only")
    shutil.rmtree(sources / "web" / F.PACKS_DIR / "web-only")


def test_validate_deep_catches_a_tampered_mixture_and_a_broken_member(sources, coll, tmp_path):
    index = build_pack_index(coll, capacity=64, weights={"web": 2})
    path = index.path / F.PACK_INDEX_JSON
    raw = json.loads(path.read_text())
    raw["mixture"]["weights"] = {"web": 3.0}  # claims three copies; the segments hold two
    path.write_bytes(F.canonical_json(raw))
    report = validate(coll.path, deep=True)
    assert not report.ok
    assert any("mixture.rounds" == p.field for p in report.errors), report.format()
    raw["mixture"]["weights"] = {"web": 2.0}
    raw["mixture"]["members"][0]["tokens"] += 1
    path.write_bytes(F.canonical_json(raw))
    report = validate(coll.path, deep=True)
    assert [p.field for p in report.errors] == ["mixture.members"], report.format()
    assert validate(coll.path).ok  # the record is a deep check
    # a member whose manifest changed after the collection was written: C3, named by member
    broken = shutil.copytree(sources / "books", tmp_path / "books")
    mix = write_collection(tmp_path / "mix2", [(None, sources / "web"), (None, broken)])
    manifest = json.loads((broken / F.MANIFEST).read_text())
    manifest["producer"]["version"] = "0.0.0-edited"
    (broken / F.MANIFEST).write_bytes(F.canonical_json(manifest))
    report = validate(mix.path)
    assert not report.ok
    fix = "write the collection again over the members as they are now (`packfmt merge`"
    assert any(p.field == "members[1].manifest" and fix in p.message for p in report.errors)
    (broken / F.TOKENS).write_bytes((broken / F.TOKENS).read_bytes()[:-2])  # the member's own V10
    report = validate(mix.path)
    assert any(p.file == "../books/tokens.bin" and p.message.startswith("member 'books' (../books): ")
               for p in report.errors), report.format()


def test_cli_pack_weights_validate_and_inspect(coll, capsys):
    assert main(["pack", str(coll.path), "--capacity", "64", "--weights", "web=2,books=0.5", "--seed", "3",
                 "--name", "mixed", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mixture"]["weights"] == {"books": 0.5, "web": 2.0}
    assert sum(out["mixture"]["proportions"].values()) == pytest.approx(1.0)
    assert main(["validate", str(coll.path), "--deep"]) == 0
    assert "valid packfmt dataset (deep check" in capsys.readouterr().out
    assert main(["inspect", str(coll.path)]) == 0
    text = capsys.readouterr().out
    assert "collection " in text and "members:" in text
    for name in ("web", "code", "books"):
        assert any(line.split()[:1] == [name] and "../" in line for line in text.splitlines())
    assert "mixture weights books=0.5, web=2 (seed 3" in text
    assert main(["inspect", str(coll.path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in summary["members"]] == ["web", "code", "books"]
    assert sum(m["share"] for m in summary["members"]) == pytest.approx(1.0)
    assert summary["pack_indexes"]["mixed"]["mixture"]["seed"] == 3
    assert main(["pack", str(coll.path), "--capacity", "64", "--weights", "news=1"]) == 1
    err = capsys.readouterr().err
    assert "--weights: 'news' names no member; the members are ['web', 'code', 'books']" in err
    assert main(["pack", str(coll.path), "--capacity", "64", "--weights", "web"]) == 1
    assert "--weights: 'web' is not NAME=WEIGHT" in capsys.readouterr().err


def test_members_with_images_pack_globally_without_cutting_an_image(tmp_path):
    """Image spans of every member are carried into collection coordinates; the image budget holds."""
    import io

    from PIL import Image

    img = 99

    def png(seed: int) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (4, 5, 3), dtype=np.uint8)).save(buf, "PNG")
        return buf.getvalue()

    def make(root: Path, docs, spans) -> Path:
        with packfmt.DatasetWriter(root, vocab_size=100, tokenizer={"name": "t", "hash": None},
                                   special_tokens={"image": img}) as w:
            for doc, sp in zip(docs, spans):
                w.add_document(doc, images=[packfmt.ImageRecord(png(b), 5, 4, "png", b, e) for b, e in sp])
        return root

    a = make(tmp_path / "a", [[1, img, img, img, 2, 3, img, img, 4], [5, 6]], [[(1, 4), (6, 8)], []])
    b = make(tmp_path / "b", [[7, 8, 9], [img, img, img, img, 1, 2, img, img]], [[], [(0, 4), (6, 8)]])
    c = make(tmp_path / "c", [[3, 3, 3, 3], [4, 4]], [[], []])
    coll = write_collection(tmp_path / "mix", [(None, a), (None, b), (None, c)])
    index = build_pack_index(coll, capacity=5, max_images_per_pack=1, materialize=True, weights={"b": 2})
    spans = np.concatenate([np.asarray(packfmt.open(p).images.token_spans) + int(coll.token_start[m])
                            for m, p in enumerate((a, b))])
    off = coll.doc_offsets
    for p in range(index.num_packs):
        starts = [off[d] + s for d, s, _ in index.pack_segments(p)]
        ends = [off[d] + e for d, _, e in index.pack_segments(p)]
        inside = sum(int(np.count_nonzero((spans[:, 0] >= s) & (spans[:, 1] <= e))) for s, e in zip(starts, ends))
        cut = sum(int(np.count_nonzero((spans[:, 0] < s) & (spans[:, 1] > s))) for s in starts)
        assert inside <= 1 and cut == 0
        want = [t for d, s, e in index.pack_segments(p) for t in member_document(coll, int(d))[s:e]]
        assert index.pack_tokens(p).tolist() == want
    report = validate(coll.path, deep=True)
    assert report.ok, report.format()


def test_cli_pack_says_copies_and_validate_names_members(coll, capsys):
    assert main(["pack", str(coll.path), "--capacity", "64", "--weights", "web=2"]) == 0
    assert f"from {coll.num_documents + 20:,} document copies" in capsys.readouterr().out
    assert main(["validate", str(coll.path)]) == 0
    assert "members 3, documents 47" in capsys.readouterr().out


def test_a_segment_past_its_document_is_refused_by_the_collections_lengths(coll, tmp_path):
    """V27 over a collection is checked against its documents' lengths (no offsets array is built): a segment one
    token past its document, or naming a document past the last, is refused at open, naming the document's length."""
    index = build_pack_index(coll, capacity=64, name="v27")
    segs = np.fromfile(index.path / F.SEGMENTS, dtype=np.int64).reshape(-1, 3)
    lengths = coll.doc_lengths
    for k, row, says in ((3, None, f"length of document {{d}} ({{n}})"), (5, "doc", "a document id in [0, ")):
        bad = segs.copy()
        if row is None:
            d = int(bad[k, 0])
            bad[k, 1], bad[k, 2] = 0, lengths[d] + 1
            says = says.format(d=d, n=int(lengths[d]))
        else:
            bad[k, 0] = coll.num_documents
        shutil.rmtree(tmp_path / "c", ignore_errors=True)
        shutil.copytree(coll.path, tmp_path / "c")
        (tmp_path / "c" / F.PACKS_DIR / "v27" / F.SEGMENTS).write_bytes(bad.tobytes())
        with pytest.raises(FormatError) as exc:
            packfmt.open(tmp_path / "c").pack_index("v27")
        assert "V27" in str(exc.value) or exc.value.field.startswith("["), str(exc.value)
        assert says in str(exc.value), str(exc.value)
