"""[resume] A run stopped by SIGTERM in the middle of an epoch and started again ends
bitwise equal to a run never stopped; its checkpoints load with weights_only=True.

The stop is deterministic: SIGTERM is sent from inside the run just before its N-th
update, as a cluster scheduler would send it; train.py must save at the next update
boundary and exit with 75. The second run then resumes from last.pt (--resume auto,
the default)."""

import os
import signal

import pytest

import train
from conftest import UpdateRecorder, assert_bitwise_equal, load, read_metrics, run_main

K = 2  # [grad-accum] micro-batches per update: the stop falls between windows
UPDATES_PER_EPOCH = 64 // 8 // K  # TINY: 64 samples in batches of 8
STOP_AT = UPDATES_PER_EPOCH + UPDATES_PER_EPOCH // 2  # the middle of epoch 2
# [ddp] the ranks agree on a stop in an update's all-reduce: a signal that
# arrives after update N's (here: at its optimizer step) travels in update N + 1's, and
# the run stops after it (--log-every 1: every update reads the flags)
STOPPED_AT = STOP_AT + 1
ARGS = ["--epochs", 3, "--checkpoint-every", 1000]
ARGS += ["--grad-accum-steps", K]  # [grad-accum]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    saved = [(s, signal.getsignal(s)) for s in (signal.SIGTERM, signal.SIGUSR1)]

    def stop_before(update):
        if update == STOP_AT:
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        run_main(tmp / "uninterrupted", *ARGS)
        with UpdateRecorder(on_update=stop_before), pytest.raises(SystemExit) as stop:
            run_main(tmp / "resumed", *ARGS)
        stopped_state = load(tmp / "resumed", "last.pt")
        run_main(tmp / "resumed", *ARGS)  # continues from last.pt
    finally:
        for signum, handler in saved:
            signal.signal(signum, handler)
    return tmp, stop.value.code, stopped_state


def test_sigterm_saves_mid_epoch_and_exits_75(runs):
    _, exit_code, stopped_state = runs
    assert exit_code == 75
    assert stopped_state["step"] == STOPPED_AT
    batches = stopped_state["batches_done"]
    assert 0 < batches < UPDATES_PER_EPOCH * K, f"stopped after batch {batches}"


def test_stopped_and_resumed_run_ends_bitwise_equal_to_uninterrupted_run(runs):
    tmp, _, _ = runs
    resumed, uninterrupted = load(tmp / "resumed"), load(tmp / "uninterrupted")
    assert_bitwise_equal(resumed["model"], uninterrupted["model"])

    def logged(name):
        train_rows, val_rows = read_metrics(tmp / name)
        for row in train_rows:
            row.pop("samples_per_s", None)  # a timing
        return train_rows, val_rows

    # the same numbers logged: every update's lr and loss, every validation
    assert logged("resumed") == logged("uninterrupted")


def test_checkpoints_load_with_weights_only_and_fit_the_model(runs):
    tmp, _, _ = runs
    last = load(tmp / "resumed", "last.pt")  # weights_only=True: tensors, plain data
    keys = ["model", "optimizer", "scheduler", "step", "batches_done", "rng", "config"]
    assert not set(keys) - set(last), f"last.pt lacks {set(keys) - set(last)}"
    for name in ("last.pt", "best.pt", "final.pt"):
        checkpoint = load(tmp / "resumed", name)
        cfg = train.Config(**checkpoint["config"])
        model = train.build_model(cfg, checkpoint["data"])
        model.load_state_dict(checkpoint["model"])  # strict: every key and shape fits
