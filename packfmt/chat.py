"""Chat encoding for ``packfmt build chat|llava``: render conversations with a chat template and
mark the trainable tokens (the loss mask).

Where the loss mask comes from:

- a template with ``{% generation %}`` blocks: transformers' own assistant mask
  (``apply_chat_template(..., return_assistant_tokens_mask=True, return_dict=True)``);
- any other template: each assistant turn is located in the one rendering of the whole
  conversation, so templates that render earlier turns differently once later turns follow
  (Qwen3's reasoning block, shown only for the last turn) work. A turn runs from the end of the
  template's assistant header to the end of its end-of-turn marker; both strings are learnt once
  per template from a probe conversation (the generation prompt is the header; the text that
  follows every assistant turn is the marker). The turn's content is searched in order between
  them, so tool-call text and reasoning blocks the template adds are part of the turn.

Options (API words; the CLI says ``--train-on``, ``--reasoning``): ``train_on="assistant"`` trains
every assistant turn, ``"last"`` only the last one, ``"all"`` every token. ``reasoning="keep"``
trains reasoning blocks (``<think>...</think>``) with their turn, ``"drop"`` leaves them out of
the loss; an empty block (the ``<think>\\n\\n</think>\\n\\n`` boilerplate) is never trained. Tokens
stay in the sequence either way: only the mask changes. System, user and tool turns are
rendered and never trained unless ``train_on="all"``.

A token is trained from the one holding a span's first character to the one holding its last
(transformers' rule), so a token the tokenizer merges across the header and an answer that starts
with whitespace is trained; an untrained reasoning range clears only the tokens wholly inside it.
"""

from __future__ import annotations

import os
import re
from typing import Sequence

import numpy as np

from .errors import InputError
from .tokenize import TextEncoder, TokenizerError, TokenizerSpec

__all__ = ["ChatEncoder", "TRAIN_ON", "REASONING", "REASONING_OPEN", "REASONING_CLOSE", "has_generation_blocks"]

TRAIN_ON = ("assistant", "last", "all")
REASONING = ("keep", "drop")
REASONING_OPEN, REASONING_CLOSE = "<think>", "</think>"
#: The pattern transformers itself uses to decide whether a template marks assistant text.
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
#: Probe contents: private-use characters no template adds and no tokenizer merges away.
_PROBES = ("\ue000packfmt-1\ue001", "\ue000packfmt-2\ue001")
_SPACE = " \t\r\n"


def has_generation_blocks(template: str) -> bool:
    """Whether ``template`` marks assistant text with ``{% generation %}`` (transformers' test)."""
    return bool(_GENERATION.search(template))


def _not_located(i: int, what: str) -> InputError:
    msg = (f"messages[{i}] (assistant): {what} in the rendered conversation, so its loss-mask span cannot be "
           "located (the chat template changes or drops it)")
    return InputError(f"{msg}: pass chat_template= with {{% generation %}} ... {{% endgeneration %}} around the "
                      "assistant text, or train_on='all'", reason="chat_span_not_found", field=f"messages[{i}]",
                      expected="the assistant content in the rendering", found="not located",
                      cli=f"{msg}: pass --chat-template FILE with {{% generation %}} ... {{% endgeneration %}} around "
                          "the assistant text, or --train-on all")


class ChatEncoder(TextEncoder):
    """Render conversations with a chat template and compute their loss masks (see the module doc).

    Args:
        spec: tokenizer; ``spec.chat_template`` overrides the tokenizer's own template.
        train_on: ``"assistant"``, ``"last"`` or ``"all"``.
        reasoning: ``"keep"`` or ``"drop"`` (reasoning blocks in the loss or not).

    Attributes:
        generation: the template has ``{% generation %}`` blocks (mask from transformers).
        header, end: the assistant header and end-of-turn marker learnt from the probe ("" if none).
    """

    needs_transformers = True  # apply_chat_template

    def __init__(self, spec: TokenizerSpec, train_on: str = "assistant", reasoning: str = "keep") -> None:
        super().__init__(spec)
        if train_on not in TRAIN_ON:
            raise ValueError(f"train_on: expected one of {TRAIN_ON}, found {train_on!r}")
        if reasoning not in REASONING:
            raise ValueError(f"reasoning: expected one of {REASONING}, found {reasoning!r}")
        self.train_on, self.reasoning = train_on, reasoning
        self.template = spec.chat_template or getattr(self.tokenizer, "chat_template", None)
        if not self.template:
            raise TokenizerError(f"{spec.path}: the tokenizer has no chat template (pass chat_template=TEXT)",
                                 file=spec.path, field="chat_template", expected="a Jinja template", found=None,
                                 cli=f"{spec.path}: the tokenizer has no chat template (pass --chat-template FILE)")
        self.generation = has_generation_blocks(self.template)
        self.header, self.end = ("", "") if self.generation else self._probe()

    # ------------------------------------------------------------------ rendering
    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, chat_template=self.template,
                                                      add_generation_prompt=add_generation_prompt)
        except Exception as exc:  # jinja raises TemplateError, TypeError, ...
            raise InputError(f"chat template failed: {type(exc).__name__}: {exc}", reason="chat_template_error",
                             field="messages", expected="renderable messages", found=type(exc).__name__) from None

    def _probe(self) -> tuple[str, str]:
        """``(assistant header, end-of-turn marker)`` of the template, from probe conversations
        (``""`` for what a template does not show or refuses to render: then less is located)."""
        user = {"role": "user", "content": "hi"}
        header = end = ""
        try:
            plain = self.render([user])
            prompted = self.render([user], add_generation_prompt=True)
            if prompted.startswith(plain):  # a prompt that opens the reasoning: the block belongs to the turn
                header = prompted[len(plain):].split(REASONING_OPEN)[0]
        except InputError:
            pass
        try:
            two = self.render([user, {"role": "assistant", "content": _PROBES[0]}, user,
                               {"role": "assistant", "content": _PROBES[1]}])
        except InputError:
            return header, end
        if all(p in two for p in _PROBES):
            end = os.path.commonprefix([two[two.index(p) + len(p):] for p in _PROBES]).split(_PROBES[1])[0]
        return header, end

    # ------------------------------------------------------------------ turn location
    def _content_at(self, msg: dict, text: str, begin: int) -> tuple[int, int]:
        """``(start, stop)`` of the assistant content as rendered after ``begin``, or ``(-1, -1)``."""
        content = msg.get("content") or ""
        candidates = [content, content.strip(_SPACE)]
        if REASONING_CLOSE in content:  # inline reasoning the template may strip from earlier turns
            candidates.append(content.split(REASONING_CLOSE)[-1].strip(_SPACE))
        for cand in candidates:
            at = text.find(cand, begin)
            if at >= 0 and not (self.header and text.find(self.header, begin, at) >= 0):
                return at, at + len(cand)
        return -1, -1

    def assistant_spans(self, messages: list[dict], text: str) -> list[tuple[int, int]]:
        """Character spans ``[begin, end)`` of the assistant turns inside ``text`` (the full render):
        the text after the assistant header up to the end of the end-of-turn marker."""
        spans: list[tuple[int, int]] = []
        cursor = 0
        for i, msg in enumerate(messages):
            content = msg.get("content") or ""
            if msg["role"] != "assistant":
                at = text.find(content, cursor) if content else -1
                limit = text.find(self.header, cursor) if self.header else -1
                if at >= 0 and (limit < 0 or at + len(content) <= limit):
                    cursor = at + len(content)
                continue
            begin = cursor
            if self.header:
                head = text.find(self.header, cursor)
                if head < 0:
                    raise _not_located(i, f"its header {self.header!r} is not found")
                begin = head + len(self.header)
            start, stop = self._content_at(msg, text, begin)
            if start < 0:
                raise _not_located(i, "its content is not found")
            if not self.header:
                begin = start
            if self.end:
                marker = text.find(self.end, stop)
                if marker < 0:
                    raise _not_located(i, f"its end-of-turn marker {self.end!r} is not found")
                stop = marker + len(self.end)
            spans.append((begin, stop))
            cursor = stop
        return spans

    def untrained_reasoning(self, text: str, spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Character ranges of the reasoning blocks inside ``spans`` that the loss leaves out: every
        block with ``reasoning="drop"``, else only the empty ones. A range covers the block and the
        newlines after it."""
        out = []
        for begin, end in spans:
            pos = text.find(REASONING_OPEN, begin, end)
            while pos >= 0:
                close = text.find(REASONING_CLOSE, pos, end)
                if close < 0:
                    break
                stop = close + len(REASONING_CLOSE)
                while stop < end and text[stop] in "\r\n":  # the template's separator, not the answer's spaces
                    stop += 1
                if self.reasoning == "drop" or not text[pos + len(REASONING_OPEN):close].strip(_SPACE):
                    out.append((pos, stop))
                pos = text.find(REASONING_OPEN, stop, end)
        return out

    # ------------------------------------------------------------------ masks
    def _generation_batch(self, conversations: list[list[dict]]) -> list:
        """``(ids, transformers' mask, offsets (n, 2))`` per conversation, or its InputError."""
        def call(batch):
            out = self.tokenizer.apply_chat_template(batch, chat_template=self.template, tokenize=True,
                                                     return_dict=True, return_assistant_tokens_mask=True,
                                                     tokenizer_kwargs={"return_offsets_mapping": True})
            return [(np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.uint8),
                     np.asarray(offsets, dtype=np.int64).reshape(-1, 2))
                    for ids, mask, offsets in zip(out["input_ids"], out["assistant_masks"], out["offset_mapping"])]
        try:
            return call(conversations)
        except Exception:  # find the conversation(s) at fault, one by one
            pass
        results = []
        for messages in conversations:
            try:
                results.extend(call([messages]))
            except Exception as exc:
                results.append(InputError(f"chat template failed: {type(exc).__name__}: {exc}",
                                          reason="chat_template_error", field="messages",
                                          expected="renderable messages", found=type(exc).__name__))
        return results

    def _may_reason(self, messages: list[dict]) -> bool:
        return REASONING_OPEN in self.template or any(
            REASONING_OPEN in (m.get("content") or "") or m.get("reasoning_content") for m in messages)

    def _generation_chat(self, conversations: list[list[dict]]) -> list:
        results = []
        for messages, res in zip(conversations, self._generation_batch(conversations)):
            if isinstance(res, InputError):
                results.append(res)
                continue
            ids, mask, offsets = res
            if self.train_on == "all":
                results.append((ids, np.ones(ids.size, dtype=np.uint8)))
                continue
            if self.train_on == "last" and mask.any():
                runs = np.flatnonzero(np.diff(np.concatenate([[0], mask])) == 1)
                mask[:runs[-1]] = 0
            if self._may_reason(messages):
                text = self.render(messages)
                self._unmask(mask, offsets, self.untrained_reasoning(text, [(0, len(text))]))
            results.append((ids, mask))
        return results

    @staticmethod
    def _unmask(mask: np.ndarray, offsets: np.ndarray, ranges: list[tuple[int, int]]) -> None:
        starts, ends = offsets[:, 0], offsets[:, 1]
        for begin, end in ranges:
            mask[(starts >= begin) & (ends <= end)] = 0

    def encode_chat(self, conversations: Sequence[list[dict]]) -> list[tuple[np.ndarray, np.ndarray] | InputError]:
        """Render and encode a batch of conversations. Each result is ``(ids int64, mask uint8)`` or the error."""
        conversations = list(conversations)
        if self.generation:
            return self._generation_chat(conversations)
        texts, spans, results = [], [], []
        for messages in conversations:
            try:
                text = self.render(messages)
                if self.train_on != "all":
                    found = self.assistant_spans(messages, text)
                    found = found[-1:] if self.train_on == "last" else found
                    spans.append((found, self.untrained_reasoning(text, found)))
                else:
                    spans.append(None)
                texts.append(text)
                results.append(None)
            except InputError as exc:
                results.append(exc)
        encodings = iter(self.backend.encode_batch(texts, add_special_tokens=False))
        span_iter = iter(spans)
        for k, res in enumerate(results):
            if res is not None:
                continue
            enc = next(encodings)
            ids = np.asarray(enc.ids, dtype=np.int64)
            located = next(span_iter)
            if located is None:
                results[k] = (ids, np.ones(ids.size, dtype=np.uint8))
                continue
            mask = np.zeros(ids.size, dtype=np.uint8)
            if not self._mark_by_chars(enc, mask, *located):  # a character in no token: the offsets decide
                offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
                starts, ends = offsets[:, 0], offsets[:, 1]
                mask[:] = 0
                for begin, end in located[0]:
                    mask[(starts < end) & (ends > begin)] = 1
                self._unmask(mask, offsets, located[1])
            results[k] = (ids, mask)
        return results

    @staticmethod
    def _mark_by_chars(enc, mask: np.ndarray, spans, untrained) -> bool:
        """Mark ``spans`` and clear ``untrained`` through ``char_to_token`` (transformers' rule: from the
        token holding a span's first character to the one holding its last; cheaper than every token's
        offsets). False when a boundary character is in no token."""
        for begin, end in spans:
            if end > begin:
                first, last = enc.char_to_token(begin), enc.char_to_token(end - 1)
                if first is None or last is None:
                    return False
                mask[first:last + 1] = 1
        for begin, end in untrained:  # only the tokens wholly inside
            first, last = enc.char_to_token(begin), enc.char_to_token(end - 1)
            if first is None or last is None:
                return False
            first += enc.token_to_chars(first)[0] < begin
            last -= enc.token_to_chars(last)[1] > end
            mask[first:last + 1] = 0
        return True
