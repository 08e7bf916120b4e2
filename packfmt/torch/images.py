"""Image transforms for ``PackedDataset(image_transform=...)`` (spec/READER.md §1)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ImageProcessorTransform"]


class ImageProcessorTransform:
    """A transformers image processor (CLIP, SigLIP, LLaVA's, ...) as a ``PackedDataset`` image transform.

    Each decoded image (a uint8 ``(H, W, C)`` tensor, ``C`` = 1, 3 or 4) is handed to the processor
    as a Pillow image, ``processor(images=image, return_tensors="pt", **kwargs)``, and the transform
    returns ``output[key][0]``: the processed image without the batch dimension, e.g. a float
    ``(3, 336, 336)`` tensor. Processors whose output has no leading per-image dimension (patch
    sequences such as Qwen2-VL's) need a transform of their own.

    Picklable whenever the processor is (transformers' processors are), so each DataLoader worker
    gets its own copy. The collates stack same-shape images into ``pixel_values``.

    Args:
        processor: a callable taking ``images=`` and ``return_tensors=`` (a transformers image processor).
        key: the output entry to return (default ``"pixel_values"``).
        **kwargs: passed to every call of the processor.
    """

    def __init__(self, processor: Any, key: str = "pixel_values", **kwargs: Any) -> None:
        self.processor, self.key, self.kwargs = processor, key, kwargs

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        from PIL import Image

        arr = image.numpy()
        if arr.ndim != 3 or arr.shape[2] not in (1, 3, 4):
            raise ValueError(f"ImageProcessorTransform: expected a uint8 (H, W, C) image with C in (1, 3, 4), "
                             f"found shape {tuple(arr.shape)}")
        pil = Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)
        out = self.processor(images=pil, return_tensors="pt", **self.kwargs)[self.key]
        return out[0]

    def __repr__(self) -> str:
        return f"ImageProcessorTransform({type(self.processor).__name__}, key={self.key!r})"
