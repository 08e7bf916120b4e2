"""A hostile bucket cannot make packfmt read outside it, nor exhaust its memory with JSON (spec/SECURITY.md A1, A2,
A17), against a real S3-protocol server (moto on 127.0.0.1):

- a collection whose member path climbs out of its bucket (a store with valid bytes placed where it leads, outside
  the cache and the bucket) is refused in every mode that opens a URL (``packfmt.open``, ``stream=True``,
  ``PackedDataset(url, stream=True)`` and its DataLoader workers, a whole dataset's workers re-opening its mirror,
  Ray's ``read_packs``, ``validate``, ``inspect``, ``pack``), naming the member, the field and the fix, and nothing is
  opened outside (every ``open`` this process makes is watched by an audit hook);
- a remote manifest of 200 MiB is refused with this process's peak memory growing by a small part of that;
  deep nesting, invalid UTF-8, NaN, duplicate keys and a root that is no object are one ``FormatError`` naming the
  URL, for ``packfmt.open``, ``stream=True`` and ``packfmt validate URL`` (exit 1, one line, no traceback);
- eviction from a cache whose folder turned read-only is a ``StorageError`` naming the folder, not an ``OSError``.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash

import packfmt
from packfmt.cli import main
from packfmt.errors import FormatError, PackfmtError
from packfmt.storage.cache import evict, mirror_path
from packfmt.storage.errors import StorageError, evicting
from packfmt.validate import validate

from s3_server import BUCKET, cache, s3_key, s3_server, time_limit, write_sample  # noqa: F401  (fixtures)

os.environ["HF_HUB_OFFLINE"] = "1"
URL = f"s3://{BUCKET}/h"
STORE, OTHER, COLL, TCOLL, INDEX = f"{URL}/s", f"{URL}/t", f"{URL}/m", f"{URL}/mt", "ffd-128"

#: Paths this process opened under the watched folder (``_watching``): what "nothing read from outside" checks.
_OPENED: list[str] = []
_WATCHED: list[str] = []


def _audit(event: str, args) -> None:
    if _WATCHED and event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, bytes)):
        path = os.path.abspath(os.fsdecode(args[0]))
        if path.startswith(_WATCHED[0]):
            _OPENED.append(path)


sys.addaudithook(_audit)  # (once per process; does nothing while no folder is watched)


@pytest.fixture(scope="module")
def data(s3_server, tmp_path_factory):
    """Two stores and two collections of them (a JSON member list and a member table), each with index ffd-128."""
    write_sample(URL, tmp_path_factory.mktemp("writer-cache"))


def _hostile(s3, src: str, dst: str, path: str) -> None:
    """A copy of collection ``src`` at ``dst`` (same parent: its other member paths still lead to their stores) whose
    member 0 has path ``path``, in its JSON member list or in its member table (checksums recomputed: only the
    path is wrong)."""
    for key in s3.find(s3_key(src)):
        if not key.endswith("/manifest.json") or "/packs/" in key:
            s3.pipe_file(key.replace(s3_key(src), s3_key(dst), 1), s3.cat_file(key))
    obj = json.loads(s3.cat_file(f"{s3_key(src)}/manifest.json"))
    if obj["members"] == "table":
        lines = s3.cat_file(f"{s3_key(src)}/member_names.txt").decode().split("\n")
        lines[0] = lines[0].split("\t", 1)[0] + "\t" + path
        names = "\n".join(lines).encode()
        s3.pipe_file(f"{s3_key(dst)}/member_names.txt", names)
        digest = "xxh3_64:" + xxhash.xxh3_64_hexdigest(names)
        obj["files"]["member_names.txt"] = {"bytes": len(names), "checksum": digest}
    else:
        obj["members"][0]["path"] = path
    s3.pipe_file(f"{s3_key(dst)}/manifest.json", json.dumps(obj).encode())


@pytest.fixture
def outside(data, cache, tmp_path):
    """A valid copy of the first member's store outside the cache and the bucket (what a climbing path leads to)."""
    where = tmp_path / "outside" / "store"
    shutil.copytree(packfmt.open(STORE, cache_dir=tmp_path / "writer").path, where)
    before = {p: p.stat().st_mtime_ns for p in where.parent.rglob("*")}
    _WATCHED[:] = [str(where.parent)]
    _OPENED.clear()
    yield where
    _WATCHED.clear()
    assert not _OPENED, f"opened outside the bucket: {_OPENED}"
    assert {p: p.stat().st_mtime_ns for p in where.parent.rglob("*")} == before  # nothing written there either


def _climb_to(target: Path, url: str) -> str:
    """The member path that leads from the mirror of collection ``url`` to ``target`` on this disk."""
    return os.path.relpath(target, mirror_path(url))


def _refused(exc: BaseException, member: str = "members[0].path") -> None:
    msg = str(exc)
    assert "\n" not in msg and member in msg and "nothing of it was read" in msg, msg


def _read_batch(ds, workers: int) -> None:
    from torch.utils.data import DataLoader

    from packfmt.torch import collate_varlen

    next(iter(DataLoader(ds, batch_size=2, num_workers=workers, collate_fn=collate_varlen)))


MODES = {
    "packfmt.open": lambda url: packfmt.open(url),
    "stream=True": lambda url: packfmt.open(url, stream=True).document(0),
    "PackedDataset(stream=True)": lambda url: _read_batch(
        pytest.importorskip("packfmt.torch").PackedDataset(url, INDEX, stream=True), 0),
    "validate": lambda url: (_ for _ in ()).throw(FormatError(validate(url).errors[0].message)),
    "read_packs": lambda url: pytest.importorskip("packfmt.ray.datasource").read_packs(url, INDEX, stream=True),
}
#: Paths that leave the bucket: to the store outside (filled in per test), to another bucket, to the folder above
#: the bucket, and a climb in the middle of a path.
CLIMBS = ["<outside>", "../../../other-bkt/h/s", "../../..", "x/../../../../../s"]


@pytest.mark.parametrize("table", [False, True], ids=["member list", "member table"])
@pytest.mark.parametrize("climb", CLIMBS)
def test_a_member_path_out_of_the_bucket_is_refused_in_every_mode(s3_server, outside, cache, capsys, climb, table):
    if not s3_server.exists("other-bkt"):
        s3_server.mkdir("other-bkt")
    bad = f"{URL}/evil"
    path = _climb_to(outside, bad) if climb == "<outside>" else climb
    _hostile(s3_server, TCOLL if table else COLL, bad, path)
    for name, run in MODES.items():
        shutil.rmtree(cache, ignore_errors=True)
        with pytest.raises(FormatError) as exc:
            run(bad)
        _refused(exc.value)
        assert exc.value.field in (None, "members[0].path"), name
    for argv in (["validate", bad], ["inspect", bad], ["pack", bad, "--capacity", "64"]):
        capsys.readouterr()
        assert main(argv) == 1, argv
        out = capsys.readouterr()
        assert "members[0].path" in out.err and "Traceback" not in out.err, (argv, out)


def test_dataloader_workers_refuse_what_their_parent_did_not_see(s3_server, outside, cache):
    """Workers re-open the dataset: a streamed collection's re-read its manifest from the bucket (replaced meanwhile by
    a hostile one), a whole one's re-open its mirror (its manifest replaced in the cache, as an older packfmt's
    streamed open left it there): both refused before any member path is resolved. A forked worker (the DataLoader's
    default) and an unpickled copy (a spawned worker, a Ray task) alike."""
    import pickle

    from packfmt.torch import PackedDataset

    for stream in (True, False):
        url = f"{URL}/w{int(stream)}"
        _hostile(s3_server, COLL, url, "../s")  # a faithful copy, first
        ds = PackedDataset(url, INDEX, stream=stream)
        _hostile(s3_server, COLL, f"{URL}/x", _climb_to(outside, url))
        hostile = s3_server.cat_file(f"{s3_key(URL)}/x/manifest.json")
        if stream:
            s3_server.pipe_file(f"{s3_key(url)}/manifest.json", hostile)
        else:
            (mirror_path(url) / "manifest.json").write_bytes(hostile)
        copy = pickle.loads(pickle.dumps(ds))
        with pytest.raises(FormatError) as exc:
            copy[0]
        _refused(exc.value)
        if stream:  # (a forked worker of a whole dataset keeps its parent's open dataset: nothing to re-open)
            with pytest.raises(Exception) as exc:  # (the DataLoader re-raises a worker's error by type and text)
                _read_batch(ds, 1)
            assert "members[0].path" in str(exc.value) and "nothing of it was read" in str(exc.value), str(exc.value)


def _rss_peak_kib() -> int:
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # the peak resident size starts again from now
    except OSError:
        pytest.skip("cannot reset this process's peak memory (/proc/self/clear_refs): Linux only")


def test_a_huge_remote_manifest_is_refused_with_memory_bounded(s3_server, data, cache, capsys):
    url, size = f"{URL}/huge", 200 << 20
    chunk = b" " * (8 << 20)
    with s3_server.open(f"{s3_key(url)}/manifest.json", "wb") as f:  # (in parts: this process never holds it)
        f.write(b"{")
        for _ in range(size // len(chunk)):
            f.write(chunk)
        f.write(b"}")
    opens = {"packfmt.open": lambda: packfmt.open(url), "stream=True": lambda: packfmt.open(url, stream=True),
             "validate": lambda: main(["validate", url])}
    for name, run in opens.items():
        capsys.readouterr()
        _reset_peak()
        before = _rss_peak_kib()
        if name == "validate":
            assert run() == 1
            out = capsys.readouterr()
            lines = (out.out + out.err).strip().splitlines()
            assert len(lines) == 2 and "manifest.json: size:" in lines[0] and "Traceback" not in out.err, lines
        else:
            with pytest.raises(FormatError) as exc:
                run()
            assert exc.value.field == "size" and f"{url}/manifest.json" in str(exc.value), str(exc.value)
        grew = (_rss_peak_kib() - before) << 10
        with capsys.disabled():
            print(f"{name}: peak memory grew by {grew / 2**20:.1f} MiB reading a {size >> 20} MiB manifest")
        assert grew < size // 8, f"{name}: peak memory grew by {grew:,} bytes for a {size:,}-byte manifest"
    s3_server.rm_file(f"{s3_key(url)}/manifest.json")


MALFORMED = {
    "deep nesting": b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "invalid UTF-8": b'{"format": "packfmt\xff"}',
    "NaN": b'{"format": "packfmt", "x": NaN}',
    "duplicate keys": b'{"format": "packfmt", "format": "packfmt-collection"}',
    "not an object": b'["packfmt"]',
}


@pytest.mark.parametrize("where", ["manifest.json", "member manifest.json", "index.json"])
@pytest.mark.parametrize("what", list(MALFORMED))
def test_malformed_remote_json_is_one_format_error(s3_server, data, cache, capsys, what, where):
    url = f"{URL}/bad"
    for key in s3_server.find(s3_key(COLL)):  # a copy of the collection (and of its first member, at bad-s)
        s3_server.pipe_file(key.replace(s3_key(COLL), s3_key(url), 1), s3_server.cat_file(key))
    for key in s3_server.find(s3_key(STORE)):
        s3_server.pipe_file(key.replace(s3_key(STORE), f"{s3_key(url)}-s", 1), s3_server.cat_file(key))
    obj = json.loads(s3_server.cat_file(f"{s3_key(url)}/manifest.json"))
    obj["members"][0]["path"] = "../bad-s"
    s3_server.pipe_file(f"{s3_key(url)}/manifest.json", json.dumps(obj).encode())
    target = {"manifest.json": f"{url}/manifest.json", "member manifest.json": f"{url}-s/manifest.json",
              "index.json": f"{url}/packs/{INDEX}/index.json"}[where]
    s3_server.pipe_file(s3_key(target), MALFORMED[what])
    opens = {"packfmt.open": lambda: packfmt.open(url)}
    if where != "member manifest.json":  # (a streamed open reads a member's manifest when a batch needs it)
        opens["stream=True"] = lambda: packfmt.open(url, stream=True).pack_index(INDEX)
    for name, run in opens.items():
        shutil.rmtree(cache, ignore_errors=True)
        with pytest.raises(PackfmtError) as exc:
            run()
        msg = str(exc.value)
        assert isinstance(exc.value, FormatError) and "\n" not in msg and target in msg, (name, msg)
    assert main(["validate", url]) == 1
    out = capsys.readouterr()
    assert target in out.out + out.err and "Traceback" not in out.err and len(out.err.strip().splitlines()) <= 2, out


def test_eviction_from_a_read_only_cache_folder_is_a_storage_error(s3_server, data, tmp_path):
    """One dataset's folder of the cache turned read-only (a read-only bind mount of it): eviction removes what it can
    (the other dataset's files), then says the cache is still over its limit, naming the folder and the fix, not an
    ``OSError``; the helper the streamed members' eviction uses says the same of any ``OSError``."""
    root = tmp_path / "cache"
    a, b = packfmt.open(STORE, cache_dir=root), packfmt.open(OTHER, cache_dir=root)  # a first: least recently used
    a_dir, b_dir = Path(a.path), Path(b.path)
    del a, b  # (their pins let go: eviction may take their files)
    gc.collect()
    done = subprocess.run(["mount", "--bind", str(a_dir), str(a_dir)], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here ({done.stderr.strip()}): a read-only folder takes one (root ignores "
                    "file modes)")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(a_dir)], check=True, timeout=30)
        a_bytes = sum(p.stat().st_size for p in a_dir.rglob("*") if p.is_file())
        with pytest.raises(StorageError) as exc:
            evict(root, 1000)
        msg = str(exc.value)
        assert "\n" not in msg and str(root) in msg and str(a_dir) in msg and "cannot evict" in msg, msg
        assert "over its limit of 1,000" in msg and "$PACKFMT_CACHE" in msg and exc.value.field == "cache", msg
        assert not (b_dir / "tokens.bin").exists() and (a_dir / "tokens.bin").exists()  # the rest was evicted
        assert a_bytes > 1000
        with pytest.raises(StorageError, match="cannot evict"), evicting(root):
            (a_dir / "tokens.bin").unlink()
    finally:
        if subprocess.run(["umount", str(a_dir)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(a_dir)], capture_output=True, timeout=30)
