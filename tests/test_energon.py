"""The WebDataset export read by Megatron-Energon (spec/WEBDATASET.md §3): ``energon prepare`` with the
crude dataset type, then Energon's own training loader (``get_train_dataset`` + ``get_loader``, its
packing off) yields every pack once, equal to ``PackedDataset``: tokens, ``cu_seqlens``, labels from the
loss mask, documents, and image bytes (or pixels, through Energon's default image decoder)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import packfmt
from packfmt.build import build_multimodal, build_text
from packfmt.export_webdataset import export_webdataset
from packfmt.packindex import build_pack_index

from test_webdataset import SAMPLE, TOK, check_samples, raw_members, samples, write_tar

energon = pytest.importorskip("megatron.energon")
from megatron.energon import (  # noqa: E402
    Cooker, DefaultTaskEncoder, Sample, SampleDecoder, WorkerConfig, basic_sample_keys, get_loader,
    get_train_dataset, stateless,
)
from megatron.energon.tools.prepare import command as energon_prepare  # noqa: E402


@dataclass
class CrudePack(Sample):
    """The crude sample's members, unchanged (what a real task encoder's cooker would start from)."""

    parts: dict


@stateless
def cook(crude: dict) -> CrudePack:
    return CrudePack(**basic_sample_keys(crude), parts={k: v for k, v in crude.items() if not k.startswith("__")})


class PackEncoder(DefaultTaskEncoder):
    cookers = [Cooker(cook)]

    def __init__(self, decoder: SampleDecoder | None):
        super().__init__()
        self.decoder = decoder


def export_and_prepare(store: Path, index: str, out: Path, **kw) -> Path:
    export_webdataset(store, out, index=index, **kw)
    energon_prepare.main([str(out), "--non-interactive", "--split-ratio", "1,0,0", "--sample-type", "CrudeWebdataset",
                          "--no-progress", "--num-workers", "1"], standalone_mode=False)
    yaml = (out / ".nv-meta" / "dataset.yaml").read_text()
    assert "__class__: CrudeWebdataset" in yaml and "__module__: megatron.energon" in yaml
    return out


def energon_read(out: Path, decoder: SampleDecoder | None) -> list[dict]:
    """One epoch through Energon's training loader; the samples as ``{__key__, member: value}``, in pack order."""
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_train_dataset(out, worker_config=wc, batch_size=None, shuffle_buffer_size=None,
                           max_samples_per_sequence=None, packing_buffer_size=None, repeat=False,
                           task_encoder=PackEncoder(decoder))
    got = [{"__key__": s.__key__, **s.parts} for s in get_loader(ds)]
    keys = [g["__key__"] for g in got]
    assert len(set(keys)) == len(keys)  # each pack exactly once in the epoch
    return sorted(got, key=lambda g: g["__key__"])


def same_pixels(member, stored: bytes) -> bool:
    """Energon's default ``image_decode="torchrgb"``: float CHW in [0, 1] with the file's pixels."""
    want = np.asarray(Image.open(io.BytesIO(stored)).convert("RGB")).transpose(2, 0, 1)
    return tuple(member.shape) == want.shape and np.array_equal((member.numpy() * 255).round().astype(np.uint8), want)


@pytest.fixture(scope="module")
def vlm(tmp_path_factory) -> tuple[list[Path], Path]:
    tmp = tmp_path_factory.mktemp("energon")
    items = samples()
    tars = [write_tar(tmp / "a.tar", items[:7]), write_tar(tmp / "b.tar", items[7:])]
    return tars, tmp


def test_multimodal_packs_through_energon(vlm):
    tars, tmp = vlm
    store = build_multimodal(tars, tmp / "store", TOK, image_tokens="dynamic", patch_size=4, merge=2).path
    idx = build_pack_index(store, capacity=160, algorithm="ffd").name
    out = export_and_prepare(store, idx, tmp / "out", shard_bytes=8192)
    assert len(list(out.glob("shard-*.tar"))) > 1
    got = energon_read(out, SampleDecoder())  # Energon's default decoder: npy -> arrays, json -> dict
    assert check_samples(store, idx, got, same_image=same_pixels) == 12
    raw = energon_read(out, None)  # no decoder: every member's bytes as stored in the tar
    found = {f"{s['__key__']}.{k}": v for s in raw for k, v in s.items() if k.startswith("img")}
    assert found == raw_members(out)
    st = packfmt.open(store)
    assert sorted(found.values()) == sorted(bytes(st.images.data(i)) for i in range(st.num_images))


def test_raw_pixel_images_stay_bytes(vlm):
    tars, tmp = vlm  # rgb8.zst is no image extension to Energon: its decoder hands the stored bytes through
    store = build_multimodal(tars, tmp / "raw", TOK, image_tokens=4, image_encoding="rgb8+zstd").path
    idx = build_pack_index(store, capacity=200, algorithm="ffd").name
    got = energon_read(export_and_prepare(store, idx, tmp / "raw_out"), SampleDecoder())
    assert any(k.endswith(".rgb8.zst") for g in got for k in g)
    assert check_samples(store, idx, got) == 12


def test_text_packs_through_energon(tmp_path):
    store = build_text([SAMPLE / "text.jsonl"], tmp_path / "t", TOK).path
    idx = build_pack_index(store, capacity=256, algorithm="ffd", materialize=True).name
    got = energon_read(export_and_prepare(store, idx, tmp_path / "out"), SampleDecoder())
    assert check_samples(store, idx, got) == 0
