"""The loss's two flags, --label-smoothing and --class-weights balanced. The loss stays
a weighted mean however a batch is split (so accumulation windows and ranks stay
exact), the weights are scikit-learn's "balanced" ones and travel in the checkpoint,
and evaluate.py reports the weighted loss training logged. These runs use the built-in
data (--data-dir ""), whatever pytest's --data-dir: validation must see the split
evaluate.py reads."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.utils.class_weight import compute_class_weight
from torch.optim.optimizer import register_optimizer_step_pre_hook

import data
import evaluate
import train
from conftest import load, run_main

LOSS_FLAGS = ["--data-dir", "", "--class-weights", "balanced", "--label-smoothing", 0.1]


def test_the_loss_is_the_weighted_mean_however_the_batch_is_split(
    tmp_path, monkeypatch
):
    """compute_loss's sums over two unequal parts of a batch, divided by the sum of the
    parts' loss_count, are F.cross_entropy's own weighted, smoothed mean over the whole
    batch: what the loop does over an accumulation window and over the ranks."""
    seen = []
    compute_loss = train.compute_loss

    def recording_compute_loss(model, batch, loss_args):
        seen.append((model, batch, loss_args))
        return compute_loss(model, batch, loss_args)

    monkeypatch.setattr(train, "compute_loss", recording_compute_loss)
    run_main(tmp_path, "--max-steps", 1, *LOSS_FLAGS)
    ((model, (inputs, targets), loss_args),) = seen
    assert loss_args["label_smoothing"] == 0.1 and loss_args["weight"] is not None
    # weights far from 1, so that a count that ignores them is far off
    generator = torch.Generator().manual_seed(0)
    weight = 0.1 + 4 * torch.rand(len(loss_args["weight"]), generator=generator)
    loss_args = {**loss_args, "weight": weight}
    model.eval()  # no dropout: the parts and the whole see the same network
    n = len(targets) // 3
    with torch.no_grad():
        parts = [
            compute_loss(model, (inputs[:n], targets[:n]), loss_args),
            compute_loss(model, (inputs[n:], targets[n:]), loss_args),
        ]
        logits = model(inputs).float()
    loss = sum(s for s, _ in parts) / sum(count for _, count in parts)
    expected = F.cross_entropy(logits, targets, weight=weight, label_smoothing=0.1)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    # the comparison can fail: the mean of the parts' means is another number
    mean_of_means = sum(s / count for s, count in parts) / 2
    assert abs(mean_of_means.item() - expected.item()) > 1e-4 * expected.item()


def test_an_update_follows_the_weighted_mean_over_its_samples(tmp_path, monkeypatch):
    """The first update's gradient is the gradient of F.cross_entropy's weighted,
    smoothed mean over every sample of its micro-batches, computed here from the
    batches the loop used: the loop divides by the sum of the weights, never by the
    number of samples."""
    calls, gradients = [], {}
    compute_loss = train.compute_loss

    def recording_compute_loss(model, batch, loss_args):
        if not gradients:  # the micro-batches of the first update
            state = (copy.deepcopy(model), batch, loss_args, torch.get_rng_state())
            calls.append((model, *state))
        return compute_loss(model, batch, loss_args)

    def record_gradients(optimizer, args, kwargs):
        if not gradients:
            live = calls[0][0]
            gradients.update({n: p.grad for n, p in live.named_parameters()})

    monkeypatch.setattr(train, "compute_loss", recording_compute_loss)
    hook = register_optimizer_step_pre_hook(record_gradients)
    micro_batches = 1  # per update
    flags = ["--max-steps", 1, "--max-grad-norm", 0, *LOSS_FLAGS]
    try:
        run_main(tmp_path, *flags)
    finally:
        hook.remove()
    model = calls[0][1]  # the weights before the update
    total, weights = 0.0, 0.0
    for _, _, (inputs, targets), loss_args, rng_state in calls:
        weight = loss_args["weight"]
        torch.set_rng_state(rng_state)  # the dropout masks the loop drew
        logits = model(inputs).float()
        total += F.cross_entropy(
            logits, targets, weight=weight, label_smoothing=0.1, reduction="sum"
        )
        weights += weight[targets].sum()
    assert len(calls) == micro_batches
    (total / weights).backward()
    compared = 0
    for name, parameter in model.named_parameters():
        if parameter.grad is None:
            assert gradients[name] is None, f"{name} got a gradient it should not have"
            continue
        scale = parameter.grad.norm().clamp(min=1e-30)  # some gradients are all 0
        difference = (gradients[name] - parameter.grad).norm() / scale
        assert difference < 1e-5, f"{name}: the gradients differ by {difference:.2e}"
        compared += 1
    assert compared, "no gradient was compared"


def training_labels(cfg) -> list[int]:
    """The training split's class ids, as data.py reads them."""
    train_set, _, _ = data.build_datasets(cfg)
    return train_set.labels.tolist()  # the built-in images


def test_balanced_weights_are_scikit_learns_and_travel_in_the_checkpoint(tmp_path):
    run_main(tmp_path / "none", "--max-steps", 1, "--data-dir", "")
    assert load(tmp_path / "none")["data"]["class_weights"] is None
    run_main(tmp_path / "balanced", "--max-steps", 1, *LOSS_FLAGS)
    checkpoint = load(tmp_path / "balanced")
    names = checkpoint["data"]["classes"]
    labels = training_labels(train.Config(**checkpoint["config"]))
    classes = np.arange(len(names))
    expected = compute_class_weight("balanced", classes=classes, y=np.array(labels))
    weights = checkpoint["data"]["class_weights"]
    assert weights == pytest.approx(expected.tolist(), rel=1e-12)
    assert (
        len(set(weights)) > 1
    ), "the built-in samples are not balanced: weights differ"


def test_evaluate_reports_the_weighted_loss_training_logged(tmp_path):
    run_main(tmp_path, "--max-steps", 2, *LOSS_FLAGS)
    logged = load(tmp_path, "best.pt")["metrics"]
    results = evaluate.main([str(tmp_path / "best.pt"), "--device", "cpu"])
    assert results["loss"] == pytest.approx(logged["val_loss"], rel=1e-12)


def test_balanced_weights_need_every_class_in_the_training_split(tmp_path):
    with pytest.raises(SystemExit) as stopped:
        run_main(tmp_path, "--synthetic-train-size", 1, *LOSS_FLAGS)
    assert "--class-weights balanced: no training sample is class" in str(stopped.value)
    assert not (tmp_path / "metrics.csv").exists()
