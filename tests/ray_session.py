"""One local Ray session shared by the Ray test modules, and a hard time limit per Ray test.

``ray.init`` costs 7-13 s and about 1 GB here, so it runs once (2 CPUs, like CI) and is shut
down cleanly at the end; a module that finds Ray already running reuses it. Every Ray test runs
under ``signal.alarm``: a Ray hang (ray-project/ray#44687, #62746) fails the test instead of CI.
``assert_same_as_local`` is what every Ray build test checks: the collection, merged physically,
holds a local build's bytes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import limits

RAY_TEST_SECONDS = 240


@pytest.fixture(scope="session")
def ray_session():
    ray = pytest.importorskip("ray")
    owned = not ray.is_initialized()
    if owned:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    if owned:
        ray.shutdown()


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
