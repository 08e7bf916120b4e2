"""Chat encoding for ``packfmt build chat|llava``: render conversations with a chat template and
mark the trainable tokens (the loss mask)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .errors import InputError
from .tokenize import TextEncoder, TokenizerError, TokenizerSpec

__all__ = ["ChatEncoder"]


class ChatEncoder(TextEncoder):
    """Render conversations with a chat template and mark the trainable tokens.

    The loss mask is 1 on the tokens of each assistant message as the template renders it:
    from the end of the generation prompt (``render(messages[:i], add_generation_prompt=True)``)
    to the end of the message (``render(messages[:i+1])``), i.e. the content plus the template's
    end-of-turn text (e.g. ``<|im_end|>\\n``), never the role header. A token belongs to a span
    when its first character does. ``train_on="all"`` sets the mask to 1 everywhere.
    """

    def __init__(self, spec: TokenizerSpec, train_on: str = "assistant") -> None:
        super().__init__(spec)
        if train_on not in ("assistant", "all"):
            raise ValueError(f"train_on: expected 'assistant' or 'all', found {train_on!r}")
        self.train_on = train_on
        self.template = spec.chat_template or getattr(self.tokenizer, "chat_template", None)
        if not self.template:
            raise TokenizerError(f"{spec.path}: the tokenizer has no chat template (pass chat_template=TEXT)",
                                 file=spec.path, field="chat_template", expected="a Jinja template", found=None,
                                 cli=f"{spec.path}: the tokenizer has no chat template (pass --chat-template FILE)")

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, chat_template=self.template,
                                                      add_generation_prompt=add_generation_prompt)
        except Exception as exc:  # jinja raises TemplateError, TypeError, ...
            raise InputError(f"chat template failed: {type(exc).__name__}: {exc}", reason="chat_template_error",
                             field="messages", expected="renderable messages", found=type(exc).__name__) from None

    def assistant_spans(self, messages: list[dict], text: str) -> list[tuple[int, int]]:
        """Character spans ``[begin, end)`` of the assistant messages inside ``text`` (the full render)."""
        spans = []
        for i, msg in enumerate(messages):
            if msg["role"] != "assistant":
                continue
            head = self.render(messages[:i], add_generation_prompt=True) if i else ""
            upto = self.render(messages[: i + 1])
            if not (text.startswith(upto) and upto.startswith(head)):
                raise InputError("the chat template does not render conversations incrementally (a prefix of the "
                                 "conversation renders differently), so assistant spans cannot be located",
                                 reason="chat_template_not_incremental", field=f"messages[{i}]",
                                 expected="prefix-stable rendering", found="different prefix")
            if len(upto) > len(head):
                spans.append((len(head), len(upto)))
        return spans

    def encode_chat(self, conversations: Sequence[list[dict]]) -> list[tuple[np.ndarray, np.ndarray] | InputError]:
        """Render and encode a batch of conversations. Each result is ``(ids int64, mask uint8)`` or the error."""
        texts, spans, results = [], [], []
        for messages in conversations:
            try:
                text = self.render(messages)
                spans.append(self.assistant_spans(messages, text) if self.train_on == "assistant" else None)
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
            span_list = next(span_iter)
            if span_list is None:
                mask = np.ones(ids.size, dtype=np.uint8)
            else:
                offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
                starts, ends = offsets[:, 0], offsets[:, 1]
                mask = np.zeros(ids.size, dtype=np.uint8)
                for begin, end in span_list:
                    mask[(starts < end) & (ends > begin)] = 1
            results[k] = (ids, mask)
        return results
