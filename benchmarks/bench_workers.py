"""Overhead of the build's worker pool (``packfmt.workers``), apart from tokenization.

Each batch's ``encode`` sleeps ``--ms`` milliseconds (no CPU, so other users of a shared machine
barely matter) and returns 32 documents of 2 KB; the consumer sleeps ``consume`` ms per batch (the
writer's share). The ideal wall time is ``max(batches * ms / workers, batches * consume)``: a pool
that leaves workers idle, or serialises on the parent, shows as the excess. Run it with
``PYTHONPATH=<other tree>`` to compare pools (an older tree builds with ``multiprocessing.Pool``). Best of 3.

    .venv/bin/python benchmarks/bench_workers.py [--batches 200] [--ms 20]
"""

from __future__ import annotations

import argparse
import time
from functools import partial

from packfmt.pipeline import _encoded_batches


class Sleepy:
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def encode(self, payloads: list) -> list:
        time.sleep(self.ms / 1000)
        return [(b"x" * 2048, None, []) for _ in payloads]


def run(workers: int, n_batches: int, ms: float, consume_ms: float) -> float:
    batches = ([("f", i, f"text {i}" * 100) for i in range(32)] for _ in range(n_batches))
    start = time.perf_counter()
    for _, results in _encoded_batches(batches, Sleepy(ms), partial(Sleepy, ms), workers):
        assert len(results) == 32
        time.sleep(consume_ms / 1000)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--ms", type=float, default=20.0, help="encode time per batch (sleep)")
    args = p.parse_args()
    for workers in (2, 4):
        for consume in (0, 5):
            best = min(run(workers, args.batches, args.ms, consume) for _ in range(3))
            ideal = max(args.batches * args.ms / 1000 / workers, args.batches * consume / 1000)
            print(f"workers={workers} consume={consume} ms: {best:.2f} s (ideal {ideal:.2f} s, "
                  f"+{100 * (best / ideal - 1):.0f}%)")


if __name__ == "__main__":
    main()
