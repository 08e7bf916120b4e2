"""Image preprocessing in Ray CPU actors (``read_packs(image_processor=)``) vs DataLoader workers on the training node.

The seed of the Ray design: a CPU fleet decodes and processes the images, the GPU workers receive
ready ``pixel_values``. This measures the packs per second one consumer (the training loop) receives
for the same packs through the same expensive transform, two ways, in one run:

- ``dataloader, N workers``: ``PackedDataset(image_transform=...)`` in a ``torch.utils.data.DataLoader``
  with ``num_workers=N`` (``0``: the training process transforms its own images);
- ``ray, N actors``: ``packfmt.ray.datasource.read_packs(image_processor=..., image_actors=N)`` iterated
  by the driver (``iter_batches``), on a local Ray with ``--cpus`` CPUs (``ray.init`` timed apart, paid
  once per cluster; every pass starts its actor pool, as every epoch of a Ray Data job does).

Store: easy-vqa's real 64x64 PNGs (``packfmt build easy-vqa``), packed; transform: a CLIP image
processor at ``--resolution`` (448: each 64x64 image upscaled, cropped, normalised to a float
``(3, 448, 448)``, 2.4 MB). Both ways must deliver the same packs and the same pixel sum (asserted).
Each figure is the best of ``--repeat`` passes; a pass includes starting the workers/actors (a DataLoader
without persistent workers, and a Ray Data execution, start them every epoch). ``first_pack_seconds``
is when the consumer got its first pack (start-up: forked DataLoader workers vs actor processes that
import torch, transformers and packfmt), ``packs_per_s_after_first`` the rate after it (the pipeline
running; a block is one pack by default, delivered as soon as it is processed).

What it measures on one machine: both ways share the same cores, so the ratio is Ray's cost (actor
start, every ``pixel_values`` serialised into the object store and read back by the consumer) at an
equal number of preprocessing processes, not the disaggregation gain. Across nodes the actors run on
CPU nodes and the training node's cores stay free; that gain is not measured here.

    .venv/bin/python benchmarks/bench_ray_preprocess.py --records 300 --workers 1 --cpus 2
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402

from common import RESULTS_DIR, machine_info, print_table, write_json  # noqa: E402


def processor(resolution: int):
    """A CLIP image processor at ``resolution`` (the Pillow backend: torchvision is not installed here)."""
    try:
        from transformers import CLIPImageProcessorPil as cls
    except ImportError:
        from transformers import CLIPImageProcessor as cls
    return cls(size={"shortest_edge": resolution}, crop_size={"height": resolution, "width": resolution})


def build_store(root: Path, records: int, capacity: int) -> Path:
    from packfmt.build import build_easy_vqa
    from packfmt.packindex import build_pack_index

    store = build_easy_vqa(root / "evqa", split="test", image_tokens=64, limit=records, workers=1).path
    build_pack_index(store, capacity=capacity, name="p")
    return Path(store)


def _identity(item):
    return item


class Pass:
    """One pass as the consumer sees it: the pack ids and pixel sum received, when the first pack came, the end."""

    def __init__(self) -> None:
        self.t0, self.first, self.first_packs, self.ids, self.total = time.perf_counter(), None, 0, [], 0.0

    def got(self, ids, images) -> None:
        self.ids.extend(int(i) for i in ids)
        self.total += sum(float(np.asarray(im, dtype=np.float64).sum()) for im in images)
        if self.first is None:
            self.first, self.first_packs = time.perf_counter() - self.t0, len(self.ids)

    def done(self) -> "Pass":
        self.seconds = time.perf_counter() - self.t0
        rest = len(self.ids) - self.first_packs  # after the first delivery: the rate once the workers/actors run
        self.after_first = rest / (self.seconds - self.first) if rest and self.seconds > self.first else float("nan")
        return self


def dataloader_pass(store: Path, proc, workers: int) -> Pass:
    """One DataLoader epoch with ``workers`` workers (started by the pass, as every epoch without persistent ones)."""
    from torch.utils.data import DataLoader

    from packfmt.torch import ImageProcessorTransform, PackedDataset

    run = Pass()
    ds = PackedDataset(store, "p", image_transform=ImageProcessorTransform(proc))
    for item in DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=_identity):
        run.got([item["pack_id"]], [im.numpy() for im in item["images"]])
    return run.done()


def ray_pass(store: Path, proc, actors: int, packs_per_block: int) -> Pass:
    """One pass over ``read_packs`` with ``actors`` CPU actors (started by the pass, as every Ray Data epoch)."""
    from packfmt.ray.datasource import read_packs

    run = Pass()
    data = read_packs(store, "p", shuffle=False, image_processor=proc, image_actors=actors,
                      packs_per_block=packs_per_block)
    for batch in data.iter_batches(batch_size=None, batch_format="numpy"):
        run.got(batch["pack_id"], [im for pv in batch["pixel_values"] for im in pv])
    return run.done()


def best(fn, repeat: int) -> tuple[Pass, Pass]:
    """(the fastest, the first) of ``repeat`` passes."""
    runs = [fn() for _ in range(repeat)]
    return min(runs, key=lambda r: r.seconds), runs[0]


def row(case: str, n: int, fastest: Pass, first: Pass) -> dict:
    return {"case": case, "n": n, "seconds": fastest.seconds, "first_pass_seconds": first.seconds,
            "first_pack_seconds": fastest.first, "packs_per_s_after_first": fastest.after_first,
            "packs": len(fastest.ids), "pixel_sum": fastest.total, "ids": sorted(fastest.ids)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=300, help="easy-vqa test records (one image each; default 300)")
    ap.add_argument("--capacity", type=int, default=512, help="pack capacity in tokens (default 512: ~6 images a pack)")
    ap.add_argument("--resolution", type=int, default=448, help="CLIP processor size (default 448)")
    ap.add_argument("--workers", default="1", help="comma-separated N: DataLoader workers and Ray actors (default 1)")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray (default 2; actors must be fewer)")
    ap.add_argument("--packs-per-block", type=int, default=1, help="packs per Ray block (default 1)")
    ap.add_argument("--repeat", type=int, default=2, help="passes per case; the best is reported (default 2)")
    ap.add_argument("--out", default=str(RESULTS_DIR / "bench_ray_preprocess.json"))
    args = ap.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    if max(counts) >= args.cpus:
        ap.error(f"--workers {args.workers}: Ray actors must be fewer than --cpus {args.cpus} (a pool holding every "
                 f"CPU starves Ray Data's other tasks, ray-project/ray#44687); raise --cpus or lower --workers")
    import ray

    proc = processor(args.resolution)
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        store = build_store(Path(tmp), args.records, args.capacity)
        from packfmt.torch import PackedDataset

        probe = PackedDataset(store, "p")
        packs, images = len(probe), int(probe.store.num_images)
        for n in [0] + counts:
            rows.append(row(f"dataloader, {n} workers", n, *best(lambda: dataloader_pass(store, proc, n), args.repeat)))
        owned = not ray.is_initialized()
        t0 = time.perf_counter()
        if owned:
            ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
        init = time.perf_counter() - t0
        context, log = ray.data.DataContext.get_current(), logging.getLogger("ray.data")
        bars, level = context.enable_progress_bars, log.level
        context.enable_progress_bars = False
        log.setLevel(logging.WARNING)
        try:
            for n in counts:
                rows.append(row(f"ray, {n} actors", n,
                                *best(lambda: ray_pass(store, proc, n, args.packs_per_block), args.repeat)))
        finally:
            context.enable_progress_bars = bars  # a session that was running before keeps its settings
            log.setLevel(level)
            if owned:
                ray.shutdown()
    for r in rows:  # the same packs through the same transform, every way
        assert r.pop("ids") == list(range(packs)), f"{r['case']}: not every pack once"
        assert np.isclose(r["pixel_sum"], rows[0]["pixel_sum"], rtol=1e-9), f"{r['case']}: another pixel sum"
        r["packs_per_s"] = r["packs"] / r["seconds"]
        r["images_per_s"] = images / r["seconds"]
    loader = {r["n"]: r for r in rows if r["case"].startswith("dataloader")}
    for r in rows:
        r["vs_dataloader_same_n"] = r["packs_per_s"] / loader[r["n"]]["packs_per_s"]
        r["after_first_vs_dataloader"] = r["packs_per_s_after_first"] / loader[r["n"]]["packs_per_s_after_first"]
    print(f"store: {packs} packs, {images} easy-vqa images (64x64 PNG) -> CLIP {args.resolution}x{args.resolution}; "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; ray.init(num_cpus={args.cpus}) {init:.1f} s (apart)")
    print_table(rows, ["case", "seconds", "first_pass_seconds", "packs_per_s", "images_per_s", "vs_dataloader_same_n",
                       "first_pack_seconds", "packs_per_s_after_first", "after_first_vs_dataloader"])
    write_json(args.out, {"machine": {**machine_info(), "load": os.getloadavg()}, "settings": vars(args),
                          "packs": packs, "images": images, "ray_init_seconds": init, "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
