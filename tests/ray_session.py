"""One local Ray session shared by the Ray test modules, and a hard time limit per Ray test.

``ray.init`` costs 7-13 s and about 1 GB here, so it runs once (2 CPUs, like CI) and is shut
down cleanly at the end; a module that finds Ray already running reuses it. Its start is given a
limit scaled by the machine's load (``limits``), tried again within it. Every Ray test runs
under ``signal.alarm`` (scaled too): a Ray hang (ray-project/ray#44687, #62746) fails the test instead of CI.
``assert_same_as_local`` is what every Ray build test checks: the collection, merged physically,
holds a local build's bytes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import limits

RAY_TEST_SECONDS = 240
#: Seconds Ray gets to start on an idle machine (it takes 7-13 s here), scaled by the load (``limits``).
RAY_READY_S = 60
#: Ray's own wait for its GCS port (``RAY_gcs_server_port_wait_time_s``, 30 s unless set): scaled the same way.
GCS_PORT_WAIT_S = 30


@pytest.fixture(scope="session")
def ray_session():
    ray = pytest.importorskip("ray")
    owned = not ray.is_initialized()
    if owned:
        _start(ray)
    yield ray
    if owned:
        ray.shutdown()


def _start(ray) -> None:
    """``ray.init`` (2 CPUs, like CI), tried again until ``limits.scaled(RAY_READY_S)`` has passed: its raylet wait
    (30 s, not configurable) fails on a loaded machine where the raylet is merely slow."""
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(round(limits.scaled(GCS_PORT_WAIT_S))))
    limit = limits.scaled(RAY_READY_S)
    start, tries = time.monotonic(), 0
    while True:
        tries += 1
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
            return
        except Exception as exc:
            ray.shutdown()  # whatever part of the node started
            if time.monotonic() - start > limit:
                raise RuntimeError(f"a local Ray did not start in {tries} tries over "
                                   f"{limits.describe(RAY_READY_S, limit)}: {type(exc).__name__}: {exc}") from exc


@pytest.fixture()
def time_limit():
    with limits.time_limit(RAY_TEST_SECONDS, "a Ray test (a Ray hang?)"):
        yield


def store_files(path: Path) -> dict[str, bytes]:
    """Every data file of a store (the manifest differs in build_report only, by design)."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.suffix == ".bin"}


def assert_same_as_local(ray_out, local: Path, tmp_path: Path) -> None:
    from packfmt.collection import merge_physical

    merged = merge_physical([ray_out], tmp_path / "merged")
    got, want = store_files(Path(merged.path)), store_files(Path(local))
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], f"{name} differs from the local build's"
