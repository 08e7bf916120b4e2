"""The node-local cache of remote datasets (packfmt/storage/cache.py) against a real S3-protocol server:
never serves a file that does not match its manifest, fetches each file once per node, evicts only what
no process has open."""

from __future__ import annotations

import gc
import json
import os
import shutil
import warnings
import subprocess
import sys
from pathlib import Path

import pytest

import packfmt
from packfmt.build import build_text
from packfmt.cli import main
from packfmt.errors import ChecksumError, FormatError
from packfmt.storage.cache import mirror_path, parse_limit
from packfmt.validate import validate

from s3_server import BUCKET, cache, s3_server, time_limit  # noqa: F401  (fixtures)

os.environ["HF_HUB_OFFLINE"] = "1"
SAMPLE = Path(packfmt.__file__).parent / "sample_data"
TOK = str(SAMPLE / "tokenizer")
URL = f"s3://{BUCKET}"
ROOT = Path(__file__).resolve().parents[1]


def _downloads(cache_root: Path) -> list[str]:
    log = cache_root / "downloads.log"
    return [json.loads(line)["url"] for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture(scope="module")
def remote(s3_server, tmp_path_factory):
    """One store in the bucket (built through a throwaway cache, so tests start from an empty one)."""
    os.environ["PACKFMT_CACHE"] = str(tmp_path_factory.mktemp("writer-cache"))
    try:
        build_text([SAMPLE / "text.jsonl"], f"{URL}/c/ds", TOK)
    finally:
        del os.environ["PACKFMT_CACHE"]
    return f"{URL}/c/ds"


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_bad_object_is_refused_never_served(s3_server, remote, cache, damage):
    key = f"{BUCKET}/c/ds/tokens.bin"
    good = s3_server.cat_file(key)
    bad = bytes([good[0] ^ 1]) + good[1:] if damage == "flipped" else good[:-7]
    s3_server.pipe_file(key, bad)
    try:
        err = ChecksumError if damage == "flipped" else FormatError
        with pytest.raises(err, match="refused by the cache") as exc:
            packfmt.open(remote)
        assert exc.value.file == f"{remote}/tokens.bin"
        assert exc.value.field == ("checksum" if damage == "flipped" else "size")
        mirror = mirror_path(remote)
        assert not (mirror / "tokens.bin").exists() and not (mirror / "manifest.json").exists()
        assert not list(mirror.glob(".tokens.bin.part-*"))  # the temp download is gone too
        report = validate(remote, deep=True)
        assert not report.ok and "refused by the cache" in report.format()
        assert main(["validate", remote]) == 1
    finally:
        s3_server.pipe_file(key, good)
    assert packfmt.open(remote).num_documents == 60  # a good object is accepted afterwards


def test_two_processes_fetch_each_file_once(s3_server, remote, cache):
    code = ("import packfmt, numpy as np; s = packfmt.open(%r); print(int(np.asarray(s.tokens, dtype=np.int64).sum()))"
            % remote)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0] and int(outs[0][0]) > 0
    fetched = _downloads(cache)
    assert sorted(fetched) == [f"{remote}/doc_offsets.bin", f"{remote}/tokens.bin"]  # once each, by either process


def test_eviction_is_lru_and_skips_open_datasets(s3_server, remote, cache, tmp_path):
    other = f"{URL}/c/other"
    build_text([SAMPLE / "text.jsonl"], other, TOK, limit=30)
    shutil.rmtree(mirror_path(other))  # the writer's warm copy: start from what readers fetched
    a = packfmt.open(remote)
    a_dir, b_dir = mirror_path(remote), mirror_path(other)
    with pytest.warns(UserWarning, match="over its limit"):  # both open: nothing may go
        b = packfmt.open(other, cache_limit=1)
    assert (a_dir / "tokens.bin").exists() and (b_dir / "tokens.bin").exists()
    b_bytes = sum(f.stat().st_size for f in b_dir.glob("*.bin"))
    markers = sorted((cache / ".packfmt-state").rglob("c/ds/*.verified"))  # kept outside the mirror
    assert [m.name for m in markers] == ["doc_offsets.bin.verified", "tokens.bin.verified"]
    for rec in markers:  # remote: used long ago
        os.utime(rec, (1, 1))
    del a
    gc.collect()
    # another open with a limit that fits `other` only: the least recently used files (remote's) go
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # it fits once remote's files are gone: no over-limit warning
        packfmt.open(other, cache_limit=b_bytes)
    assert not (a_dir / "tokens.bin").exists() and not (a_dir / "doc_offsets.bin").exists()
    assert (b_dir / "tokens.bin").exists() and b.num_documents == 30
    before = len(_downloads(cache))
    assert packfmt.open(remote).num_documents == 60  # evicted files come back, verified
    assert len(_downloads(cache)) == before + 2


def test_without_fsspec_a_url_names_the_extra_and_local_paths_never_import_it(tmp_path):
    build_text([SAMPLE / "text.jsonl"], tmp_path / "ds", TOK, limit=3)
    code = f"""
import sys
sys.modules["fsspec"] = None  # as if not installed
import packfmt
from packfmt.validate import validate
assert packfmt.open({str(tmp_path / 'ds')!r}).num_documents == 3 and validate({str(tmp_path / 'ds')!r}).ok
try:
    packfmt.open("s3://bucket/ds")
except packfmt.PackfmtError as exc:
    print(exc)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'packfmt[s3]'" in out.stdout and "s3://bucket/ds" in out.stdout


def test_parse_limit():
    assert parse_limit(None) is None and parse_limit(1000) == 1000 and parse_limit("1000") == 1000
    assert parse_limit("500M") == 500 << 20 and parse_limit("2GiB") == 2 << 30 and parse_limit("1.5k") == 1536
    with pytest.raises(ValueError, match="cache_limit"):
        parse_limit("lots")
