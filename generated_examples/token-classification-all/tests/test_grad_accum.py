"""[grad-accum] K micro-batches of b make the same update as one batch of K*b, and the
schedule, `step` and the logs count optimizer updates, never micro-batches.

Three runs of your train.main() see the same samples in the same order: --batch-size 8
--grad-accum-steps 4 (the accumulated run), --batch-size 32 (the big-batch run) and
--batch-size 8 (the micro-batch run). 72 samples make 9 micro-batches of 8 per epoch, so
the accumulated run's last window holds a single micro-batch: its update must be that
micro-batch's own, i.e. scaled by the window's real size, not by 4 micro-batches. An
update is the same when its gradient and its learning rate are; UpdateRecorder records
both at every optimizer.step().

The learning rate is tiny, so the weights stay where they started and every update's
gradient is compared at the same weights. A ReLU makes a gradient jump where its input
crosses zero; after a few real updates the last bit of float32 rounding, which differs
between two ways of batching, could decide such a jump and the runs would drift apart
for reasons that have nothing to do with the loop. See
batch_independent() in conftest.py for why dropout is off here.
"""

import pytest

from conftest import (
    UpdateRecorder,
    batch_independent,
    load,
    read_metrics,
    relative_difference,
    run_main,
)

K, B = 4, 8
# far above float32 rounding (~1e-7), far below any scaling mistake
FLOAT32_NOISE = 1e-4
# 2 epochs of 3 updates; no clipping: the gradients are compared as they are
ARGS = ["--synthetic-train-size", 72, "--epochs", 2, "--max-grad-norm", 0]
ARGS += ["--lr", 1e-12]
# weighted and smoothed: a window's loss is the weighted mean over all its tokens
ARGS += ["--class-weights", "balanced", "--label-smoothing", 0.1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grad-accum")
    with pytest.MonkeyPatch.context() as monkeypatch:
        args = ARGS + batch_independent(monkeypatch.setattr)
        with UpdateRecorder() as accumulated:
            windows = ["--batch-size", B, "--grad-accum-steps", K]
            run_main(tmp / "accumulated", *args, *windows)
        with UpdateRecorder() as one_batch:
            run_main(tmp / "one-batch", *args, "--batch-size", K * B)
        with UpdateRecorder() as micro_batches:
            run_main(tmp / "micro-batches", *args, "--batch-size", B)
    return tmp, accumulated, one_batch, micro_batches


def test_k_micro_batches_give_the_gradient_of_one_batch_of_k_times_b(runs):
    _, accumulated, one_batch, _ = runs
    assert len(accumulated.grads) == len(one_batch.grads) == 6, "expected 6 updates"
    for update, (a, b) in enumerate(
        zip(accumulated.grads, one_batch.grads, strict=True), 1
    ):
        difference = relative_difference(a, b)
        message = f"update {update}: the gradients differ by {difference:.2e}"
        assert difference < FLOAT32_NOISE, message


def test_shorter_last_window_is_scaled_by_its_real_size(runs):
    _, accumulated, _, micro_batches = runs
    assert len(micro_batches.grads) == 18, "expected 9 updates per epoch"
    # update 3 (6) of the accumulated run is micro-batch 9 (18) alone
    for update, micro_batch in ((3, 9), (6, 18)):
        a, b = accumulated.grads[update - 1], micro_batches.grads[micro_batch - 1]
        difference = relative_difference(a, b)
        message = f"update {update}: the gradient differs by {difference:.2e}"
        assert difference < FLOAT32_NOISE, message


def test_schedule_step_and_logs_count_updates_not_micro_batches(runs):
    tmp, accumulated, one_batch, _ = runs
    assert accumulated.lrs == one_batch.lrs, "the learning rate of each update differs"
    rows = read_metrics(tmp / "accumulated")[0]
    big_batch_rows = read_metrics(tmp / "one-batch")[0]
    assert [row["step"] for row in rows] == list(range(1, 7))
    assert [row["step"] for row in big_batch_rows] == list(range(1, 7))
    assert [row["lr"] for row in rows] == [row["lr"] for row in big_batch_rows]
    # the logged loss is the loss of the whole window
    for row, big in zip(rows, big_batch_rows, strict=True):
        assert abs(row["train_loss"] - big["train_loss"]) < FLOAT32_NOISE, (row, big)
    assert load(tmp / "accumulated")["step"] == 6
