"""Build throughput: local 1 process, local N processes, Ray Data (``--engine ray``) on the same input.

Corpus: the Python standard library's ``.py`` sources as JSONL (``bench_build.corpus``), about
``--mb`` MB, tokenized with the shipped byte-level BPE. Three builds of the same file:

- ``local, 1 process`` and ``local, N processes``: ``build_text(workers=...)``, a store;
- ``ray, C CPUs``: ``build_text(engine="ray")`` on a local Ray started with ``num_cpus=C``
  (tokenizer pool ``C - 1`` actors, ray#44687), a collection. ``ray.init`` is timed apart
  (it is paid once per cluster, not per build), and so is the first (cold) Ray job, whose
  actors start and import the tokenizer; the figure is the warm job.

Every build writes the same tokens (asserted). Prints a table and writes results/bench_ray_build.json.

    .venv/bin/python benchmarks/bench_ray_build.py --mb 4 --cpus 2 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).parent))

import packfmt  # noqa: E402
from bench_build import corpus  # noqa: E402
from packfmt.build import build_text  # noqa: E402

HERE = Path(__file__).parent
TOK = Path(packfmt.__file__).parent / "sample_data" / "tokenizer"


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=4.0, help="corpus size in MB (default 4)")
    p.add_argument("--cpus", type=int, default=2, help="CPUs given to the local Ray (default 2)")
    p.add_argument("--workers", type=int, default=2, help="processes of the local N-process build (default 2)")
    p.add_argument("--records-per-member", type=int, default=40, help="Ray work unit size in records (default 40: ~8 units of the 4 MB corpus)")
    args = p.parse_args(argv)
    import ray

    texts = corpus(int(args.mb * 1e6))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "corpus.jsonl"
        src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
        nbytes = src.stat().st_size

        def local(workers):
            out = Path(tmp) / f"local{workers}"
            shutil.rmtree(out, ignore_errors=True)
            return build_text([src], out, TOK, workers=workers).report["tokens"]

        for workers in (1, args.workers):
            secs, tokens = timed(lambda: local(workers))
            rows.append({"build": f"local, {workers} process(es)", "seconds": secs, "tokens": tokens})
        init, _ = timed(lambda: ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False,
                                         configure_logging=False))

        def on_ray(k):
            out = Path(tmp) / f"ray{k}"
            return build_text([src], out, TOK, engine="ray", records_per_member=args.records_per_member).report

        cold, rep = timed(lambda: on_ray(0))
        warm, rep = timed(lambda: on_ray(1))
        ray.shutdown()
        rows.append({"build": f"ray, {args.cpus} CPUs ({rep['ray']['actor_pool']} actor(s)), cold job",
                     "seconds": cold, "tokens": rep["tokens"]})
        rows.append({"build": f"ray, {args.cpus} CPUs ({rep['ray']['actor_pool']} actor(s)), warm job",
                     "seconds": warm, "tokens": rep["tokens"], "units": rep["ray"]["units"]})
    assert len({r["tokens"] for r in rows}) == 1, "the builds wrote different token counts"
    base = rows[0]["tokens"] / rows[0]["seconds"]
    print(f"corpus: {len(texts):,} files, {nbytes / 1e6:.1f} MB JSONL, {rows[0]['tokens']:,} tokens; "
          f"ray.init(num_cpus={args.cpus}) {init:.1f} s (apart)")
    print(f"{'build':<40} {'seconds':>8} {'tokens/s':>12} {'vs local 1':>10}")
    for r in rows:
        r["tokens_per_second"] = r["tokens"] / r["seconds"]
        r["ratio"] = r["tokens_per_second"] / base
        print(f"{r['build']:<40} {r['seconds']:8.2f} {r['tokens_per_second']:12,.0f} {r['ratio']:10.2f}")
    out = HERE / "results" / "bench_ray_build.json"
    out.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                           "load": os.getloadavg()},
                               "settings": vars(args), "ray_init_seconds": init, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
