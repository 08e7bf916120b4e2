"""``packfmt build {text,chat,llava,easy-vqa} ...``: convert sources into a packfmt dataset."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ..images import IMAGE_ENCODINGS
from ..report_paths import shown_message
from ..sources import FORMATS


def _common(p: argparse.ArgumentParser, *, tokenizer_required: bool = True) -> None:
    p.add_argument("--tokenizer", required=tokenizer_required,
                   help="local Hugging Face tokenizer: a directory or a tokenizer.json (never downloaded)")
    _tokenizer_name(p)
    p.add_argument("--on-error", choices=("fail", "skip"), default="fail",
                   help="bad records: stop with file, line and reason (default), or count and skip them")
    p.add_argument("--skip-log", help="also write every skipped record as one JSON line to this file")
    p.add_argument("--workers", type=int, default=1, help="tokenizer processes (default 1); output is identical for any N")
    p.add_argument("--batch-size", type=int, default=256, help="records per encoding batch (default 256)")
    p.add_argument("--vocab-size", type=int, help="vocabulary size to record (default: len(tokenizer), incl. added tokens)")
    p.add_argument("--limit", type=int, help="read at most this many records")
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset at OUT (atomically)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar")
    p.add_argument("--json", action="store_true", help="print the build report as JSON")


def _tokenizer_name(p: argparse.ArgumentParser, default: str = "the base name of --tokenizer") -> None:
    p.add_argument("--tokenizer-name", metavar="NAME", default=None,
                   help=f"the tokenizer name the manifest records (default: {default}); informative: stores mix "
                        "(merge, collections) when their tokenizer hashes agree, whatever their names")


def _inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", help="input files or folders (.tar WebDataset shards too; or URLs: s3://..., "
                                             "downloaded first); with --format hf, names of datasets in the local "
                                             "Hugging Face cache (never downloaded)")
    p.add_argument("-o", "--out", required=True, help="target dataset directory or URL (s3://...: written locally, "
                                                      "uploaded manifest last)")
    p.add_argument("--format", dest="fmt", choices=FORMATS, help="input format (default: from each path)")
    p.add_argument("--split", help="split of a DatasetDict (save_to_disk folder or --format hf name; default: train; "
                                   "a DatasetDict without train needs --split)")


def _engine(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: this machine, --workers processes, writes a store (default); ray: a Ray Data job "
                        "(needs pip install 'packfmt[ray]'), writes a collection of member stores under OUT/members/")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="with --engine ray: the cluster to join ('auto', ray://HOST:10001; default: start Ray locally)")
    p.add_argument("--records-per-member", type=int, metavar="N",
                   help="with --engine ray: input records (lines, rows) per work unit and member store (default 100000)")


def _bos_eos(p: argparse.ArgumentParser) -> None:
    p.add_argument("--add-bos", dest="add_bos", action="store_true", default=None, help="prepend BOS to every document")
    p.add_argument("--no-add-bos", dest="add_bos", action="store_false", help="never prepend BOS")
    p.add_argument("--add-eos", dest="add_eos", action="store_true", default=None, help="append EOS to every document")
    p.add_argument("--no-add-eos", dest="add_eos", action="store_false", help="never append EOS")


def _chat_opts(p: argparse.ArgumentParser, *, turns: bool = False) -> None:
    p.add_argument("--chat-template", help="Jinja chat template file (default: the tokenizer's)")
    if not turns:
        p.add_argument("--train-on", choices=("assistant", "all"), default="assistant",
                       help="loss mask: assistant tokens only (default) or every token")
        return
    p.add_argument("--train-on", choices=("assistant", "last", "all"), default="assistant",
                   help="loss mask: every assistant turn (default), only the last assistant turn, or every token "
                        "(system, user and tool turns are trained only with 'all')")
    p.add_argument("--reasoning", choices=("keep", "drop"), default="keep",
                   help="reasoning blocks (<think>...</think>) of assistant turns: trained with their turn (keep, "
                        "default) or left out of the loss (drop); an empty <think></think> is never trained")


def _image_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image-tokens", default="576",
                   help="tokens per image: an integer (fixed, e.g. 576) or 'dynamic' (see --patch-size, --merge; "
                        "computed from the stored size, i.e. after --image-max-side)")
    p.add_argument("--patch-size", type=int, default=14, help="dynamic rule: pixels per patch side (default 14)")
    p.add_argument("--merge", type=int, default=2, help="dynamic rule: patches merged per side (default 2)")
    p.add_argument("--max-pixels", type=int, help="refuse images with more pixels (decompression bombs)")
    p.add_argument("--image-token", default="<image>", help="the marker string / token of one image (default <image>)")
    p.add_argument("--image-max-side", type=int, metavar="N",
                   help="downsize (Lanczos, aspect kept) images whose longer side exceeds N pixels and re-encode them "
                        "(to --image-encoding, else their own format if png/jpeg/webp, else png); the recorded width/height "
                        "and the dynamic --image-tokens count use the stored (resized) size")
    p.add_argument("--image-encoding", choices=IMAGE_ENCODINGS, default="original",
                   help="original: store each file's bytes (default); png, jpeg, webp: re-encode every image; "
                        "rgb8+zstd: raw RGB pixels (height*width*3 bytes, row-major) in one zstd frame")
    p.add_argument("--jpeg-quality", type=int, default=90, metavar="Q",
                   help="quality 1-100 of jpeg and webp re-encodes (default 90)")


def add_parser(sub) -> None:
    p = sub.add_parser("build", help="convert text, chat, multimodal sources into a dataset",
                       description="Tokenize records into a packfmt dataset (streaming, atomic, every record accounted for).")
    kinds = p.add_subparsers(dest="kind", metavar="KIND", required=True)

    t = kinds.add_parser("text", help="JSONL / JSON / Parquet / HF save_to_disk / folder of .txt -> token documents")
    _inputs(t)
    t.add_argument("--field", default="text", help="text field of each record (default: text)")
    t.add_argument("--template", help='combine fields, e.g. "{title}\\n{text}" (overrides --field)')
    t.add_argument("--glob", default="*.txt", help="files of a text folder (default *.txt)")
    _bos_eos(t)
    _common(t)
    _engine(t)
    t.set_defaults(func=run)

    c = kinds.add_parser("chat", help="messages / conversations (OpenAI or ShareGPT) -> tokens + loss mask")
    _inputs(c)
    _chat_opts(c, turns=True)
    _common(c)
    _engine(c)
    c.set_defaults(func=run)

    m = kinds.add_parser("llava", help="LLaVA / {messages, images} records with images -> tokens, mask, images")
    _inputs(m)
    m.add_argument("--image-root", help="folder that image paths are relative to (paths may not escape it); "
                                        "not needed for WebDataset .tar shards, whose images are members of each sample. "
                                        "A URL (s3://...): fetched as a folder for a local build; with --engine ray "
                                        "each actor reads the images it needs")
    _chat_opts(m, turns=True)
    _image_opts(m)
    _common(m)
    _engine(m)
    m.set_defaults(func=run)

    e = kinds.add_parser("easy-vqa", help="the easy-vqa PyPI dataset (shipped multimodal example)")
    e.add_argument("out", help="target dataset directory")
    e.add_argument("--split", choices=("train", "test"), default="train")
    _chat_opts(e)
    _image_opts(e)
    _common(e, tokenizer_required=False)
    e.set_defaults(func=run)

    g = kinds.add_parser("megatron", help="Megatron-LM / Megatron-Core PREFIX.bin + PREFIX.idx -> dataset")
    g.add_argument("prefix", help="input prefix (reads PREFIX.bin and PREFIX.idx)")
    g.add_argument("-o", "--out", required=True, help="target dataset directory")
    g.add_argument("--vocab-size", type=int, required=True,
                   help="vocabulary size (Megatron files do not record it; ids >= it are refused)")
    _tokenizer_name(g, default="unknown; Megatron files record no tokenizer, and no hash is recorded: such stores "
                          "mix only with stores of the same name and no hash")
    g.add_argument("--overwrite", action="store_true", help="replace an existing dataset at OUT (atomically)")
    _engine(g)
    g.set_defaults(func=run_megatron)


def run_megatron(args: argparse.Namespace) -> int:
    from .. import open as packfmt_open  # a Ray build writes a collection
    from ..megatron import import_megatron
    from ..opening import open_dataset

    if args.vocab_size < 1:
        print("packfmt build megatron: error: --vocab-size must be >= 1", file=sys.stderr)
        return 2
    from ..storage import download_inputs, is_remote, remote_output

    tok = {"name": args.tokenizer_name, "hash": None} if args.tokenizer_name else None
    if args.engine == "ray":
        try:
            from ..ray.megatron import run_ray_megatron
        except ImportError:
            print("packfmt build: error: --engine ray needs Ray Data: pip install 'packfmt[ray]'", file=sys.stderr)
            return 2
        extra = {} if args.records_per_member is None else {"records_per_member": args.records_per_member}
        out = run_ray_megatron(args.prefix, args.out, vocab_size=args.vocab_size, tokenizer=tok,
                               overwrite=args.overwrite, ray_address=args.ray_address, **extra)
        coll = packfmt_open(out)
        print(f"wrote {coll.num_documents:,} documents, {coll.num_tokens:,} tokens ({coll.token_dtype}) to {out} "
              f"(a collection of {len(coll.members)} member stores)")
        return 0
    if args.ray_address is not None or args.records_per_member is not None:
        print("packfmt build: error: --ray-address and --records-per-member need --engine ray", file=sys.stderr)
        return 2
    (bin_, _), tmp = download_inputs([args.prefix + ".bin", args.prefix + ".idx"])
    try:
        prefix = bin_[:-len(".bin")]
        if is_remote(args.out):
            with remote_output(args.out, overwrite=args.overwrite) as local:
                import_megatron(prefix, local, vocab_size=args.vocab_size, tokenizer=tok)
            out = args.out
        else:
            out = import_megatron(prefix, args.out, vocab_size=args.vocab_size, tokenizer=tok, overwrite=args.overwrite)
    finally:
        if tmp is not None:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    store = open_dataset(out)
    print(f"wrote {store.num_documents:,} documents, {store.num_tokens:,} tokens ({store.manifest.token_dtype}) to {out}")
    return 0


def _image_rule(args) -> dict:
    """Image keyword arguments of build_multimodal / build_easy_vqa (SystemExit on a bad value)."""
    if args.image_max_side is not None and args.image_max_side < 1:
        raise SystemExit(f"packfmt build: error: --image-max-side: expected >= 1, found {args.image_max_side}")
    if args.patch_size < 1 or args.merge < 1:
        raise SystemExit(f"packfmt build: error: --patch-size and --merge must be >= 1, found {args.patch_size}, {args.merge}")
    if not 1 <= args.jpeg_quality <= 100:
        raise SystemExit(f"packfmt build: error: --jpeg-quality: expected 1-100, found {args.jpeg_quality}")
    enc = {"image_max_side": args.image_max_side, "image_encoding": args.image_encoding, "jpeg_quality": args.jpeg_quality}
    if args.image_tokens == "dynamic":
        return {"image_tokens": "dynamic", "patch_size": args.patch_size, "merge": args.merge, **enc}
    try:
        k = int(args.image_tokens)
    except ValueError:
        raise SystemExit(f"packfmt build: error: --image-tokens: expected an integer or 'dynamic', found {args.image_tokens!r}")
    if k < 1:
        raise SystemExit(f"packfmt build: error: --image-tokens: expected >= 1 or 'dynamic', found {k}")
    return {"image_tokens": k, **enc}


def _unescape(template: str | None) -> str | None:
    """``\\n`` and ``\\t`` typed on a command line mean newline and tab in --template."""
    return None if template is None else template.replace("\\n", "\n").replace("\\t", "\t")


def _read_template(path: str | None) -> str | None:
    return None if path is None else Path(path).read_text(encoding="utf-8")


def run(args: argparse.Namespace) -> int:
    from .. import build as B

    if args.workers < 1 or args.batch_size < 1:
        print("packfmt build: error: --workers and --batch-size must be >= 1", file=sys.stderr)
        return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from ..storage import download_inputs

    # URLs fetched to a temp dir (object storage; packfmt.storage) for a local build (a folder of images in
    # one concurrent copy); with --engine ray the actors read the inputs by ranges (packfmt.ray.units) and
    # each image under a remote --image-root themselves (sources.multimodal): nothing is fetched here
    ray_reads = getattr(args, "engine", "local") == "ray"
    inputs = [] if ray_reads else list(getattr(args, "inputs", []))
    remote = inputs + ([args.image_root] if getattr(args, "image_root", None) and not ray_reads else [])
    local, tmp = download_inputs(remote)
    try:
        if inputs:
            args.inputs = local[:len(inputs)]
        if len(local) > len(inputs):  # the --image-root fetched above
            args.image_root = local[-1]
        return _run(args, B)
    finally:
        if tmp is not None:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


def _run(args: argparse.Namespace, B) -> int:
    common = dict(on_error=args.on_error, workers=args.workers, batch_size=args.batch_size, overwrite=args.overwrite,
                  progress=args.progress and sys.stderr.isatty(), vocab_size=args.vocab_size, limit=args.limit,
                  skip_log=args.skip_log, tokenizer_name=args.tokenizer_name)
    engine = getattr(args, "engine", "local")
    if engine == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            print("packfmt build: error: --engine ray needs Ray Data: pip install 'packfmt[ray]'", file=sys.stderr)
            return 2
        if args.limit is not None:
            print("packfmt build: error: --limit is not supported with --engine ray", file=sys.stderr)
            return 2
        del common["limit"]
        common.update(engine="ray", ray_address=args.ray_address)
        if args.records_per_member is not None:
            if args.records_per_member < 1:
                print("packfmt build: error: --records-per-member must be >= 1", file=sys.stderr)
                return 2
            common["records_per_member"] = args.records_per_member
    elif getattr(args, "ray_address", None) is not None or getattr(args, "records_per_member", None) is not None:
        print("packfmt build: error: --ray-address and --records-per-member need --engine ray", file=sys.stderr)
        return 2
    try:
        if args.kind == "text":
            result = B.build_text(args.inputs, args.out, args.tokenizer, field=args.field, template=_unescape(args.template),
                                  fmt=args.fmt, add_bos=args.add_bos, add_eos=args.add_eos, split=args.split,
                                  glob=args.glob, **common)
        elif args.kind == "chat":
            result = B.build_chat(args.inputs, args.out, args.tokenizer, fmt=args.fmt, split=args.split,
                                  chat_template=_read_template(args.chat_template), train_on=args.train_on,
                                  reasoning=args.reasoning, **common)
        elif args.kind == "llava":
            result = B.build_multimodal(args.inputs, args.out, args.tokenizer, image_root=args.image_root, fmt=args.fmt,
                                        split=args.split, chat_template=_read_template(args.chat_template),
                                        train_on=args.train_on, reasoning=args.reasoning, image_token=args.image_token,
                                        max_pixels=args.max_pixels, **_image_rule(args), **common)
        else:
            result = B.build_easy_vqa(args.out, args.tokenizer, split=args.split,
                                      chat_template=_read_template(args.chat_template), train_on=args.train_on,
                                      image_token=args.image_token, max_pixels=args.max_pixels, **_image_rule(args),
                                      **common)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    print_report(result, as_json=args.json, skip_log=args.skip_log)
    return 0


def print_report(result, *, as_json: bool = False, skip_log: str | None = None) -> None:
    r = result.report
    if as_json:
        print(json.dumps({"path": str(result.path), "build_report": r}, indent=2))
        return
    skipped = sum(r["skipped"].values())
    print(f"wrote {result.path}")
    for source in r.get("sources", []):
        if "split" in source:
            print(f"  read split {source['split']!r} of {source['path']} (pick another with --split)")
    print(f"  {r['records_read']:,} records read = {r['documents_written']:,} written + {skipped:,} skipped")
    examples: dict[str, list] = {}
    for ex in r.get("skipped_examples", []):
        examples.setdefault(ex["reason"], []).append(ex)
    for reason, n in r["skipped"].items():
        shown = examples.get(reason, [])
        print(f"    skipped {n:,} x {reason}" + (", e.g.:" if shown else ""))
        for ex in shown:
            print(f"      {shown_message(ex, result.path)}")  # the report names it from the dataset (A15)
        if n > len(shown):
            print(f"      ... {n - len(shown):,} more" + (f" (every one is in {skip_log})" if skip_log else
                                                             " (pass --skip-log FILE to list every one)"))
    print(f"  {r['tokens']:,} tokens" + (f", {r['images']:,} images" if r.get("images") else "")
          + f" in {r['seconds']:.2f} s ({r['tokens_per_second']:,.0f} tokens/s, {r['workers']} worker(s))")
    if r.get("engine") == "ray":
        ray = r["ray"]
        print(f"  ray: {ray['units']} work units, {ray['actor_pool']} tokenizer actor(s) on {ray['cluster_cpus']:g} CPUs; "
              f"a collection: read it with packfmt.open, or `packfmt merge --physical {result.path} -o STORE`")
    print(f"  tokenizer {r['tokenizer']['name']} ({r['tokenizer']['class']}, {r['tokenizer']['hash'][:19]}...)")
