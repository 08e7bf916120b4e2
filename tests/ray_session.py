"""One local Ray session shared by the Ray test modules, and a hard time limit per Ray test.

``ray.init`` costs 7-13 s and about 1 GB here, so it runs once (2 CPUs, like CI) and is shut
down cleanly at the end; a module that finds Ray already running reuses it. Every Ray test runs
under ``signal.alarm``: a Ray hang (ray-project/ray#44687, #62746) fails the test instead of CI.
"""

from __future__ import annotations


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
