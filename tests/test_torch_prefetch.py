"""``packfmt.torch.prefetch.prefetch(ds, order, lookahead=...)``: how far ahead to prefetch is ``lookahead=``;
its old name ``window=`` (which the samplers use for their shuffle window of members, READER.md §6) still
works for one version, with a ``DeprecationWarning`` saying to use ``lookahead=``, and plans the same.

What the plan does with a streamed collection is tested against a real S3-protocol server
(``tests/test_storage_stream.py``, slow); here, the parameter on a local collection, whose reads
ignore the plan.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from packfmt.packindex import build_pack_index
from packfmt.torch import DistributedPackSampler, PackedDataset
from packfmt.torch.prefetch import DEFAULT_LOOKAHEAD, prefetch
from packfmt.torch.testing import write_random_collection


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root, _, _ = write_random_collection(tmp_path_factory.mktemp("prefetch"), [5, 4, 6])
    build_pack_index(root, capacity=48, name="p")
    return root


@pytest.fixture
def ds(root) -> PackedDataset:
    return PackedDataset(root, "p")


def _plan(ds) -> tuple:
    order, batch_size, lookahead, threads, _ = ds._stream_plan
    return order.tolist(), batch_size, lookahead, threads


def test_lookahead_is_the_name_and_window_warns_and_plans_the_same(ds, root):
    order = DistributedPackSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=1).epoch_indices()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name and the default warn of nothing
        prefetch(ds, order, batch_size=2, lookahead=7)
        new = _plan(ds)
        prefetch(ds, order)
        assert _plan(ds)[2] == DEFAULT_LOOKAHEAD == 4096
    with pytest.warns(DeprecationWarning, match=r"window= is renamed lookahead=.*use lookahead=") as caught:
        prefetch(ds, order, batch_size=2, window=7)
    assert _plan(ds) == new == (list(order), 2, 7, None)  # threads: None, adaptive
    assert caught[0].filename == __file__  # points at the caller's line
    plain = PackedDataset(root, "p")  # a local read ignores the plan
    assert [x["input_ids"].tolist() for x in ds.__getitems__(order)] == [plain[i]["input_ids"].tolist() for i in order]


@pytest.mark.parametrize("kw,error", [
    ({"lookahead": 7, "window": 7}, TypeError),  # one parameter under two names
    ({"lookahead": 0}, ValueError),
    ({"lookahead": 2.5}, ValueError),
    ({"lookahead": True}, ValueError),
    ({"window": 0}, ValueError),  # the old name checked as the new one (after its warning)
    ({"threads": 0}, ValueError),
])
def test_bad_lookahead_is_refused_naming_it(ds, kw, error):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(error, match="lookahead|threads"):
            prefetch(ds, np.arange(len(ds)), **kw)
