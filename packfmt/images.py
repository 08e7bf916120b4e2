"""Image codecs of the image store (spec §3.4): decode stored bytes to pixels, sniff encoded bytes."""

from __future__ import annotations

import io

import numpy as np

from .errors import FormatError, InputError
from .format import PIL_FORMATS

#: Default bound on decoded pixels (a decompression bomb guard): 178,956,970 = Pillow's own default.
DEFAULT_MAX_PIXELS = 178_956_970


def decode_image(data: bytes, codec: str, width: int, height: int, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode one stored image to a uint8 array of shape (height, width, channels)."""
    if width * height > max_pixels:
        raise FormatError(field="image size", expected=f"<= {max_pixels} pixels", found=f"{width}x{height}")
    if codec in ("rgb8", "rgb8+zstd"):
        raw = data
        if codec == "rgb8+zstd":
            import zstandard

            raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=width * height * 3)
        if len(raw) != width * height * 3:
            raise FormatError(field="image data", expected=f"{width * height * 3} bytes of rgb8", found=f"{len(raw)} bytes")
        return np.frombuffer(raw, dtype=np.uint8).reshape(height, width, 3)
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        if im.size != (width, height):
            raise FormatError(field="image size", expected=f"{width}x{height} (image_meta)", found=f"{im.size[0]}x{im.size[1]}")
        im = im.convert("RGB") if im.mode not in ("RGB", "L", "RGBA") else im
        arr = np.asarray(im, dtype=np.uint8)
    return arr if arr.ndim == 3 else arr[:, :, None]


def sniff_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[str, int, int]:
    """Return ``(codec, width, height)`` of encoded image bytes, verifying they decode.

    Raises InputError with reason ``undecodable_image``, ``unsupported_image_format`` or
    ``decompression_bomb``.
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            fmt = im.format
            width, height = im.size
            if width * height > max_pixels:
                raise InputError(f"image of {width}x{height} pixels exceeds the bound of {max_pixels} pixels",
                                 reason="decompression_bomb", expected=f"<= {max_pixels} pixels", found=width * height)
            if fmt not in PIL_FORMATS:
                raise InputError(f"unsupported image format {fmt}", reason="unsupported_image_format",
                                 expected=f"one of {sorted(PIL_FORMATS)}", found=fmt)
            im.load()
    except InputError:
        raise
    except Image.DecompressionBombError as exc:
        raise InputError(f"decompression bomb: {exc}", reason="decompression_bomb") from None
    except Exception as exc:  # Pillow raises many types for corrupt data
        raise InputError(f"cannot decode image: {exc}", reason="undecodable_image", expected="a decodable image",
                         found=type(exc).__name__) from None
    return PIL_FORMATS[fmt], width, height
