"""Train the byte-level BPE tokenizer shipped in ``packfmt/sample_data/tokenizer/``.

How the sample tokenizer was made (reproducible, offline)::

    .venv/bin/python tools/train_tokenizer.py --out packfmt/sample_data/tokenizer --sample-data packfmt/sample_data

It trains a byte-level BPE (vocab 8,192) with the ``tokenizers`` library on local real text:
the Python standard library's own ``.py`` sources (files that are not valid UTF-8 are
skipped). Special tokens come first, so their ids are fixed::

    0 <s>   1 </s>   2 <pad>   3 <image>   4 <|im_start|>   5 <|im_end|>

The post-processor adds ``<s>`` ... ``</s>`` around a single text (pretraining documents get BOS
and EOS by the tokenizer's own config); the chat template (ChatML) adds ``<s>`` itself and is
rendered without special tokens.

``--sample-data DIR`` also writes the bundled sample data: ``text.jsonl`` (``{"title", "text"}``:
the module docstrings of the standard library, real English prose) and ``chat.jsonl``
(``{"messages": [...]}``: two-turn questions about those modules answered from the docstrings).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

SPECIALS = ["<s>", "</s>", "<pad>", "<image>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def iter_texts(root: Path, max_bytes: int):
    """Yield the UTF-8 text of ``*.py`` files under ``root`` (sorted), up to ``max_bytes`` in total."""
    total = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts or "tests" in path.parts:
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # some stdlib files are deliberately not UTF-8
        total += len(text)
        yield text
        if total >= max_bytes:
            return


def train(out: Path, source: Path, vocab_size: int, max_bytes: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(iter_texts(source, max_bytes), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 1)])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"), pretty=False)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
        "additional_special_tokens": ["<image>", "<|im_start|>", "<|im_end|>"],
        "model_max_length": 1_000_000,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def module_docs(root: Path, max_bytes: int) -> list[dict]:
    """``{"title", "text", "names"}`` for stdlib modules with a docstring of >= 300 characters (sorted)."""
    import ast

    docs, total = [], 0
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        doc = ast.get_docstring(tree)
        if not doc or len(doc) < 300:
            continue
        names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")]
        docs.append({"title": path.stem, "text": doc.strip(), "names": names[:12]})
        total += len(doc)
        if total >= max_bytes:
            break
    return docs


def write_sample_data(out: Path, source: Path, max_bytes: int = 90_000) -> None:
    """Write ``text.jsonl`` (module docstrings) and ``chat.jsonl`` (two-turn Q&A built from them)."""
    docs = module_docs(source, max_bytes)
    with open(out / "text.jsonl", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"title": d["title"], "text": d["text"]}, ensure_ascii=False) + "\n")
    with open(out / "chat.jsonl", "w", encoding="utf-8") as f:
        for d in docs[:60]:
            first = d["text"].split("\n\n")[0].strip()
            messages = [
                {"role": "system", "content": "You answer questions about the Python standard library."},
                {"role": "user", "content": f"What is the Python module `{d['title']}` for?"},
                {"role": "assistant", "content": first},
            ]
            if d["names"]:
                messages += [
                    {"role": "user", "content": "Which public functions or classes does it define?"},
                    {"role": "assistant", "content": ", ".join(f"`{n}`" for n in d["names"]) + "."},
                ]
            f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("packfmt/sample_data/tokenizer"))
    p.add_argument("--source", type=Path, default=Path(os.path.dirname(os.__file__)),
                   help="folder of real text to train on (default: the Python stdlib)")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--max-bytes", type=int, default=20_000_000)
    p.add_argument("--sample-data", type=Path, help="also write text.jsonl and chat.jsonl (stdlib docstrings) here")
    args = p.parse_args(argv)
    train(args.out, args.source, args.vocab_size, args.max_bytes)
    if args.sample_data:
        write_sample_data(args.sample_data, args.source)
    print(f"wrote {args.out}/tokenizer.json and tokenizer_config.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
