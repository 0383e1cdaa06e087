"""[early-stopping] Training stops after --patience validations without an
improvement of more than --min-delta in --monitor (in the --mode direction); best.pt
holds the best epoch.

Validation returns scripted numbers here (train.evaluate is replaced), so the stop epoch
is known in advance; everything else is your loop."""

import pytest

import train
from conftest import load, read_metrics, run_main

METRICS = ["val_loss", "val_acc"]
CASES = {
    # a score equal to the best is no improvement: epochs 3 and 4 are the 2 bad ones
    "min-patience-2": (
        ["--monitor", "val_loss", "--mode", "min", "--patience", 2],
        [1.0, 0.8, 0.85, 0.8, 0.1, 0.1],
        (4, 2),  # (stop epoch, best epoch)
    ),
    # +0.02 is below --min-delta 0.05: epoch 3 is the 1 bad one
    "max-min-delta": (
        ["--monitor", "val_acc", "--mode", "max", "--patience", 1, "--min-delta", 0.05],
        [0.5, 0.6, 0.62, 0.9, 0.9, 0.9],
        (3, 2),
    ),
    # always improving: never stops early
    "improving": (
        ["--monitor", "val_loss", "--mode", "min", "--patience", 1],
        [0.9, 0.8, 0.7, 0.6, 0.5, 0.4],
        (6, 6),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_training_stops_after_patience_epochs_without_improvement(
    tmp_path, monkeypatch, case
):
    flags, scores, (stop_epoch, best_epoch) = CASES[case]
    validations = []

    def scripted_evaluate(*args, **kwargs):
        metrics = dict.fromkeys(METRICS, 0.5)
        metrics[flags[1]] = scores[len(validations)]
        validations.append(metrics)
        return metrics

    monkeypatch.setattr(train, "evaluate", scripted_evaluate)
    # 2 updates per epoch
    run_main(tmp_path, "--synthetic-train-size", 16, "--epochs", 6, *flags)
    message = f"stopped after epoch {len(validations)}, expected {stop_epoch}"
    assert len(validations) == stop_epoch, message
    assert load(tmp_path, "best.pt")["epoch"] == best_epoch
    _, val_rows = read_metrics(tmp_path)
    assert [row["epoch"] for row in val_rows] == list(range(1, stop_epoch + 1))
