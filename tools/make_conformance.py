"""Regenerate the conformance vectors ``spec/conformance/`` (spec/conformance/README.md).

Small datasets of every kind, written by packfmt's own writers, and the values any reader must
read from them, in plain JSON. Everything is a function of the inputs below: no seed is left
free, no timestamp or host path reaches a file, so two runs write the same bytes, and
``tests/test_conformance.py`` regenerates into a temporary folder and compares byte for byte::

    .venv/bin/python tools/make_conformance.py            # refuses to overwrite
    .venv/bin/python tools/make_conformance.py --force    # replace spec/conformance/data and expected

Run it when the vectors change on purpose (a new dataset, a new field, a new producer version)
and commit the result with the change that made it. The one wall-clock value a writer stores,
``stats.seconds`` of an ``index.json`` (FORMAT.md §5.3), is written as 0.0 here: the writers run
under a stopped clock (``stopped_clock``).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import struct
import sys
import zlib
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "spec" / "conformance"
#: What this script writes under its output folder (the README beside them is written by hand).
GENERATED = ("data", "expected")

VOCAB = 1000
TOKENIZER = {"name": "conformance", "hash": None}
SPECIAL = {"bos": 1, "eos": 2, "pad": 4}
IMAGE_ID = 3


# ----------------------------------------------------------------------------- inputs
def text_documents() -> list[list[int]]:
    """8 documents of lengths 5 .. 33, one of a single token; token ``i`` of document ``d`` is ``100 (d + 1) + i``,
    so every id names its document and position."""
    return [[100 * (d + 1) + i for i in range(n)] for d, n in enumerate([5, 12, 3, 20, 7, 16, 1, 33])]


def chat_documents() -> list[tuple[list[int], list[int]]]:
    """``(tokens, loss mask)`` of 5 conversations: BOS (mask 0), then turns of a prompt (ids ``300 + 20 d + k``,
    mask 0) and an answer (ids ``400 + 20 d + k``, mask 1), then EOS (mask 1). At capacity 16 document 1 is cut
    before an answer token (mask 1) and document 2 before a prompt token (mask 0)."""
    turns = [[(3, 4)], [(4, 5), (3, 6)], [(5, 10), (6, 2)], [(2, 2)], [(1, 1)]]
    docs = []
    for d, doc in enumerate(turns):
        tokens, mask, k = [SPECIAL["bos"]], [0], 0
        for prompt, answer in doc:
            tokens += [300 + 20 * d + k + j for j in range(prompt)]
            tokens += [400 + 20 * d + k + j for j in range(answer)]
            mask += [0] * prompt + [1] * answer
            k += prompt + answer
        docs.append((tokens + [SPECIAL["eos"]], mask + [1]))
    return docs


def png(pixels: bytes, width: int, height: int, channels: int) -> bytes:
    """A PNG file of 8-bit RGB (3 channels) or RGBA (4) pixels, with its image data in one stored (uncompressed)
    deflate block: the same bytes with any zlib, and readable by every PNG decoder."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = width * channels
    raw = b"".join(b"\x00" + pixels[y * row:(y + 1) * row] for y in range(height))  # filter 0 on every row
    deflate = b"\x78\x01" + b"\x01" + struct.pack("<HH", len(raw), len(raw) ^ 0xFFFF) + raw
    ihdr = struct.pack(">IIBBBBB", width, height, 8, {3: 2, 4: 6}[channels], 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", deflate + struct.pack(">I", zlib.adler32(raw))) + chunk(b"IEND", b""))


#: The three images: (codec, width, height, channels, pixels row-major).
IMAGES = [
    ("png", 2, 2, 3, bytes([255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255])),
    ("rgb8", 3, 1, 3, bytes([10, 20, 30, 40, 50, 60, 70, 80, 90])),
    ("png", 1, 2, 4, bytes([200, 100, 50, 255, 1, 2, 3, 0])),
]


def image_documents() -> list[tuple[list[int], list[int], list[tuple[int, int, int]]]]:
    """``(tokens, loss mask, images as (image, begin, end))`` of 4 documents; image tokens are ``IMAGE_ID`` with
    mask 0. Document 2 (24 tokens) has an image run ``[14, 18)`` across position 16, so at capacity 16 it is cut
    at 14, the largest cut not inside a run (FORMAT §4.3), and its second segment holds two images."""
    b, e, i = SPECIAL["bos"], SPECIAL["eos"], IMAGE_ID
    return [
        ([b, i, i, i, i, 700, 701, 702, e], [0, 0, 0, 0, 0, 1, 1, 1, 1], [(0, 1, 5)]),
        ([b, 710, 711, 712, 713, 714, 715, e], [0, 0, 0, 1, 1, 1, 1, 1], []),
        ([b, *range(720, 733), i, i, i, i, 740, 741, i, i, 742, e],
         [0] + [1] * 13 + [0] * 4 + [1, 1, 0, 0, 1, 1], [(1, 14, 18), (2, 20, 22)]),
        ([b, 750, 751, e], [0, 1, 1, 1], []),
    ]


def wide_documents() -> list[list[int]]:
    """Ids above 65535: a ``uint32`` store (vocab 100000)."""
    return [[65534, 65535, 65536], [99999, 0, 70000, 1, 2], [12345]]


# ----------------------------------------------------------------------------- writing
@contextlib.contextmanager
def stopped_clock():
    """The packers' wall-clock timers read 0: ``stats.seconds`` (FORMAT §4.1, the one value §5.3 lets differ
    between runs) is written as 0.0, so a second run writes the same bytes."""
    from packfmt import packindex
    from packfmt.collection import shards

    class Stopped:
        @staticmethod
        def perf_counter() -> float:
            return 0.0

    with mock.patch.object(packindex, "time", Stopped), mock.patch.object(shards, "time", Stopped):
        yield


def write_stores(data: Path) -> None:
    import packfmt
    from packfmt.packindex import build_pack_index

    with packfmt.DatasetWriter(data / "text", vocab_size=VOCAB, tokenizer=TOKENIZER, special_tokens=SPECIAL) as w:
        for tokens in text_documents():
            w.add_document(tokens)
    build_pack_index(data / "text", capacity=20, algorithm="ffd")
    build_pack_index(data / "text", capacity=20, algorithm="bfd")  # at 20, best fit packs otherwise than first fit
    build_pack_index(data / "text", capacity=12, algorithm="bfd", oversize="truncate", name="bfd-12-truncate",
                     max_lost_fraction=1.0)
    build_pack_index(data / "text", capacity=16, algorithm="greedy", oversize="drop", name="greedy-16-drop",
                     max_lost_fraction=1.0)
    build_pack_index(data / "text", capacity=16, algorithm="first_fit_shuffle", seed=7, max_docs_per_pack=2)

    with packfmt.DatasetWriter(data / "chat", vocab_size=VOCAB, tokenizer=TOKENIZER, special_tokens=SPECIAL,
                               loss_mask=True) as w:
        for tokens, mask in chat_documents():
            w.add_document(tokens, loss_mask=mask)
    build_pack_index(data / "chat", capacity=16, algorithm="ffd", materialize=True)

    blobs = [png(px, wd, ht, ch) if codec == "png" else px for codec, wd, ht, ch, px in IMAGES]
    with packfmt.DatasetWriter(data / "images", vocab_size=VOCAB, tokenizer=TOKENIZER,
                               special_tokens={**SPECIAL, "image": IMAGE_ID}, loss_mask=True) as w:
        for tokens, mask, images in image_documents():
            w.add_document(tokens, loss_mask=mask, images=[
                packfmt.ImageRecord(blobs[k], IMAGES[k][1], IMAGES[k][2], IMAGES[k][0], begin, end)
                for k, begin, end in images])
    build_pack_index(data / "images", capacity=16, algorithm="balanced")

    with packfmt.DatasetWriter(data / "wide", vocab_size=100_000, tokenizer={"name": "conformance-wide", "hash": None},
                               special_tokens={"pad": 0}) as w:
        for tokens in wide_documents():
            w.add_document(tokens)
    build_pack_index(data / "wide", capacity=4, algorithm="ffd")


#: The mixtures of the collection ``array`` (COLLECTION §5, §5.1).
WEIGHTS = {"text": 2, "chat": 0.5}
PROPORTIONS = {"text": 0.5, "chat": 0.25, "images": 0.25}
PROPORTION_TOKENS = 200
#: The layout's shards: cut at the first pack boundary where a shard reaches this many bytes (COLLECTION §9.1).
SHARD_BYTES = 100


def write_collections(data: Path) -> None:
    from packfmt.collection import write_collection
    from packfmt.collection.shards import write_shards
    from packfmt.packindex import build_pack_index

    members = [(None, data / name) for name in ("text", "chat", "images")]
    write_collection(data / "array", members, member_table=False)
    build_pack_index(data / "array", capacity=16, algorithm="greedy")
    build_pack_index(data / "array", capacity=32, algorithm="ffd", name="ffd-32-weights", weights=WEIGHTS)
    build_pack_index(data / "array", capacity=32, algorithm="ffd", name="ffd-32-proportions",
                     proportions=PROPORTIONS, tokens=PROPORTION_TOKENS)
    write_collection(data / "table", members, member_table=True)
    build_pack_index(data / "table", capacity=24, algorithm="ffd", materialize=True)
    write_shards(data / "array", "greedy-16", data / "layout", shard_bytes=SHARD_BYTES)


def check_written(data: Path) -> None:
    """What makes two runs write the same bytes: no ``build_report`` (timings, FORMAT §2.2), ``stats.seconds``
    0.0 in every index (a timer ``stopped_clock`` does not stop would write the time taken)."""
    import json

    for path in sorted(data.rglob("*.json")):
        obj = json.loads(path.read_text("utf-8"))
        if "build_report" in obj:
            raise RuntimeError(f"{path}: build_report: expected absent (it records timings), found one")
        seconds = obj.get("stats", {}).get("seconds", 0.0)
        if seconds != 0.0:
            raise RuntimeError(f"{path}: stats.seconds: expected 0.0 under stopped_clock, found {seconds}: the packer "
                               "times itself elsewhere now; patch that module's clock in stopped_clock")


def write_all(out: Path) -> None:
    """Every dataset under ``out/data`` and its expected values under ``out/expected``."""
    from conformance_values import write_expected

    data = out / "data"
    with stopped_clock():
        write_stores(data)
        write_collections(data)
    check_written(data)
    write_expected(data, out / "expected")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"target folder (default: {OUT})")
    parser.add_argument("--force", action="store_true", help="replace the generated folders there")
    args = parser.parse_args(argv)
    existing = [args.out / name for name in GENERATED if (args.out / name).exists()]
    if existing and not args.force:
        print(f"{existing[0]} exists; pass --force to regenerate", file=sys.stderr)
        return 2
    for path in existing:
        shutil.rmtree(path)
    write_all(args.out)
    files = sorted(p for name in GENERATED for p in (args.out / name).rglob("*") if p.is_file())
    print(f"wrote {len(files)} files, {sum(p.stat().st_size for p in files):,} bytes, under {args.out}")
    return 0


if __name__ == "__main__":  # (run as a script, tools/ is on sys.path: conformance_values imports)
    sys.exit(main())
