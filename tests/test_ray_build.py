"""packfmt build --engine ray: same bytes as a local build (after a physical merge), same counts, faults survived.

Runs on one shared local Ray session with 2 CPUs (tests/ray_session.py); skipped without ray.
"""

from __future__ import annotations


import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("ray")

import packfmt  # noqa: E402
from packfmt.build import build_chat, build_multimodal, build_text  # noqa: E402
from packfmt.collection import Collection  # noqa: E402
from packfmt.errors import DatasetExistsError, InputError  # noqa: E402

from ray_session import assert_same_as_local, ray_session, time_limit  # noqa: E402,F401
from s3_server import s3_server  # noqa: E402,F401  (skips without moto / s3fs)

SAMPLE = Path(packfmt.__file__).parent / "sample_data"
SAMPLE_TOK = SAMPLE / "tokenizer"
REPO = Path(__file__).resolve().parents[1]
# one xdist worker runs every Ray test (tools/test.sh: --dist loadgroup), so one Ray session serves them all
pytestmark = [pytest.mark.usefixtures("ray_session", "time_limit"), pytest.mark.xdist_group("ray")]


def no_leftovers(out: Path) -> None:
    """Nothing but the collection: no staging folder, no temp sibling, no dead attempt."""
    assert sorted(p.name for p in out.iterdir()) == ["doc_lengths.bin", "manifest.json", "members"]
    hidden = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    assert hidden == []
    for member in (out / "members").iterdir():
        assert not member.name.startswith("."), member


def test_text_jsonl_same_bytes_as_local(tmp_path):
    local = build_text([SAMPLE / "text.jsonl"], tmp_path / "local", SAMPLE_TOK).path
    result = build_text([SAMPLE / "text.jsonl"], tmp_path / "ray", SAMPLE_TOK, engine="ray", records_per_member=7)
    coll = Collection(result.path)
    assert len(coll.members) == 9  # 60 lines in units of 7
    assert result.report["records_read"] == result.report["documents_written"] == 60
    assert result.report["engine"] == "ray" and result.report["ray"]["actor_pool"] == 1  # below the 2 CPUs
    assert_same_as_local(result.path, local, tmp_path)
    no_leftovers(result.path)


def test_parquet_same_bytes_as_local(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (SAMPLE / "text.jsonl").read_text(encoding="utf-8").splitlines()]
    src = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src, row_group_size=13)
    local = build_text([src], tmp_path / "local", SAMPLE_TOK).path
    result = build_text([src], tmp_path / "ray", SAMPLE_TOK, engine="ray", records_per_member=25)
    assert len(Collection(result.path).members) == 3
    assert_same_as_local(result.path, local, tmp_path)


def test_chat_same_bytes_and_mask_as_local(tmp_path):
    local = build_chat([SAMPLE / "chat.jsonl"], tmp_path / "local", SAMPLE_TOK).path
    result = build_chat([SAMPLE / "chat.jsonl"], tmp_path / "ray", SAMPLE_TOK, engine="ray", records_per_member=11)
    assert (local / "loss_mask.bin").is_file()
    assert_same_as_local(result.path, local, tmp_path)


def test_llava_same_image_bytes_as_local(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    rng = np.random.default_rng(0)
    lines = []
    for k in range(9):
        w, h = 20 + 7 * k, 30 + 3 * k
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(root / f"{k}.png")
        lines.append(json.dumps({"image": f"{k}.png", "conversations": [
            {"from": "human", "value": f"<image>\nWhat is picture {k}?"}, {"from": "gpt", "value": f"Noise {k}."}]}))
    src = tmp_path / "llava.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    kw = dict(image_root=root, image_tokens="dynamic", patch_size=4, merge=2)
    local = build_multimodal([src], tmp_path / "local", SAMPLE_TOK, **kw).path
    result = build_multimodal([src], tmp_path / "ray", SAMPLE_TOK, engine="ray", records_per_member=4, **kw)
    assert result.report["images"] == 9
    assert (local / "image_blobs.bin").is_file()
    assert_same_as_local(result.path, local, tmp_path)


def bad_jsonl(tmp_path: Path) -> Path:
    good = (SAMPLE / "text.jsonl").read_text(encoding="utf-8").splitlines()[:12]
    lines = good[:3] + ["{not json"] + good[3:6] + ['{"title": "no text"}', '{"text": "   "}'] + good[6:9] + \
        ["[1, 2]", "", '{"text": 7}'] + good[9:]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_bad_records_counted_as_in_a_local_build(tmp_path):
    src = bad_jsonl(tmp_path)
    local = build_text([src], tmp_path / "local", SAMPLE_TOK, on_error="skip", skip_log=tmp_path / "local.log")
    ray = build_text([src], tmp_path / "ray", SAMPLE_TOK, on_error="skip", skip_log=tmp_path / "ray.log",
                     engine="ray", records_per_member=4)
    for key in ("records_read", "documents_written", "skipped", "skipped_examples", "tokens"):
        assert ray.report[key] == local.report[key], key
    assert ray.report["skipped"] == {"empty_text": 1, "malformed_json": 1, "missing_field": 1, "not_a_string": 1,
                                     "not_an_object": 1}
    assert (tmp_path / "ray.log").read_text() == (tmp_path / "local.log").read_text()
    assert_same_as_local(ray.path, local.path, tmp_path)


def test_bad_record_under_fail_names_it_and_publishes_nothing(tmp_path):
    src = bad_jsonl(tmp_path)
    with pytest.raises(InputError) as local:
        build_text([src], tmp_path / "local", SAMPLE_TOK)
    with pytest.raises(InputError) as ray:
        build_text([src], tmp_path / "ray", SAMPLE_TOK, engine="ray", records_per_member=4)
    assert f"{src}:4:" in str(ray.value) and ray.value.reason == local.value.reason == "malformed_json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_write_task_dying_midway_is_retried_once_with_no_leftovers(tmp_path):
    local = build_text([SAMPLE / "text.jsonl"], tmp_path / "local", SAMPLE_TOK).path
    marker = tmp_path / "died"
    result = build_text([SAMPLE / "text.jsonl"], tmp_path / "out" / "ray", SAMPLE_TOK, engine="ray",
                        records_per_member=10, _fault={"where": "write", "at": 2, "marker": str(marker)})
    assert marker.exists()  # the task did die once, after writing part of its store
    assert result.report["documents_written"] == 60
    assert_same_as_local(result.path, local, tmp_path)
    no_leftovers(result.path)


def test_tokenizer_actor_killed_mid_block_every_record_once(tmp_path):
    local = build_text([SAMPLE / "text.jsonl"], tmp_path / "local", SAMPLE_TOK).path
    marker = tmp_path / "died"
    result = build_text([SAMPLE / "text.jsonl"], tmp_path / "out" / "ray", SAMPLE_TOK, engine="ray",
                        records_per_member=10, _fault={"where": "encode", "at": 3, "marker": str(marker)})
    assert marker.exists()
    assert result.report["records_read"] == result.report["documents_written"] == 60
    assert_same_as_local(result.path, local, tmp_path)
    no_leftovers(result.path)


DRIVER = """
import sys
from pathlib import Path
from packfmt.build import build_text
S = Path(sys.argv[1])
build_text([S / "text.jsonl"], sys.argv[2], S / "tokenizer", engine="ray", records_per_member=10,
           ray_address=sys.argv[3], _fault={"where": "commit", "at": 2, "marker": sys.argv[4]})
"""


def test_driver_killed_in_commit_leaves_no_collection_and_rerun_succeeds(tmp_path, ray_session):
    out = tmp_path / "ray"
    address = ray_session.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(SAMPLE), str(out), address, str(tmp_path / "died")],
                          env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert (tmp_path / "died").exists() and not out.exists()
    temps = [p for p in tmp_path.iterdir() if p.name.startswith(".ray.packfmt-tmp-")]
    assert len(temps) == 1 and (temps[0] / "members").is_dir()  # died with members renamed, manifest unwritten
    with pytest.raises(Exception):
        Collection(temps[0])
    local = build_text([SAMPLE / "text.jsonl"], tmp_path / "local", SAMPLE_TOK).path
    result = build_text([SAMPLE / "text.jsonl"], out, SAMPLE_TOK, engine="ray", records_per_member=10)
    assert_same_as_local(result.path, local, tmp_path)
    no_leftovers(out)


def test_cli_engine_ray_joins_a_running_cluster(tmp_path, ray_session):
    """`packfmt build chat --engine ray --ray-address ADDR` in another process; validate accepts the collection."""
    address = ray_session.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / "chat"
    cmd = [sys.executable, "-m", "packfmt.cli", "build", "chat", str(SAMPLE / "chat.jsonl"), "-o", str(out),
           "--tokenizer", str(SAMPLE_TOK), "--engine", "ray", "--ray-address", address, "--records-per-member", "30",
           "--no-progress"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "60 records read = 60 written + 0 skipped" in proc.stdout
    assert "2 work units" in proc.stdout
    check = subprocess.run([sys.executable, "-m", "packfmt.cli", "validate", str(out), "--deep"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and "warning" not in check.stdout, check.stdout


def test_cli_ray_options_need_engine_ray(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "packfmt.cli", "build", "text", str(SAMPLE / "text.jsonl"), "-o",
                           str(tmp_path / "o"), "--tokenizer", str(SAMPLE_TOK), "--ray-address", "auto"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "need --engine ray" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_megatron_on_ray_same_bytes_as_import(tmp_path):
    from packfmt.megatron import export_megatron, import_megatron
    from packfmt.ray.megatron import run_ray_megatron

    src = build_text([SAMPLE / "text.jsonl"], tmp_path / "src", SAMPLE_TOK).path
    export_megatron(src, tmp_path / "mg" / "corpus")
    vocab = packfmt.open(src).vocab_size
    local = import_megatron(tmp_path / "mg" / "corpus", tmp_path / "local", vocab_size=vocab)
    out = run_ray_megatron(tmp_path / "mg" / "corpus", tmp_path / "ray", vocab_size=vocab, records_per_member=16)
    coll = Collection(out)
    assert len(coll.members) == 4 and coll.num_documents == 60
    assert_same_as_local(out, local, tmp_path)
    no_leftovers(out)


def bucket_keys(fs, prefix: str) -> list[str]:
    fs.invalidate_cache(prefix)
    return sorted(p[len(prefix) + 1:] for p in fs.find(prefix))


def only_listed_members(fs, prefix: str) -> list[str]:
    """Every object under ``prefix`` is the manifest, a file it lists or inside a member it lists; the member paths."""
    manifest = json.loads(fs.cat_file(f"{prefix}/manifest.json"))
    listed = [m["path"] for m in manifest["members"]]
    for key in bucket_keys(fs, prefix):
        assert key == "manifest.json" or key in manifest["files"] or any(key.startswith(p + "/") for p in listed), \
            f"unlisted object {key}"
    return listed


def test_ray_build_to_object_storage(tmp_path, monkeypatch, s3_server):
    """-o s3://...: write tasks upload their members (one dies midway and is retried), the driver the manifest
    last; nothing unlisted stays in the bucket; a fresh node reads it back."""
    from s3_server import BUCKET, explicit_options

    monkeypatch.setenv("PACKFMT_CACHE", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/ray/text"
    marker = tmp_path / "died"
    result = build_text([SAMPLE / "text.jsonl"], url, SAMPLE_TOK, engine="ray", records_per_member=20,
                        storage_options=explicit_options(), _fault={"where": "write", "at": 1, "marker": str(marker)})
    assert result.path == url and marker.exists()
    listed = only_listed_members(s3_server, f"{BUCKET}/ray/text")
    assert len(listed) == 3 and all(p.startswith("members/") for p in listed)
    assert not (tmp_path / "cache").exists()  # the driver mirrored nothing: the members went up from the tasks
    with pytest.raises(DatasetExistsError):  # refused before any work
        build_text([SAMPLE / "text.jsonl"], url, SAMPLE_TOK, engine="ray", storage_options=explicit_options())
    build_text([SAMPLE / "text.jsonl"], url, SAMPLE_TOK, engine="ray", records_per_member=30, overwrite=True,
               storage_options=explicit_options())
    relisted = only_listed_members(s3_server, f"{BUCKET}/ray/text")  # the replaced members are gone
    assert len(relisted) == 2 and not set(relisted) & set(listed)
    monkeypatch.setenv("PACKFMT_CACHE", str(tmp_path / "fresh"))
    coll = packfmt.open(url)
    local = packfmt.open(build_text([SAMPLE / "text.jsonl"], tmp_path / "local", SAMPLE_TOK).path)
    assert coll.num_documents == local.num_documents == 60
    assert all(coll.document(d).tolist() == local.document(d).tolist() for d in range(60))
    record = np.frombuffer(s3_server.cat_file(f"{BUCKET}/ray/text/doc_lengths.bin"), dtype="<i8")  # the tasks' lengths
    np.testing.assert_array_equal(record, np.asarray(local.doc_lengths))


_DRIVER_OPENS: list | None = None  # paths this process opens while a test watches (sys.addaudithook, below)


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _DRIVER_OPENS is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        _DRIVER_OPENS.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


def test_ray_build_reads_remote_inputs_in_the_actors(tmp_path, monkeypatch, s3_server):
    """JSONL + Parquet living only in the bucket, -o s3://: the driver plans units by ranged reads and never
    opens a copy of an input; the actors read their ranges; same bytes and skipped lines as a local build."""
    global _DRIVER_OPENS
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq
    from s3_server import BUCKET, explicit_options

    src = bad_jsonl(tmp_path)  # 17 lines: 5 bad records and 1 blank line among them
    rows = [json.loads(line) for line in (SAMPLE / "text.jsonl").read_text(encoding="utf-8").splitlines()]
    table = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), table, row_group_size=13)
    s3_server.put_file(str(src), f"{BUCKET}/in/bad.jsonl")
    s3_server.put_file(str(table), f"{BUCKET}/in/rows.parquet")
    # what a killed write attempt of an earlier build left: removed before the manifest is written
    s3_server.pipe_file(f"{BUCKET}/out/web/members/000001-deadbeef/tokens.bin", b"partial")
    inputs = [f"s3://{BUCKET}/in/bad.jsonl", f"s3://{BUCKET}/in/rows.parquet"]
    url = f"s3://{BUCKET}/out/web"
    driver_tmp = tmp_path / "driver-tmp"
    driver_tmp.mkdir()
    monkeypatch.setenv("PACKFMT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(driver_tmp))
    _DRIVER_OPENS = []
    try:
        ray = build_text(inputs, url, SAMPLE_TOK, engine="ray", records_per_member=4, on_error="skip",
                         skip_log=tmp_path / "ray.log", storage_options=explicit_options())
    finally:
        opened, _DRIVER_OPENS = _DRIVER_OPENS, None
    monkeypatch.undo()
    # the driver never opened a local file named like an input (a download would write one) nor a temp input dir
    assert opened, "the audit hook saw no open at all"
    assert [p for p in opened if p.endswith(("bad.jsonl", "rows.parquet")) or "packfmt-inputs-" in p] == []
    assert list(driver_tmp.iterdir()) == [] and not (tmp_path / "cache").exists()
    assert ray.report["ray"]["units"] >= 4 + 5  # JSONL byte ranges + runs of row groups, planned by ranged reads
    assert ray.report["sources"] == [{"path": inputs[0], "format": "jsonl"}, {"path": inputs[1], "format": "parquet"}]
    listed = only_listed_members(s3_server, f"{BUCKET}/out/web")
    assert "members/000001-deadbeef" not in listed

    local = build_text([src, table], tmp_path / "local", SAMPLE_TOK, on_error="skip", skip_log=tmp_path / "local.log")
    for key in ("records_read", "documents_written", "skipped", "tokens"):
        assert ray.report[key] == local.report[key], key
    got = [json.loads(x) for x in (tmp_path / "ray.log").read_text().splitlines()]
    want = [json.loads(x) for x in (tmp_path / "local.log").read_text().splitlines()]
    assert [(g["file"], g["line"], g["reason"]) for g in got] == [(inputs[0], w["line"], w["reason"]) for w in want]
    assert [g["message"] for g in got] == [w["message"].replace(str(src), inputs[0]) for w in want]
    monkeypatch.setenv("PACKFMT_CACHE", str(tmp_path / "reader-cache"))
    assert_same_as_local(url, local.path, tmp_path)


def test_ray_build_reads_remote_images_in_the_actors(tmp_path, monkeypatch, s3_server):
    """LLaVA records and their images only in the bucket (--image-root s3://...): the actors read each image
    themselves, the driver opens none; a missing image and a path climbing out of the root are counted skips,
    exactly as a local build from local files counts them; same bytes otherwise."""
    global _DRIVER_OPENS
    from s3_server import BUCKET, explicit_options

    root = tmp_path / "images"
    root.mkdir()
    rng = np.random.default_rng(1)
    lines = []
    for k in range(7):
        w, h = 18 + 5 * k, 25 + 2 * k
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(root / f"{k}.png")
        s3_server.put_file(str(root / f"{k}.png"), f"{BUCKET}/imgs/{k}.png")
        lines.append(json.dumps({"image": f"{k}.png", "conversations": [
            {"from": "human", "value": f"<image>\nWhat is picture {k}?"}, {"from": "gpt", "value": f"Noise {k}."}]}))
    for bad in ("gone.png", "../secret.png"):  # not in the bucket; out of the root
        lines.insert(3, json.dumps({"image": bad, "conversations": [
            {"from": "human", "value": "<image>\nAnd this?"}, {"from": "gpt", "value": "Nothing."}]}))
    src = tmp_path / "llava.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    s3_server.put_file(str(src), f"{BUCKET}/mm/llava.jsonl")
    kw = dict(image_tokens="dynamic", patch_size=4, merge=2, on_error="skip")
    _DRIVER_OPENS = []
    try:
        ray = build_multimodal([f"s3://{BUCKET}/mm/llava.jsonl"], tmp_path / "ray", SAMPLE_TOK, engine="ray",
                               records_per_member=3, image_root=f"s3://{BUCKET}/imgs/",
                               storage_options=explicit_options(), **kw)
    finally:
        opened, _DRIVER_OPENS = _DRIVER_OPENS, None
    assert opened and [p for p in opened if p.endswith(".png") or "packfmt-inputs-" in p] == []
    local = build_multimodal([src], tmp_path / "local", SAMPLE_TOK, image_root=root, **kw)
    assert ray.report["images"] == local.report["images"] == 7
    assert ray.report["skipped"] == local.report["skipped"] == {"image_path_escapes_root": 1, "missing_image": 1}
    assert_same_as_local(ray.path, local.path, tmp_path)
