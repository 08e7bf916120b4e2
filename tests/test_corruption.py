"""Corruption suite: no value in any array of any file crashes, hangs or fools the reader.

Three datasets (text; chat with a loss mask and a materialized index; images) are mutated one
element at a time: every array file, elements at its edges and middle (every column of 2-D
arrays), values at the boundaries that matter (-1, 0, 1, one off the old value, the array's
length, 2^31, 2^62, the int64 extremes; for unsigned arrays 0, 1, the dtype's maximum). The
checksums in ``manifest.json`` / ``index.json`` are fixed up after each mutation, so only the
structural checks stand between the bytes and the reader.

Every case is read in a subprocess (``corruption_reader.py``) through every public entry:
``packfmt.open``, documents, loss masks, image decoding, ``PackIndex``, ``PackedDataset`` items and
batches, ``collate_varlen``. A signal, a hang (time limit), an exception other than
``PackfmtError``, or an accepted pack that differs from a bounds-checked reference fails the test;
so does a case the reader refuses when it opens the dataset while the quick ``validate`` accepts it
(image bytes are checked when an image is decoded, as spec V20 is a deep check).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from images import png
from mutations import boundary_values, fix_checksums

import packfmt
from packfmt import format as F
from packfmt import index_format as IF
from packfmt.packindex import build_pack_index

HERE = Path(__file__).parent
TIME_LIMIT_S = 600


# ----------------------------------------------------------------------------- the three datasets
def _text(root: Path) -> Path:
    rng = np.random.default_rng(1)
    with packfmt.DatasetWriter(root, vocab_size=70000) as w:  # uint32 tokens
        for n in rng.integers(1, 30, 14):
            w.add_document(rng.integers(0, 70000, n))
    build_pack_index(root, capacity=16, algorithm="ffd")
    return root


def _chat(root: Path) -> Path:
    rng = np.random.default_rng(2)
    with packfmt.DatasetWriter(root, vocab_size=500, loss_mask=True) as w:
        for n in rng.integers(2, 25, 12):
            w.add_document(rng.integers(0, 500, n), rng.integers(0, 2, n))
    build_pack_index(root, capacity=20, algorithm="bfd", materialize=True)
    return root


def _images(root: Path) -> Path:
    IMG = 99
    with packfmt.DatasetWriter(root, vocab_size=100, special_tokens={"image": IMG}) as w:
        w.add_document([1, IMG, IMG, IMG, 2, 3], images=[packfmt.ImageRecord(png(4, 3, (255, 0, 0)), 4, 3, "png", 1, 4)])
        w.add_document([4, 5, 6])
        w.add_document([4, IMG, IMG, 7, IMG, IMG, 8], images=[
            packfmt.ImageRecord(png(2, 2, (0, 0, 255)), 2, 2, "png", 1, 3),
            packfmt.ImageRecord(png(3, 2, (0, 255, 0)), 3, 2, "png", 4, 6)])
        w.add_document([9, 10, 11, 12, 13])
    build_pack_index(root, capacity=8, algorithm="ffd")
    return root


DATASETS = {"text": _text, "chat": _chat, "images": _images}


# ----------------------------------------------------------------------------- mutations
def _arrays(root: Path) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """(relative path, dtype, shape) of every array file of the dataset and its pack indexes."""
    store = packfmt.open(root)
    out = [(name, dtype, shape) for name, (dtype, shape) in F.expected_layout(store.manifest).items()]
    if store.images is not None:
        out.append((F.IMAGE_BLOBS, F.BLOB_DTYPE, (store.manifest.files[F.IMAGE_BLOBS].bytes,)))
    for name in store.pack_index_names():
        pm = store.pack_index(name).manifest
        layout = IF.pack_index_layout(pm, store.manifest.np_token_dtype, store.manifest.has_loss_mask,
                                     pm.raw["counts"]["packed_tokens"])
        out += [(f"{F.PACKS_DIR}/{name}/{fname}", dtype, shape) for fname, (dtype, shape) in layout.items()]
    return out


def _positions(shape: tuple[int, ...]) -> list[int]:
    rows = shape[0]
    picks = sorted({r for r in (0, 1, rows // 2, rows - 2, rows - 1) if 0 <= r < rows})
    cols = shape[1] if len(shape) == 2 else 1
    return [r * cols + c for r in picks for c in range(cols)]


def _cases(base: Path, out: Path) -> list[tuple[Path, str]]:
    cases = []
    for rel, dtype, shape in _arrays(base):
        original = np.fromfile(base / rel, dtype=dtype)
        for pos in _positions(shape):
            for value in boundary_values(dtype, int(original[pos]), shape[0]):
                case = out / f"c{len(cases)}"
                shutil.copytree(base, case)
                arr = original.copy()
                arr[pos] = value
                arr.tofile(case / rel)
                fix_checksums(case, rel)
                cases.append((case, f"{rel}[{pos}] = {value} (was {int(original[pos])})"))
    return cases


def _run(cases: list[tuple[Path, str]]) -> dict[int, str]:
    proc = subprocess.run([sys.executable, str(HERE / "corruption_reader.py"), *(str(c) for c, _ in cases)],
                          capture_output=True, text=True, timeout=TIME_LIMIT_S, cwd=HERE)
    outcomes, running = {}, None
    for line in proc.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "BEGIN":
            running = int(rest)
        elif tag == "END":
            i, _, outcome = rest.partition(" ")
            outcomes[int(i)] = outcome
            running = None
    if proc.returncode != 0:
        what = cases[running][1] if running is not None else "?"
        pytest.fail(f"reader process died with {proc.returncode} (a signal when negative) while reading {what}:\n"
                    f"{proc.stderr[-3000:]}")
    return outcomes


@pytest.mark.parametrize("kind", sorted(DATASETS))
def test_no_value_in_any_array_crashes_or_fools_the_reader(tmp_path, kind):
    base = DATASETS[kind](tmp_path / "base")
    cases = _cases(base, tmp_path / "cases")
    outcomes = _run(cases)
    assert len(outcomes) == len(cases)
    bad = [f"{cases[i][1]}: {o}" for i, o in outcomes.items() if o.startswith("BAD")]
    assert not bad, f"{len(bad)} of {len(cases)} cases:\n" + "\n".join(bad[:20])
    lax = [cases[i][1] for i, o in outcomes.items() if o in ("refused-open validate=ok", "refused-read validate=ok")]
    assert not lax, "the reader refused, the quick validate accepted:\n" + "\n".join(lax[:20])
    refused = sum(o.startswith("refused") for o in outcomes.values())
    # the suite must exercise both sides: most mutations of offsets are refused, some values are harmless
    assert refused > len(cases) // 3 and refused < len(cases), (refused, len(cases))
