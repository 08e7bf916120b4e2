"""Chat / SFT records as they come -> tokens + loss mask (the encoding is :mod:`packfmt.chat`).

Accepted shapes: OpenAI ``messages`` (role/content, with ``tool_calls``, ``tool_call_id``, ``name``
and ``reasoning_content`` / ``reasoning`` / ``thinking`` carried to the template), ShareGPT
``conversations`` (from/value; human/gpt/system/function_call/observation... mapped to roles; a
top-level ``system`` string becomes the first message), and content as a list of parts (text
parts joined; image parts become the image marker in multimodal builds).
"""

from __future__ import annotations

from ..errors import InputError
from ..chat import ChatEncoder
from ..tokenize import TokenizerSpec

#: ShareGPT / LLaVA speaker names -> chat roles.
ROLE_NAMES = {
    "system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
    "bot": "assistant", "model": "assistant", "function_call": "assistant", "tool": "tool", "function": "tool",
    "observation": "tool", "ipython": "tool", "tool_response": "tool",
}
#: Message fields handed to the template as they are (besides role and content).
PASSTHROUGH = ("tool_calls", "tool_call_id", "name")
#: Names datasets use for a message's reasoning; the template sees it as ``reasoning_content``.
REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")


def _content_text(content, where: str, image_marker: str | None) -> str:
    """A message's content as text: a string, or OpenAI parts (text parts; image parts -> marker)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                out.append(part["text"])
            elif kind in ("image", "image_url") and image_marker is not None:
                out.append(image_marker)
            elif kind in ("image", "image_url"):
                raise InputError(f"{where}: an image part in a text-only chat build", reason="image_in_chat",
                                 field=where, expected="text parts", found=kind,
                                 cli=f"{where}: an image part in a text-only chat build (build conversations with "
                                     "images with `packfmt build llava`)")
            else:
                raise InputError(f"{where}: unsupported content part {str(part)[:60]!r}", reason="invalid_messages",
                                 field=where, expected="text parts" + (" or image parts" if image_marker else ""),
                                 found=str(kind))
        return "".join(out)
    raise InputError(f"{where}: content is {type(content).__name__}", reason="invalid_messages", field=where,
                     expected="string or list of parts", found=type(content).__name__)


def normalize_messages(obj: dict, *, image_marker: str | None = None) -> list[dict]:
    """``[{"role", "content"}]`` from ``messages`` (role/content) or ``conversations`` (from/value).

    Raises InputError (``missing_field``, ``invalid_messages``) naming the bad message.
    """
    key = "messages" if "messages" in obj else "conversations" if "conversations" in obj else None
    if key is None:
        raise InputError("no 'messages' or 'conversations' field", reason="missing_field", field="messages",
                         expected="messages or conversations", found=f"keys {sorted(obj)[:8]}")
    raw = obj[key]
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{key}: expected a non-empty list", reason="invalid_messages", field=key,
                         expected="non-empty list", found=type(raw).__name__ if raw else "empty")
    out = []
    for i, msg in enumerate(raw):
        where = f"{key}[{i}]"
        if not isinstance(msg, dict):
            raise InputError(f"{where}: not an object", reason="invalid_messages", field=where, expected="object",
                             found=type(msg).__name__)
        role = msg.get("role", msg.get("from"))
        content = msg.get("content", msg.get("value"))
        if role not in ROLE_NAMES:
            raise InputError(f"{where}: unknown role {role!r}", reason="invalid_messages", field=f"{where}.role",
                             expected=f"one of {sorted(ROLE_NAMES)}", found=repr(role))
        role = ROLE_NAMES[role]
        tool_calls = msg.get("tool_calls")
        if content is None and tool_calls:  # an assistant turn that only calls tools
            content = ""
        norm = {"role": role, "content": _content_text(content, f"{where}.content", image_marker)}
        norm.update((k, msg[k]) for k in PASSTHROUGH if msg.get(k) is not None)
        reasoning = next((msg[k] for k in REASONING_FIELDS if msg.get(k)), None)
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise InputError(f"{where}: reasoning is {type(reasoning).__name__}", reason="invalid_messages",
                                 field=f"{where}.reasoning_content", expected="string", found=type(reasoning).__name__)
            norm["reasoning_content"] = reasoning
        out.append(norm)
    system = obj.get("system")
    if isinstance(system, str) and system and out[0]["role"] != "system":
        out.insert(0, {"role": "system", "content": system})
    return out


class ChatConverter:
    """Conversations -> ``(tokens, loss mask)`` documents (loss mask stored in the dataset).

    Args:
        spec: tokenizer (and optional chat template).
        train_on: ``"assistant"`` (every assistant turn), ``"last"`` (the last one) or ``"all"``.
        reasoning: ``"keep"`` or ``"drop"`` reasoning blocks from the loss (see :mod:`packfmt.chat`).
    """

    loss_mask = True
    columns = None

    def __init__(self, spec: TokenizerSpec, train_on: str = "assistant", reasoning: str = "keep") -> None:
        self.spec = spec
        self.train_on = train_on
        self.encoder = ChatEncoder(spec, train_on, reasoning)

    def prepare(self, obj: dict) -> list[dict]:
        messages = normalize_messages(obj)
        if self.train_on != "all" and not any(m["role"] == "assistant" for m in messages):
            raise InputError("no assistant message: nothing to train on", reason="no_assistant_turn",
                             field="messages", expected="an assistant message", found="none")
        return messages

    def encode(self, conversations: list[list[dict]]) -> list:
        out = []
        for res in self.encoder.encode_chat(conversations):
            if isinstance(res, InputError):
                out.append((res.reason, str(res)))
            else:
                out.append((res[0], res[1], []))
        return out
