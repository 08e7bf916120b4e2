"""Image codecs of the image store (spec §3.4): decode stored bytes to pixels, sniff encoded bytes,
and (optionally) resize / re-encode images at build time.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from .errors import FormatError, InputError
from .format import MAX_IMAGE_PIXELS, PIL_FORMATS

#: Default bound on decoded pixels (a decompression bomb guard): the format's bound, spec §3.4.
DEFAULT_MAX_PIXELS = MAX_IMAGE_PIXELS


#: codec name -> the Pillow format that must decode it (a PNG stored as "jpeg" is refused).
_PIL_NAME = {codec: pil for pil, codec in PIL_FORMATS.items()}


def decode_image(data: bytes, codec: str, width: int, height: int, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode one stored image to a uint8 array of shape (height, width, channels).

    The channel count follows the decoded image (spec §3.4, "Decoded pixels"): 1 for grayscale
    (8-bit ``L``, bilevel ``1``, 16-bit ``I;16*`` reduced to its high byte), 4 when it has alpha
    (``RGBA``, ``LA``, ``PA``, a palette with transparency: all expanded to RGBA), else 3 (RGB:
    ``rgb8`` codecs, RGB, a palette without transparency, and every other mode through Pillow's
    ``convert("RGB")``).
    """
    if width * height > max_pixels:
        raise FormatError(field="image size", expected=f"<= {max_pixels} pixels", found=f"{width}x{height}")
    if codec in ("rgb8", "rgb8+zstd"):
        raw = _unzstd(data, width * height * 3) if codec == "rgb8+zstd" else data
        if len(raw) != width * height * 3:
            raise FormatError(field="image data", expected=f"{width * height * 3} bytes of rgb8", found=f"{len(raw)} bytes")
        return np.frombuffer(raw, dtype=np.uint8).reshape(height, width, 3)
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data), formats=[_PIL_NAME[codec]] if codec in _PIL_NAME else None) as im:
            if im.size != (width, height):
                raise FormatError(field="image size", expected=f"{width}x{height} (image_meta)",
                                  found=f"{im.size[0]}x{im.size[1]}")
            arr = _pixels(im)
    except FormatError:
        raise
    except Exception as exc:  # Pillow raises many types for corrupt data; none may escape as a crash
        raise FormatError(f"image data: expected a decodable {codec} image, found undecodable bytes "
                          f"({type(exc).__name__}: {exc})", field="image data", expected=f"decodable {codec}",
                          found=type(exc).__name__) from None
    return arr if arr.ndim == 3 else arr[:, :, None]


_ALPHA_MODES = ("RGBA", "LA", "PA", "La", "RGBa")
_GRAY16_MODES = ("I;16", "I;16L", "I;16B", "I;16N")


def _pixels(im) -> np.ndarray:
    """uint8 ``(H, W)`` (grayscale) or ``(H, W, 3|4)`` pixels of a Pillow image, per spec §3.4."""
    if im.mode in ("RGB", "L", "RGBA"):
        return np.asarray(im, dtype=np.uint8)
    if im.mode == "1":
        return np.asarray(im.convert("L"), dtype=np.uint8)
    if im.mode in _GRAY16_MODES:
        return (np.asarray(im).astype(np.uint16) >> 8).astype(np.uint8)
    if im.mode in _ALPHA_MODES or (im.mode == "P" and "transparency" in im.info):
        return np.asarray(im.convert("RGBA"), dtype=np.uint8)
    return np.asarray(im.convert("RGB"), dtype=np.uint8)


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


def _unzstd(data: bytes, size: int) -> bytes:
    """Decompress one Zstandard frame of exactly ``size`` bytes of content, never allocating more.

    ``ZstdDecompressor.decompress`` trusts a content size written in the frame header over its
    ``max_output_size`` argument (a 6 KB frame may claim 200 MB), so the header is checked first.
    """
    import zstandard

    try:
        declared = zstandard.frame_content_size(data)
        if declared not in (-1, size):  # -1: the header does not state the size
            raise FormatError(field="image data", expected=f"a zstd frame of {size} bytes of rgb8",
                              found=f"a frame of {declared} bytes")
        if declared == -1:  # bounded first pass: raises if the content exceeds ``size``
            zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
        stream = zstandard.ZstdDecompressor().decompressobj()
        raw = stream.decompress(data)
    except zstandard.ZstdError as exc:
        raise FormatError(field="image data", expected="one valid zstd frame", found=str(exc)) from None
    if not stream.eof or stream.unused_data:
        raise FormatError(field="image data", expected="exactly one complete zstd frame",
                          found="a truncated frame" if not stream.eof else f"{len(stream.unused_data)} trailing bytes")
    return raw


# ----------------------------------------------------------------------------- build-time re-encoding
#: Target encodings of ``packfmt build --image-encoding`` ("original" keeps the file's bytes).
IMAGE_ENCODINGS = ("original", "png", "jpeg", "webp", "rgb8+zstd")
#: Zstandard level of ``rgb8+zstd`` blobs (fixed, so the output is deterministic).
ZSTD_LEVEL = 9
#: PNG zlib level of re-encoded PNGs (Pillow's default; fixed for deterministic bytes).
PNG_COMPRESS_LEVEL = 6
_RESIZE_KEEPS = ("png", "jpeg", "webp")  # codecs a resize re-encodes to themselves; others become png
_SAVE_FORMAT = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}


@dataclass(frozen=True)
class ImageEncoding:
    """How ``packfmt build`` stores images.

    Attributes:
        codec: ``"original"`` (the file's bytes, unless resized), or a forced re-encode:
            ``"png"``, ``"jpeg"``, ``"webp"`` or ``"rgb8+zstd"`` (raw RGB, zstd level :data:`ZSTD_LEVEL`).
        max_side: if set, images whose longer side exceeds it (pixels) are downsized with Lanczos,
            aspect ratio kept, so the longer side is exactly ``max_side``; a resized image is
            re-encoded (to ``codec``, or with ``"original"`` to its own format if png/jpeg/webp,
            else png).
        jpeg_quality: quality in [1, 100] of jpeg and (lossy) webp re-encodes.
    """

    codec: str = "original"
    max_side: int | None = None
    jpeg_quality: int = 90

    def __post_init__(self) -> None:
        if self.codec not in IMAGE_ENCODINGS:
            raise ValueError(f"image encoding: expected one of {IMAGE_ENCODINGS}, found {self.codec!r}")
        if self.max_side is not None and self.max_side < 1:
            raise ValueError(f"image max side: expected >= 1 pixel, found {self.max_side}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg quality: expected an integer in [1, 100], found {self.jpeg_quality}")

    @property
    def is_identity(self) -> bool:
        """True when every image keeps its original bytes."""
        return self.codec == "original" and self.max_side is None

    def describe(self) -> dict:
        """The settings as recorded in the build report."""
        return {"image_encoding": self.codec, "image_max_side": self.max_side, "jpeg_quality": self.jpeg_quality,
                "resample": "lanczos", "zstd_level": ZSTD_LEVEL if self.codec == "rgb8+zstd" else None}

    def apply(self, data: bytes, codec: str, width: int, height: int) -> tuple[bytes, str, int, int]:
        """See :func:`encode_image`."""
        return encode_image(data, codec, width, height, target=self.codec, max_side=self.max_side,
                            jpeg_quality=self.jpeg_quality)


def fit_size(width: int, height: int, max_side: int | None) -> tuple[int, int]:
    """``(width, height)`` scaled so the longer side is at most ``max_side`` (aspect kept, each >= 1)."""
    long = max(width, height)
    if max_side is None or long <= max_side:
        return width, height
    scale = max_side / long
    return (max_side if width == long else max(1, round(width * scale)),
            max_side if height == long else max(1, round(height * scale)))


def _target_codec(source: str, target: str, resized: bool) -> str | None:
    """The codec to re-encode to, or None to keep the original bytes."""
    if target != "original":
        return target
    if not resized:
        return None
    return source if source in _RESIZE_KEEPS else "png"


def _normalize_mode(im, codec: str):
    """Convert to a mode the target codec stores losslessly: RGB / L / RGBA (no alpha for jpeg, rgb8)."""
    has_alpha = im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info)
    if codec in ("jpeg", "rgb8+zstd"):
        keep = ("RGB",) if codec == "rgb8+zstd" else ("RGB", "L")
        return im if im.mode in keep else im.convert("RGB")
    if im.mode in ("RGB", "L", "RGBA"):
        return im
    return im.convert("RGBA" if has_alpha else "RGB")


def _save(im, codec: str, jpeg_quality: int, icc: bytes | None) -> bytes:
    """Encode a Pillow image with fixed parameters and no metadata but its ICC profile."""
    if codec == "rgb8+zstd":
        import zstandard

        raw = np.ascontiguousarray(np.asarray(im, dtype=np.uint8)).tobytes()  # (H, W, 3), C order
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True, write_checksum=False,
                                        threads=0).compress(raw)
    im.info = {}  # no text chunks, timestamps or EXIF carried over
    params: dict = {"icc_profile": icc} if icc else {}
    if codec == "png":
        params.update(compress_level=PNG_COMPRESS_LEVEL, optimize=False)
    elif codec == "jpeg":
        params.update(quality=jpeg_quality, optimize=False, progressive=False, subsampling=2)  # 4:2:0
    else:  # webp
        params.update(quality=jpeg_quality, method=4, lossless=False, exact=False)
    buf = io.BytesIO()
    im.save(buf, format=_SAVE_FORMAT[codec], **params)
    return buf.getvalue()


def encode_image(data: bytes, codec: str, width: int, height: int, *, target: str = "original",
                 max_side: int | None = None, jpeg_quality: int = 90) -> tuple[bytes, str, int, int]:
    """Optionally downsize and re-encode one image (deterministic: same input, same bytes).

    Args:
        data: the original encoded bytes (already checked by :func:`sniff_image`).
        codec: their codec name; ``width``, ``height``: their size in pixels.
        target: one of :data:`IMAGE_ENCODINGS`; ``"original"`` keeps ``data`` unless resized.
        max_side: bound in pixels on the longer side (Lanczos downsizing, aspect kept); None = no bound.
        jpeg_quality: quality of jpeg / webp output, in [1, 100].

    Returns:
        ``(data, codec, width, height)`` as stored: the size is the one after resizing, which is
        what image-token rules must use. ``rgb8+zstd`` holds ``height * width * 3`` bytes of RGB,
        row-major (C order), in one zstd frame.
    """
    from PIL import Image

    new_w, new_h = fit_size(width, height, max_side)
    resized = (new_w, new_h) != (width, height)
    out_codec = _target_codec(codec, target, resized)
    if out_codec is None:
        return data, codec, width, height
    with Image.open(io.BytesIO(data)) as src:
        icc = src.info.get("icc_profile")
        im = _normalize_mode(src, out_codec)
        if im is src:
            im = src.copy()
    if resized:
        im = im.resize((new_w, new_h), resample=Image.Resampling.LANCZOS)
    return _save(im, out_codec, jpeg_quality, icc), out_codec, new_w, new_h
