"""``packfmt inspect --plot``: the summary as a picture, every number on it read from ``summarize``'s dict.

The figure has a document-length histogram, pack-fill histograms and token grids of one batch
under three layouts (pad to longest, pad to capacity, packed). The batch is a seeded random
sample of the index's packs (packers sort, so the first and the last, leftover packs are not
typical). The padding grids draw a line where each batch of ``batch_size`` rows begins. Cells are
coloured by what the token is: a document's trained token (two colours, alternating between
documents), a loss-masked token (lighter), an image token, padding.

Numbers in titles and legends come from the summary and are formatted as ``format_summary``
formats them, so the picture never disagrees with the text; the distributions drawn (histograms,
grids) are read from the arrays.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .dataset import Dataset
from .index import PackIndex
from .render import pct
from .summary import DEFAULT_BATCH

__all__ = ["batch_grids", "sample_packs", "draw_summary", "plot_summary", "CELL_CLASSES"]

#: Grid cell values, in drawing priority (a column covering several tokens shows the highest).
NONE, PAD, DOC_A, DOC_B, MASKED_A, MASKED_B, IMAGE = -1, 0, 1, 2, 3, 4, 5
CELL_CLASSES = {NONE: "no slot", PAD: "padding", DOC_A: "document token", DOC_B: "document token",
                MASKED_A: "loss-masked token (not trained)", MASKED_B: "loss-masked token (not trained)",
                IMAGE: "image token"}
_COLOURS = ["white", "#c8c8c8", "#1f77b4", "#ff7f0e", "#aec7e8", "#ffbb78", "#2ca02c"]  # NONE .. IMAGE
#: Most grid columns drawn; longer rows are scaled down.
MAX_WIDTH = 1024
#: Seed of the pack sample (shown on the figure).
SAMPLE_SEED = 0


def sample_packs(index: PackIndex, k: int, seed: int = SAMPLE_SEED) -> np.ndarray:
    """``min(k, num_packs)`` distinct pack numbers drawn at random (seeded), sorted.

    A one-pack sample never is the last pack when there are others: that is the leftover.
    """
    n = index.num_packs
    k = min(max(k, 1), n)
    rng = np.random.default_rng(seed)
    pool = n - 1 if (k == 1 and n > 1) else n
    return np.sort(rng.choice(pool, size=k, replace=False)).astype(np.int64)


def _token_classes(store: Dataset, segs: np.ndarray, first_colour: int) -> np.ndarray:
    """Per-token cell classes of the segments ``(doc, begin, end)`` laid end to end."""
    off = np.asarray(store.doc_offsets)
    mask, images = store.loss_mask, store.images
    spans = np.asarray(images.token_spans) if images is not None else np.zeros((0, 2), dtype=np.int64)
    parts = []
    for k, (d, b, e) in enumerate(np.asarray(segs).tolist()):
        alt = (first_colour + k) % 2
        cls = np.full(e - b, DOC_B if alt else DOC_A, dtype=np.int8)
        g0, g1 = int(off[d]) + b, int(off[d]) + e
        if mask is not None:
            cls[np.asarray(mask[g0:g1]) == 0] = MASKED_B if alt else MASKED_A
        lo, hi = np.searchsorted(spans[:, 1], g0, side="right"), np.searchsorted(spans[:, 0], g1, side="left")
        for s0, s1 in spans[lo:hi].tolist():
            cls[max(s0, g0) - g0:min(s1, g1) - g0] = IMAGE
        parts.append(cls)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int8)


def _paint(rows: list[np.ndarray], slots: list[int], cap: int, width: int) -> np.ndarray:
    """Token classes per row -> ``(len(rows), width)`` grid; each column shows its highest-priority token."""
    grid = np.full((len(rows), width), NONE, dtype=np.int32)
    scale = width / cap
    for r, (cls, n_slots) in enumerate(zip(rows, slots)):
        cells = np.full(n_slots, PAD, dtype=np.int32)
        cells[:cls.size] = cls
        col = np.minimum((np.arange(n_slots) * scale).astype(np.int64), width - 1)
        np.maximum.at(grid[r], col, cells)
    return grid


def batch_grids(store: Dataset, index: PackIndex | None, rows: int = DEFAULT_BATCH, capacity: int | None = None,
                width: int = MAX_WIDTH, seed: int = SAMPLE_SEED) -> dict:
    """Token grids of one batch under three layouts, on the same tokens.

    The tokens are those of ``rows`` packs sampled from ``index`` (``sample_packs``), or without an
    index the first ``rows`` documents cut at ``capacity``. The padding layouts lay the same pieces out
    one per row in data order, in batches of ``rows``. Each grid is int32 ``(n_rows, width)`` of
    ``CELL_CLASSES`` values (columns are token positions scaled to ``width``).

    Returns ``{layout: (grid, efficiency of these rows)}`` for ``pad_to_longest``, ``pad_to_capacity``
    and (with an index) ``packed``, in that order.
    """
    if index is not None:
        cap = index.capacity
        po = np.asarray(index.pack_offsets)
        pack_rows = [np.asarray(index.segments[po[i]:po[i + 1]]) for i in sample_packs(index, rows, seed)]
        segs = np.concatenate(pack_rows) if pack_rows else np.zeros((0, 3), dtype=np.int64)
    else:
        cap = int(capacity or max(1, int(store.doc_lengths[:rows].max())))
        lens = np.minimum(np.asarray(store.doc_lengths[:rows]), cap)
        segs = np.stack([np.arange(lens.size), np.zeros(lens.size, dtype=np.int64), lens], axis=1)
        pack_rows = None
    width = min(width, cap)
    data_order = segs[np.lexsort((segs[:, 1], segs[:, 0]))]  # as a padding loader would read them
    lens = (data_order[:, 2] - data_order[:, 1]).astype(np.int64)
    pieces = [_token_classes(store, data_order[i:i + 1], i) for i in range(lens.size)]
    longest = [int(lens[i // rows * rows:(i // rows + 1) * rows].max()) for i in range(lens.size)]
    out = {"pad_to_longest": (_paint(pieces, longest, cap, width), _eff(lens.sum(), sum(longest))),
           "pad_to_capacity": (_paint(pieces, [cap] * lens.size, cap, width), _eff(lens.sum(), cap * lens.size))}
    if pack_rows is not None:
        colour, packed = 0, []
        for r in pack_rows:
            packed.append(_token_classes(store, r, colour))
            colour += r.shape[0]
        used = sum(int(p.size) for p in packed)
        out["packed"] = (_paint(packed, [cap] * len(packed), cap, width), _eff(used, cap * len(packed)))
    return out


def _eff(tokens: int, slots: int) -> float:
    return float(tokens / slots) if slots else 1.0


# ----------------------------------------------------------------------------- the figure
def draw_summary(store: Dataset, summary: dict, index_name: str | None = None, batch_size: int | None = None):
    """The matplotlib Figure for ``summary`` (``summarize(store, ...)``). Tick labels aside, every number
    in its text is one that ``format_summary(summary)`` prints, formatted the same way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    names = list(summary["pack_indexes"])
    name = index_name or (names[0] if names else None)
    index = store.pack_index(name) if name is not None else None
    ix = summary["pack_indexes"].get(name) if name is not None else None
    if ix is not None:  # the batch size the text's pad-to-longest line used
        batch_size = ix["padding"]["pad_to_longest"]["batch_size"]
    batch_size = batch_size or DEFAULT_BATCH
    grids = batch_grids(store, index, rows=batch_size)
    heights = [3.0, 3.0] + [float(np.clip(0.15 * g.shape[0] + 0.8, 1.2, 4.5)) for g, _ in grids.values()]
    fig = plt.figure(figsize=(12, sum(heights) + 1.6), layout="constrained")
    gs = fig.add_gridspec(2 + len(grids), 1, height_ratios=heights)
    _plot_lengths(fig.add_subplot(gs[0]), np.asarray(store.doc_lengths), summary, ix)
    _plot_fill(fig.add_subplot(gs[1]), store, summary)
    cmap = ListedColormap(_COLOURS)
    titles = _grid_titles(ix, name, batch_size)
    present: set[int] = set()
    for k, (layout, (grid, _)) in enumerate(grids.items()):
        ax = fig.add_subplot(gs[2 + k])
        ax.imshow(grid, cmap=cmap, vmin=NONE, vmax=IMAGE, aspect="auto", interpolation="nearest")
        present.update(np.unique(grid).tolist())
        if layout != "packed":  # where each batch of batch_size rows begins
            for start in range(batch_size, grid.shape[0], batch_size):
                ax.axhline(start - 0.5, color="black", linewidth=1.2)
        ax.set_title(titles[layout], fontsize=10, loc="left")
        ax.set_yticks([])
        cap = index.capacity if index is not None else grid.shape[1]
        ax.set_xticks(np.linspace(-0.5, grid.shape[1] - 0.5, 5))
        ax.set_xticklabels([f"{int(round(x))}" for x in np.linspace(0, cap, 5)])
        ax.set_xlabel("token position" if k == len(grids) - 1 else "")
    fig.legend(handles=_legend(present), loc="outside lower center", ncol=5, fontsize=9, frameon=False)
    c = summary["counts"]
    fig.suptitle(f"{Path(summary['path']).name}: {c['documents']:,} documents, {c['tokens']:,} tokens, "
                 f"{c['images']:,} images", fontsize=12)
    return fig


def plot_summary(store: Dataset, summary: dict, path: str | os.PathLike, index_name: str | None = None,
                 batch_size: int | None = None) -> Path:
    """Write ``draw_summary``'s figure as a PNG at ``path``."""
    import matplotlib.pyplot as plt

    fig = draw_summary(store, summary, index_name, batch_size)
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _grid_titles(ix: dict | None, name: str | None, batch_size: int) -> dict:
    if ix is None:
        return {"pad_to_longest": f"pad to longest (batches of {batch_size}): the first documents",
                "pad_to_capacity": "pad every document to capacity: the first documents"}
    pad = ix["padding"]
    sample = (f"{min(batch_size, ix['packs']):,} of {ix['packs']:,} packs drawn at random (seed {SAMPLE_SEED})"
              if batch_size < ix["packs"] else f"all {ix['packs']:,} packs")
    return {
        "pad_to_longest": f"pad to longest (batches of {batch_size}): efficiency {pct(pad['pad_to_longest']['efficiency'])}"
                          f" on the whole dataset; the documents of the packs below, one batch between lines",
        "pad_to_capacity": f"pad every document to capacity: efficiency {pct(pad['pad_to_capacity']['efficiency'])}"
                           " on the whole dataset; same documents",
        "packed": f"packed (index {name!r}): fill efficiency {pct(ix['fill_efficiency'])} on the whole index; "
                  f"{sample}",
    }


def _legend(present: set[int]) -> list:
    from matplotlib.patches import Patch

    entries = [(PAD, "padding"), (DOC_A, "document token (colours alternate between documents)")]
    entries += [(c, CELL_CLASSES[c]) for c in (MASKED_A, IMAGE) if c in present or c + 1 in present]
    return [Patch(facecolor=_COLOURS[c + 1], edgecolor="#555555", label=label) for c, label in entries]


def _plot_lengths(ax, lengths: np.ndarray, summary: dict, ix: dict | None) -> None:
    if lengths.size:
        bins = np.unique(np.geomspace(max(1, lengths.min()), max(2, lengths.max()), 60).astype(np.int64))
        ax.hist(lengths, bins=bins if bins.size > 1 else 10, color="#1f77b4")
        ax.set_xscale("log")
        if ix is not None:
            ax.axvline(ix["capacity"], color="#d62728", linestyle="--", linewidth=1)
            ax.text(ix["capacity"], ax.get_ylim()[1] * 0.9, f"capacity {ix['capacity']:,} ", color="#d62728",
                    fontsize=8, ha="right")
    d = summary["document_lengths"]
    title = "document length (tokens)"
    if d.get("count"):
        title += f": p50 {d['p50']:,.1f}, p90 {d['p90']:,.1f}, p99 {d['p99']:,.1f}, max {d['max']:,}"
    ax.set_title(title, fontsize=10, loc="left")
    ax.set_ylabel("documents")


def _plot_fill(ax, store: Dataset, summary: dict) -> None:
    names = list(summary["pack_indexes"])
    if not names:
        ax.text(0.5, 0.5, "no pack index", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    bins = np.linspace(0, 1, 41)
    for name in names:
        index = store.pack_index(name)
        po = np.asarray(index.pack_offsets)
        seg = np.asarray(index.segments)
        cum = np.concatenate([[0], np.cumsum(seg[:, 2] - seg[:, 1])])
        fill = (cum[po[1:]] - cum[po[:-1]]) / index.capacity
        ax.hist(fill, bins=bins, histtype="step", linewidth=1.5,
                label=f"{name}: fill efficiency {pct(summary['pack_indexes'][name]['fill_efficiency'])}")
    ax.set_title("pack fill (tokens / capacity) per index", fontsize=10, loc="left")
    ax.set_xlabel("fill")
    ax.set_ylabel("packs")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
