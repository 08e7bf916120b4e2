"""Chat templates of current models (issue 13): ChatML, a Qwen3-like reasoning template (not
incremental), a Llama-3-like header template and {% generation %} templates, against real
transformers. For every assistant message the trained tokens decode to exactly that message as
the template renders it (plus its end marker); nothing from system/user/tool turns is trained;
train_on= and reasoning= do what they say; record shapes are accepted as they come.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

import packfmt
from packfmt import cli
from packfmt.build import build_chat
from packfmt.errors import InputError
from packfmt.tokenize import load_tokenizer

os.environ["HF_HUB_OFFLINE"] = "1"
SAMPLE_TOK = Path(packfmt.__file__).parent / "sample_data" / "tokenizer"

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
#: Qwen3's shape: the reasoning block is rendered only for assistant turns after the last user
#: query (always for the final one, empty if there is no reasoning), and inline <think> is split
#: out of earlier turns; tool calls follow the content; tool results come back as a user turn.
QWEN3_BODY = (
    "{%- set content = m.content %}{%- set reasoning = '' %}"
    "{%- if m.reasoning_content is defined and m.reasoning_content %}{%- set reasoning = m.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}"
    "{{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- content }}"
    "{%- if m.tool_calls %}{%- for call in m.tool_calls %}{%- if content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n' + call.function.name + ' ' + call.function.arguments + '\\n</tool_call>' }}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
)


def qwen3(generation: bool = False) -> str:
    body = "{% generation %}" + QWEN3_BODY + "{% endgeneration %}" if generation else QWEN3_BODY
    return (
        "{%- set ns = namespace(last_query=-1) %}"
        "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}"
        "{%- endfor %}{%- for m in messages %}"
        "{%- if m.role == 'system' or m.role == 'user' %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{%- elif m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}" + body +
        "{%- elif m.role == 'tool' %}"
        "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


LLAMA3 = (
    "{{- bos_token }}{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + (m.content | trim) + '<|eot_id|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
GEN_CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}{% generation %}"
              "{{ m['content'] }}<|im_end|>\n{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

CALL = {"type": "function", "function": {"name": "calc", "arguments": '{"x": "3+3"}'}}
RECORDS = [
    {"messages": [  # reasoning field, a tool-call-only turn, a tool result, a final answer with reasoning
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4.", "reasoning_content": "2 plus 2."},
        {"role": "user", "content": "And 3+3? Use the tool."},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "6"},
        {"role": "assistant", "content": "It is 6.", "reasoning_content": "The tool said 6."}]},
    {"messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}]},
    {"messages": [  # inline reasoning, as R1-style datasets hold it
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>\nsay hi back\n</think>\n\nHello!"},
        {"role": "user", "content": "bye"}, {"role": "assistant", "content": "<think>\nsay bye\n</think>\n\nGoodbye!"}]},
    {"messages": [  # the answer repeats the question; whitespace the Llama-3 template trims
        {"role": "user", "content": "ok"}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": " again "}, {"role": "assistant", "content": "  ok, again \n"}]},
]
THINK = re.compile(r"<think>(.*?)</think>\s*", re.S)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """The sample tokenizer plus the Llama-3 header tokens (special) and Qwen3's <think>/<tool_call>
    (added, not special), as those models have them."""
    tok = load_tokenizer(SAMPLE_TOK)
    tok.add_tokens(["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], special_tokens=True)
    tok.add_tokens(["<think>", "</think>", "<tool_call>", "</tool_call>"])
    out = tmp_path_factory.mktemp("tok")
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tok(tok_dir):
    return load_tokenizer(tok_dir)


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def same_runs(runs: list[list[str]], expected: list[list[str]]) -> bool:
    """Runs equal the expected texts, except that a message starting with whitespace may have the
    template's whitespace before it merged into its first token by the tokenizer (that token is
    trained, as transformers' generation mask trains it)."""
    def same(run: str, exp: str) -> bool:
        return run == exp or (exp[:1].isspace() and run.endswith(exp) and not run[:-len(exp)].strip())

    return len(runs) == len(expected) and all(
        len(r) == len(e) and all(map(same, r, e)) for r, e in zip(runs, expected))


def trained_runs(tok, path) -> list[list[str]]:
    """Per document, the decoded text of each run of trained tokens."""
    store = packfmt.open(path)
    out = []
    for i in range(len(store)):
        ids, mask = store.document(i), store.document_loss_mask(i).astype(np.int8)
        edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
        out.append([tok.decode(ids[b:e]) for b, e in zip(edges[::2], edges[1::2])])
    return out


def expected_runs(template: str, messages: list[dict], *, reasoning: str = "keep", train_on: str = "assistant"):
    """What each assistant message renders as, written out per template shape (the oracle)."""
    last_query = max(i for i, m in enumerate(messages) if m["role"] == "user")
    out = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        content = m["content"]
        if template == "qwen3":
            thought = m.get("reasoning_content", "")
            if not thought and "</think>" in content:
                thought = content.split("</think>")[0].split("<think>")[-1].strip("\n")
                content = content.split("</think>")[-1].lstrip("\n")
            shown = i > last_query and (i == len(messages) - 1 or thought)
            think = f"<think>\n{thought.strip()}\n</think>\n\n" if shown and thought and reasoning == "keep" else ""
            calls = "".join(("\n" if content or j else "") + f"<tool_call>\n{c['function']['name']} "
                            f"{c['function']['arguments']}\n</tool_call>" for j, c in enumerate(m.get("tool_calls", [])))
            out.append(think + content + calls + "<|im_end|>\n")
        else:
            if reasoning == "drop":
                content = THINK.sub("", content)
            out.append(content.strip() + "<|eot_id|>" if template == "llama3" else content + "<|im_end|>\n")
    return out[-1:] if train_on == "last" else out


TEMPLATES = {"chatml": CHATML, "qwen3": qwen3(), "llama3": LLAMA3}


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("reasoning", ["keep", "drop"])
@pytest.mark.parametrize("train_on", ["assistant", "last"])
def test_trained_tokens_are_exactly_the_assistant_messages(tmp_path, tok_dir, tok, name, reasoning, train_on):
    src = write_jsonl(tmp_path / "c.jsonl", RECORDS)
    result = build_chat([src], tmp_path / "ds", tok_dir, chat_template=TEMPLATES[name], train_on=train_on,
                        reasoning=reasoning)
    assert result.report["skipped"] == {} and result.report["documents_written"] == len(RECORDS)
    assert result.report["settings"]["loss_mask_from"] == "located_turns"
    store = packfmt.open(result.path)
    for k, (record, runs) in enumerate(zip(RECORDS, trained_runs(tok, result.path), strict=True)):
        text = tok.apply_chat_template(record["messages"], chat_template=TEMPLATES[name], tokenize=False)
        assert store.document(k).tolist() == tok(text, add_special_tokens=False)["input_ids"]  # tokens untouched
        assert same_runs([runs], [expected_runs(name, record["messages"], reasoning=reasoning, train_on=train_on)])


def test_qwen3_template_is_not_incremental_and_every_multi_turn_record_builds(tmp_path, tok_dir, tok):
    messages = RECORDS[0]["messages"]
    whole = tok.apply_chat_template(messages, chat_template=qwen3(), tokenize=False)
    prefix = tok.apply_chat_template(messages[:3], chat_template=qwen3(), tokenize=False)
    assert not whole.startswith(prefix)  # the first answer's reasoning is shown only while it is the last turn
    multi = [r for r in RECORDS if sum(m["role"] == "assistant" for m in r["messages"]) > 1]
    result = build_chat([write_jsonl(tmp_path / "c.jsonl", multi)], tmp_path / "ds", tok_dir, chat_template=qwen3())
    assert result.report["documents_written"] == len(multi) and result.report["skipped"] == {}


def test_empty_reasoning_boilerplate_is_never_trained(tmp_path, tok_dir, tok):
    record = RECORDS[1]  # single turn without reasoning: Qwen3 renders <think>\n\n</think>\n\n before the answer
    result = build_chat([write_jsonl(tmp_path / "c.jsonl", [record])], tmp_path / "ds", tok_dir, chat_template=qwen3())
    store = packfmt.open(result.path)
    assert "<think>\n\n</think>\n\n" in tok.decode(store.document(0))
    assert trained_runs(tok, result.path) == [["Paris.<|im_end|>\n"]]


def test_train_on_all_trains_every_token(tmp_path, tok_dir):
    result = build_chat([write_jsonl(tmp_path / "c.jsonl", RECORDS)], tmp_path / "ds", tok_dir, chat_template=qwen3(),
                        train_on="all", reasoning="drop")
    store = packfmt.open(result.path)
    assert all(store.document_loss_mask(i).all() for i in range(len(store)))


def hf_mask(tok, messages, template):
    out = tok.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    return list(out["input_ids"]), np.asarray(out["assistant_masks"], dtype=np.uint8)


@pytest.mark.parametrize("name, template", [("chatml", GEN_CHATML), ("qwen3", qwen3(generation=True))])
def test_generation_template_mask_is_transformers_own(tmp_path, tok_dir, tok, name, template):
    result = build_chat([write_jsonl(tmp_path / "c.jsonl", RECORDS)], tmp_path / "ds", tok_dir, chat_template=template)
    assert result.report["settings"]["loss_mask_from"] == "generation_blocks"
    store = packfmt.open(result.path)
    for k, record in enumerate(RECORDS):
        ids, mask = hf_mask(tok, record["messages"], template)
        assert store.document(k).tolist() == ids
        ours = store.document_loss_mask(k).astype(bool)
        if name == "chatml":
            assert ours.tolist() == mask.astype(bool).tolist()
        else:  # transformers also trains the empty <think></think> boilerplate; packfmt never does
            assert not (ours & ~mask.astype(bool)).any()
            assert re.fullmatch(r"(<think>\s*</think>\s*)*", tok.decode(np.asarray(ids)[mask.astype(bool) & ~ours]))
    assert same_runs(trained_runs(tok, result.path), [expected_runs(name, r["messages"]) for r in RECORDS])


def test_generation_template_options(tmp_path, tok_dir, tok):
    src = write_jsonl(tmp_path / "c.jsonl", RECORDS)
    for train_on, reasoning in (("last", "keep"), ("assistant", "drop"), ("last", "drop")):
        result = build_chat([src], tmp_path / f"{train_on}-{reasoning}", tok_dir, chat_template=qwen3(generation=True),
                            train_on=train_on, reasoning=reasoning)
        assert same_runs(trained_runs(tok, result.path), [expected_runs("qwen3", r["messages"], reasoning=reasoning,
                                                                        train_on=train_on) for r in RECORDS])


def test_record_shapes_as_they_come(tmp_path, tok_dir):
    """ShareGPT from/value (with a top-level system and tool roles) and content as a list of parts build
    the same bytes as plain messages."""
    names = {"user": "human", "assistant": "gpt", "tool": "observation"}
    plain, sharegpt, parts = [], [], []
    for r in RECORDS[1:]:
        msgs = [m for m in r["messages"] if "tool_calls" not in m]
        plain.append({"messages": [{"role": "system", "content": "Be brief."}, *msgs]})
        sharegpt.append({"system": "Be brief.", "conversations": [{"from": names[m["role"]], "value": m["content"]}
                                                                  for m in msgs]})
        parts.append({"messages": [{"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text",
                                                                                                 "text": "brief."}]},
                                   *({"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
                                     for m in msgs)]})
    built = [build_chat([write_jsonl(tmp_path / f"{k}.jsonl", recs)], tmp_path / f"ds{k}", tok_dir,
                        chat_template=qwen3()) for k, recs in enumerate((plain, sharegpt, parts))]
    for name in ("tokens.bin", "loss_mask.bin", "doc_offsets.bin"):
        assert len({(b.path / name).read_bytes() for b in built}) == 1


def test_image_parts_in_a_text_chat_build_are_counted_skips(tmp_path, tok_dir):
    image = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
                          {"role": "assistant", "content": "A cat."}]}
    src = write_jsonl(tmp_path / "c.jsonl", [RECORDS[1], image])
    result = build_chat([src], tmp_path / "ds", tok_dir, on_error="skip")
    assert result.report["skipped"] == {"image_in_chat": 1} and result.report["documents_written"] == 1
    with pytest.raises(InputError, match="image part"):
        build_chat([src], tmp_path / "ds2", tok_dir)


def test_bad_option_values_name_the_choices(tmp_path, tok_dir):
    src = write_jsonl(tmp_path / "c.jsonl", RECORDS[:1])
    with pytest.raises(InputError, match="'assistant', 'last', 'all'"):
        build_chat([src], tmp_path / "ds", tok_dir, train_on="final")
    with pytest.raises(InputError, match="'keep', 'drop'"):
        build_chat([src], tmp_path / "ds", tok_dir, reasoning="hide")


def test_cli_train_on_last_and_reasoning_drop(tmp_path, tok_dir, tok, capsys):
    src = write_jsonl(tmp_path / "c.jsonl", RECORDS)
    (tmp_path / "qwen3.jinja").write_text(qwen3(), encoding="utf-8")
    out = tmp_path / "ds"
    code = cli.main(["build", "chat", str(src), "-o", str(out), "--tokenizer", str(tok_dir), "--chat-template",
                     str(tmp_path / "qwen3.jinja"), "--train-on", "last", "--reasoning", "drop", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    settings = packfmt.open(out).manifest.raw["build_report"]["settings"]
    assert settings["train_on"] == "last" and settings["reasoning"] == "drop"
    assert same_runs(trained_runs(tok, out), [expected_runs("qwen3", r["messages"], reasoning="drop", train_on="last")
                                              for r in RECORDS])


def test_generation_prompt_that_opens_the_reasoning(tmp_path, tok_dir, tok):
    """DeepSeek-R1's shape: the generation prompt ends in <think>\\n, earlier turns lose their reasoning;
    the reasoning block then belongs to the turn (kept or dropped like any other)."""
    template = ("{% for m in messages %}{% if m.role == 'user' %}<|im_start|>User: {{ m.content }}"
                "{% else %}<|im_start|>Assistant: {% set c = m.content %}{% if not loop.last %}"
                "{% set c = c.split('</think>')[-1] %}{% endif %}{{ c }}<|im_end|>{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>Assistant: <think>\n{% endif %}")
    record = RECORDS[2]
    src = write_jsonl(tmp_path / "c.jsonl", [record])
    for reasoning, last in (("keep", "<think>\nsay bye\n</think>\n\nGoodbye!<|im_end|>"), ("drop", "Goodbye!<|im_end|>")):
        result = build_chat([src], tmp_path / reasoning, tok_dir, chat_template=template, reasoning=reasoning)
        assert same_runs(trained_runs(tok, result.path), [["\n\nHello!<|im_end|>", last]])


def test_llava_build_takes_the_chat_mask_options(tmp_path):
    """build llava trains on the last assistant turn only when asked (--train-on last), as build chat does."""
    import io

    from PIL import Image

    from packfmt.build import build_multimodal

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (255, 0, 0)).save(buf, format="PNG")
    (tmp_path / "img.png").write_bytes(buf.getvalue())
    record = {"image": "img.png", "conversations": [
        {"from": "human", "value": "<image>\nwhat?"}, {"from": "gpt", "value": "red"},
        {"from": "human", "value": "sure?"}, {"from": "gpt", "value": "yes"}]}
    src = tmp_path / "mm.json"
    src.write_text(json.dumps([record]))
    masks = {}
    for train_on in ("assistant", "last"):
        result = build_multimodal([src], tmp_path / train_on, SAMPLE_TOK, image_root=tmp_path,
                                  image_tokens=2, train_on=train_on)
        store = packfmt.open(result.path)
        masks[train_on] = store.document_loss_mask(0).astype(bool)
        assert result.report["settings"]["train_on"] == train_on
    tok = load_tokenizer(SAMPLE_TOK)
    ids = packfmt.open(tmp_path / "last").document(0)
    assert masks["last"].sum() < masks["assistant"].sum()
    assert "yes" in tok.decode(ids[masks["last"]]) and "red" not in tok.decode(ids[masks["last"]])
    assert "red" in tok.decode(ids[masks["assistant"]])
