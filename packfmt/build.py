"""``packfmt build``: stream records from sources, tokenize in batches (optionally in N processes),
apply the error policy, and write a dataset with a build report.

The pipeline, per batch of ``batch_size`` records, in input order::

    source records ──prepare (main)──► payloads ──encode (worker pool)──► documents ──► DatasetWriter

``prepare`` is cheap and per record (pick a field, validate a conversation, resolve image paths);
``encode`` is the expensive, batched part (tokenization, image sniffing) and runs in worker
processes when ``workers > 1``. At most ``2 * workers`` batches are in flight, so memory stays
bounded whatever the input size, and results are consumed in submission order, so the output is
identical for any number of workers.

Every record ends up either written or skipped with a reason; ``on_error="fail"`` (default)
stops at the first bad record (``file:line: reason``) and publishes nothing (see ``skips``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import string
import time
from collections import deque
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence


from .errors import InputError
from .skips import Tally
from .sources import Raw, count_records, describe_sources, is_path, iter_records
from .sources.hf import is_dataset_object
from .tokenize import TextEncoder, TokenizerSpec
from .writer import DatasetWriter

__all__ = ["BuildResult", "TextConverter", "convert_records", "write_doc", "build_text", "build_chat", "build_multimodal", "build_easy_vqa", "run_build",
           "ON_ERROR_POLICIES"]

ON_ERROR_POLICIES = ("fail", "skip")

#: One encoded document: ``(tokens int64 (n,), loss mask uint8 (n,) or None, images)``.
Doc = tuple  # (np.ndarray, np.ndarray | None, list[ImageRecord])
#: A record that failed in a worker: ``(reason, message)`` (exceptions with kwargs do not pickle).
Failure = tuple


@dataclass
class BuildResult:
    """What a build produced: the dataset path and its build report (also in the manifest)."""

    path: Path
    report: dict


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


# ----------------------------------------------------------------------------- worker pool
_WORKER: Any = None


def _init_worker(factory: Callable[[], Any]) -> None:
    global _WORKER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER = factory()


def _encode_in_worker(payloads: list) -> list:
    return _WORKER.encode(payloads)


def _pool_context():
    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods else "spawn")


def _encoded_batches(batches: Iterator[list], converter, factory, workers: int) -> Iterator[tuple[list, list]]:
    """Yield ``(batch, results)`` in submission order; ``results`` covers the batch's good payloads."""
    def payloads(batch):
        return [item for _, _, item in batch if not isinstance(item, InputError)]

    if workers <= 1:
        for batch in batches:
            good = payloads(batch)
            yield batch, (converter.encode(good) if good else [])
        return
    pool = _pool_context().Pool(workers, initializer=_init_worker, initargs=(factory,))
    pending: deque = deque()
    try:
        for batch in batches:
            pending.append((batch, pool.apply_async(_encode_in_worker, (payloads(batch),))))
            if len(pending) >= 2 * workers:
                done, result = pending.popleft()
                yield done, result.get()
        while pending:
            done, result = pending.popleft()
            yield done, result.get()
        pool.close()
    finally:
        pool.terminate()
        pool.join()


def _prepared_batches(records: Iterable[Raw], converter, batch_size: int, limit: int | None) -> Iterator[list]:
    """Group records into batches of ``(file, line, payload | InputError)``."""
    batch = []
    for n, (file, line, obj) in enumerate(records):
        if limit is not None and n >= limit:
            break
        if isinstance(obj, InputError):
            item = obj
        else:
            try:
                item = converter.prepare(obj)
            except InputError as exc:
                item = exc
        batch.append((file, line, item))
        if len(batch) >= batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


# ----------------------------------------------------------------------------- writing + error policy
def _write_doc(writer: DatasetWriter, tally: Tally, file: str, line: int, doc: Doc) -> None:
    tokens, mask, images = doc
    if tokens.size == 0:
        tally.bad(file, line, "empty_tokens", "the tokenizer produced no tokens")
        return
    top = int(tokens.max())
    if top >= writer.vocab_size or int(tokens.min()) < 0:
        tally.bad(file, line, "token_out_of_range",
                  f"token id {top} is not below vocab_size {writer.vocab_size}")
        return
    writer.add_document(tokens, mask, images or None)
    tally.written += 1
    tally.tokens += int(tokens.size)
    tally.images += len(images)


def _consume(batch: list, results: list, writer: DatasetWriter, tally: Tally) -> None:
    res = iter(results)
    for file, line, item in batch:
        tally.read += 1
        if isinstance(item, InputError):
            tally.bad(file, line, item.reason, str(item), item.cli)
            continue
        out = next(res)
        if isinstance(out, InputError):
            tally.bad(file, line, out.reason, str(out), out.cli)
        elif len(out) == 2:  # Failure (reason, message) from a worker
            tally.bad(file, line, out[0], out[1])
        else:
            _write_doc(writer, tally, file, line, out)
    tally.end_batch()


def convert_records(records: Iterable[Raw], converter, batch_size: int) -> Iterator[tuple]:
    """Convert records in the calling process as a local build does (prepare, then encode per batch).

    Yields ``(file, line, doc, None)`` or ``(file, line, None, (reason, message, cli))`` for every
    record, in order; the Ray engine's tokenizer actors run this, then ``write_doc`` in its sink.
    """
    for batch in _prepared_batches(records, converter, batch_size, None):
        good = [item for _, _, item in batch if not isinstance(item, InputError)]
        res = iter(converter.encode(good) if good else [])
        for file, line, item in batch:
            out = item if isinstance(item, InputError) else next(res)
            if isinstance(out, InputError):
                yield file, line, None, (out.reason, str(out), out.cli)
            elif len(out) == 2:  # Failure (reason, message)
                yield file, line, None, (out[0], out[1], None)
            else:
                yield file, line, out, None


#: Public name of the per-document write rule (empty tokens and ids out of range are skips).
write_doc = _write_doc


def writer_args(converter, vocab_size: int | None) -> dict:
    """The ``DatasetWriter`` keywords a converter's documents are written with (every engine uses these)."""
    enc = converter.encoder
    vocab = int(vocab_size or enc.vocab_size)
    special = {k: (v if v is not None and v < vocab else None) for k, v in enc.special_tokens.items()}
    return {"vocab_size": vocab, "tokenizer": enc.identity, "special_tokens": special, "loss_mask": converter.loss_mask}


def _progress(total: int | None, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="doc", disable=not enabled, dynamic_ncols=True, smoothing=0.1)


def run_build(
    records: Iterable[Raw],
    converter,
    factory: Callable[[], Any],
    out: str | os.PathLike,
    *,
    report_base: dict,
    vocab_size: int | None = None,
    on_error: str = "fail",
    workers: int = 1,
    batch_size: int = 256,
    overwrite: bool = False,
    progress: bool = False,
    total: int | None = None,
    limit: int | None = None,
    skip_log: str | os.PathLike | None = None,
    storage_options: dict | None = None,
) -> BuildResult:
    """Run the pipeline for any converter (text, chat, multimodal) and publish the dataset.

    ``out`` may be a URL (``s3://...``): the dataset is written locally, then uploaded with its
    manifest last (``packfmt.storage``; ``storage_options`` go to fsspec).

    Args:
        records: the source records, in order.
        converter: the main process's converter (prepare, and encode when ``workers <= 1``).
        factory: picklable callable building an equivalent converter in each worker.
        out: target dataset directory.
        report_base: build-report keys known up front (``sources``, ``settings``, ``command``).
        vocab_size: overrides ``len(tokenizer)`` (ids at or above it are ``token_out_of_range``).
    """
    if on_error not in ON_ERROR_POLICIES:
        raise ValueError(f"on_error: expected one of {ON_ERROR_POLICIES}, found {on_error!r}")
    from .storage import is_remote, local_file

    if is_remote(out):
        from .storage import remote_output

        with remote_output(str(out), storage_options, overwrite=overwrite) as local:
            result = run_build(records, converter, factory, local, report_base=report_base, vocab_size=vocab_size,
                               on_error=on_error, workers=workers, batch_size=batch_size, progress=progress,
                               total=total, limit=limit, skip_log=skip_log)
        return BuildResult(str(out).rstrip("/"), result.report)
    out = local_file(out)
    enc = converter.encoder
    writer = DatasetWriter(out, **writer_args(converter, vocab_size), overwrite=overwrite)
    log_file = open(skip_log, "w", encoding="utf-8") if skip_log else None
    tally = Tally(on_error, log_file)
    start = time.perf_counter()
    bar = _progress(total if limit is None else min(total or limit, limit), progress)
    try:
        batches = _prepared_batches(records, converter, batch_size, limit)
        with closing(_encoded_batches(batches, converter, factory, workers)) as encoded:  # closing stops the pool
            for batch, results in encoded:
                _consume(batch, results, writer, tally)
                bar.update(len(batch))
                secs = max(time.perf_counter() - start, 1e-9)
                bar.set_postfix_str(f"{tally.tokens / secs:,.0f} tok/s, skipped {sum(tally.skipped.values())}",
                                    refresh=False)
        seconds = time.perf_counter() - start
        writer.build_report = {
            **report_base,
            "records_read": tally.read,
            "documents_written": tally.written,
            "skipped": dict(sorted(tally.skipped.items())),
            "skipped_examples": tally.examples,
            "tokens": tally.tokens,
            "images": tally.images,
            "seconds": round(seconds, 3),
            "tokens_per_second": round(tally.tokens / max(seconds, 1e-9), 1),
            "tokenizer": enc.identity,
            "on_error": on_error,
            "workers": workers,
        }
        if tally.written == 0:
            raise tally.nothing_written(str(out), report_base.get("sources", []))
        path = writer.finalize()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
        if log_file is not None:
            log_file.close()
    return BuildResult(path, writer.build_report)


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
        engine: ``"local"`` (this process and ``workers`` processes; writes a store) or ``"ray"``
            (Ray Data; writes a collection, see :func:`packfmt.ray.build.run_ray_build`).
        **kw: passed to :func:`run_build` (on_error, workers, batch_size, overwrite, progress,
            vocab_size, limit, skip_log; with ``engine="ray"``: ray_address, records_per_member).
    """
    spec = TokenizerSpec(str(tokenizer), add_bos=add_bos, add_eos=add_eos, image_token=None)
    factory = partial(TextConverter, spec, field, template)
    def settings(converter) -> dict:
        enc = converter.encoder
        return {"field": field, "template": template, "add_bos": enc.add_bos, "add_eos": enc.add_eos,
                "bos_eos_from": "flags" if enc.explicit else "tokenizer"}

    return _build_records("text", factory, inputs, out, fmt=fmt, split=split, settings=settings, glob=glob,
                          engine=engine, **kw)


def _run_engine(engine: str, inputs, fmt, split, glob, converter, factory, out, base: dict, kw: dict) -> BuildResult:
    if engine != "ray":
        raise ValueError(f"engine: expected one of ('local', 'ray'), found {engine!r}")
    from .ray.build import run_ray_build

    return run_ray_build(inputs, converter, factory, out, fmt=fmt, split=split, glob=glob, report_base=base, **kw)


def _build_records(command: str, factory, inputs, out, *, fmt, split, settings: dict | Callable, glob: str = "*.txt",
                   engine: str = "local", **kw) -> BuildResult:
    """Any converter over any sources (``packfmt.sources``): records reach ``run_build`` (or the Ray
    engine) one way. ``settings``: the report's settings, or a function of the converter giving them.
    """
    converter = factory()
    if callable(settings):
        settings = settings(converter)
    inputs = as_inputs(inputs)
    records = iter_records(inputs, fmt, columns=converter.columns, split=split, glob=glob)
    total = count_records(inputs, fmt, split=split, glob=glob)
    settings = {**settings, "batch_size": kw.get("batch_size", 256),
                "vocab_size": kw.get("vocab_size") or converter.encoder.vocab_size}
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
        **kw: as :func:`build_text`.
    """
    from .chat import REASONING, TRAIN_ON
    from .sources.chat import ChatConverter

    for name, value, choices in (("train_on", train_on, TRAIN_ON), ("reasoning", reasoning, REASONING)):
        if value not in choices:
            raise InputError(f"{name}={value!r}: expected one of {', '.join(map(repr, choices))}", reason="invalid_option",
                             field=name, expected=list(choices), found=value,
                             cli=f"--{name.replace('_', '-')} {value}: expected one of {', '.join(choices)}")
    spec = TokenizerSpec(str(tokenizer), chat_template=chat_template, image_token=None)
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
    fmt: str | None = None,
    split: str | None = None,
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
        **kw: as :func:`build_text`.
    """
    from .sources.multimodal import MultimodalConverter

    spec = TokenizerSpec(str(tokenizer), chat_template=chat_template, image_token=image_token)
    rule = _image_rule(image_tokens, patch_size, merge)
    encoding = _image_encoding(image_encoding, image_max_side, jpeg_quality)
    root = None if image_root is None else str(Path(image_root).resolve())
    factory = partial(MultimodalConverter, spec, root, rule, train_on, max_pixels, encoding)
    settings = {"train_on": train_on, "chat_template": "custom" if chat_template else "tokenizer",
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
    **kw: Any,
) -> BuildResult:
    """Convert the PyPI ``easy-vqa`` dataset (64x64 PNG shapes, questions with one-word answers).

    ``tokenizer`` defaults to the shipped sample tokenizer (which has ``<image>`` and a chat template).
    Image options are those of :func:`build_multimodal`.
    """
    from .sources.multimodal import MultimodalConverter, easy_vqa_records

    if tokenizer is None:
        tokenizer = Path(__file__).parent / "sample_data" / "tokenizer"
    records, root, total = easy_vqa_records(split, image_token)
    spec = TokenizerSpec(str(tokenizer), chat_template=chat_template, image_token=image_token)
    rule = _image_rule(image_tokens, patch_size, merge)
    encoding = _image_encoding(image_encoding, image_max_side, jpeg_quality)
    factory = partial(MultimodalConverter, spec, str(root), rule, train_on, max_pixels, encoding)
    converter = factory()
    settings = {"train_on": train_on, "split": split, "image_root": str(root), "image_tokens": rule.describe(),
                "image_token": image_token, "max_pixels": max_pixels, **encoding.describe(),
                "batch_size": kw.get("batch_size", 256),
                "vocab_size": kw.get("vocab_size") or converter.encoder.vocab_size}
    base = {"command": "easy-vqa", "sources": [{"path": str(root.parent), "format": "easy_vqa"}], "settings": settings}
    return run_build(records, converter, factory, out, report_base=base, total=total, **kw)
