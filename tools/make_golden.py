"""Regenerate the golden dataset ``tests/data/golden_v1_0/`` (spec/FORMAT.md, version 1.0).

Run only when the format changes on purpose (a new format version gets a new golden directory;
``golden_v1_0`` must never change once released)::

    .venv/bin/python tools/make_golden.py            # refuses to overwrite
    .venv/bin/python tools/make_golden.py --force    # replace it

``tests/test_golden.py`` never calls this script: it compares the committed files with literal
expected values and with a fresh write of the same input.

The dataset: 4 documents, vocab 1000 (uint16), a loss mask, 2 tiny PNG images (encoded here with
Pillow; the committed bytes are the reference, not a re-encoding), and one materialized pack index
(ffd, capacity 8, split) in which document 2 is split in two segments.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import shutil
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden_v1_0"

VOCAB_SIZE = 1000
SPECIAL_TOKENS = {"bos": 1, "eos": 2, "pad": 0, "image": 3}
#: A stand-in tokenizer: its files, hashed with the rule of spec/FORMAT.md §2.3.
TOKENIZER_FILES = {
    "tokenizer.json": b'{"model": {"type": "WordLevel"}, "version": "1.0"}\n',
    "special_tokens_map.json": b'{"bos_token": "<s>", "eos_token": "</s>"}\n',
}
DOCS = [
    # (tokens, loss_mask, images as (pixels row-major RGB, width, height, begin, end))
    ([1, 10, 11, 12, 2], [0, 0, 1, 1, 1], []),
    ([1, 3, 3, 3, 3, 20, 21, 2], [0, 0, 0, 0, 0, 1, 1, 1],
     [(bytes([255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255]), 2, 2, 1, 5)]),
    ([1, 30, 31, 32, 33, 34, 35, 36, 37, 2], [0, 1, 1, 1, 1, 1, 1, 1, 1, 1], []),
    ([1, 40, 3, 3, 41, 999, 2], [0, 0, 0, 0, 1, 1, 1],
     [(bytes([0, 0, 0, 128, 128, 128, 255, 255, 255]), 1, 3, 2, 4)]),
]
PACK = {"capacity": 8, "algorithm": "ffd", "oversize": "split", "materialize": True}


def tokenizer_hash(files: dict[str, bytes]) -> str:
    """``"sha256:..."`` over ``path NUL u64le(len) bytes`` for each file sorted by path (spec §2.3)."""
    h = hashlib.sha256()
    for name in sorted(files, key=lambda p: p.encode("utf-8")):
        data = files[name]
        h.update(name.encode("utf-8") + b"\x00" + struct.pack("<Q", len(data)) + data)
    return "sha256:" + h.hexdigest()


def encode_png(pixels: bytes, width: int, height: int) -> bytes:
    """Deterministic PNG bytes of an RGB image (no metadata chunks)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.frombytes("RGB", (width, height), pixels).save(buf, format="PNG", compress_level=9, optimize=False)
    return buf.getvalue()


def write_golden(path: Path) -> None:
    """Write the golden dataset and its pack index at ``path`` (must not exist)."""
    import packfmt
    from packfmt.packindex import build_pack_index

    tokenizer = {"name": "golden-tokenizer", "hash": tokenizer_hash(TOKENIZER_FILES)}
    with packfmt.DatasetWriter(path, vocab_size=VOCAB_SIZE, tokenizer=tokenizer,
                               special_tokens=SPECIAL_TOKENS, loss_mask=True) as w:
        for tokens, mask, images in DOCS:
            records = [packfmt.ImageRecord(encode_png(px, wd, ht), wd, ht, "png", b, e) for px, wd, ht, b, e in images]
            w.add_document(tokens, loss_mask=mask, images=records)
    build_pack_index(path, **PACK)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="replace an existing golden directory")
    parser.add_argument("--out", type=Path, default=GOLDEN, help=f"target (default: {GOLDEN})")
    args = parser.parse_args(argv)
    if args.out.exists():
        if not args.force:
            print(f"{args.out} exists; pass --force to regenerate it", file=sys.stderr)
            return 2
        shutil.rmtree(args.out)
    write_golden(args.out)
    print(f"wrote {args.out}")
    for p in sorted(args.out.rglob("*")):
        if p.is_file():
            print(f"  {p.relative_to(args.out)}  {p.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
