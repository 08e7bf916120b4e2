"""``packfmt build``: the converters and the front doors (``build_text``, ``build_chat``,
``build_multimodal``, ``build_easy_vqa``), each a converter over ``packfmt.sources`` run by the
pipeline of ``packfmt.pipeline`` (or by the Ray engine, ``packfmt.ray``).
"""

from __future__ import annotations

import os
import string
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

from .engines import engine as engine_named
from .errors import InputError
from .pipeline import ON_ERROR_POLICIES, BuildResult, Doc, Failure, run_build
from .sources import (
    count_records,
    describe_sources,
    is_path,
    iter_records,
    remote_format,
)
from .sources.hf import is_dataset_object
from .report_paths import report_path
from .storage.uri import is_remote, is_url, local_file
from .tokenize import TextEncoder, TokenizerSpec

__all__ = ["BuildResult", "TextConverter", "build_text", "build_chat", "build_multimodal", "build_easy_vqa", "run_build",
           "ON_ERROR_POLICIES"]

# ----------------------------------------------------------------------------- text converter
def template_fields(template: str) -> list[str]:
    """Plain ``{name}`` fields of a template; attribute/index access and conversions are refused (InputError)."""
    def refuse(problem: str) -> InputError:
        return InputError(f"template= {template!r}: {problem}", reason="invalid_template", field="template",
                          expected="plain {field} names", found=template, cli=f"--template {template!r}: {problem}")

    names = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise refuse(f"{exc} (write a literal brace as {{{{ or }}}})") from None
    for _, name, spec, conv in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conv:
            raise refuse(f"field {{{name}}}: only plain {{field}} names are allowed, like {{title}}")
        names.append(name)
    return names


class TextConverter:
    """Text records -> token documents.

    Args:
        spec: the tokenizer and BOS/EOS policy.
        field: the record's text field (used when ``template`` is None).
        template: e.g. ``"{title}\\n{text}"``; every named field must be a non-null string or number.
    """

    loss_mask = False

    def __init__(self, spec: TokenizerSpec, field: str = "text", template: str | None = None) -> None:
        self.spec = spec
        self.field = field
        self.template = template
        self.fields = template_fields(template) if template is not None else [field]
        self.encoder = TextEncoder(spec)

    @property
    def columns(self) -> list[str]:
        return self.fields

    def prepare(self, obj: dict) -> str:
        """The text of one record (raises InputError: missing_field, not_a_string, empty_text)."""
        for name in self.fields:
            value = obj.get(name)
            if value is None:
                raise InputError(f"field {name!r} missing (record keys: {sorted(obj)[:8]})", reason="missing_field",
                                 field=name, expected="present", found="missing")
            if self.template is None and not isinstance(value, str):
                raise InputError(f"field {name!r} is {type(value).__name__}, not a string", reason="not_a_string",
                                 field=name, expected="string", found=type(value).__name__)
        text = obj[self.field] if self.template is None else self.template.format_map({n: obj[n] for n in self.fields})
        if not text.strip():
            raise InputError("empty text", reason="empty_text", field=self.field, expected="non-empty text", found=repr(text[:20]))
        return text

    def encode(self, texts: list[str]) -> list[Doc | Failure]:
        flat, offsets = self.encoder.encode(texts)
        return [(flat[offsets[i]:offsets[i + 1]], None, []) for i in range(len(texts))]


def tokenizer_setting(spec: TokenizerSpec, out) -> dict:
    """``{"tokenizer_path": ...}`` for the build report's settings: the tokenizer's path as given, relative to the
    dataset ``out`` (a dataset carries no path of its writing host; links on the way are kept, so the name typed
    is), so that a message about this store can name a path a user can type (informative, like the sources';
    the manifest's ``tokenizer`` never holds a path: FORMAT.md §2.2). A dataset at a URL records the base name."""
    return {"tokenizer_path": report_path(spec.path, out, links=True)}


def source_report(inputs: Sequence[Any], fmt: str | None, split: str | None = None) -> list[dict]:
    """``{path, format}`` of each input, plus ``split`` (the one read) for a DatasetDict."""
    return describe_sources(inputs, fmt, split)


def as_inputs(inputs: Any) -> list:
    """A list of inputs: paths as ``str``, ``datasets`` objects as they are; one path or object alone is a list of one."""
    if is_path(inputs) or is_dataset_object(inputs):
        inputs = [inputs]
    return [str(p) if is_path(p) else p for p in inputs]


def build_text(
    inputs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    tokenizer: str | os.PathLike,
    *,
    field: str = "text",
    template: str | None = None,
    fmt: str | None = None,
    add_bos: bool | None = None,
    add_eos: bool | None = None,
    split: str | None = None,
    glob: str = "*.txt",
    engine: str = "local",
    tokenizer_name: str | None = None,
    **kw: Any,
) -> BuildResult:
    """Tokenize text records (JSONL, JSON, Parquet, HF save_to_disk, .txt folder, WebDataset tar shards,
    Hugging Face datasets) into a dataset.

    Args:
        inputs: files or folders, read in order; or a ``datasets.Dataset`` / ``IterableDataset`` /
            ``DatasetDict`` (alone or in the list); with ``fmt="hf"``, names of datasets in the local
            HF cache (never downloaded).
        out: target dataset directory (atomic publish; nothing appears there on failure).
        tokenizer: local tokenizer directory or tokenizer.json.
        field / template: where the text comes from (``template`` like ``"{title}\\n{text}"``).
        add_bos / add_eos: None = the tokenizer's own config; a bool = explicit (see TokenizerSpec).
        tokenizer_name: the manifest's ``tokenizer.name`` (default: the base name of ``tokenizer``); informative:
            stores mix when their tokenizer hashes agree, whatever their names.
        engine: ``"local"`` (this process and ``workers`` processes; writes a store) or ``"ray"``
            (Ray Data; writes a collection, see :func:`packfmt.ray.build.run_ray_build`).
        **kw: passed to :func:`run_build` (on_error, workers, batch_size, overwrite, progress,
            vocab_size, limit, skip_log; with ``engine="ray"``: ray_address, records_per_member).
    """
    spec = TokenizerSpec(str(tokenizer), add_bos=add_bos, add_eos=add_eos, image_token=None, name=tokenizer_name)
    factory = partial(TextConverter, spec, field, template)
    def settings(converter) -> dict:
        enc = converter.encoder
        return {"field": field, "template": template, "add_bos": enc.add_bos, "add_eos": enc.add_eos,
                "bos_eos_from": "flags" if enc.explicit else "tokenizer"}

    return _build_records("text", factory, inputs, out, fmt=fmt, split=split, settings=settings, glob=glob,
                          engine=engine, **kw)


def _run_engine(name: str, inputs, fmt, split, glob, converter, factory, out, base: dict, kw: dict) -> BuildResult:
    """An engine other than ``"local"``, found by name (``packfmt.engines``; ``"ray"``: ``packfmt.ray.build``)."""
    # inputs and output may be URLs: the Ray actors read remote inputs by ranges and the write tasks upload
    # their members; the driver downloads nothing and commits the collection manifest last
    return engine_named(name)(inputs, converter, factory, out, fmt=fmt, split=split, glob=glob, report_base=base, **kw)


def _build_records(command: str, factory, inputs, out, *, fmt, split, settings: dict | Callable, glob: str = "*.txt",
                   engine: str = "local", **kw) -> BuildResult:
    """Any converter over any sources (``packfmt.sources``): records reach ``run_build`` (or the Ray
    engine) one way. ``settings``: the report's settings, or a function of the converter giving them.
    """
    inputs = as_inputs(inputs)
    remote_ray = engine == "ray" and any(isinstance(p, str) and is_remote(p) for p in inputs)
    if remote_ray:
        inputs = [p if is_remote(p) else str(local_file(p)) if isinstance(p, str) else p for p in inputs]
    if not remote_ray and any(isinstance(p, str) and is_url(p) for p in inputs):  # fetched first (packfmt.storage)
        import shutil

        from .storage import download_inputs

        local, tmp = download_inputs(inputs, kw.pop("storage_options", None))
        try:
            return _build_records(command, factory, local, out, fmt=fmt, split=split, settings=settings, glob=glob,
                                  engine=engine, **kw)
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
    converter = factory()
    if callable(settings):
        settings = settings(converter)
    settings = {**settings, "batch_size": kw.get("batch_size", 256),
                "vocab_size": kw.get("vocab_size") or converter.encoder.vocab_size,
                **tokenizer_setting(converter.encoder.spec, out)}
    if remote_ray:  # the Ray engine reads remote inputs in its actors: the driver only names them
        sources = [{"path": p, "format": fmt or remote_format(p)} if is_remote(p) else source_report([p], fmt, split)[0]
                   for p in inputs]
        return _run_engine(engine, inputs, fmt, split, glob, converter, factory, out,
                           {"command": command, "sources": sources, "settings": settings}, kw)
    records = iter_records(inputs, fmt, columns=converter.columns, split=split, glob=glob)
    total = count_records(inputs, fmt, split=split, glob=glob)
    base = {"command": command, "sources": source_report(inputs, fmt, split), "settings": settings}
    if engine != "local":
        return _run_engine(engine, inputs, fmt, split, glob, converter, factory, out, base, kw)
    return run_build(records, converter, factory, out, report_base=base, total=total, **kw)


def build_chat(
    inputs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    tokenizer: str | os.PathLike,
    *,
    chat_template: str | None = None,
    train_on: str = "assistant",
    reasoning: str = "keep",
    fmt: str | None = None,
    split: str | None = None,
    tokenizer_name: str | None = None,
    **kw: Any,
) -> BuildResult:
    """Chat/SFT records (``messages`` role/content or ``conversations`` from/value) -> tokens + loss mask.

    The mask comes from the template's ``{% generation %}`` blocks when it has them (transformers'
    assistant mask), else from each assistant turn located in the rendered conversation (any
    template that renders the turn's content, incremental or not); see :mod:`packfmt.chat`.

    Args:
        chat_template: Jinja template text overriding the tokenizer's own.
        train_on: ``"assistant"``: every assistant turn; ``"last"``: only the last one; ``"all"``: every token.
        reasoning: ``"keep"``: reasoning blocks (``<think>...</think>``) are trained with their turn;
            ``"drop"``: left out of the loss. An empty block is never trained.
        tokenizer_name, **kw: as :func:`build_text`.
    """
    from .chat import REASONING, TRAIN_ON
    from .sources.chat import ChatConverter

    for name, value, choices in (("train_on", train_on, TRAIN_ON), ("reasoning", reasoning, REASONING)):
        if value not in choices:
            raise InputError(f"{name}={value!r}: expected one of {', '.join(map(repr, choices))}", reason="invalid_option",
                             field=name, expected=list(choices), found=value,
                             cli=f"--{name.replace('_', '-')} {value}: expected one of {', '.join(choices)}")
    spec = TokenizerSpec(str(tokenizer), chat_template=chat_template, image_token=None, name=tokenizer_name)
    factory = partial(ChatConverter, spec, train_on, reasoning)

    def settings(converter) -> dict:
        return {"train_on": train_on, "reasoning": reasoning, "chat_template": "custom" if chat_template else "tokenizer",
                "loss_mask_from": "generation_blocks" if converter.encoder.generation else "located_turns"}

    return _build_records("chat", factory, inputs, out, fmt=fmt, split=split, settings=settings, **kw)


def _image_rule(image_tokens: int | str, patch_size: int, merge: int):
    from .sources.multimodal import ImageTokenRule

    if image_tokens == "dynamic":
        return ImageTokenRule(None, patch_size, merge)
    return ImageTokenRule(int(image_tokens), patch_size, merge)


def _image_encoding(image_encoding: str, image_max_side: int | None, jpeg_quality: int):
    from .images import ImageEncoding

    return ImageEncoding(image_encoding, image_max_side, jpeg_quality)


def build_multimodal(
    inputs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    tokenizer: str | os.PathLike,
    *,
    image_root: str | os.PathLike | None = None,
    image_tokens: int | str = 576,
    patch_size: int = 14,
    merge: int = 2,
    max_pixels: int | None = None,
    image_max_side: int | None = None,
    image_encoding: str = "original",
    jpeg_quality: int = 90,
    image_token: str = "<image>",
    chat_template: str | None = None,
    train_on: str = "assistant",
    reasoning: str = "keep",
    fmt: str | None = None,
    split: str | None = None,
    tokenizer_name: str | None = None,
    **kw: Any,
) -> BuildResult:
    """LLaVA-style (``conversations`` + ``image``) or ``{messages, images}`` records -> tokens, mask, images.

    Args:
        image_root: folder image paths are relative to (paths escaping it are refused); not needed
            when every image comes with its record (WebDataset members, HF ``Image`` bytes).
        image_tokens: tokens per image: an int (fixed) or ``"dynamic"``
            (``ceil(h/(patch_size*merge)) * ceil(w/(patch_size*merge))``).
        max_pixels: refuse images with more pixels (decompression bombs); default Pillow's bound.
        image_max_side: downsize (Lanczos, aspect kept) images whose longer side exceeds this many
            pixels, then re-encode them (to ``image_encoding``, or their own format if png/jpeg/webp,
            else png). Width, height and the dynamic token count use the stored (resized) size.
        image_encoding: ``"original"`` (keep the file's bytes) or force a re-encode of every image:
            ``"png"``, ``"jpeg"``, ``"webp"``, ``"rgb8+zstd"`` (raw RGB pixels in a zstd frame).
        jpeg_quality: quality in [1, 100] of jpeg / webp re-encodes.
        image_token: marker string in the text; must be one token of the tokenizer.
        train_on, reasoning: the loss mask, as :func:`build_chat` (image tokens are never trained).
        tokenizer_name, **kw: as :func:`build_text`.
    """
    from .sources.multimodal import MultimodalConverter

    spec = TokenizerSpec(str(tokenizer), chat_template=chat_template, image_token=image_token, name=tokenizer_name)
    rule = _image_rule(image_tokens, patch_size, merge)
    encoding = _image_encoding(image_encoding, image_max_side, jpeg_quality)
    # a root in object storage stays a URL: each image is read by the process converting its record
    # (a build worker, a Ray actor), never downloaded as a folder first
    remote_root = image_root is not None and is_remote(str(image_root))
    root = None if image_root is None else str(image_root).rstrip("/") if remote_root else str(Path(image_root).resolve())
    factory = partial(MultimodalConverter, spec, root, rule, train_on, max_pixels, encoding, reasoning,
                      kw.get("storage_options") if remote_root else None)
    settings = {"train_on": train_on, "reasoning": reasoning, "chat_template": "custom" if chat_template else "tokenizer",
                "image_root": root, "image_tokens": rule.describe(),
                "image_token": image_token, "max_pixels": max_pixels, **encoding.describe()}
    return _build_records("multimodal", factory, inputs, out, fmt=fmt, split=split, settings=settings, **kw)


def build_easy_vqa(
    out: str | os.PathLike,
    tokenizer: str | os.PathLike | None = None,
    *,
    split: str = "train",
    image_tokens: int | str = 576,
    patch_size: int = 14,
    merge: int = 2,
    max_pixels: int | None = None,
    image_max_side: int | None = None,
    image_encoding: str = "original",
    jpeg_quality: int = 90,
    image_token: str = "<image>",
    chat_template: str | None = None,
    train_on: str = "assistant",
    tokenizer_name: str | None = None,
    **kw: Any,
) -> BuildResult:
    """Convert the PyPI ``easy-vqa`` dataset (64x64 PNG shapes, questions with one-word answers).

    ``tokenizer`` defaults to the shipped sample tokenizer (which has ``<image>`` and a chat template).
    Image options are those of :func:`build_multimodal`; ``tokenizer_name`` as :func:`build_text`.
    """
    from .sources.multimodal import MultimodalConverter, easy_vqa_records

    if tokenizer is None:
        tokenizer = Path(__file__).parent / "sample_data" / "tokenizer"
    records, root, total = easy_vqa_records(split, image_token)
    spec = TokenizerSpec(str(tokenizer), chat_template=chat_template, image_token=image_token, name=tokenizer_name)
    rule = _image_rule(image_tokens, patch_size, merge)
    encoding = _image_encoding(image_encoding, image_max_side, jpeg_quality)
    factory = partial(MultimodalConverter, spec, str(root), rule, train_on, max_pixels, encoding)
    converter = factory()
    settings = {"train_on": train_on, "split": split, "image_root": str(root), "image_tokens": rule.describe(),
                "image_token": image_token, "max_pixels": max_pixels, **encoding.describe(),
                "batch_size": kw.get("batch_size", 256),
                "vocab_size": kw.get("vocab_size") or converter.encoder.vocab_size,
                **tokenizer_setting(spec, out)}
    base = {"command": "easy-vqa", "sources": [{"path": str(root.parent), "format": "easy_vqa"}], "settings": settings}
    return run_build(records, converter, factory, out, report_base=base, total=total, **kw)
