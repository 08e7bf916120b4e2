"""The error policy of a build: stop at a bad record (``fail``) or count and skip it (``skip``).

Every record read is either written or skipped for a reason, and the counts are exact
(``records_read = documents_written + sum(skipped)``). The build report keeps the first
``EXAMPLES_PER_REASON`` examples of each reason; ``skip_log`` receives every skipped record.

What a failure says depends on how many records failed. One bad record among good ones is a
bad record: the message suggests skipping such records. When every record read fails, skipping
would only produce an empty dataset: the input or the options are wrong, and the message says
which option to check for that reason (``field=`` / ``--field``, ``train_on=`` / ``--train-on``...).
Under ``fail`` the decision is taken at the end of the batch holding the first bad record, so a
whole batch (``batch_size`` records) is seen before judging.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .errors import InputError

__all__ = ["Tally", "EXAMPLES_PER_REASON", "reason_hint"]

#: How many skipped records of each reason the build report lists verbatim (all are counted).
EXAMPLES_PER_REASON = 3

_FORMAT = "the input is not what its name says (JSON Lines: one object per line; .json: one array of objects)"
#: reason -> (what to do, in API words; in CLI words) when every record fails for that reason.
_HINTS: dict[str, tuple[str, str]] = {
    "missing_field": ("name a field the records have with field= or template= (or use build_chat / "
                      "build_multimodal for conversations)",
                      "name a field the records have with --field or --template (or use `packfmt build chat` / "
                      "`packfmt build llava` for conversations)"),
    "not_a_string": ("field= names a field that is not text: pick the text field with field=, or combine fields "
                     "with template=", "--field names a field that is not text: pick the text field with --field, "
                     "or combine fields with --template"),
    "empty_text": ("the text is empty in every record: pick another field= or template=",
                   "the text is empty in every record: pick another --field or --template"),
    "malformed_json": (_FORMAT + ": pass fmt= if the name misleads", _FORMAT + ": pass --format if the name misleads"),
    "not_an_object": (_FORMAT + ": pass fmt= if the name misleads", _FORMAT + ": pass --format if the name misleads"),
    "token_out_of_range": ("vocab_size= is below the tokenizer's ids: leave it out to use len(tokenizer)",
                           "--vocab-size is below the tokenizer's ids: leave it out to use len(tokenizer)"),
    "invalid_messages": ("the records hold no messages/conversations lists: use build_text for plain text",
                         "the records hold no messages/conversations lists: use `packfmt build text` for plain text"),
    "no_assistant_turn": ("no record has an assistant turn: pass train_on='all' to train on every token",
                          "no record has an assistant turn: pass --train-on all to train on every token"),
    "chat_template_error": ("the chat template cannot render these messages: pass chat_template= with one that can",
                            "the chat template cannot render these messages: pass --chat-template FILE with one that can"),
    "chat_span_not_found": ("the chat template changes the assistant contents, so their turns cannot be located: "
                            "pass chat_template= with {% generation %} blocks, or train_on='all'",
                            "the chat template changes the assistant contents, so their turns cannot be located: "
                            "pass --chat-template FILE with {% generation %} blocks, or --train-on all"),
    "image_in_chat": ("the conversations hold images: build them with build_multimodal",
                      "the conversations hold images: build them with `packfmt build llava`"),
    "image_marker_mismatch": ("the text's image markers are not image_token=: pass the marker the data uses",
                              "the text's image markers are not --image-token: pass the marker the data uses"),
    "missing_image": ("the image paths do not resolve: pass image_root= the folder they are relative to",
                      "the image paths do not resolve: pass --image-root, the folder they are relative to"),
    "image_path_escapes_root": ("the image paths leave image_root=: pass the folder they are relative to",
                                "the image paths leave --image-root: pass the folder they are relative to"),
    "undecodable_text": ("the files are not UTF-8 text", "the files are not UTF-8 text"),
    "encode_error": ("the tokenizer (or the converter) raised on every record, each alone too: the message names the "
                     "exception; encode one record with the tokenizer to see it",
                     "the tokenizer (or the converter) raised on every record, each alone too: the message names the "
                     "exception; encode one record with the tokenizer to see it"),
    "truncated_shard": ("the tar shard is cut short (an interrupted copy or download?): copy it again",
                        "the tar shard is cut short (an interrupted copy or download?): copy it again"),
    "unreadable_shard": ("the file is not a tar shard, or is corrupt: write or copy it again",
                         "the file is not a tar shard, or is corrupt: write or copy it again"),
}
_DEFAULT_HINT = ("check the input files and the options", "check the input files and the options")


def reason_hint(reason: str) -> tuple[str, str]:
    """What to do when every record fails for ``reason``: ``(API words, CLI words)``."""
    return _HINTS.get(reason, _DEFAULT_HINT)


def _counts(skipped: Counter) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in skipped.most_common())


@dataclass
class Tally:
    """Counts of one build; ``bad`` records a bad record, ``end_batch`` applies ``fail``."""

    on_error: str
    skip_log: Any = None
    read: int = 0
    written: int = 0
    tokens: int = 0
    images: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: list = field(default_factory=list)
    _first: tuple | None = None  # (file, line, reason, message, cli message) of the first bad record

    def bad(self, file: str, line: int, reason: str, message: str, cli: str | None = None) -> None:
        """Count a bad record (under ``fail``, the build stops at the end of this batch)."""
        where = f"{file}:{line}"
        if not message.startswith(file):
            message = f"{where}: {message}"
            cli = None if cli is None else f"{where}: {cli}"
        if self._first is None:
            self._first = (file, line, reason, message, cli or message)
        self.skipped[reason] += 1
        if self.skipped[reason] <= EXAMPLES_PER_REASON:
            self.examples.append({"file": file, "line": line, "reason": reason, "message": message})
        if self.skip_log is not None and self.on_error == "skip":
            self.skip_log.write(json.dumps({"file": file, "line": line, "reason": reason, "message": message}) + "\n")

    def end_batch(self) -> None:
        """Under ``fail``: raise for the first bad record, once its batch has been seen whole."""
        if self.on_error != "fail" or self._first is None:
            return
        file, line, reason, message, cli = self._first
        if self.written == 0:
            raise self._all_failed(file, line, reason, f"{message} [reason: {reason}]", f"{cli} [reason: {reason}]",
                                   "read so far")
        raise InputError(f"{message} [reason: {reason}] (pass on_error='skip' to count and skip such records)",
                         reason=reason, file=file, line=line,
                         cli=f"{cli} [reason: {reason}] (use --on-error skip to count and skip such records)")

    def nothing_written(self, out: str, sources: list[dict]) -> InputError:
        """The error of a build that wrote no document: empty input, or every record skipped."""
        if self.read == 0:
            names = ", ".join(s["path"] for s in sources) or "the input"
            folder = any(s.get("format") == "text_dir" for s in sources)
            extra = (" (no file of the folder matches glob=)", " (no file of the folder matches --glob)") if folder else ("", "")
            return InputError(f"{names}: no records: the input is empty{extra[0]}", reason="nothing_written",
                              file=names, expected=">= 1 record", found=0, cli=f"{names}: no records: the input is "
                              f"empty{extra[1]}")
        file, line, reason, message, cli = self._first
        return self._all_failed(file, line, reason, f"no document was written to {out}: first {message}",
                                f"no document was written to {out}: first {cli}", "read", found=0)

    def _all_failed(self, file: str, line: int, reason: str, api: str, cli: str, when: str,
                    found: int | None = None) -> InputError:
        top = self.skipped.most_common(1)[0][0]
        api_hint, cli_hint = reason_hint(top)
        tail = f"; all {self.read} records {when} failed ({_counts(self.skipped)}), so skipping them would leave nothing: "
        return InputError(api + tail + api_hint, reason="nothing_written" if found == 0 else reason, file=file,
                          line=line, expected=">= 1 document" if found == 0 else None, found=found,
                          cli=cli + tail + cli_hint)
