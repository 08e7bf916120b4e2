"""Ray Train over packfmt.ray.datasource.read_packs: two TorchTrainer workers step equally, every pack once.

One real ``TorchTrainer`` (2 CPU workers, gloo, a DDP model whose every step all-reduces gradients)
reads two epochs: epoch 0 through Ray Train's own split (``datasets=``: ``streaming_split(2,
equal=True)`` over a deal of a multiple of 2 rows), epoch 1 through each worker's own share
(``read_packs(..., rank=)`` built in the loop). Each worker writes the rows it received to a
``.npz``; the test checks them against ``DistributedPackSampler``'s deal and ``PackedDataset``'s
items. Unequal step counts would hang the DDP all-reduce: the test's time limit turns that into a
failure.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

import packfmt  # noqa: E402
from packfmt.build import build_text  # noqa: E402
from packfmt.packindex import build_pack_index  # noqa: E402
from packfmt.ray.datasource import ROW_KEYS, read_packs  # noqa: E402
from packfmt.torch import DistributedPackSampler, PackedDataset  # noqa: E402

from ray_session import ray_session, time_limit  # noqa: E402,F401

SAMPLE = Path(packfmt.__file__).parent / "sample_data"
pytestmark = [pytest.mark.usefixtures("ray_session", "time_limit"), pytest.mark.xdist_group("ray")]


def _train_loop(config: dict) -> None:
    """One Ray Train worker: two epochs of a DDP step per batch; the rows it got saved for the test."""
    import ray.train
    import torch
    from ray.train.torch import prepare_model

    from packfmt.ray.datasource import read_packs as read

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Embedding(config["vocab"], 4))  # DDP: every backward all-reduces
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in (0, 1):
        if epoch == 0:  # Ray Train's split of the dataset passed to the trainer
            batches = ray.train.get_dataset_shard("epoch0").iter_batches(batch_size=2, batch_format="numpy")
        else:  # this worker's own share of the deal
            own = read(config["store"], "p", num_replicas=world, rank=rank, epoch=1, balance="tokens",
                       packs_per_block=4)
            batches = own.iter_batches(batch_size=2, batch_format="numpy")
        rows, steps = {}, 0
        for batch in batches:
            loss = sum(model(torch.as_tensor(ids)).mean() for ids in batch["input_ids"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            for j in range(len(batch["pack_id"])):
                i = len(rows) // len(ROW_KEYS)
                rows.update({f"{i}/{key}": np.asarray(batch[key][j]) for key in ROW_KEYS})
        np.savez(Path(config["out"]) / f"epoch{epoch}_rank{rank}.npz", steps=np.int64(steps), **rows)


def _received(out: Path, epoch: int, rank: int) -> tuple[int, list[dict]]:
    """(steps, rows in arrival order) a worker saved."""
    with np.load(out / f"epoch{epoch}_rank{rank}.npz", allow_pickle=False) as f:
        count = (len(f.files) - 1) // len(ROW_KEYS)
        return int(f["steps"]), [{key: f[f"{i}/{key}"] for key in ROW_KEYS} for i in range(count)]


def test_torch_trainer_workers_step_equally_over_every_pack_once(tmp_path):
    from ray import cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests/ modules

    store = build_text([SAMPLE / "text.jsonl"], tmp_path / "s", SAMPLE / "tokenizer").path
    build_pack_index(store, capacity=512, name="p")
    ds = PackedDataset(store, "p")
    n = len(ds)
    assert n % 2 == 1  # an odd number of packs: the deal over 2 workers pads one
    vocab = int(max(int(ds[i]["input_ids"].max()) for i in range(n))) + 1
    out = tmp_path / "out"
    out.mkdir()
    trainer = TorchTrainer(
        _train_loop, train_loop_config={"store": str(store), "out": str(out), "vocab": vocab},
        # half a CPU a worker: a worker holding a whole CPU of the 2 leaves the read tasks none (they wait forever)
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(storage_path=str(tmp_path / "runs"), name="packs"),
        datasets={"epoch0": read_packs(store, "p", num_replicas=2, epoch=0, packs_per_block=3)})
    trainer.fit()

    for epoch in (0, 1):
        sampler = DistributedPackSampler(ds, 2, 0, balance="tokens" if epoch else "none")
        deal = sampler.assignment(epoch)
        assert deal.shape == ((n + 1) // 2, 2)
        got = [_received(out, epoch, rank) for rank in (0, 1)]
        steps = [s for s, _ in got]
        assert steps[0] == steps[1] == -(-deal.shape[0] // 2)  # equal steps: batches of 2 rows
        ids = [[int(r["pack_id"]) for r in rows] for _, rows in got]
        assert len(ids[0]) == len(ids[1]) == n // 2 + 1
        # every pack once, plus the declared padding: the epoch's first pack
        assert sorted(ids[0] + ids[1]) == sorted(deal.reshape(-1).tolist())
        assert sorted(set(ids[0] + ids[1])) == list(range(n))
        if epoch == 1:  # read per rank: exactly the sampler's packs, in its order
            assert ids == [deal[:, 0].tolist(), deal[:, 1].tolist()]
        for _, rows in got:
            for row in rows:
                item = ds[int(row["pack_id"])]
                for key in ROW_KEYS:
                    assert np.array_equal(row[key], item[key].numpy()), key
