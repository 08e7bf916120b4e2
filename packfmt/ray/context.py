"""A Ray session for one build: joined or started, Data settings kept for the block, shut down if started here.

What the local-output build (``ray.build``) and the object-storage output (``ray.remote``) share.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

__all__ = ["Job", "ray_context"]


def _connect(address: str | None) -> tuple[bool, float]:
    """Start or join Ray; ``(whether this call started it, seconds)``."""
    import ray

    t0 = time.perf_counter()
    if ray.is_initialized():
        return False, 0.0
    ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    return True, time.perf_counter() - t0


class Job:
    """Where one build stages its members, and the Ray session it runs in."""

    def __init__(self, tmp: Path | None, address: str | None, startup: float, staging=None) -> None:
        self.tmp, self.address, self.startup = tmp, address, startup
        self.staging = staging if staging is not None else tmp / "staging"

    def describe(self) -> dict:
        import ray

        return {"address": self.address, "cluster_cpus": ray.cluster_resources().get("CPU", 0),
                "startup_seconds": round(self.startup, 3), "preserve_order": True}


@contextmanager
def ray_context(ray_address: str | None, progress: bool):
    """Join/start Ray and keep order for the block (``seconds`` to start); restore the settings, shut down
    Ray if this call started it."""
    from ray.data import DataContext

    started, startup = _connect(ray_address)
    ctx = DataContext.get_current()
    saved = (ctx.execution_options.preserve_order, ctx.enable_progress_bars)
    try:
        ctx.execution_options.preserve_order = True  # write tasks in input order: members = records in order
        ctx.enable_progress_bars = progress
        yield startup
    finally:
        ctx.execution_options.preserve_order, ctx.enable_progress_bars = saved
        if started:
            import ray

            ray.shutdown()
