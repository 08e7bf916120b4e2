"""``packfmt pack COLL --shards OUT``: the packs of an index rewritten in pack order as a collection of shards
(spec/COLLECTION.md §9, format 1.3).

Real stores built by the CLI (text without a loss mask, chat, LLaVA with PNGs) in one collection,
packed with a small capacity (split documents, a truncating index) and a weighted mixture; for
every pack, ``PackedDataset`` over OUT gives the same ``input_ids``, ``labels``, ``position_ids``
and images as over the source. OUT validates (structural and deep); a layout that breaks the
coverage rule of §9 is refused with an error naming the file and field. A new index over OUT, or a merge of
it, is refused (§9.2: its lookahead tokens are labels only), naming the index to train from.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packfmt
from packfmt import format as F
from packfmt._io import checksum_file
from packfmt.cli import main
from packfmt.collection import Collection, shards, write_collection
from packfmt.collection.shards import parse_size, write_shards
from packfmt.errors import DatasetExistsError, FormatError, WriteError
from packfmt.packindex import build_pack_index
from packfmt.torch import PackedDataset
from packfmt.torch.testing import write_flat_dataset
from packfmt.validate import validate

from limits import time_limit
from mixed_stores import build_mixed_stores
from s3_server import BUCKET, cache, s3_server  # noqa: F401  (fixtures; the server starts for the remote test only)
from shards_reference import reference_write_shards
from stream_bounds import limit_for

NAME = "c48"
#: Compared key by key; ``document_ids`` and ``image_ids`` are ids of OUT's own documents and images.
SAME = ("input_ids", "labels", "position_ids", "doc_ids", "seq_lens", "num_label_tokens", "pack_id", "image_spans")


@pytest.fixture(scope="module")
def mix(tmp_path_factory) -> Collection:
    root = tmp_path_factory.mktemp("shards")
    stores = build_mixed_stores(root)
    return write_collection(root / "mix", [(None, stores[k]) for k in ("text", "chat", "vqa")])


@pytest.fixture(scope="module")
def out(mix, tmp_path_factory) -> Collection:
    """The CLI path: a weighted mixture (text 1.5: copies are documents of the shards too), split documents."""
    dst = tmp_path_factory.mktemp("out") / "shards"
    assert main(["pack", str(mix.path), "--capacity", "48", "--name", NAME, "--weights", "text=1.5",
                 "--shards", str(dst), "--shard-size", "3KiB"]) == 0
    return Collection(dst)


def assert_same_packs(src, dst, name: str, **kw) -> None:
    a, b = PackedDataset(src, index=name, **kw), PackedDataset(dst, index=name, **kw)
    assert len(a) == len(b) > 0
    for i in range(len(a)):
        x, y = a[i], b[i]
        for key in SAME:
            if key in x:
                assert x[key].tolist() == y[key].tolist(), (i, key)
        assert len(x.get("images", [])) == len(y.get("images", []))
        for p, q in zip(x.get("images", []), y.get("images", [])):
            assert p.shape == q.shape and bool((p == q).all()), i


def assert_same_bytes(got: Path, want: Path) -> None:
    """Every file of two OUTs byte for byte, but ``stats.seconds`` of an ``index.json`` (how long the write took)."""
    files = sorted(p.relative_to(want).as_posix() for p in want.rglob("*") if p.is_file())
    assert sorted(p.relative_to(got).as_posix() for p in got.rglob("*") if p.is_file()) == files
    for name in files:
        a, b = (got / name).read_bytes(), (want / name).read_bytes()
        if name.startswith(F.PACKS_DIR + "/") and name.endswith("/" + F.PACK_INDEX_JSON):
            a, b = json.loads(a), json.loads(b)
            assert isinstance(a["stats"].pop("seconds"), float) and isinstance(b["stats"].pop("seconds"), float)
        assert a == b, name


def test_every_pack_reads_the_same(mix, out):
    assert_same_packs(str(mix.path), str(out.path), NAME)
    assert_same_packs(str(mix.path), str(out.path), NAME, pad_to_capacity=True)
    layout = out.manifest.raw["layout"]
    src = mix.pack_index(NAME)
    assert out.manifest.raw["format_version"] == "1.3" and layout["kind"] == "pack-ordered"
    assert layout["index"] == NAME and layout["source"]["mixture"] == src.manifest.raw["mixture"]
    assert layout["source"]["index"] == checksum_file(src.path / F.PACK_INDEX_JSON)
    assert layout["source"]["manifest"] == checksum_file(mix.path / F.MANIFEST)
    # one document per source segment, the lookahead tokens on top of the packed tokens; nothing lost
    assert out.num_documents == src.manifest.num_segments
    assert out.num_tokens == src.manifest.raw["counts"]["packed_tokens"] + layout["lookahead_tokens"]
    assert 0 < layout["lookahead_tokens"] < out.num_documents
    assert out.num_images == mix.num_images  # every image in one segment, once (the weights copy text only)
    assert "mixture" not in out.pack_index(NAME).manifest.raw  # the packer did not make it: validate must not re-plan


def test_truncated_and_single_store_sources(mix, tmp_path):
    """A truncating index (the label at a truncation cut is in no pack: the lookahead carries it), and a
    store (a collection of one) as the source."""
    build_pack_index(mix, capacity=40, name="t40", oversize="truncate", algorithm="bfd", max_lost_fraction=1)
    assert_same_packs(str(mix.path), str(write_shards(mix, "t40", tmp_path / "t").path), "t40")
    text = mix.member_path(0)
    build_pack_index(str(text), capacity=32, name="s32")
    dst = write_shards(str(text), "s32", tmp_path / "s", shard_bytes=1 << 30)
    assert len(dst.members) == 1 and not dst.has_loss_mask
    assert_same_packs(str(text), str(dst.path), "s32")
    assert validate(dst.path, deep=True).ok


def test_same_bytes_as_the_writer_that_held_every_segment(mix, out, tmp_path):
    """The streamed writer's OUT is, file for file, what the pre-streaming writer (tests/shards_reference.py) wrote."""
    assert_same_bytes(out.path, reference_write_shards(mix, NAME, tmp_path / "ref", shard_bytes=3 * 1024).path)


@pytest.mark.parametrize("chunk,tokens", [(1, 1), (2, 5), (7, 1 << 20)])
def test_same_bytes_whatever_the_chunk(mix, out, tmp_path, monkeypatch, chunk, tokens):
    """The index is read ``CHUNK_SEGMENTS`` rows at a time: chunks of a few segments end inside packs (a pack
    longer than a chunk), inside shards and where shards end; documents are gathered ``CHUNK_TOKENS`` at a
    time. OUT is the same, byte for byte, as the pre-streaming writer's."""
    monkeypatch.setattr(shards, "CHUNK_SEGMENTS", chunk)
    monkeypatch.setattr(shards, "CHUNK_TOKENS", tokens)
    po = np.asarray(mix.pack_index(NAME).pack_offsets)
    assert np.setdiff1d(np.arange(chunk, po[-1], chunk), po).size  # chunks end inside packs ...
    assert chunk > 2 or np.diff(po).max() > chunk  # ... packs longer than a chunk (up to 3 segments here)
    starts = np.asarray(out.doc_start[1:-1])  # the segments where shards 1, 2, ... begin
    assert (starts % chunk == 0).any() and (chunk == 1 or (starts % chunk != 0).any())  # at shard ends or not
    assert (np.diff(out.doc_start) > chunk).any()  # shards span chunks
    dst = write_shards(mix, NAME, tmp_path / "o", shard_bytes=3 * 1024)
    assert_same_bytes(dst.path, reference_write_shards(mix, NAME, tmp_path / "ref", shard_bytes=3 * 1024).path)


def doc_bytes(store, d0: int, d1: int) -> int:
    """Bytes of documents ``d0 .. d1 - 1`` of a shard: tokens, loss mask, encoded images (what the size counts)."""
    per = store.np_token_dtype.itemsize + (1 if store.has_loss_mask else 0)
    n = int(store.doc_offsets[d1] - store.doc_offsets[d0]) * per
    if store.num_images:
        i0, i1 = store.images.doc_image_offsets[d0], store.images.doc_image_offsets[d1]
        n += int(store.images.offsets[i1] - store.images.offsets[i0])
    return n


def test_shards_are_cut_at_pack_boundaries_near_the_size(out):
    layout, idx = out.manifest.raw["layout"], out.pack_index(NAME)
    segs, po = np.asarray(idx.segments), np.asarray(idx.pack_offsets)
    assert np.array_equal(segs[:, 0], np.arange(out.num_documents)) and not segs[:, 1].any()
    member = out.member_of(segs[:, 0])
    assert np.array_equal(member[po[:-1]], member[po[1:] - 1])  # no pack crosses a shard
    assert np.bincount(member[po[:-1]]).tolist() == layout["member_packs"]
    assert len(out.members) > 3 and [m.path for m in out.members] == [f"shards/{k:05d}" for k in range(len(out.members))]
    ends = np.cumsum(layout["member_packs"])
    for m in range(len(out.members)):
        store = out.member(m)
        size = doc_bytes(store, 0, store.num_documents)
        last = int(po[ends[m] - 1] - out.doc_start[m])  # the first document of the shard's last pack
        assert size >= 3 * 1024 or m == len(out.members) - 1, m  # reached the size (the last: what was left)
        assert size - doc_bytes(store, last, store.num_documents) < 3 * 1024, m  # not before its last pack


def test_validate_structural_deep_and_cli(out, capsys):
    for deep in (False, True):
        report = validate(out.path, deep=deep)
        assert report.ok and not report.problems, [p.message for p in report.problems]
    assert main(["validate", str(out.path), "--deep"]) == 0
    assert "valid" in capsys.readouterr().out
    assert main(["inspect", str(out.path)]) == 0
    text = capsys.readouterr().out
    assert f"pack-ordered: index '{NAME}' in pack order, {len(out.members)} shard(s)" in text
    assert "source mixture weights text=1.5" in text
    assert "streamed (stream=True): its index is read a shard at a time" in text


def test_inspect_says_how_a_layout_index_streams(out, tmp_path, capsys):
    """A 1.1 layout index (no shard digests) is fetched whole by a streamed read: inspect says so and what writes
    one read a shard at a time."""
    from old_collections import without_shard_rows

    root = copy_of(out, tmp_path)
    without_shard_rows(root / F.PACKS_DIR / NAME)
    assert main(["inspect", str(root)]) == 0
    text = capsys.readouterr().out
    assert "its index is fetched whole before the first batch" in text and "--shards OUT" in text
    assert main(["inspect", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pack_indexes"][NAME]["shard_rows"] is False


# ------------------------------------------------------------------------ no new index over OUT, no merge of it
def assert_says_what_to_do(message: str, out, verb: str) -> None:
    """The collection, the manifest key, the index to train from and the other choice (spec/COLLECTION.md §9.2)."""
    assert message.startswith(f"{out.path}: a pack-ordered layout (manifest.json key `layout`"), message
    assert f"{out.manifest.raw['layout']['lookahead_tokens']:,} of them ending with a lookahead token" in message
    assert f"Train from the index it lays out, {out.path}/packs/{NAME}" in message
    assert f"or {verb} the source collection it was cut from ('mix') instead" in message


def test_a_new_index_over_the_shards_is_refused(mix, out, capsys, tmp_path):
    """Its lookahead tokens are labels only: FORMAT.md §4.3 would pack them as inputs. Refused before anything
    is written, through the API (a collection or a path) and the CLI; the source packs."""
    before = out.pack_index_names()
    for dataset in (out, str(out.path)):
        with pytest.raises(WriteError) as exc:
            build_pack_index(dataset, capacity=64, name="c64")
        assert exc.value.field == "layout" and exc.value.file == f"{out.path}/{F.MANIFEST}"
        assert_says_what_to_do(str(exc.value), out, "pack")
    for extra in ([], ["--shards", str(tmp_path / "again")]):
        assert main(["pack", str(out.path), "--capacity", "64", "--name", "c64", *extra]) == 1
        err = capsys.readouterr().err
        assert_says_what_to_do(err.removeprefix("packfmt pack: error: "), out, "pack")
        assert "instead: packfmt pack SRC --capacity N [--shards NEW]" in err
    assert Collection(out.path).pack_index_names() == before and not (tmp_path / "again").exists()
    assert main(["pack", str(mix.path), "--capacity", "64", "--name", "c64"]) == 0  # what the message says to do
    assert "c64" in mix.pack_index_names()


def test_a_merge_of_the_shards_is_refused(mix, out, capsys, tmp_path):
    """A merge drops the `layout` record: any index over the result would train on the lookahead tokens."""
    from packfmt.collection import merge_physical

    with pytest.raises(WriteError) as exc:
        merge_physical([(None, out.path)], tmp_path / "one")
    assert exc.value.field == "layout"
    assert_says_what_to_do(str(exc.value), out, "merge")
    with pytest.raises(WriteError) as exc:  # the Python API of the plain merge too
        write_collection(tmp_path / "one", [(None, mix.path), (None, out.path)])
    assert exc.value.field == "layout"
    for args in ([str(mix.path), str(out.path)], ["--physical", str(out.path)]):
        assert main(["merge", *args, "-o", str(tmp_path / "m")]) == 1
        assert_says_what_to_do(capsys.readouterr().err.removeprefix("packfmt merge: error: "), out, "merge")
    assert not (tmp_path / "one").exists() and not (tmp_path / "m").exists()
    assert main(["merge", str(mix.path), "-o", str(tmp_path / "m")]) == 0


def test_a_merge_of_remote_shards_is_refused_from_its_manifest(out, s3_server, cache, capsys, tmp_path):
    """An s3:// layout source: refused from its manifest.json alone, before any member is fetched into the cache,
    naming the URL given (not the cache's copy), through the API and the CLI, plain and --physical."""
    from packfmt.collection import merge_physical

    url = f"s3://{BUCKET}/refused/shards"
    for f in out.path.rglob("*"):
        if f.is_file():
            s3_server.put_file(str(f), f"{BUCKET}/refused/shards/{f.relative_to(out.path).as_posix()}")
    with pytest.raises(WriteError) as exc:
        write_collection(f"s3://{BUCKET}/refused/merged", [(None, url)])
    assert exc.value.field == "layout" and exc.value.file == f"{url}/{F.MANIFEST}"
    with pytest.raises(WriteError) as exc:
        merge_physical([(None, url + "/")], tmp_path / "one")
    assert exc.value.file == f"{url}/{F.MANIFEST}"
    for args in ([url, "-o", f"s3://{BUCKET}/refused/m"], ["--physical", f"n={url}", "-o", str(tmp_path / "m")]):
        assert main(["merge", *args]) == 1
        err = capsys.readouterr().err.removeprefix("packfmt merge: error: ")
        assert err.startswith(f"{url}: a pack-ordered layout (manifest.json key `layout`"), err
        assert f"Train from the index it lays out, {url}/packs/{NAME}" in err and str(cache) not in err
    fetched = [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []
    assert fetched == [], fetched  # not a member file, not even the manifest: nothing was mirrored
    assert not (tmp_path / "one").exists() and not (tmp_path / "m").exists()
    assert not s3_server.exists(f"{BUCKET}/refused/merged") and not s3_server.exists(f"{BUCKET}/refused/m")


def test_the_shards_index_reshards(mix, out, tmp_path):
    """Writing shards of another size from OUT's own index is not packing: they read as the source's packs."""
    again = write_shards(out, NAME, tmp_path / "again", shard_bytes=1 << 20)
    assert len(again.members) == 1 and again.num_tokens == out.num_tokens
    assert again.manifest.raw["layout"]["lookahead_tokens"] == out.manifest.raw["layout"]["lookahead_tokens"]
    assert_same_packs(str(mix.path), str(again.path), NAME)


# ---------------------------------------------------------------------------------------------- refusals
def copy_of(out, tmp_path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(out.path, dst, symlinks=True)
    return dst


def rewrite_index(root: Path, segs: np.ndarray, packed_delta: int = 0) -> None:
    """Replace ``segments.bin`` of the laid-out index, its files entry and packed count kept true."""
    d = root / F.PACKS_DIR / NAME
    (d / F.SEGMENTS).write_bytes(np.ascontiguousarray(segs, dtype=F.OFFSET_DTYPE).tobytes())
    obj = json.loads((d / F.PACK_INDEX_JSON).read_bytes())
    obj["files"][F.SEGMENTS] = {"bytes": (d / F.SEGMENTS).stat().st_size, "checksum": checksum_file(d / F.SEGMENTS)}
    obj["counts"]["packed_tokens"] += packed_delta
    (d / F.PACK_INDEX_JSON).write_bytes(F.canonical_json(obj))


def rewrite_manifest(root: Path, edit) -> None:
    obj = json.loads((root / F.MANIFEST).read_bytes())
    edit(obj)
    (root / F.MANIFEST).write_bytes(F.canonical_json(obj))


def coverage_errors(root: Path) -> list:
    assert validate(root).ok  # structural checks pass: only the coverage rule (deep) is broken
    report = validate(root, deep=True)
    return [p for p in report.errors if p.file == f"{F.PACKS_DIR}/{NAME}/{F.SEGMENTS}" and p.field == "coverage"]


def lookahead_rows(out) -> tuple[np.ndarray, np.ndarray]:
    segs = np.array(out.pack_index(NAME).segments)
    return segs, np.flatnonzero(segs[:, 2] == np.diff(np.asarray(out.doc_offsets)) - 1)


def test_a_segment_not_starting_at_0_is_refused(out, tmp_path):
    root = copy_of(out, tmp_path)
    segs, ahead = lookahead_rows(out)
    segs[ahead[0], 1:] += 1  # [1, L): same length, the lookahead token now an input
    rewrite_index(root, segs)
    errors = coverage_errors(root)
    assert errors and "[0, L) or [0, L - 1)" in errors[0].expected and f"segment {ahead[0]} is [1," in errors[0].found


def test_two_lookahead_tokens_are_refused(out, tmp_path):
    root = copy_of(out, tmp_path)
    segs, ahead = lookahead_rows(out)
    segs[ahead[0], 2] -= 1  # [0, L - 2)
    rewrite_index(root, segs, packed_delta=-1)
    errors = coverage_errors(root)
    assert errors and f"segment {ahead[0]} is [0," in errors[0].found


def test_a_lookahead_on_an_untrained_token_is_refused(out, tmp_path):
    """A lookahead token is a label, so its loss mask is 1: a shard whose mask says 0 there is refused
    (the shard, the collection's member record and the index binding all rewritten to agree)."""
    from packfmt.collection.manifest import member_list_checksum

    root = copy_of(out, tmp_path)
    _, ahead = lookahead_rows(out)
    g = int(ahead[-1])
    m, d = out.locate(g)
    shard = root / out.members[m].path
    flat = shard / F.LOSS_MASK
    data = bytearray(flat.read_bytes())
    data[int(out.member(m).doc_offsets[d + 1]) - 1] = 0
    flat.write_bytes(bytes(data))
    rewrite_manifest(shard, lambda o: o["files"][F.LOSS_MASK].update(checksum=checksum_file(flat)))
    rewrite_manifest(root, lambda o: o["members"][m].update(manifest=checksum_file(shard / F.MANIFEST)))
    members = json.loads((root / F.MANIFEST).read_bytes())["members"]
    index_json = root / F.PACKS_DIR / NAME / F.PACK_INDEX_JSON
    obj = json.loads(index_json.read_bytes())
    obj["collection"] = member_list_checksum(members)
    index_json.write_bytes(F.canonical_json(obj))
    errors = coverage_errors(root)
    assert errors and "loss mask 1" in errors[0].expected and str(g) in errors[0].found


def test_a_missing_layout_record_is_refused(out, tmp_path):
    """Without the record the index is checked by FORMAT.md §4.3: its lookahead tokens leave gaps."""
    root = copy_of(out, tmp_path)
    rewrite_manifest(root, lambda o: o.pop("layout"))
    errors = coverage_errors(root)
    assert errors and "tile [0, length)" in errors[0].expected


@pytest.mark.parametrize("edit,field", [
    (lambda o: o["layout"].update(kind="shuffled"), "layout.kind"),
    (lambda o: o["layout"].update(member_packs=o["layout"]["member_packs"][:-1]), "layout.member_packs"),
    (lambda o: o["layout"]["source"].update(index="xxh3_64:nothex"), "layout.source.index"),
    (lambda o: o["layout"].pop("lookahead_tokens"), "layout.lookahead_tokens"),
    (lambda o: o.update(format_version="1.2"), "layout"),
])
def test_a_malformed_layout_record_is_refused_on_open(out, tmp_path, edit, field):
    root = copy_of(out, tmp_path)
    rewrite_manifest(root, edit)
    with pytest.raises(FormatError) as exc:
        Collection(root)
    assert exc.value.file == F.MANIFEST and exc.value.field == field
    assert not validate(root).ok


def test_record_that_disagrees_with_the_index_is_refused(out, tmp_path):
    root = copy_of(out, tmp_path)
    rewrite_manifest(root, lambda o: o["layout"].update(lookahead_tokens=o["layout"]["lookahead_tokens"] + 1))
    assert [p.field for p in validate(root, deep=True).errors] == ["layout.lookahead_tokens"]
    rewrite_manifest(root, lambda o: o["layout"].update(index="nope", lookahead_tokens=o["layout"]["lookahead_tokens"] - 1))
    assert [p.field for p in validate(root).errors] == ["layout.index"]


def test_cli_usage_and_existing_output(mix, out, capsys, tmp_path):
    assert main(["pack", str(mix.path), "--capacity", "48", "--shard-size", "1MiB"]) == 2
    assert "--shard-size" in capsys.readouterr().err
    assert main(["pack", str(mix.path), "--capacity", "48", "--shards", "x", "--shard-size", "lots"]) == 2
    assert main(["pack", str(mix.path), "--capacity", "48", "--name", "again", "--shards", str(out.path)]) == 1
    assert "already exists" in capsys.readouterr().err and "again" not in mix.pack_index_names()  # refused first
    assert Collection(out.path).num_documents == out.num_documents
    assert main(["pack", str(mix.path), "--capacity", "64", "--name", "j64", "--shards", str(tmp_path / "j"),
                 "--json"]) == 0
    shards = json.loads(capsys.readouterr().out)["shards"]
    assert shards["documents"] == mix.pack_index("j64").manifest.num_segments == Collection(tmp_path / "j").num_documents
    with pytest.raises(DatasetExistsError):
        write_shards(mix, NAME, out.path)
    with pytest.raises(WriteError):
        write_shards(mix, NAME, tmp_path / "x", shard_bytes=0)
    with pytest.raises(WriteError, match="must go beside it"):
        write_shards(mix, NAME, mix.path / "shards", overwrite=True)
    assert Collection(mix.path).num_documents == mix.num_documents
    assert parse_size("256MiB") == 256 << 20 and parse_size("1GB") == 10**9 and parse_size("4096") == 4096
    with pytest.raises(ValueError):
        parse_size("0.1")


def test_remote_out_is_uploaded_and_reads_the_same(mix, out, s3_server, cache, tmp_path, monkeypatch):
    """A URL OUT: written where the cache mirrors it, uploaded manifest last; read back through a fresh cache,
    whole and streamed member by member."""
    url = f"s3://{BUCKET}/shards/out"
    with time_limit(240, "write_shards to a moto server, read back whole and streamed"):
        dst = write_shards(mix, NAME, url, shard_bytes=6 * 1024)
        keys = {k.split("/shards/out/", 1)[1] for k in s3_server.find(f"{BUCKET}/shards/out")}
        assert {F.MANIFEST, f"{F.PACKS_DIR}/{NAME}/{F.PACK_INDEX_JSON}", f"shards/00000/{F.TOKENS}"} <= keys
        assert len(dst.members) == len({k.split("/")[1] for k in keys if k.startswith("shards/")})
        fresh = packfmt.open(url, cache_dir=tmp_path / "fresh")
        assert_same_packs(str(mix.path), fresh, NAME)
        assert validate(url, deep=True).ok
        with pytest.raises(DatasetExistsError):
            write_shards(mix, NAME, url)
        with pytest.raises(WriteError, match=f"^{url}: a pack-ordered layout .* it lays out, {url}/packs/{NAME} "):
            build_pack_index(url, capacity=64, name="c64")  # a URL: refused the same
        # why shards: streamed in shards' order (shards shuffled, packs shuffled within each), each shard is
        # fetched once, whatever the order inside it, with room for two shards only (text: images are not
        # streamed yet)
        text = mix.member_path(0)
        build_pack_index(str(text), capacity=32, name="r32", overwrite=True)
        dst = write_shards(str(text), "r32", f"{url}-text", shard_bytes=4 * 1024)
        monkeypatch.setenv("PACKFMT_CACHE", str(tmp_path / "streamed"))
        two = limit_for(f"{url}-text", "r32", 2, tmp_path / "probe")  # the fixed files and room for two shards
        ds = PackedDataset(f"{url}-text", "r32", stream=True, cache_limit=two)
        reference = PackedDataset(str(text), "r32")
        rng, ends = np.random.default_rng(0), np.concatenate([[0], np.cumsum(dst.manifest.raw["layout"]["member_packs"])])
        for k in rng.permutation(len(dst.members)):
            for p in rng.permutation(np.arange(ends[k], ends[k + 1])):
                assert ds[int(p)]["labels"].tolist() == reference[int(p)]["labels"].tolist()
        fetched = _fetched_tokens(tmp_path / "streamed")
        assert len(dst.members) > 4 and sorted(fetched) == sorted(set(fetched)) and len(fetched) == len(dst.members)
        # the same packs in a global shuffle fetch shards again and again
        monkeypatch.setenv("PACKFMT_CACHE", str(tmp_path / "shuffled"))
        ds = PackedDataset(f"{url}-text", "r32", stream=True, cache_limit=two)
        for p in rng.permutation(len(ds))[:4 * len(dst.members)]:  # 4 packs per shard: a quarter of a shard's cost
            ds[int(p)]
        assert len(_fetched_tokens(tmp_path / "shuffled")) > 2 * len(dst.members)


def _fetched_tokens(cache_root: Path) -> list[str]:
    """The ``tokens.bin`` URLs a cache downloaded, one per download."""
    log = (cache_root / "downloads.log").read_text().splitlines()
    return [json.loads(line)["url"] for line in log if f"/{F.TOKENS}" in line]


# ------------------------------------------------------------------------------------------ property
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_property_labels_and_positions_survive_sharding(tmp_path_factory, data):
    """Random documents and loss masks, any capacity and oversize policy, any shard and chunk size: same packs,
    and the same bytes as the pre-streaming writer."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    lengths = rng.integers(1, 40, size=data.draw(st.integers(1, 30)))
    tokens = rng.integers(0, 500, size=int(lengths.sum()))
    masked = data.draw(st.booleans())
    mask = (rng.random(tokens.size) < 0.7).astype(np.uint8) if masked else None
    root = tmp_path_factory.mktemp("prop")
    store = write_flat_dataset(root / "ds", tokens, np.concatenate([[0], np.cumsum(lengths)]), vocab_size=500,
                               loss_mask=mask)
    oversize = data.draw(st.sampled_from(["split", "truncate", "drop"]))
    cap = data.draw(st.integers(1, 50))
    if oversize == "drop" and int(lengths.min()) > cap:
        cap = int(lengths.min())
    build_pack_index(store, capacity=cap, name="p", oversize=oversize, max_lost_fraction=1,
                     algorithm=data.draw(st.sampled_from(["ffd", "first_fit_shuffle"])))
    size = data.draw(st.integers(1, 400))
    with pytest.MonkeyPatch.context() as mp:  # chunks of any size, down to one segment and one token
        mp.setattr(shards, "CHUNK_SEGMENTS", data.draw(st.sampled_from([1, 2, 3, 5, 8, 1 << 16])))
        mp.setattr(shards, "CHUNK_TOKENS", data.draw(st.sampled_from([1, 7, 40, 1 << 20])))
        dst = write_shards(store, "p", root / "out", shard_bytes=size)
    assert_same_packs(str(store.path), str(dst.path), "p")
    assert validate(dst.path, deep=True).ok
    assert_same_bytes(dst.path, reference_write_shards(store, "p", root / "ref", shard_bytes=size).path)


def test_a_shard_per_pack_is_listed_as_a_member_table(mix, out, tmp_path):  # out: mix packed as NAME
    """One pack per shard (shard_bytes=1) makes hundreds of shards: their list is a member table (COLLECTION §2.5,
    format 2.0), the bytes are the reference writer's, and every pack reads as the source's."""
    many = write_shards(mix, NAME, tmp_path / "many", shard_bytes=1)
    assert len(many.members) >= 256 and many.manifest.raw["members"] == "table"
    assert many.manifest.raw["format_version"] == "2.0" and many.manifest.raw["layout"]["member_packs"] == [1] * len(
        many.members)
    reference_write_shards(mix, NAME, tmp_path / "ref", shard_bytes=1)
    assert_same_bytes(many.path, tmp_path / "ref")
    assert_same_packs(str(mix.path), str(many.path), NAME)
    assert validate(many.path, deep=True).ok


def _rewrite_index_file(root: Path, fname: str, data: bytes, drop: str | None = None) -> None:
    """Replace one file of the laid-out index (``drop``: unlist another), its files entry kept true."""
    d = root / F.PACKS_DIR / NAME
    (d / fname).write_bytes(data)
    obj = json.loads((d / F.PACK_INDEX_JSON).read_bytes())
    obj["files"][fname] = {"bytes": len(data), "checksum": checksum_file(d / fname)}
    if drop is not None:
        del obj["files"][drop]
        (d / drop).unlink()
    (d / F.PACK_INDEX_JSON).write_bytes(F.canonical_json(obj))


def test_the_index_lists_each_shards_digests_and_each_packs_length(out):
    """COLLECTION §9.4: index 1.2 with shard_digests.bin (K, 2) and pack_tokens.bin (P,), each as its rows give it."""
    import xxhash

    idx = out.pack_index(NAME)
    assert idx.manifest.raw["format_version"] == "1.2"
    digests = np.fromfile(idx.path / "shard_digests.bin", dtype="<u8").reshape(-1, 2)
    lengths = np.fromfile(idx.path / "pack_tokens.bin", dtype="<u4")
    assert digests.shape == (len(out.members), 2) and lengths.tolist() == idx.pack_lengths.tolist()
    po, segs = np.asarray(idx.pack_offsets), np.asarray(idx.segments)
    c = np.concatenate([[0], np.cumsum(out.manifest.raw["layout"]["member_packs"])])
    for k in (0, len(out.members) - 1):
        d0, d1 = int(out.doc_start[k]), int(out.doc_start[k + 1])
        assert po[c[k]] == d0 and po[c[k + 1]] == d1
        assert digests[k, 0] == xxhash.xxh3_64_intdigest(po[c[k]:c[k + 1] + 1].tobytes())
        assert digests[k, 1] == xxhash.xxh3_64_intdigest(segs[d0:d1].tobytes())


@pytest.mark.parametrize("fname,row,field", [("shard_digests.bin", 3, "[3, 1]"), ("pack_tokens.bin", 5, "[5]")])
def test_a_wrong_digest_or_pack_length_is_refused_by_deep_validation(out, tmp_path, fname, row, field):
    root = copy_of(out, tmp_path)
    path = root / F.PACKS_DIR / NAME / fname
    arr = np.fromfile(path, dtype="<u8" if fname == "shard_digests.bin" else "<u4")
    arr[2 * row + 1 if fname == "shard_digests.bin" else row] += 1
    _rewrite_index_file(root, fname, arr.tobytes())
    assert validate(root).ok  # sizes and the files table hold: only the rows disagree (deep)
    errors = validate(root, deep=True).errors
    assert [(p.file, p.field) for p in errors] == [(f"{F.PACKS_DIR}/{NAME}/{fname}", field)], errors


def test_a_changed_segment_breaks_its_shards_digest(out, tmp_path):
    root = copy_of(out, tmp_path)
    segs, ahead = lookahead_rows(out)
    segs[ahead[0], 2] -= 1
    rewrite_index(root, segs, packed_delta=-1)
    k = int(np.searchsorted(np.asarray(out.doc_start), ahead[0], side="right") - 1)
    found = {(p.file, p.field) for p in validate(root, deep=True).errors}
    assert (f"{F.PACKS_DIR}/{NAME}/shard_digests.bin", f"[{k}, 1]") in found, found


@pytest.mark.parametrize("case", ["one file", "wrong size", "old version"])
def test_the_two_files_are_checked_structurally(out, tmp_path, case):
    root = copy_of(out, tmp_path)
    d = root / F.PACKS_DIR / NAME
    if case == "one file":
        _rewrite_index_file(root, "pack_tokens.bin", (d / "pack_tokens.bin").read_bytes(), drop="shard_digests.bin")
        want = (f"{F.PACKS_DIR}/{NAME}/{F.PACK_INDEX_JSON}", "files")
    elif case == "wrong size":
        _rewrite_index_file(root, "shard_digests.bin", (d / "shard_digests.bin").read_bytes()[:-16])
        want = (f"{F.PACKS_DIR}/{NAME}/shard_digests.bin", "size (bytes)")
    else:
        obj = json.loads((d / F.PACK_INDEX_JSON).read_bytes())
        obj["format_version"] = "1.1"
        (d / F.PACK_INDEX_JSON).write_bytes(F.canonical_json(obj))
        want = (f"{F.PACKS_DIR}/{NAME}/{F.PACK_INDEX_JSON}", "files")
    errors = validate(root).errors
    assert want in {(p.file, p.field) for p in errors}, errors
