"""The WebDataset export read by Megatron-Energon (spec/WEBDATASET.md §3): ``energon prepare`` with the
crude dataset type, then Energon's own training loader (``get_train_dataset`` + ``get_loader``, its
packing off) yields every pack once, equal to ``PackedDataset``: tokens, ``cu_seqlens``, labels at every
position (cuts included), documents, and image bytes (or pixels, through Energon's default image
decoder); and the task encoder of spec/WEBDATASET.md §3 (``packfmt.energon.sample_to_batch``) cooks a
collection's split packs into Megatron's ``thd`` inputs equal to ``PackedDataset``'s."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import packfmt
from packfmt.build import build_multimodal, build_text
from packfmt.energon import sample_to_batch
from packfmt.export_webdataset import export_webdataset
from packfmt.packindex import build_pack_index
from packfmt.torch import PackedDataset

from test_webdataset import SAMPLE, TOK, check_samples, cut_labels, raw_members, samples, stored_image, vlm_collection, write_tar

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


@dataclass
class PackedSample(Sample):
    """spec/WEBDATASET.md §3's worked example, as written there."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    packed_seq_params: object
    image_ids: torch.Tensor
    image_spans: torch.Tensor
    images: list


@stateless
def cook_batch(crude: dict) -> PackedSample:
    b = sample_to_batch(crude, packed_seq_params=True)
    images = [crude[m["member"]] for m in crude["json"]["images"]]
    return PackedSample(**basic_sample_keys(crude), images=images,
                        **{k: b[k] for k in ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens",
                                             "max_seqlen", "packed_seq_params", "image_ids", "image_spans")})


class PackTaskEncoder(DefaultTaskEncoder):
    cookers = [Cooker(cook_batch)]
    decoder = SampleDecoder()


def export_and_prepare(store: Path, index: str, out: Path, **kw) -> Path:
    export_webdataset(store, out, index=index, **kw)
    energon_prepare.main([str(out), "--non-interactive", "--split-ratio", "1,0,0", "--sample-type", "CrudeWebdataset",
                          "--no-progress", "--num-workers", "1"], standalone_mode=False)
    yaml = (out / ".nv-meta" / "dataset.yaml").read_text()
    assert "__class__: CrudeWebdataset" in yaml and "__module__: megatron.energon" in yaml
    return out


def energon_epoch(out: Path, task_encoder) -> list:
    """One epoch through Energon's training loader, in pack order (the key names the pack)."""
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_train_dataset(out, worker_config=wc, batch_size=None, shuffle_buffer_size=None,
                           max_samples_per_sequence=None, packing_buffer_size=None, repeat=False,
                           task_encoder=task_encoder)
    got = list(get_loader(ds))
    keys = [s.__key__ for s in got]
    assert len(set(keys)) == len(keys)  # each pack exactly once in the epoch
    return sorted(got, key=lambda s: s.__key__)


def energon_read(out: Path, decoder: SampleDecoder | None) -> list[dict]:
    """The samples as ``{__key__, member: value}``, in pack order."""
    return [{"__key__": s.__key__, **s.parts} for s in energon_epoch(out, PackEncoder(decoder))]


def same_pixels(member, stored: bytes) -> bool:
    """Energon's default ``image_decode="torchrgb"``: float CHW in [0, 1] with the file's pixels."""
    want = np.asarray(Image.open(io.BytesIO(stored)).convert("RGB")).transpose(2, 0, 1)
    return tuple(member.shape) == want.shape and np.array_equal((member.numpy() * 255).round().astype(np.uint8), want)


def check_cooked(got: list, ds: PackedDataset, source) -> int:
    """Task-encoder samples (``PackTaskEncoder``, pack order) equal ``ds`` at every position: tokens, labels
    (cuts included), Megatron's loss mask, positions, ``cu_seqlens``, ``PackedSeqParams``, image ids and
    spans, and each image's pixels those of the stored image its id names. Returns the images seen."""
    assert len(got) == len(ds)
    images = 0
    for p, s in enumerate(got):
        item = ds[p]
        assert s.__key__ == f"{p:09d}"
        assert torch.equal(s.input_ids[0], item["input_ids"])
        assert torch.equal(s.labels[0], item["labels"])  # every position, the cuts' true next tokens included
        assert torch.equal(s.loss_mask[0], (item["labels"] != -100).float())
        assert torch.equal(s.position_ids[0], item["position_ids"])
        cu = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(item["seq_lens"], 0).int()])
        assert torch.equal(s.cu_seqlens, cu) and s.cu_seqlens.dtype == torch.int32
        assert s.max_seqlen == int(item["seq_lens"].max())
        params = s.packed_seq_params
        assert type(params).__name__ == "PackedSeqParams" and params.qkv_format == "thd"
        assert params.cu_seqlens_q is params.cu_seqlens_kv is s.cu_seqlens
        assert params.max_seqlen_q == params.max_seqlen_kv == s.max_seqlen
        assert torch.equal(s.image_ids, item["image_ids"])  # collection-wide ids, as the reader numbers them
        assert torch.equal(s.image_spans, item["image_spans"])
        for g, pixels in zip(s.image_ids.tolist(), s.images):
            assert same_pixels(pixels, stored_image(source, g))
        images += len(s.images)
    return images


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


def test_task_encoder_cooks_a_collections_split_packs_like_packed_dataset(vlm):
    """spec/WEBDATASET.md §3's task encoder on a collection of two image stores, packed with
    ``oversize: split`` at a capacity that cuts documents: every label (cuts included), position,
    boundary and image id equals ``PackedDataset``'s."""
    tars, tmp = vlm
    coll_path = vlm_collection(tmp / "coll_src", tars)
    coll = packfmt.open(coll_path)
    idx = build_pack_index(coll_path, capacity=40, algorithm="ffd", oversize="split").name
    out = export_and_prepare(coll_path, idx, tmp / "coll_out", shard_bytes=8192)
    crude = energon_read(out, SampleDecoder())
    cuts = cut_labels(coll, crude)
    assert cuts and any(c != -100 for c in cuts)  # documents are cut, and some cut has a real target
    got = energon_epoch(out, PackTaskEncoder())
    assert check_cooked(got, PackedDataset(coll_path, idx), coll) == coll.num_images == 12
    assert sorted(i for s in got for i in s.image_ids.tolist()) == list(range(12))


def test_sample_to_batch_takes_raw_member_bytes(vlm):
    """With ``decoder = None`` the members are the tar's bytes; the batch is the same."""
    tars, tmp = vlm
    coll_path = vlm_collection(tmp / "raw_src", tars)
    idx = build_pack_index(coll_path, capacity=48, algorithm="ffd", oversize="split").name
    out = export_and_prepare(coll_path, idx, tmp / "raw_bytes_out")
    raw, decoded = energon_read(out, None), energon_read(out, SampleDecoder())
    assert isinstance(raw[0]["input_ids.npy"], bytes)
    for r, d in zip(raw, decoded):
        a, b = sample_to_batch(r), sample_to_batch(d)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)
