"""[fsdp] Two processes (gloo on the CPU, started by a real torchrun) with batch b make
the same updates as one process with batch 2b, and validation counts every sample once
across ranks.

An update is the same when its gradient and its learning rate are: rank 0 records both
at every optimizer.step() (tests/fsdp_worker.py), and so does the single process. The
learning rate is tiny, so the weights stay where they started and each update's
gradient is compared at the same weights: a ReLU makes a gradient jump where its input
crosses zero, and after a few real updates float32 rounding, which differs between one
and two processes, could decide such a jump. See
batch_independent() in conftest.py for why BatchNorm is kept in eval mode and
augmentation off.
"""

import os
import subprocess
import sys

import pytest
import torch

from conftest import (
    PROJECT,
    TINY,
    UpdateRecorder,
    batch_independent,
    read_metrics,
    relative_difference,
    run_main,
)

# far above float32 rounding (~1e-7), far below any scaling mistake
FLOAT32_NOISE = 1e-4
# 15 validation samples: shards of 8 and 7; a padded shard would count a sample twice
ARGS = ["--synthetic-val-size", "15", "--epochs", "2", "--lr", "1e-12"]
# weighted and smoothed: an update is the weighted mean over every rank's samples
ARGS += ["--class-weights", "balanced", "--label-smoothing", "0.1"]
# [grad-accum] windows of 2: no_sync on all but a window's last micro-batch
ARGS += ["--grad-accum-steps", "2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    worker = [str(PROJECT / "tests" / "fsdp_worker.py"), str(tmp / "updates.pt")]
    flags = [*TINY, *ARGS, "--batch-size", "8", "--out-dir", str(tmp / "two-ranks")]
    ranks = subprocess.run(
        [*torchrun, "--nproc-per-node", "2", *worker, *flags],
        cwd=PROJECT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = f"{ranks.stdout[-3000:]}\n{ranks.stderr[-3000:]}"
    assert ranks.returncode == 0, f"torchrun failed:\n{output}"
    two_ranks = torch.load(tmp / "updates.pt", weights_only=True)
    with pytest.MonkeyPatch.context() as monkeypatch:
        flags = batch_independent(monkeypatch.setattr, augment=False)
        with UpdateRecorder() as one_process:
            run_main(tmp / "one-process", *ARGS, "--batch-size", "16", *flags)
    return tmp, two_ranks, one_process


def test_two_ranks_make_the_updates_of_one_process_with_twice_the_batch(runs):
    tmp, two_ranks, one_process = runs
    assert len(two_ranks["grads"]) == len(one_process.grads) > 0
    assert two_ranks["lrs"] == one_process.lrs, "the lr of each update differs"
    for update, (a, b) in enumerate(
        zip(two_ranks["grads"], one_process.grads, strict=True), 1
    ):
        difference = relative_difference(a, b)
        message = f"update {update}: the gradients differ by {difference:.2e}"
        assert difference < FLOAT32_NOISE, message
    rows = [read_metrics(tmp / name)[0] for name in ("two-ranks", "one-process")]
    assert [r["step"] for r in rows[0]] == [r["step"] for r in rows[1]]
    # the logged loss is the loss of the whole update, over both ranks
    for a, b in zip(*rows, strict=True):
        assert abs(a["train_loss"] - b["train_loss"]) < FLOAT32_NOISE * b["train_loss"]


def test_validation_counts_every_sample_once_across_ranks(runs):
    tmp, _, _ = runs
    two_ranks = read_metrics(tmp / "two-ranks")[1]
    one_process = read_metrics(tmp / "one-process")[1]
    assert len(two_ranks) == len(one_process) == 2
    for a, b in zip(two_ranks, one_process, strict=True):
        for name in (name for name in b if name.startswith("val_")):
            assert abs(a[name] - b[name]) < FLOAT32_NOISE * max(1, b[name]), name
