"""Tokenizers for ``packfmt build``: local loading, identity hash, BOS/EOS policy (chat rendering: ``chat``).

Only local tokenizers are accepted (a directory saved with ``save_pretrained`` or a single
``tokenizer.json``); ``HF_HUB_OFFLINE=1`` is set before transformers is imported, so nothing is
ever downloaded. A text encoder reads a generic fast tokenizer with the ``tokenizers`` library
alone (``fast_tokenizer``: no transformers, hence no torch, imported); chat encoders and every
other tokenizer go through transformers. Every object here is cheap to describe with a picklable
:class:`TokenizerSpec`, which a worker process turns back into the tokenizer once (``TextEncoder(spec)``).
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import PackfmtError

__all__ = [
    "TOKENIZER_FILE_NAMES",
    "TokenizerSpec",
    "TextEncoder",
    "tokenizer_files",
    "tokenizer_hash",
    "load_tokenizer",
]

#: The files that make up a tokenizer directory (the identity hash covers exactly these, when present).
TOKENIZER_FILE_NAMES = (
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "merges.txt",
    "special_tokens_map.json",
    "spiece.model",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
)


class TokenizerError(PackfmtError):
    """The tokenizer cannot be found, loaded, or lacks something the build needs."""


def tokenizer_files(path: str | os.PathLike) -> list[tuple[str, Path]]:
    """The tokenizer's files as ``(relative name, path)``, sorted by relative name (bytewise).

    A directory contributes those of its files named in ``TOKENIZER_FILE_NAMES`` (plus
    ``additional_chat_templates/*.jinja``); a single file contributes itself under its base name.
    """
    p = Path(path)
    if p.is_file():
        return [(p.name, p)]
    if not p.is_dir():
        raise TokenizerError(f"{p}: tokenizer not found (expected a local directory or a tokenizer.json file)",
                             file=str(p), expected="directory or tokenizer.json", found="missing")
    found = [(name, p / name) for name in TOKENIZER_FILE_NAMES if (p / name).is_file()]
    extra = p / "additional_chat_templates"
    if extra.is_dir():
        found += [(f"additional_chat_templates/{f.name}", f) for f in extra.glob("*.jinja") if f.is_file()]
    if not found:
        raise TokenizerError(f"{p}: no tokenizer files (expected one of {list(TOKENIZER_FILE_NAMES)})",
                             file=str(p), expected="tokenizer files", found="none")
    return sorted(found, key=lambda item: item[0].encode("utf-8"))


def tokenizer_hash(path: str | os.PathLike) -> str:
    """``"sha256:<hex>"`` identity of a tokenizer's files (spec: tokenizer identity hash).

    sha256 over the files sorted by relative path (UTF-8 bytes, ``/`` separators); for each file:
    the relative path's UTF-8 bytes, one NUL byte, the file length as 8-byte little-endian
    unsigned integer, then the file's bytes.
    """
    h = hashlib.sha256()
    for name, file in tokenizer_files(path):
        data = file.read_bytes()
        h.update(name.encode("utf-8"))
        h.update(b"\0")
        h.update(struct.pack("<Q", len(data)))
        h.update(data)
    return "sha256:" + h.hexdigest()


def load_tokenizer(path: str | os.PathLike):
    """Load a local fast tokenizer with transformers, offline. Returns the transformers tokenizer."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    p = Path(path)
    tokenizer_files(p)  # raises a clear error if nothing is there
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        if p.is_file():
            tok = PreTrainedTokenizerFast(tokenizer_file=str(p))
        else:
            tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as exc:  # transformers raises many types
        raise TokenizerError(f"{p}: cannot load tokenizer ({type(exc).__name__}: {exc})", file=str(p),
                             expected="a local Hugging Face tokenizer", found=type(exc).__name__) from None
    if getattr(tok, "backend_tokenizer", None) is None:
        raise TokenizerError(f"{p}: {type(tok).__name__} is not a fast tokenizer (need tokenizer.json)",
                             file=str(p), expected="fast tokenizer", found=type(tok).__name__)
    return tok


@dataclass(frozen=True)
class TokenizerSpec:
    """Everything a worker needs to rebuild the encoder (picklable).

    Attributes:
        path: tokenizer directory or tokenizer.json.
        add_bos, add_eos: ``None`` = the tokenizer's own post-processor decides (its config);
            a bool given for either one switches to explicit mode: encode without special tokens,
            then prepend BOS / append EOS as asked (the one left ``None`` follows what the
            tokenizer itself adds).
        chat_template: a Jinja template string overriding the tokenizer's (chat builds).
        image_token: the marker string that stands for one image (multimodal builds).
        name: the manifest's ``tokenizer.name``; None: the base name of ``path`` (informative: stores mix when
            their tokenizer hashes agree, whatever their names, spec/COLLECTION.md §2.3).
    """

    path: str
    add_bos: bool | None = None
    add_eos: bool | None = None
    chat_template: str | None = None
    image_token: str | None = "<image>"
    name: str | None = None


def _id_of(tok, *names: str) -> int | None:
    for name in names:
        value = getattr(tok, f"{name}_token_id", None)
        if isinstance(value, int):
            return value
    return None


class TextEncoder:
    """Batched text encoding with a fixed BOS/EOS policy.

    Attributes:
        tokenizer: the transformers tokenizer, or a ``fast_tokenizer.PlainTokenizer`` (the same ids without
            transformers) when ``needs_transformers`` is false and transformers would load it unchanged.
        vocab_size: ``len(tokenizer)``, the full id space including added tokens.
        bos_id, eos_id, pad_id: special ids (BOS falls back to CLS, EOS to SEP), or None.
    """

    #: Whether this encoder calls transformers itself (a chat template does): then it always loads through it.
    needs_transformers = False

    def __init__(self, spec: TokenizerSpec) -> None:
        self.spec = spec
        plain = None
        if not self.needs_transformers:
            tokenizer_files(spec.path)  # a clear error when nothing is there
            from .fast_tokenizer import plain_tokenizer

            plain = plain_tokenizer(spec.path)
        self.tokenizer = plain if plain is not None else load_tokenizer(spec.path)
        self.backend = self.tokenizer.backend_tokenizer
        # tokenizer.json may carry truncation/padding settings (e.g. max_length 128); a training
        # corpus wants every document whole and unpadded, as ``tokenizer(text)`` returns it.
        self.backend.no_truncation()
        self.backend.no_padding()
        self.vocab_size = len(self.tokenizer)
        self.bos_id = _id_of(self.tokenizer, "bos", "cls")
        self.eos_id = _id_of(self.tokenizer, "eos", "sep")
        self.pad_id = _id_of(self.tokenizer, "pad")
        self.explicit = spec.add_bos is not None or spec.add_eos is not None
        if self.explicit:
            own_bos, own_eos = self._own_policy()
            self.add_bos = own_bos if spec.add_bos is None else spec.add_bos
            self.add_eos = own_eos if spec.add_eos is None else spec.add_eos
            for flag, value, tid in (("add_bos", self.add_bos, self.bos_id), ("add_eos", self.add_eos, self.eos_id)):
                if value and tid is None:
                    raise TokenizerError(f"{spec.path}: --{flag.replace('_', '-')} asked but the tokenizer has no "
                                         f"{flag[4:]} token", file=spec.path, field=f"{flag[4:]}_token",
                                         expected="a token id", found=None)
        else:
            self.add_bos, self.add_eos = self._own_policy()

    def _own_policy(self) -> tuple[bool, bool]:
        """Whether the tokenizer's own post-processor adds BOS / EOS (probed on one text)."""
        with_special = self.backend.encode("a", add_special_tokens=True).ids
        plain = self.backend.encode("a", add_special_tokens=False).ids
        extra_front = len(with_special) > len(plain) and with_special[0] == self.bos_id
        extra_back = len(with_special) > len(plain) and with_special[-1] == self.eos_id
        return bool(extra_front), bool(extra_back)

    @cached_property
    def identity(self) -> dict:
        """The manifest's ``tokenizer`` object: name (``spec.name``, else the base name of the path given), hash,
        class (no path: it would name a file on this host, which the manifest must not hold, spec §2.2 and §5.3)."""
        p = Path(self.spec.path)
        name = getattr(self.tokenizer, "name_or_path", "") or p.name
        cls = getattr(self.tokenizer, "class_name", None) or type(self.tokenizer).__name__
        return {"name": self.spec.name or Path(name).name or p.name, "hash": tokenizer_hash(p), "class": cls}

    @property
    def special_tokens(self) -> dict:
        image_id = self.token_id(self.spec.image_token) if self.spec.image_token else None
        return {"bos": self.bos_id, "eos": self.eos_id, "pad": self.pad_id, "image": image_id}

    def token_id(self, token: str) -> int | None:
        """The id of ``token`` if it is one token of the vocabulary, else None."""
        tid = self.backend.token_to_id(token)
        return tid if isinstance(tid, int) else None

    def encode_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (one batched call into the Rust tokenizer)."""
        if not self.explicit:
            return [e.ids for e in self.backend.encode_batch_fast(list(texts), add_special_tokens=True)]
        ids = [e.ids for e in self.backend.encode_batch_fast(list(texts), add_special_tokens=False)]
        if self.add_bos:
            ids = [[self.bos_id, *x] for x in ids]
        if self.add_eos:
            for x in ids:
                x.append(self.eos_id)
        return ids

    def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Encode a batch. Returns ``(tokens, offsets)``: int64 flat ids, and int64 ``(n+1,)``
        offsets so that text ``i`` has ``tokens[offsets[i]:offsets[i+1]]``."""
        ids = self.encode_ids(texts)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(offsets[-1]))
        return flat, offsets
