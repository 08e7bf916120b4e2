"""``packfmt inspect --plot``: the numbers drawn are the text summary's, the batch is a random sample,
batches are marked, image and loss-masked tokens have their own colours."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import packfmt
from images import png
from packfmt.cli import main
from packfmt.inspect import format_summary, summarize
from packfmt.packindex import build_pack_index
from packfmt.plot import DOC_A, DOC_B, IMAGE, MASKED_A, MASKED_B, batch_grids, draw_summary, sample_packs

CAPACITY = 256  # <= MAX_WIDTH: grids are drawn at full resolution, one column per token
IMAGE_TOKENS = 16
NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?%?")


@pytest.fixture(scope="module")
def chat_mm(tmp_path_factory) -> Path:
    """Chat-like documents (a masked prompt, a trained answer); every third has one image at token 2."""
    root = tmp_path_factory.mktemp("plot") / "mm"
    rng = np.random.default_rng(3)
    with packfmt.DatasetWriter(root, vocab_size=500, loss_mask=True, special_tokens={"image": 7}) as w:
        for d in range(150):
            n = int(rng.integers(30, 200))
            prompt = int(rng.integers(5, n // 2))
            images = [packfmt.ImageRecord(png(4, 4), 4, 4, "png", 2, 2 + IMAGE_TOKENS)] if d % 3 == 0 else []
            w.add_document(rng.integers(10, 500, n), np.r_[np.zeros(prompt), np.ones(n - prompt)], images=images)
    build_pack_index(root, capacity=CAPACITY, algorithm="ffd", name="ffd")
    return root


def _drawn_texts(fig) -> list[str]:
    """Every text on the figure but the axis tick labels (positions and counts of the histogram scales)."""
    from matplotlib.text import Text

    ticks = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            ticks |= {id(t.label1) for t in axis.get_major_ticks() + axis.get_minor_ticks()}
            ticks |= {id(t.label2) for t in axis.get_major_ticks() + axis.get_minor_ticks()}
            ticks.add(id(axis.get_offset_text()))
    return [t.get_text() for t in fig.findobj(Text) if id(t) not in ticks and t.get_text()]


def test_every_number_drawn_is_in_the_text_summary(chat_mm):
    import matplotlib.pyplot as plt

    store = packfmt.open(chat_mm)
    summary = summarize(store, batch_size=4)
    text = format_summary(summary)
    fig = draw_summary(store, summary)
    try:
        drawn = " | ".join(_drawn_texts(fig))
    finally:
        plt.close(fig)
    in_text = set(NUMBER.findall(text))
    numbers = NUMBER.findall(drawn)
    assert numbers and [n for n in numbers if n not in in_text] == [], drawn
    ix = summary["pack_indexes"]["ffd"]
    pad = ix["padding"]
    for must in (f"{100 * ix['fill_efficiency']:.2f}%", f"{100 * pad['pad_to_longest']['efficiency']:.2f}%",
                 f"{100 * pad['pad_to_capacity']['efficiency']:.2f}%", "batches of 4", f"of {ix['packs']:,} packs",
                 f"p90 {summary['document_lengths']['p90']:,.1f}", f"{summary['counts']['tokens']:,} tokens"):
        assert must in drawn, (must, drawn)


def test_sample_is_seeded_random_and_never_the_last_pack_alone(chat_mm):
    index = packfmt.open(chat_mm).pack_index("ffd")
    n = index.num_packs
    assert n > 20
    picks = sample_packs(index, 4)
    assert picks.tolist() == sample_packs(index, 4).tolist()  # seeded: the same picture every run
    assert picks.tolist() != sample_packs(index, 4, seed=1).tolist()
    assert len(set(picks.tolist())) == 4 and picks.tolist() != list(range(n - 4, n))
    assert all(sample_packs(index, 1, seed=s).tolist() != [n - 1] for s in range(50))
    assert sample_packs(index, 10 * n).tolist() == list(range(n))  # a batch larger than the index: every pack

    grid, _ = batch_grids(packfmt.open(chat_mm), index, rows=4)["packed"]
    fills = [int(index.pack_segments(p)[:, 2].sum() - index.pack_segments(p)[:, 1].sum()) for p in picks]
    assert (grid > 0).sum(axis=1).tolist() == fills  # the rows drawn are exactly the sampled packs


def test_image_and_masked_tokens_have_their_own_colours(chat_mm):
    store = packfmt.open(chat_mm)
    index = store.pack_index("ffd")
    grids = batch_grids(store, index, rows=6)
    picks = sample_packs(index, 6)
    segs = np.concatenate([np.asarray(index.pack_segments(p)) for p in picks])
    off = np.asarray(store.doc_offsets)
    mask = np.asarray(store.loss_mask)
    spans = np.asarray(store.images.token_spans)
    image_tokens = masked = 0
    for d, b, e in segs.tolist():
        g0, g1 = off[d] + b, off[d] + e
        is_image = np.zeros(e - b, dtype=bool)
        for s0, s1 in spans.tolist():
            is_image[max(s0, g0) - g0:max(min(s1, g1) - g0, 0)] = True
        image_tokens += int(is_image.sum())
        masked += int(((mask[g0:g1] == 0) & ~is_image).sum())
    assert image_tokens > 0 and masked > 0
    for layout, (grid, _) in grids.items():  # the same tokens under every layout, each in its class
        assert int((grid == IMAGE).sum()) == image_tokens, layout
        assert int(np.isin(grid, [MASKED_A, MASKED_B]).sum()) == masked, layout
        assert int(np.isin(grid, [DOC_A, DOC_B]).sum()) == int((segs[:, 2] - segs[:, 1]).sum()) - image_tokens - masked

    import matplotlib.pyplot as plt

    fig = draw_summary(store, summarize(store, batch_size=6))
    try:
        labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
        longest_ax = fig.axes[2]
        rows = longest_ax.images[0].get_array().shape[0]
        boundaries = [line for line in longest_ax.lines if line.get_ydata()[0] == line.get_ydata()[1]]
    finally:
        plt.close(fig)
    assert "image token" in labels and any("loss-masked" in x for x in labels) and "padding" in labels
    assert len(boundaries) == (rows - 1) // 6  # a line where each batch of 6 rows begins


def test_text_only_legend_has_no_image_or_mask_entry(tmp_path):
    import matplotlib.pyplot as plt

    root = tmp_path / "txt"
    with packfmt.DatasetWriter(root, vocab_size=100) as w:
        for n in (5, 9, 30, 12):
            w.add_document(np.arange(n))
    build_pack_index(root, capacity=32, algorithm="ffd", name="ffd")
    store = packfmt.open(root)
    fig = draw_summary(store, summarize(store))
    try:
        labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    finally:
        plt.close(fig)
    assert "image token" not in labels and not any("loss-masked" in x for x in labels)


def test_cli_plot_uses_the_batch_size_it_was_given(chat_mm, tmp_path, capsys):
    png = tmp_path / "p.png"
    assert main(["inspect", str(chat_mm), "--plot", str(png), "--batch-size", "3"]) == 0
    out = capsys.readouterr().out
    assert "pad to longest (batches of 3)" in out and png.read_bytes()[:4] == b"\x89PNG"
