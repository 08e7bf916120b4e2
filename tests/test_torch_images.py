"""Multimodal packs through a real transformers image processor, and ``pixel_values`` in batches."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

import packfmt
from packfmt.torch import ImageProcessorTransform, PackedDataset, collate_padded, collate_varlen
from packfmt.torch.testing import write_pack_index

IMG = 99
SIDE = 8


def _processor():
    try:  # the Pillow backend (transformers >= 5 without torchvision); older versions: the class itself
        from transformers import CLIPImageProcessorPil as cls
    except ImportError:
        from transformers import CLIPImageProcessor as cls
    return cls(size={"shortest_edge": SIDE}, crop_size={"height": SIDE, "width": SIDE})


def _png(mode: str, w: int, h: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    shape = {"RGB": (h, w, 3), "L": (h, w), "RGBA": (h, w, 4)}[mode]
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture()
def store(tmp_path):
    """Three documents with four images of different sizes and modes (RGB, L, RGBA)."""
    specs = [[("RGB", 12, 9)], [("L", 5, 7), ("RGBA", 10, 10)], [("RGB", 6, 6)]]
    docs = [[1, IMG, IMG, 2], [3, IMG, IMG, 4, IMG, IMG, IMG, 5], [6, 7, IMG, IMG]]
    spans = [[(1, 3)], [(1, 3), (4, 7)], [(2, 4)]]
    pngs = []
    with packfmt.DatasetWriter(tmp_path / "ds", vocab_size=100, special_tokens={"image": IMG}) as w:
        for doc, sp, im in zip(docs, spans, specs):
            recs = []
            for (b, e), (mode, iw, ih) in zip(sp, im):
                data = _png(mode, iw, ih, len(pngs))
                pngs.append(data)
                recs.append(packfmt.ImageRecord(data, iw, ih, "png", b, e))
            w.add_document(doc, images=recs)
    s = packfmt.open(tmp_path / "ds")
    # pack 0: documents 2 and 0; pack 1: document 1
    write_pack_index(s, np.array([[2, 0, 4], [0, 0, 4], [1, 0, 8]]), np.array([0, 2, 3]), capacity=12, name="p")
    return s, pngs


def _expected(processor, png: bytes) -> torch.Tensor:
    """The processor applied to the stored image as Pillow opens it (independent of packfmt)."""
    with Image.open(io.BytesIO(png)) as im:
        return processor(images=im.copy(), return_tensors="pt")["pixel_values"][0]


def test_items_carry_processed_images(store):
    s, pngs = store
    proc = _processor()
    ds = PackedDataset(s, "p", image_transform=ImageProcessorTransform(proc))
    item = ds[1]
    assert item["image_ids"].tolist() == [1, 2]
    assert [tuple(t.shape) for t in item["images"]] == [(3, SIDE, SIDE)] * 2
    for img, j in zip(item["images"], item["image_ids"].tolist()):
        assert img.dtype == torch.float32 and torch.allclose(img, _expected(proc, pngs[j]), atol=1e-6)
    assert pickle.loads(pickle.dumps(ds.image_transform)).kwargs == {}


def test_batches_stack_same_shape_images_into_pixel_values(store):
    s, pngs = store
    proc = _processor()
    ds = PackedDataset(s, "p", image_transform=ImageProcessorTransform(proc))
    want = torch.stack([_expected(proc, pngs[j]) for j in (3, 0, 1, 2)])  # pack 0 (docs 2, 0), then pack 1
    for collate in (collate_varlen, collate_padded):
        for batch in (ds.__getitems__([0, 1]), [ds[0], ds[1]]):
            b = collate(batch)
            assert b["image_ids"].tolist() == [3, 0, 1, 2]
            assert b["pixel_values"].shape == (4, 3, SIDE, SIDE) and torch.allclose(b["pixel_values"], want, atol=1e-6)
            assert all(t.untyped_storage().data_ptr() == b["pixel_values"].untyped_storage().data_ptr()
                       for t in b["images"])
    # Through real workers (the transform and its processor are pickled into each worker).
    got = list(DataLoader(ds, batch_size=2, collate_fn=collate_varlen, num_workers=2))
    assert len(got) == 1 and torch.allclose(got[0]["pixel_values"], want, atol=1e-6)
    assert got[0]["pixel_values"].is_shared()


def test_raw_images_of_different_sizes_stay_a_list(store):
    s, _ = store
    b = collate_varlen(PackedDataset(s, "p").__getitems__([0, 1]))
    assert "pixel_values" not in b
    assert [tuple(t.shape) for t in b["images"]] == [(6, 6, 3), (9, 12, 3), (7, 5, 1), (10, 10, 4)]
    assert all(t.dtype == torch.uint8 for t in b["images"])


def test_transform_rejects_what_is_not_an_image():
    with pytest.raises(ValueError, match="H, W, C"):
        ImageProcessorTransform(_processor())(torch.zeros(4, 4, dtype=torch.uint8))
