"""A converter that raises on a record: the record found and named, its error a skip or a build error, never a dead
worker.

A build encodes records a batch at a time (``converter.encode(payloads)``: one call into the tokenizer). When that
call raises (a tokenizer's bug on some text, a chat template's ``raise_exception``, ``sys.exit`` in user code), the
batch does not say which record it was. ``encode_batch`` then encodes each record of the batch alone: a record that
raises again, alone, fails the same way every time (deterministic: retrying it in a fresh worker would fail again),
and becomes a failure of that record, reason ``encode_error``, with the exception's type and message; the other
records of the batch are encoded. The pipeline then applies the error policy to it like to any bad record
(``fail``: an ``InputError`` naming the file, the line, the batch and the exception; ``skip``: counted under
``encode_error``). The same function runs in this process (``workers=1``) and in each worker, so both report a
record the same way.

``SystemExit`` raised while encoding (code that calls ``sys.exit``) is such a failure too: the build does not end,
and a worker does not exit (which read as a worker dying, retried, then "lower --workers"). ``KeyboardInterrupt``
is one inside a worker only, which ignores SIGINT (the parent handles Ctrl-C), so that one can only come from the
encoding code; in this process it is the user's Ctrl-C and stops the build.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ENCODE_ERROR", "encode_batch", "encode_error_message"]

#: The skip reason of a record the converter raises on (alone too).
ENCODE_ERROR = "encode_error"


def _raised(exc: BaseException) -> str:
    """The exception as one line: its type and the first line of its message (what ``sys.exit`` was given)."""
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}): the encoding code called sys.exit()"
    if type(exc) is KeyboardInterrupt:
        return "KeyboardInterrupt raised by the encoding code (a worker ignores Ctrl-C: it was no interrupt)"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def encode_batch(converter, payloads: list, *, in_worker: bool = False) -> list:
    """``converter.encode(payloads)``; when it raises, each payload encoded alone, one that raises again becoming the
    failure ``(ENCODE_ERROR, "Type: message")`` in its place. ``in_worker``: a ``KeyboardInterrupt`` is the code's too
    (a worker ignores SIGINT); in this process it propagates (Ctrl-C)."""
    faults: tuple = (Exception, SystemExit, KeyboardInterrupt) if in_worker else (Exception, SystemExit)
    try:
        return converter.encode(payloads)
    except faults:
        pass
    out: list[Any] = []
    for payload in payloads:  # which record: each alone (a failure that repeats is the record's, not chance's)
        try:
            out.extend(converter.encode([payload]))
        except faults as exc:
            out.append((ENCODE_ERROR, _raised(exc)))
    return out


def encode_error_message(raised: str, batch: str) -> str:
    """The message of a record that failed with ``raised`` (``encode_batch``'s) in the batch of records ``batch``
    (``file:first-last``); the pipeline prefixes the record's ``file:line``."""
    return (f"{raised} (raised while encoding the batch of records {batch}, and again when this record was "
            "encoded alone: the record fails every time, so it is not retried)")
