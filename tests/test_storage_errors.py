"""Object-storage and cache mistakes are one-line PackfmtErrors naming the URL (or cache folder) and the fix,
and leave no temp dirs behind (packfmt/storage/errors.py), against a real S3-protocol server (moto on
127.0.0.1): no credentials, a wrong endpoint (a port nothing listens on), a missing bucket, a missing key,
a cache folder that cannot be created, one on a read-only file system, and one that fills up (a real tmpfs
of 32 KiB; skipped where mounting is not allowed)."""

from __future__ import annotations

import gc
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

import packfmt
from packfmt.build import build_text
from packfmt.cli import main
from packfmt.errors import FormatError, PackfmtError
from packfmt.storage.errors import StorageError

from s3_server import BUCKET, _free_port, cache, s3_server, time_limit  # noqa: F401  (fixtures)

os.environ["HF_HUB_OFFLINE"] = "1"
SAMPLE = Path(packfmt.__file__).parent / "sample_data"
TOK = str(SAMPLE / "tokenizer")
STORE = f"s3://{BUCKET}/e/ds"


@pytest.fixture(scope="module")
def store(s3_server, tmp_path_factory):
    os.environ["PACKFMT_CACHE"] = str(tmp_path_factory.mktemp("writer-cache"))
    try:
        build_text([SAMPLE / "text.jsonl"], STORE, TOK)
    finally:
        del os.environ["PACKFMT_CACHE"]
    return STORE


def _inputs_temp_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("packfmt-inputs-*")}


def _assert_one_line(exc: BaseException, *names: str) -> None:
    msg = str(exc)
    print(msg)  # (shown with pytest -s: what a user reads)
    assert "\n" not in msg and all(n in msg for n in names), msg


MISTAKES = {  # what is wrong: (URL, storage_options, words the message must hold)
    "no credentials": (STORE, {}, ["no credentials", "AWS_ACCESS_KEY_ID"]),
    "wrong endpoint": (STORE, None, ["cannot connect", "AWS_ENDPOINT_URL"]),
    "missing bucket": ("s3://no-such-bucket/ds", {}, ["bucket 'no-such-bucket' does not exist"]),
    "missing key": (f"s3://{BUCKET}/e/nothing-here", {}, ["not a packfmt dataset", "packfmt build"]),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_s3_mistakes_are_one_line_errors_naming_url_and_fix(s3_server, store, cache, monkeypatch, capsys, mistake,
                                                            tmp_path):
    url, so, words = MISTAKES[mistake]
    so = {"endpoint_url": f"http://127.0.0.1:{_free_port()}"} if so is None else so
    if mistake == "no credentials":
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(k)
    so = {**so, "skip_instance_cache": True}  # a file system built for this environment, not a cached one
    # this process's temp dirs only: tests in the other xdist worker download inputs into the shared /tmp
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    before = _inputs_temp_dirs()
    with pytest.raises(PackfmtError) as exc:
        packfmt.open(url, storage_options=so)
    _assert_one_line(exc.value, url, *words)
    assert isinstance(exc.value, FormatError if mistake == "missing key" else StorageError)
    # nothing left behind: no mirror, no state, no temp download
    assert not cache.exists() or not [p for p in cache.rglob("*") if p.is_file()]
    # the build front door: a remote input with the same mistake, then the CLI's one line on stderr
    with pytest.raises(PackfmtError) as exc:
        build_text([f"{url}/input.jsonl"], cache.parent / "out", TOK, storage_options=so)
    _assert_one_line(exc.value, url)
    assert _inputs_temp_dirs() == before  # the downloaded-inputs temp dir is removed
    if mistake == "wrong endpoint":
        monkeypatch.setenv("AWS_ENDPOINT_URL", so["endpoint_url"])
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    try:
        assert main(["inspect", url]) == 1
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and url in err and "Traceback" not in err, err


def test_build_into_a_missing_bucket_fails_before_the_work_and_leaves_nothing(s3_server, cache):
    url = "s3://no-such-bucket/out"
    with pytest.raises(StorageError) as exc:
        build_text([SAMPLE / "text.jsonl"], url, TOK, limit=3)
    _assert_one_line(exc.value, url, "bucket 'no-such-bucket' does not exist")
    assert not cache.exists() or not [p for p in cache.rglob("*") if p.is_file()]


def test_output_prefix_holding_other_objects_is_refused_and_kept(s3_server, cache):
    """A local build refuses an existing directory; a remote one must not wipe a prefix that holds
    objects but no dataset (an upload removes what the new tree lacks), nor write into it."""
    import fsspec

    fs = fsspec.filesystem("s3")
    url = f"s3://{BUCKET}/e/notes"
    fs.pipe(f"{BUCKET}/e/notes/README.txt", b"keep me")
    with pytest.raises(PackfmtError) as exc:
        build_text([SAMPLE / "text.jsonl"], url, TOK, limit=3)
    _assert_one_line(exc.value, url, "not a packfmt dataset", "overwrite")
    fs.invalidate_cache()
    assert fs.cat(f"{BUCKET}/e/notes/README.txt") == b"keep me"
    assert not fs.exists(f"{BUCKET}/e/notes/manifest.json")
    build_text([SAMPLE / "text.jsonl"], url, TOK, limit=3, overwrite=True)  # the user said so: replaced whole
    fs.invalidate_cache()
    assert fs.exists(f"{BUCKET}/e/notes/manifest.json") and not fs.exists(f"{BUCKET}/e/notes/README.txt")


def test_cache_folder_that_cannot_be_created(s3_server, store, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    where = blocker / "cache"  # mkdir fails with ENOTDIR, as root too
    with pytest.raises(StorageError) as exc:
        packfmt.open(store, cache_dir=where)
    _assert_one_line(exc.value, store, str(where), "not writable", "$PACKFMT_CACHE", "cache_dir=", "cache_limit=")
    assert exc.value.field == "cache"


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a tmpfs with the given options on a fresh folder (root with CAP_SYS_ADMIN; else skip)."""
    mounted = []

    def mount(options: str) -> Path:
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True,
                              text=True, timeout=30)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}): a read-only or full "
                        "cache needs a real file system to show it; the message is tested via ENOTDIR above")
        mounted.append(where)
        return where

    yield mount
    gc.collect()
    for where in mounted:
        if subprocess.run(["umount", str(where)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)  # detach even if busy


def test_cache_on_a_read_only_file_system(s3_server, store, tmpfs):
    where = tmpfs("ro,size=1m")
    with pytest.raises(StorageError) as exc:
        packfmt.open(store, cache_dir=where)
    _assert_one_line(exc.value, store, str(where), "not writable", "$PACKFMT_CACHE")


def test_full_cache_is_one_line_and_leaves_no_partial_file(s3_server, store, tmpfs):
    where = tmpfs("size=32k")  # tokens.bin is 48 KB: the download runs out of room (ENOSPC)
    with pytest.raises(StorageError) as exc:
        packfmt.open(store, cache_dir=where)
    _assert_one_line(exc.value, store, str(where), "is full", "cache_limit=")
    left = [p.name for p in where.rglob("*") if p.is_file() and "tokens.bin" in p.name]
    assert left == ["tokens.bin.lock"]  # no partial or temp copy (the empty lock file is bookkeeping)
