"""The test suite in two parts: ``bash tools/test.sh`` runs the fast default (every test not marked
``slow``), ``bash tools/test.sh --slow`` the rest; CI (``.ci/run``) runs both.

A test is slow when it starts a server or a cluster (Ray, the S3-protocol server, Energon's
prepare), spawns training processes, or sweeps a configuration space at a size that costs tens of
seconds on 2 cores. They are listed here, each with why, instead of scattered over the files, so
that the fast set stays one reviewable list: a file's tests by file name, single tests by node id.
Move a test here when it takes more than ~10 s on its own (``pytest --durations=30`` shows them).
"""

from __future__ import annotations

import pytest

SLOW_FILES = {
    "test_ray_build.py": "a real local Ray (ray.init ~10 s, ~1 GB) and Ray jobs",
    "test_ray_datasource.py": "a real local Ray",
    "test_ray_train.py": "a real local Ray and a Ray Train TorchTrainer with 2 CPU workers, ~1 min",
    "test_ray_remote_reads.py": "a real local Ray and the S3-protocol server (moto); GETs counted through a relay",
    "test_storage.py": "a real S3-protocol server (moto) on 127.0.0.1",
    "test_storage_cache.py": "a real S3-protocol server (moto) on 127.0.0.1, several processes",
    "test_storage_errors.py": "a real S3-protocol server (moto) on 127.0.0.1",
    "test_storage_faults.py": "a real S3-protocol server (moto) behind a fault proxy; each persistent fault waits out "
                              "3 attempts of 1 s, ~2 min",
    "test_storage_hostile.py": "a real S3-protocol server (moto) on 127.0.0.1; a 200 MiB manifest in the bucket, "
                               "every open mode of a hostile collection, ~1 min",
    "test_storage_stream.py": "a real S3-protocol server (moto) on 127.0.0.1, 200 members fetched one by one",
    "test_storage_stream_images.py": "a real S3-protocol server (moto) on 127.0.0.1, image members streamed",
    "test_storage_resume_plan.py": "a real S3-protocol server (moto): streamed epochs resumed through StatefulDataLoader",
    "test_storage_window.py": "a real S3-protocol server (moto), two shuffled epochs of 200 members streamed, ~2 min",
    "test_storage_shards_stream.py": "a real S3-protocol server (moto); a global index's ~100 shards written, uploaded "
                                     "and streamed by 2 ranks with window=2, 0 and 2 workers, ~2 min",
    "test_storage_nodes_proof.py": "a real S3-protocol server (moto) behind 4 capped proxies: 4 nodes x 2 rank "
                                   "processes x 2 DataLoader workers stream ~150 shards, an epoch and a resume, ~2 min",
    "test_copy.py": "a real S3-protocol server (moto) on 127.0.0.1: packfmt cp round trips, refusals, a stopped upload",
    "test_energon.py": "Megatron-Energon's prepare and loader over exported shards",
    "test_torch_train_example.py": "torchrun with two CPU ranks training a tiny model",
    "test_bench_gpu_train.py": "the GPU benchmark's CPU smoke run (trains a small model)",
    "test_bench_stream_peers.py": "the peers streaming benchmark's smoke run: moto, two proxies, two nodes' reader "
                                  "processes streamed then cached, ~2 min",
}

SLOW_TESTS = {
    "test_fuzz_commands.py::test_every_command_is_total_on_a_thousand_mutations_per_family":
        "1,000 mutated files per family, every command on each in a subprocess, ~0.3 s a case",
    "test_many_members.py::test_a_hundred_thousand_members_read_pack_and_validate_like_one_store":
        "writes, opens, packs and validates 10^5 member stores, minutes",
    "test_torch_dataset.py::test_int32_index_dtype_equals_int64_everywhere": "every option combination, ~50 s",
    "test_torch_fields.py::test_variants_equal_default_everywhere": "every field/dtype variant, ~30 s",
    "test_sources_hf.py::test_cli_format_hf_reads_the_local_cache_and_never_downloads": "HF datasets CLI, ~25 s",
    "test_kernel_bounds.py::test_pack_index_opened_streamed_is_not_read_locally":
        "a real S3-protocol server (moto) on 127.0.0.1: a collection opened streamed",
    "test_shards.py::test_remote_out_is_uploaded_and_reads_the_same":
        "a real S3-protocol server (moto) on 127.0.0.1; shards uploaded, read whole and streamed, ~30 s",
    "test_docs_snippets.py::test_page_runs_whole_with_servers":
        "every block of a guide in order (tens of commands, moto, Ray, torchrun, Energon), 0.5-3 min a guide",
    "test_docs_snippets.py::test_readme_walkthrough": "the README's quick start, then its bucket example on moto",
    "test_mixed_exports.py::test_webdataset_export_through_energon_equals_packed_dataset":
        "Megatron-Energon's prepare and loader over a mixed collection's 362 packs, ~15 s",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: servers, clusters, subprocess training or large sweeps "
                                       "(run by `bash tools/test.sh --slow`; see tests/conftest.py)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        file = item.path.name
        node = f"{file}::{item.originalname if hasattr(item, 'originalname') else item.name}"
        if file in SLOW_FILES or node in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
