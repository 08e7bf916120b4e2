"""Remote bytes are verified on every read (packfmt/storage/cache.py, verify.py; packfmt/remote/mirror.py), against a
real S3-protocol server (moto on 127.0.0.1): a bad object is refused on every open path, cold or after clearing the
cache; a byte changed in the cache is hashed again and re-fetched, never served; the cache's bookkeeping stays
out of the mirror (validate sees the dataset only); a collection cannot reach outside its bucket."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import packfmt
from packfmt.collection import write_collection
from packfmt.errors import ChecksumError, FormatError, PackfmtError, WriteError
from packfmt.storage import verify as V
from packfmt.storage.cache import cache_root, mirror_path
from packfmt.validate import validate

from s3_server import BUCKET, cache, s3_key, s3_server, time_limit, write_sample  # noqa: F401  (fixtures)

os.environ["HF_HUB_OFFLINE"] = "1"
URL = f"s3://{BUCKET}/v"
STORE, OTHER, COLL, INDEX = f"{URL}/s", f"{URL}/t", f"{URL}/m", "ffd-128"
TCOLL = f"{URL}/mt"  # the same collection with its member list as a member table (spec/COLLECTION.md §2.5)


@pytest.fixture(scope="module")
def data(s3_server, tmp_path_factory):
    """A store and a collection (of it and another store) in the bucket, each with pack index ffd-128."""
    write_sample(URL, tmp_path_factory.mktemp("writer-cache"))


@contextmanager
def corrupt(fs, url: str):
    """The object at ``url`` with its first byte flipped for the duration of the block."""
    good = fs.cat_file(s3_key(url))
    fs.pipe_file(s3_key(url), bytes([good[0] ^ 1]) + good[1:])
    try:
        yield
    finally:
        fs.pipe_file(s3_key(url), good)


def _flip(path: Path, at: int = 100) -> None:
    with open(path, "r+b") as f:  # an in-place write: same inode, same size
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


def _downloads(root: Path) -> list[dict]:
    log = root / "downloads.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _one_line(exc: BaseException, *names: str) -> str:
    msg = str(exc)
    assert "\n" not in msg and all(n in msg for n in names), msg
    return msg


def _validate_refuses(url: str) -> None:
    report = validate(url, deep=True)
    assert not report.ok
    raise FormatError(report.errors[0].message)


OPENERS = {
    "packfmt.open": lambda url: packfmt.open(url),
    "PackedDataset": lambda url: pytest.importorskip("packfmt.torch").PackedDataset(url, INDEX)[0],
    "pack_index": lambda url: packfmt.open(url).pack_index(INDEX).pack_segments(0),
    "validate --deep": _validate_refuses,
}
#: (object corrupted in the bucket, dataset opened): a store's own file, its pack index file, a collection
#: member's file, the collection's pack index file, the collection's own doc_lengths.bin.
BAD = [(f"{STORE}/tokens.bin", STORE), (f"{STORE}/packs/{INDEX}/segments.bin", STORE),
       (f"{OTHER}/doc_offsets.bin", COLL), (f"{COLL}/packs/{INDEX}/segments.bin", COLL),
       (f"{COLL}/doc_lengths.bin", COLL), (f"{TCOLL}/members.bin", TCOLL), (f"{TCOLL}/member_names.txt", TCOLL)]


@pytest.mark.parametrize("when", ["cold cache", "after clearing the cache"])
@pytest.mark.parametrize("bad,url", BAD, ids=[b.removeprefix(URL + "/") for b, _ in BAD])
def test_corrupted_bucket_object_refused_on_every_open_path(s3_server, data, cache, bad, url, when):
    if when == "after clearing the cache":
        packfmt.open(url)  # warm, from the good object
    with corrupt(s3_server, bad):
        for name, open_ in OPENERS.items():
            if when == "after clearing the cache":
                shutil.rmtree(cache, ignore_errors=True)
            with pytest.raises(PackfmtError) as exc:
                open_(url)
            _one_line(exc.value, bad, "refused by the cache")
            assert not (mirror_path(bad.rsplit("/", 1)[0]) / bad.rsplit("/", 1)[1]).exists(), name
            assert not list(cache.rglob("*.part-*")), name  # no temp download left behind
    assert packfmt.open(url).num_documents > 0  # the good object is accepted again


@pytest.mark.parametrize("chunk", [1 << 23, 1000])
@pytest.mark.parametrize("damage", ["longer", "shorter", "missing"])
def test_object_of_another_size_is_refused_whatever_the_chunking(s3_server, data, cache, monkeypatch, chunk, damage):
    """Downloads are ranged reads of ``CHUNK_BYTES``, several in flight (the last one past the listed size): an object one byte longer
    or shorter than listed, or gone, is refused, with chunks the size of the file or many per file; the good object
    reads back byte for byte through the same chunking."""
    import packfmt.storage.download as C

    monkeypatch.setattr(C, "CHUNK_BYTES", chunk)
    key = s3_key(f"{STORE}/tokens.bin")
    good = s3_server.cat_file(key)
    assert len(good) > 2 * 1000  # several chunks of 1000 bytes
    bad = {"longer": good + b"\0", "shorter": good[:-1], "missing": None}[damage]
    if bad is None:
        s3_server.rm_file(key)
    else:
        s3_server.pipe_file(key, bad)
    try:
        with pytest.raises(FormatError) as exc:
            packfmt.open(STORE)
        msg = _one_line(exc.value, f"{STORE}/tokens.bin")
        assert {"longer": f"found more than {len(good)}", "shorter": f"found {len(good) - 1}",
                "missing": "missing"}[damage] in msg
        assert not (mirror_path(STORE) / "tokens.bin").exists() and not list(cache.rglob("*.part-*"))
    finally:
        s3_server.pipe_file(key, good)
    assert (mirror_path(STORE) / "tokens.bin").read_bytes() == good if packfmt.open(STORE) else False


def test_changed_cached_byte_is_hashed_again_and_refetched_never_served(s3_server, data, cache):
    want = np.asarray(packfmt.open(STORE).tokens).copy()
    local = mirror_path(STORE) / "tokens.bin"
    _flip(local)  # any ordinary write moves mtime and ctime
    assert np.array_equal(np.asarray(packfmt.open(STORE).tokens), want)
    assert _downloads(cache)[-1] == {"url": f"{STORE}/tokens.bin", "bytes": local.stat().st_size, "pid": os.getpid(),
                                     "why": "changed in the cache"}
    st = local.stat()
    _flip(local)
    os.utime(local, ns=(st.st_atime_ns, st.st_mtime_ns))  # a write that restores mtime: ctime still moved
    assert np.array_equal(np.asarray(packfmt.open(STORE).tokens), want)
    tokens = lambda: [d["why"] for d in _downloads(cache) if d["url"] == f"{STORE}/tokens.bin"]
    assert tokens() == ["absent", "changed in the cache", "changed in the cache"]
    # touched but not changed (stat moved, bytes the same): hashed, kept, not downloaded again
    os.utime(local)
    assert np.array_equal(np.asarray(packfmt.open(STORE).tokens), want) and len(tokens()) == 3
    # changed in the cache and bad in the bucket too: refused, and the changed copy is gone
    _flip(local)
    with corrupt(s3_server, f"{STORE}/tokens.bin"), pytest.raises(ChecksumError) as exc:
        packfmt.open(STORE)
    _one_line(exc.value, f"{STORE}/tokens.bin", "refused by the cache")
    assert not local.exists()


def test_worker_reopening_the_mirror_rehashes_a_changed_file(s3_server, data, cache):
    """DataLoader workers unpickle PackedDataset to the mirror's local path: that open checks markers too."""
    torch_ds = pytest.importorskip("packfmt.torch")
    ds = torch_ds.PackedDataset(STORE, INDEX)
    first = ds[0]["input_ids"].clone()
    clone = pickle.loads(pickle.dumps(ds))
    assert np.array_equal(clone[0]["input_ids"].numpy(), first.numpy())  # unchanged: served
    local = mirror_path(STORE) / "tokens.bin"
    _flip(local, at=0)
    clone = pickle.loads(pickle.dumps(ds))
    with pytest.raises(ChecksumError) as exc:
        clone[0]
    _one_line(exc.value, str(local), "changed in the cache")
    assert not local.exists()  # removed: the next open of the URL fetches it anew
    assert np.array_equal(torch_ds.PackedDataset(STORE, INDEX)[0]["input_ids"].numpy(), first.numpy())


def test_unchanged_stat_is_the_honest_limit_and_full_verify_closes_it(s3_server, data, cache, monkeypatch):
    """Bytes changed behind the file system's back (bit rot; simulated by re-recording the marker after a write)
    keep the stat the marker holds: served by default (the documented limit), refused by cache_verify="full"."""
    want = np.asarray(packfmt.open(STORE).tokens).copy()
    local = mirror_path(STORE) / "tokens.bin"
    entry = packfmt.open(STORE).manifest.files["tokens.bin"]
    _flip(local)
    V.write_marker(cache_root(), local, entry)  # the stat now matches: nothing tells the cache
    assert not np.array_equal(np.asarray(packfmt.open(STORE).tokens), want)  # the limit, as documented
    assert np.array_equal(np.asarray(packfmt.open(STORE, cache_verify="full").tokens), want)  # re-hashed, re-fetched
    _flip(local)
    V.write_marker(cache_root(), local, entry)
    monkeypatch.setenv("PACKFMT_CACHE_VERIFY", "full")
    assert np.array_equal(np.asarray(packfmt.open(STORE).tokens), want)
    with pytest.raises(ValueError, match="cache_verify"):
        packfmt.open(STORE, cache_verify="sometimes")


def test_validate_sees_the_dataset_only(s3_server, data, cache):
    legacy = [".tokens.bin.verified", ".tokens.bin.lock", V.PIN]  # what an older packfmt kept in the mirror
    mirror_path(STORE).mkdir(parents=True)
    for name in legacy:
        (mirror_path(STORE) / name).write_text("")
    for url in (STORE, COLL):
        assert packfmt.open(url) is not None
        report = validate(url, deep=True)
        assert report.ok and report.warnings == [], report.format()
    mirrored = sorted(p.relative_to(mirror_path(STORE)).as_posix() for p in mirror_path(STORE).rglob("*") if p.is_file())
    assert mirrored == sorted(p.removeprefix(s3_key(STORE) + "/") for p in s3_server.find(s3_key(STORE)))
    assert list((cache / V.STATE).rglob("*.verified")) and list((cache / V.STATE).rglob(V.PIN))


def test_a_collections_lengths_record_is_mirrored_verified_or_left_out_when_missing(s3_server, data, cache):
    """The cache mirrors a collection's doc_lengths.bin (spec/COLLECTION.md §2.4) with its other files, verified
    (a corrupted copy: every open path refuses it, test above), so a remote collection packs from it; one missing
    from the bucket is left out: the collection opens on its members' own lengths and validate warns."""
    url = f"{COLL}/doc_lengths.bin"
    coll = packfmt.open(COLL)
    assert (mirror_path(COLL) / "doc_lengths.bin").read_bytes() == s3_server.cat_file(s3_key(url))
    lengths = coll.doc_lengths.copy()
    assert validate(COLL).ok
    good = s3_server.cat_file(s3_key(url))
    s3_server.rm_file(s3_key(url))
    try:
        shutil.rmtree(cache, ignore_errors=True)
        bare = packfmt.open(COLL)
        assert not (mirror_path(COLL) / "doc_lengths.bin").exists()
        np.testing.assert_array_equal(bare.doc_lengths, lengths)  # the members' own
        report = validate(COLL)
        assert report.ok and [(p.file, p.found) for p in report.warnings] == [("doc_lengths.bin", "missing")]
    finally:
        s3_server.pipe_file(s3_key(url), good)


def _collection_with_member_path(s3_server, url: str, path: str) -> None:
    obj = json.loads(s3_server.cat_file(f"{s3_key(COLL)}/manifest.json"))
    obj["members"][0]["path"] = path
    s3_server.pipe_file(f"{s3_key(url)}/manifest.json", json.dumps(obj).encode())


@pytest.mark.parametrize("path", ["../../../../../../../../tmp/packfmt-escape", "../../../other-bkt/v/s", "../../.."])
def test_collection_member_outside_its_bucket_is_refused(s3_server, data, cache, path):
    if not s3_server.exists("other-bkt"):
        s3_server.mkdir("other-bkt")
    bad = f"{URL}/evil"
    _collection_with_member_path(s3_server, bad, path)
    with pytest.raises(FormatError) as exc:
        packfmt.open(bad)
    assert exc.value.field == "members[0].path"
    _one_line(exc.value, f"{bad}/manifest.json", f"inside s3://{BUCKET}/")
    assert not Path("/tmp/packfmt-escape").exists() and not (cache / "tmp").exists()
    assert not validate(bad).ok


def test_collection_writer_refuses_a_member_in_another_bucket(s3_server, data, cache):
    if not s3_server.exists("other-bkt"):
        s3_server.mkdir("other-bkt")
    with pytest.raises(WriteError, match="not in the bucket of"):
        write_collection("s3://other-bkt/mix", [(None, STORE)])


def test_a_member_table_is_mirrored_verified_and_never_left_out(s3_server, data, cache):
    """A remote collection with a member table (spec/COLLECTION.md §2.5) opens, whole and streamed, exactly as the
    same collection with a JSON array; its table files are verified like every listed file (corrupted: the test
    above, on every open path) and, unlike doc_lengths.bin, one missing from the bucket is an error naming it."""
    from packfmt.torch import PackedDataset

    table, array = packfmt.open(TCOLL), packfmt.open(COLL)
    assert table.manifest.raw["members"] == "table" and list(table.members) == list(array.members)
    np.testing.assert_array_equal(table.doc_lengths, array.doc_lengths)
    for stream in (False, True):
        a, b = PackedDataset(TCOLL, INDEX, stream=stream), PackedDataset(COLL, INDEX, stream=stream)
        for i in (0, len(a) - 1):
            assert np.array_equal(a[i]["input_ids"], b[i]["input_ids"])
    assert validate(TCOLL, deep=True).ok
    for name in ("members.bin", "member_names.txt"):
        key = f"{s3_key(TCOLL)}/{name}"
        good = s3_server.cat_file(key)
        s3_server.rm_file(key)
        try:
            shutil.rmtree(cache, ignore_errors=True)
            for open_ in (lambda: packfmt.open(TCOLL), lambda: PackedDataset(TCOLL, INDEX, stream=True)):
                with pytest.raises(FormatError) as exc:
                    open_()
                assert name in str(exc.value) and "missing" in str(exc.value)
        finally:
            s3_server.pipe_file(key, good)
