"""A fast tokenizer loaded with the ``tokenizers`` library alone, when transformers would load it unchanged.

``packfmt build text`` needs a tokenizer's encoder, its vocabulary size and its BOS/EOS/PAD ids; importing
transformers for them also imports torch (transformers 5 imports it at ``import transformers``): about 8 s of a
60-record build here, most of it on a loaded machine. ``plain_tokenizer`` gives those from ``tokenizer.json`` and
``tokenizer_config.json`` directly, and only for a tokenizer transformers would itself take as it is: a generic
class (``PreTrainedTokenizerFast``/``TokenizersBackend``, or a lone ``tokenizer.json``), which transformers 5
loads by ``tokenizers.Tokenizer.from_file`` and then changes only in the cases refused here (``_special_ids``). Any
other tokenizer (a model class such as ``BertTokenizer``, whose ``__init__`` may rebuild the backend; config
flags that rewrite the post-processor; special tokens transformers would add) is loaded by transformers, as
before (``tokenize.load_tokenizer``). Chat templates always need transformers (``chat``).

``tests/test_build_text.py`` checks that both loaders agree (ids, vocabulary size, special ids, identity).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["PlainTokenizer", "plain_tokenizer", "GENERIC_CLASSES", "CLASS_NAME"]

#: ``tokenizer_class`` values transformers 5 loads by reading ``tokenizer.json`` as it is (``TokenizersBackend``).
GENERIC_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
#: What the manifest's informative ``tokenizer.class`` records for a tokenizer loaded here.
CLASS_NAME = "tokenizers.Tokenizer"
#: transformers' named special tokens (``SPECIAL_TOKENS_ATTRIBUTES``).
_NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: Config keys with which transformers changes the backend or the special tokens at load time.
_CHANGES = ("add_bos_token", "add_eos_token", "add_prefix_space", "split_special_tokens", "extra_special_tokens",
            "model_specific_special_tokens", "legacy", "from_slow")
#: transformers 5 may patch the pre-tokenizer of a tokenizer this large next to a Mistral ``config.json``.
_MISTRAL_CHECK_VOCAB = 100000


class PlainTokenizer:
    """What ``tokenize.TextEncoder`` reads of a transformers tokenizer, from the ``tokenizers`` library alone.

    Attributes:
        backend_tokenizer: the ``tokenizers.Tokenizer`` read from ``tokenizer.json``.
        name_or_path: the path as given (transformers' ``name_or_path`` of ``from_pretrained``), or "" for a lone
            ``tokenizer.json`` (as ``PreTrainedTokenizerFast(tokenizer_file=...)`` has).
        class_name: ``CLASS_NAME``.
        bos_token_id, eos_token_id, pad_token_id, cls_token_id, sep_token_id: ids of the config's special tokens, or None.
    """

    class_name = CLASS_NAME

    def __init__(self, backend, name_or_path: str, ids: dict[str, int | None]) -> None:
        self.backend_tokenizer = backend
        self.name_or_path = name_or_path
        for key in ("bos", "eos", "pad", "cls", "sep"):
            setattr(self, f"{key}_token_id", ids.get(f"{key}_token"))

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)


def plain_tokenizer(path: str) -> PlainTokenizer | None:
    """The tokenizer at ``path`` read without transformers, or None when transformers must load it (module doc)."""
    p = Path(path)
    file = p if p.is_file() else p / "tokenizer.json"
    if not file.is_file():
        return None
    config = {}
    if p.is_dir():
        if (p / "added_tokens.json").exists():
            return None
        try:
            config = json.loads((p / "tokenizer_config.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            config = {}
        except (OSError, ValueError):
            return None  # transformers reports what is wrong with it
        if not isinstance(config, dict) or ((p / "special_tokens_map.json").exists()
                                            and "added_tokens_decoder" not in config):
            return None  # a special_tokens_map.json transformers 5 merges in (legacy): not read here
    try:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(file))
    except Exception:
        return None  # transformers gives the error message users know
    ids = _special_ids(p, config, backend)
    if ids is None:
        return None
    return PlainTokenizer(backend, str(path) if p.is_dir() else "", ids)


def _special_ids(p: Path, config: dict, backend) -> dict[str, int | None] | None:
    """The special ids of a tokenizer transformers would load as it is, or None when it would change it."""
    if config.get("tokenizer_class", GENERIC_CLASSES[0]) not in GENERIC_CLASSES:
        return None  # a model class: its __init__ may rebuild the backend or set defaults of its own
    extra = config.get("additional_special_tokens") or []
    if any(key in config for key in _CHANGES) or not isinstance(extra, list) or any(_id(backend, t) is None
                                                                                      for t in extra):
        return None  # a flag that changes the backend, or a special token transformers would add
    if backend.post_processor is None or backend.padding is not None:
        return None  # transformers writes a post-processor, or takes the pad token from the padding settings
    if backend.get_vocab_size(with_added_tokens=True) > _MISTRAL_CHECK_VOCAB and (p / "config.json").exists():
        return None
    for idx, token in (config.get("added_tokens_decoder") or {}).items():
        if not (isinstance(token, dict) and str(idx).isdigit() and _id(backend, token) == int(idx)):
            return None  # an added token transformers would add or move
    ids = {}
    for key in _NAMED:
        value = config.get(key)
        if value is None:
            ids[key] = None
            continue
        ids[key] = _id(backend, value)
        if ids[key] is None:
            return None  # not in the vocabulary: transformers would add it (a new id, a larger vocabulary)
    return ids


def _id(backend, token) -> int | None:
    """The id of a special token written as a string or as an AddedToken object (``{"content": ...}``)."""
    content = token.get("content") if isinstance(token, dict) else token
    if not isinstance(content, str):
        return None
    tid = backend.token_to_id(content)
    return tid if isinstance(tid, int) else None
