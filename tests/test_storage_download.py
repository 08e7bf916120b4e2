"""One object downloaded into the cache (packfmt/storage/download.py) from a real S3-protocol server, with several
ranged GETs in flight: the bytes in order whatever the size, the number of ranges and the number in flight, and an
object that differs from its entry (longer, shorter, at a chunk boundary or not, a byte changed, gone) refused with
nothing left behind."""

from __future__ import annotations

import os

import numpy as np
import pytest
import xxhash

from packfmt import format as F
from packfmt.errors import ChecksumError, FormatError
from packfmt.storage import download as D

from s3_server import BUCKET, GetCounter, s3_server, time_limit  # noqa: F401  (fixtures)

CHUNK = 1000  # bytes a range: small, so that a few kB are many ranges


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(D, "CHUNK_BYTES", CHUNK)


def _entry(data: bytes) -> F.FileEntry:
    return F.FileEntry("x.bin", len(data), "xxh3_64:" + xxhash.xxh3_64_hexdigest(data))


def _fetch(fs, key: str, entry: F.FileEntry, tmp_path):
    local, tmp = tmp_path / "x.bin", tmp_path / ".x.bin.part"
    D.download(fs, f"{BUCKET}/{key}", f"s3://{BUCKET}/{key}", local, tmp, entry, "manifest.json")
    return local


@pytest.mark.parametrize("in_flight", ["1", "3", "8"])
def test_bytes_arrive_in_order_whatever_the_ranges(s3_server, small_chunks, monkeypatch, tmp_path, in_flight):
    monkeypatch.setenv(D.RANGES_ENV, in_flight)
    rng = np.random.default_rng(int(in_flight))
    for i, size in enumerate([0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 7 * CHUNK + 17, 20 * CHUNK]):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        key = f"dl/{in_flight}/{i}"
        s3_server.pipe_file(f"{BUCKET}/{key}", data)
        out = tmp_path / str(i)
        out.mkdir()
        assert _fetch(s3_server, key, _entry(data), out).read_bytes() == data
        assert sorted(os.listdir(out)) == ["x.bin"]  # the temp file renamed, nothing else


def test_ranges_in_flight_ask_for_no_more_than_one_window_past_the_end(s3_server, small_chunks, monkeypatch,
                                                                       tmp_path):
    """Through a relay counting the bytes GETs return: a file of 20 chunks is fetched exactly once with 4 in flight,
    and an object longer than listed costs at most the window past its listed end, not the rest of it."""
    import s3fs

    monkeypatch.setenv(D.RANGES_ENV, "4")
    relay = GetCounter(os.environ["AWS_ENDPOINT_URL"])
    try:
        fs = s3fs.S3FileSystem(**relay.options(), skip_instance_cache=True)
        data = np.random.default_rng(1).integers(0, 256, 20 * CHUNK, dtype=np.uint8).tobytes()
        s3_server.pipe_file(f"{BUCKET}/dl/w", data + b"y" * (50 * CHUNK))
        relay.take()
        with pytest.raises(FormatError, match="more than"):
            _fetch(fs, "dl/w", _entry(data), tmp_path)
        got = relay.take()[f"/{BUCKET}/dl/w"]
        assert 20 * CHUNK < got <= 20 * CHUNK + 1  # the last range reaches one byte past the listed size, no more
        s3_server.pipe_file(f"{BUCKET}/dl/w", data)
        assert _fetch(fs, "dl/w", _entry(data), tmp_path).read_bytes() == data
        # each byte once; the range one byte past the end (20 * CHUNK is a chunk boundary) is refused by S3 (416),
        # whose short error body the relay counts too
        assert len(data) <= relay.take()[f"/{BUCKET}/dl/w"] < len(data) + CHUNK
    finally:
        relay.close()


@pytest.mark.parametrize("damage", ["longer", "shorter", "shorter_at_boundary", "flipped", "gone"])
def test_an_object_unlike_its_entry_is_refused_with_nothing_left(s3_server, small_chunks, monkeypatch, tmp_path,
                                                                 damage):
    monkeypatch.setenv(D.RANGES_ENV, "4")
    data = np.random.default_rng(2).integers(0, 256, 10 * CHUNK + 3, dtype=np.uint8).tobytes()
    stored = {"longer": data + b"z", "shorter": data[:-5], "shorter_at_boundary": data[:6 * CHUNK],
              "flipped": data[:8 * CHUNK] + bytes([data[8 * CHUNK] ^ 1]) + data[8 * CHUNK + 1:], "gone": None}[damage]
    key = f"dl/bad/{damage}"
    if stored is not None:
        s3_server.pipe_file(f"{BUCKET}/{key}", stored)
    err = ChecksumError if damage == "flipped" else FormatError
    with pytest.raises(err) as exc:
        _fetch(s3_server, key, _entry(data), tmp_path)
    assert exc.value.file == f"s3://{BUCKET}/{key}"
    want = {"longer": ("size", f"> {len(data)}"), "shorter": ("size", len(data) - 5),
            "shorter_at_boundary": ("size", 6 * CHUNK), "gone": (None, "missing")}
    if damage in want:
        assert (exc.value.field, exc.value.found) == want[damage]
    assert os.listdir(tmp_path) == []  # neither the file nor its temp


@pytest.mark.parametrize("raw", ["0", "65", "two"])
def test_a_bad_setting_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv(D.RANGES_ENV, raw)
    with pytest.raises(ValueError, match=f"{D.RANGES_ENV}: expected an integer in \\[1, 64\\]"):
        D.ranges_in_flight()
