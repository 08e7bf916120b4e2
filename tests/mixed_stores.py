"""Builders shared by the mixed-collection tests: three real stores of one tokenizer, built by the CLI
from the bundled sample data and real PNGs (spec/COLLECTION.md §2.3).

``build_mixed_stores(root)`` -> ``{"text": path, "chat": path, "vqa": path}``: a text store (no loss
mask, no image id), a chat store (a loss mask) and a LLaVA store (a loss mask, an image id, 6 images:
``vqa.json`` records 0-8, every third one without an image; ``build_llava`` builds more like it).
"""

from __future__ import annotations

import json
from pathlib import Path

import packfmt
from packfmt.cli import main

from images import png

SAMPLE = Path(packfmt.__file__).parent / "sample_data"
SAMPLE_TOK = SAMPLE / "tokenizer"
MIXED_MEMBERS = ("text", "chat", "vqa")


def build_store(kind: str, src: Path, out: Path, *extra: str, tok: Path = SAMPLE_TOK) -> Path:
    """``packfmt build KIND SRC -o OUT --tokenizer TOK EXTRA...`` (asserting it succeeds)."""
    assert main(["build", kind, str(src), "-o", str(out), "--tokenizer", str(tok), "--no-progress", *extra]) == 0
    return out


def build_llava(root: Path, name: str, sizes: list[tuple[int, int]], records: int = 9, shade: int = 0) -> Path:
    """A LLaVA store ``root/name`` of ``records`` one-question chats over PNGs of ``sizes`` (colours moved by
    ``shade``): record ``k`` shows ``img{k % len(sizes)}`` unless ``k % 3 == 2`` (no image)."""
    images = root / f"{name}_images"
    images.mkdir()
    for k, (w, h) in enumerate(sizes):
        (images / f"img{k}.png").write_bytes(png(w, h, ((40 * k + shade) % 256, 200 - 50 * k, 90)))
    recs = []
    for k in range(records):
        turn = {"from": "human", "value": ("<image>\n" if k % 3 != 2 else "") + f"What colour is picture {k}?"}
        recs.append({"id": str(k), **({"image": f"img{k % len(sizes)}.png"} if k % 3 != 2 else {}),
                     "conversations": [turn, {"from": "gpt", "value": f"Colour number {k}, clearly."}]})
    (root / f"{name}.json").write_text(json.dumps(recs), encoding="utf-8")
    return build_store("llava", root / f"{name}.json", root / name, "--image-root", str(images), "--image-tokens", "16")


def build_mixed_stores(root: Path) -> dict[str, Path]:
    """The text, chat and vqa stores under ``root`` (see the module docstring)."""
    return {
        "text": build_store("text", SAMPLE / "text.jsonl", root / "text"),
        "chat": build_store("chat", SAMPLE / "chat.jsonl", root / "chat"),
        "vqa": build_llava(root, "vqa", [(64, 48), (30, 100), (57, 29)]),
    }
