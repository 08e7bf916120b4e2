"""Multimodal records: LLaVA (``conversations`` + ``image``) and ``{messages, images}`` -> tokens, mask, images.

Each ``<image>`` marker in the text stands for the record's next image (in order). The marker is
rendered by the chat template, tokenized as one special token, and then expanded to ``k`` copies
of the image token id, with ``k`` from the user's rule (:class:`ImageTokenRule`). Images are stored
as their original encoded bytes by default, or resized / re-encoded per an
:class:`~packfmt.images.ImageEncoding`, with width, height and codec as stored (the token count
uses the stored size).
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..images import DEFAULT_MAX_PIXELS, ImageEncoding, sniff_image
from ..chat import ChatEncoder
from ..tokenize import TokenizerError, TokenizerSpec
from ..writer import ImageRecord
from .chat import normalize_messages


@dataclass(frozen=True)
class ImageTokenRule:
    """How many tokens one image becomes.

    ``fixed`` set: always that many (e.g. 576 = (336/14)^2 for CLIP ViT-L/14 at 336 px).
    Otherwise dynamic: ``ceil(height / (patch * merge)) * ceil(width / (patch * merge))``.
    """

    fixed: int | None = 576
    patch_size: int = 14
    merge: int = 2

    def __post_init__(self) -> None:
        if self.fixed is not None and self.fixed < 1:
            raise ValueError(f"image tokens: expected >= 1, found {self.fixed}")
        if self.patch_size < 1 or self.merge < 1:
            raise ValueError("patch size and merge must be >= 1")

    def tokens(self, width: int, height: int) -> int:
        if self.fixed is not None:
            return self.fixed
        side = self.patch_size * self.merge
        return math.ceil(height / side) * math.ceil(width / side)

    def describe(self) -> dict:
        if self.fixed is not None:
            return {"rule": "fixed", "tokens": self.fixed}
        return {"rule": "dynamic", "patch_size": self.patch_size, "merge": self.merge,
                "formula": "ceil(h/(patch*merge)) * ceil(w/(patch*merge))"}


def _image_list(obj: dict) -> list[str | tuple[bytes, str]]:
    """The record's images in order: a path string (relative to the image root), or ``(bytes, name)``
    for an image carried in the record (a tar shard member, an HF ``Image`` feature's ``{"bytes", "path"}``)."""
    raw = obj.get("images", obj.get("image"))
    if raw is None:
        return []
    items = raw if isinstance(raw, list) else [raw]
    out = []
    for k, item in enumerate(items):
        if isinstance(item, dict) and isinstance(item.get("bytes"), (bytes, bytearray)):
            out.append((bytes(item["bytes"]), str(item.get("path") or f"images[{k}]")))
            continue
        path = item.get("path") if isinstance(item, dict) else item
        if not isinstance(path, str) or not path:
            raise InputError(f"images[{k}]: expected a path string, found {type(path).__name__}", reason="invalid_image_entry",
                             field=f"images[{k}]", expected="relative path", found=type(path).__name__)
        out.append(path)
    return out


def resolve_image(root: Path | str | None, rel: str) -> Path | str:
    """``root / rel`` resolved (symlinks too); raises ``image_path_escapes_root`` if it leaves ``root``.

    A root in object storage (a ``s3://...`` string) is resolved lexically, as member paths of a
    collection at a URL are (spec/COLLECTION.md §2.2): ``..`` may not climb above it; the URL is returned.
    """
    if root is None:
        raise InputError(f"image {rel!r} is a path but no image root was given", reason="missing_image", field="image",
                         expected="image_root= (the folder image paths are relative to)", found=rel,
                         cli=f"image {rel!r} is a path but no image root was given: pass --image-root")
    if isinstance(root, str):
        norm = posixpath.normpath(rel.replace("\\", "/"))
        if norm.startswith(("/", "../")) or norm in ("..", "."):
            raise InputError(f"image path {rel!r} escapes the image root {root}", reason="image_path_escapes_root",
                             field="image", expected=f"a path inside {root}", found=rel)
        return f"{root}/{norm}"
    target = (root / rel).resolve()
    if not target.is_relative_to(root):
        raise InputError(f"image path {rel!r} escapes the image root {root}", reason="image_path_escapes_root",
                         field="image", expected=f"a path inside {root}", found=rel)
    return target


def _read_file(path: Path | str, rel: str, storage_options: dict | None = None) -> bytes:
    if isinstance(path, str):  # an image in object storage: read by this process (a build worker or Ray actor)
        return _read_object(path, rel, storage_options)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"image {rel!r} not found ({path})", reason="missing_image", field="image",
                         expected="an existing file", found="missing") from None
    except OSError as exc:
        raise InputError(f"image {rel!r} unreadable: {exc}", reason="missing_image", field="image",
                         expected="a readable file", found=type(exc).__name__) from None


def _read_object(url: str, rel: str, storage_options: dict | None) -> bytes:
    """An image object's bytes; a missing object is the ``missing_image`` skip a missing file is."""
    from ..storage.errors import storage_errors
    from ..storage.transport import remote

    with storage_errors(url, storage_options):
        fs, path = remote(url, storage_options)
        try:
            return fs.cat_file(path)
        except (FileNotFoundError, IsADirectoryError):
            pass
    raise InputError(f"image {rel!r} not found ({url})", reason="missing_image", field="image",
                     expected="an existing object", found="missing")


def load_image(source: Path | str | bytes, rel: str, max_pixels: int,
               storage_options: dict | None = None) -> tuple[bytes, str, int, int]:
    """The image's bytes (read from ``source`` when a path or URL) and ``(codec, width, height)`` after checking it decodes."""
    data = source if isinstance(source, bytes) else _read_file(source, rel, storage_options)
    try:
        codec, width, height = sniff_image(data, max_pixels=max_pixels)
    except InputError as exc:
        raise InputError(f"image {rel!r}: {exc}", reason=exc.reason, field="image", expected=exc.expected,
                         found=exc.found) from None
    return data, codec, width, height


def reencode_image(encoding: ImageEncoding, image: tuple[bytes, str, int, int], rel: str) -> tuple[bytes, str, int, int]:
    """``encoding.apply`` to one loaded image; an encoder failure is an ``image_reencode_failed`` InputError."""
    try:
        return encoding.apply(*image)
    except Exception as exc:  # Pillow / libwebp raise many types
        raise InputError(f"image {rel!r}: cannot re-encode to {encoding.codec}: {exc}", reason="image_reencode_failed",
                         field="image", expected=f"an image {encoding.codec} can store", found=type(exc).__name__) from None


def expand_images(ids: np.ndarray, mask: np.ndarray, image_id: int, images: list[tuple[bytes, str, int, int]],
                  rule: ImageTokenRule) -> tuple[np.ndarray, np.ndarray, list[ImageRecord]]:
    """Replace the i-th image token by ``k_i`` copies; image tokens get loss mask 0."""
    where = np.flatnonzero(ids == image_id)
    if where.size != len(images):
        raise InputError(f"{where.size} image tokens in the rendered text but {len(images)} images",
                         reason="image_marker_mismatch", field="images", expected=len(images), found=int(where.size))
    reps = np.ones(ids.size, dtype=np.int64)
    counts = [rule.tokens(w, h) for _, _, w, h in images]
    reps[where] = counts
    new_ids = np.repeat(ids, reps)
    new_mask = np.repeat(mask, reps)
    starts = np.concatenate([[0], np.cumsum(reps)[:-1]])
    records = []
    for pos, k, (data, codec, w, h) in zip(where, counts, images):
        begin = int(starts[pos])
        new_mask[begin:begin + k] = 0
        records.append(ImageRecord(data, w, h, codec, begin, begin + k))
    return new_ids, new_mask, records


class MultimodalConverter:
    """LLaVA / ``{messages, images}`` records -> documents with images.

    Args:
        spec: tokenizer; ``spec.image_token`` must be one token of its vocabulary.
        image_root: folder that image paths are relative to; paths may not leave it (images carried
            in the record as bytes, e.g. WebDataset members, need none). A URL (``s3://bucket/images``):
            each image is read from object storage by the process that converts its record.
        rule: image token count rule.
        train_on: loss mask policy, as ``build_chat`` (image tokens are never trained on).
        reasoning: ``"keep"`` or ``"drop"`` reasoning blocks from the loss, as ``build_chat``.
        max_pixels: decompression-bomb bound (width * height) of the source images.
        encoding: resize / re-encode policy (default: original bytes).
    """

    loss_mask = True
    columns = None

    def __init__(self, spec: TokenizerSpec, image_root: str | None, rule: ImageTokenRule, train_on: str = "assistant",
                 max_pixels: int | None = None, encoding: ImageEncoding | None = None, reasoning: str = "keep",
                 storage_options: dict | None = None) -> None:
        from ..storage.uri import is_remote

        self.spec = spec
        self.root = None if image_root is None else (
            str(image_root).rstrip("/") if is_remote(str(image_root)) else Path(image_root).resolve())
        self.storage_options = storage_options
        self.rule = rule
        self.train_on = train_on
        self.max_pixels = int(max_pixels or DEFAULT_MAX_PIXELS)
        self.encoding = encoding or ImageEncoding()
        self.encoder = ChatEncoder(spec, train_on, reasoning)
        self.image_id = self.encoder.token_id(spec.image_token)
        if self.image_id is None:
            raise TokenizerError(f"{spec.path}: image token {spec.image_token!r} is not one token of the vocabulary "
                                 "(add it as a special token, or pass image_token=)", file=spec.path,
                                 field="image_token", expected="a single token", found=spec.image_token,
                                 cli=f"{spec.path}: image token {spec.image_token!r} is not one token of the vocabulary "
                                     "(add it as a special token, or pass --image-token)")

    def prepare(self, obj: dict) -> tuple[list[dict], list[str], list[str]]:
        marker = self.spec.image_token
        messages = normalize_messages(obj, image_marker=marker)
        rels = _image_list(obj)
        markers = sum(m["content"].count(marker) for m in messages)
        if markers != len(rels):
            raise InputError(f"{markers} {marker} markers in the conversation but {len(rels)} images",
                             reason="image_marker_mismatch", field="images", expected=markers, found=len(rels))
        if self.train_on in ("assistant", "last") and not any(m["role"] == "assistant" for m in messages):
            raise InputError("no assistant message: nothing to train on", reason="no_assistant_turn",
                             field="messages", expected="an assistant message", found="none")
        sources = [str(resolve_image(self.root, e)) if isinstance(e, str) else e[0] for e in rels]
        return messages, sources, [e if isinstance(e, str) else e[1] for e in rels]

    def _encode_one(self, payload, encoded) -> tuple:
        messages, paths, rels = payload
        remote = isinstance(self.root, str)  # paths are URLs under a root in object storage
        images = [load_image(p if isinstance(p, bytes) or remote else Path(p), rel, self.max_pixels, self.storage_options)
                  for p, rel in zip(paths, rels)]
        if isinstance(encoded, InputError):
            raise encoded
        if not self.encoding.is_identity:
            images = [reencode_image(self.encoding, image, rel) for image, rel in zip(images, rels)]
        ids, mask = encoded
        return expand_images(ids, mask, self.image_id, images, self.rule)

    def encode(self, payloads: list) -> list:
        encoded = self.encoder.encode_chat([p[0] for p in payloads])
        out = []
        for payload, enc in zip(payloads, encoded):
            try:
                out.append(self._encode_one(payload, enc))
            except InputError as exc:
                out.append((exc.reason, str(exc)))
        return out


def easy_vqa_records(split: str = "train", marker: str = "<image>"):
    """The easy-vqa questions as ``{messages, images}`` records; returns ``(records, image_root)``.

    Each question ``[question, answer, image_id]`` becomes a user turn ``"<image>\\n" + question`` and
    an assistant turn with the answer; the image is ``<image_id>.png`` under the split's image folder.
    """
    import easy_vqa

    from .record import Raw

    base = Path(easy_vqa.__file__).parent / "data" / split
    questions_file = base / "questions.json"
    texts, answers, image_ids = (easy_vqa.get_train_questions if split == "train" else easy_vqa.get_test_questions)()

    def records():
        for i, (q, a, image_id) in enumerate(zip(texts, answers, image_ids), start=1):
            yield Raw(str(questions_file), i, {
                "messages": [{"role": "user", "content": marker + "\n" + q}, {"role": "assistant", "content": a}],
                "images": [f"{image_id}.png"],
            })

    return records(), base / "images", len(texts)

