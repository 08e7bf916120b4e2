"""packfmt build --engine ray from JSONL objects in a bucket: each byte read once, lines named exactly.

The GETs are counted on the wire (``s3_server.GetCounter``, a relay in front of the S3-protocol
server that the driver and the Ray actors all talk to), not by a hook in packfmt. Runs on the
shared local Ray session (tests/ray_session.py); skipped without ray, moto or s3fs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("ray")

import packfmt  # noqa: E402
from packfmt.build import build_text  # noqa: E402
from packfmt.errors import InputError  # noqa: E402

from ray_session import assert_same_as_local, ray_session, time_limit  # noqa: E402,F401
from s3_server import BUCKET, GetCounter, explicit_options, s3_server  # noqa: E402,F401

SAMPLE = Path(packfmt.__file__).parent / "sample_data"
SAMPLE_TOK = SAMPLE / "tokenizer"
pytestmark = [pytest.mark.usefixtures("ray_session", "time_limit"), pytest.mark.xdist_group("ray")]

#: Bytes a relayed GET may return beyond the object's own (none expected: ranges are exact).
HEADER_SLACK = 1024


def sample_lines() -> list[str]:
    return (SAMPLE / "text.jsonl").read_text(encoding="utf-8").splitlines()


def upload(s3_server, tmp_path: Path, name: str, lines: list[str]) -> tuple[Path, str]:
    src = tmp_path / name
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    s3_server.put_file(str(src), f"{BUCKET}/in/{name}")
    return src, f"s3://{BUCKET}/in/{name}"


def test_remote_jsonl_bytes_are_read_once_on_the_cluster(tmp_path, s3_server):
    """The GETs of the build minus the driver's planning reads (the same ``plan_units`` call, counted alone)
    return each object's bytes once: the actors read their ranges and nothing reads them again to count lines."""
    from packfmt.ray.units import plan_units
    from packfmt.storage.ranges import SAMPLE as PLAN_SAMPLE

    lines = sample_lines()
    small = upload(s3_server, tmp_path, "small.jsonl", lines[:3] + ["", "{not json"] + lines[3:40])
    padded = [json.dumps({"text": json.loads(x)["text"], "pad": "p" * 60_000}) for x in lines[40:60]]
    big = upload(s3_server, tmp_path, "big.jsonl", padded)  # larger than the planning sample: planned by ranges
    assert big[0].stat().st_size > PLAN_SAMPLE
    inputs = [small[1], big[1]]
    relay = GetCounter(os.environ["AWS_ENDPOINT_URL"])
    try:
        units = plan_units(inputs, None, 7, relay.options())
        planned = relay.take()
        result = build_text(inputs, tmp_path / "ray", SAMPLE_TOK, engine="ray", records_per_member=7,
                            on_error="skip", storage_options=relay.options())
        built = relay.take()
    finally:
        relay.close()
    assert len([u for u in units if u["path"] == big[1]]) >= 3
    for src, url in (small, big):
        key, size = f"/{BUCKET}/in/{src.name}", src.stat().st_size
        cluster = built[key] - planned[key]
        assert size <= cluster <= size + HEADER_SLACK, f"{url}: {size} bytes, the cluster read {cluster}"
        assert planned[key] < size or size <= PLAN_SAMPLE  # the driver reads a sample and windows, not the object
    local = build_text([small[0], big[0]], tmp_path / "local", SAMPLE_TOK, on_error="skip")
    assert result.report["records_read"] == local.report["records_read"] == 41 + 20
    assert result.report["skipped"] == local.report["skipped"] == {"malformed_json": 1}
    assert result.report["skipped_examples"][0]["line"] == 5
    assert_same_as_local(result.path, local.path, tmp_path)


def test_bad_record_in_a_later_remote_unit_names_its_absolute_line(tmp_path, s3_server):
    """Blank and whitespace-only lines before it (units with no record among them): a bad record of a later
    byte range is ``s3://...:LINE`` of the object, in the error under fail and in the skip log, as locally."""
    from packfmt.storage.ranges import line_ranges

    good = sample_lines()
    lines = good[:5] + ["", "", ""] + [" " * 20_000] * 12 + good[5:14] + ["{not json"] + good[14:18] + \
        ['{"title": "no text"}'] + good[18:22] + ["[1, 2]"] + good[22:26]
    src, url = upload(s3_server, tmp_path, "later.jsonl", lines)
    bad_lines = [i + 1 for i, x in enumerate(lines) if x in ("{not json", '{"title": "no text"}', "[1, 2]")]
    # the plan this test is about: ranges holding no record, then the bad records in later ranges
    data = src.read_bytes()
    cuts = line_ranges(url, 4, explicit_options())
    records = [sum(1 for x in data[b:e].split(b"\n") if x.strip()) for b, e in cuts]
    first_bad = next(i for i, (b, e) in enumerate(cuts) if b"{not json" in data[b:e])
    assert 0 in records[:first_bad] and first_bad >= 3

    with pytest.raises(InputError) as local:
        build_text([src], tmp_path / "local-fail", SAMPLE_TOK)
    with pytest.raises(InputError) as ray:
        build_text([url], tmp_path / "ray-fail", SAMPLE_TOK, engine="ray", records_per_member=4,
                   storage_options=explicit_options())
    assert ray.value.line == local.value.line == bad_lines[0]
    assert f"{url}:{bad_lines[0]}: malformed JSON" in str(ray.value)
    assert str(ray.value) == str(local.value).replace(str(src), url)
    assert ray.value.cli == local.value.cli.replace(str(src), url)
    assert not (tmp_path / "ray-fail").exists()

    local = build_text([src], tmp_path / "local", SAMPLE_TOK, on_error="skip", skip_log=tmp_path / "local.log")
    ray = build_text([url], tmp_path / "ray", SAMPLE_TOK, engine="ray", records_per_member=4, on_error="skip",
                     skip_log=tmp_path / "ray.log", storage_options=explicit_options())
    got = [json.loads(x) for x in (tmp_path / "ray.log").read_text().splitlines()]
    want = [json.loads(x) for x in (tmp_path / "local.log").read_text().splitlines()]
    assert [g["line"] for g in got] == bad_lines
    assert got == [{**w, "file": url, "message": w["message"].replace(str(src), url)} for w in want]
    # a local build's report names its input relative to the dataset (SECURITY A15), a URL stays a URL
    assert ray.report["skipped_examples"] == [{**w, "file": url, "message": w["message"].replace(w["file"], url)}
                                              for w in local.report["skipped_examples"]]
    assert_same_as_local(ray.path, local.path, tmp_path)
