"""[amp] fp16 with a GradScaler trains; an update the scaler skips moves neither the
schedule nor `step`; gradients are unscaled before they are clipped. fp16 autocast and
the GradScaler run on the CPU too, so these tests need no GPU."""

import math

import pytest
import torch

import train
from conftest import UpdateRecorder, load, read_metrics, run_main


def test_fp16_with_grad_scaler_trains(tmp_path, monkeypatch):
    scalers = []  # every GradScaler train.py creates
    grad_scaler = torch.amp.GradScaler

    def recording_grad_scaler(*args, **kwargs):
        scalers.append(grad_scaler(*args, **kwargs))
        return scalers[-1]

    monkeypatch.setattr(torch.amp, "GradScaler", recording_grad_scaler)
    args = ["--synthetic-train-size", 32, "--epochs", 3, "--warmup-steps", 2]
    run_main(tmp_path, "--precision", "fp16", *args)
    assert any(s.is_enabled() for s in scalers), "fp16 ran without a GradScaler"
    train_rows, _ = read_metrics(tmp_path)
    assert [row["step"] for row in train_rows] == list(range(1, 13)), "updates missing"
    losses = [row["train_loss"] for row in train_rows]
    assert all(math.isfinite(loss) for loss in losses), losses
    assert sum(losses[-4:]) < 0.9 * sum(losses[:4]), f"no progress: {losses}"
    weights = load(tmp_path)["model"].values()
    floats = [w.dtype for w in weights if w.is_floating_point()]
    assert set(floats) == {torch.float32}, "parameters must stay float32 under autocast"


def test_skipped_fp16_update_leaves_schedule_and_step_unmoved(tmp_path, monkeypatch):
    # The 3rd backward pass gets an infinite gradient, as an fp16 overflow does: the
    # GradScaler skips that update. The run must still make 4 real updates, with the
    # learning rates of 4 consecutive steps (those of an fp32 run).
    backward_passes = []
    build_model = train.build_model

    def overflow_on_third_pass(grad):
        backward_passes.append(1)
        return grad * math.inf if len(backward_passes) == 3 else grad

    def build_model_that_overflows_once(cfg, data_info):
        model = build_model(cfg, data_info)
        next(model.parameters()).register_hook(overflow_on_third_pass)
        return model

    with UpdateRecorder() as fp32:
        run_main(tmp_path / "fp32", "--precision", "fp32", "--max-steps", 4)
    monkeypatch.setattr(train, "build_model", build_model_that_overflows_once)
    with UpdateRecorder() as fp16:
        run_main(tmp_path / "fp16", "--precision", "fp16", "--max-steps", 4)
    assert len(backward_passes) == 5, "expected 4 updates and the skipped one"
    assert len(fp16.lrs) == 4, f"{len(fp16.lrs)} optimizer steps for 4 updates"
    assert fp16.lrs == fp32.lrs, "the schedule moved on the skipped update"
    train_rows, _ = read_metrics(tmp_path / "fp16")
    assert [row["step"] for row in train_rows] == [1, 2, 3, 4]
    assert [row["lr"] for row in train_rows] == fp32.lrs
    weights = load(tmp_path / "fp16")["model"].values()
    assert all(torch.isfinite(w).all() for w in weights), "inf reached the weights"


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_clipping_acts_on_unscaled_gradients(tmp_path, precision):
    # The true gradient norms here are far above 0.01, so every update is clipped to
    # norm 0.01. Clipping the scaled gradients instead leaves 0.01 / loss scale (about
    # 1.5e-7).
    max_norm = 0.01
    args = ["--precision", precision, "--max-steps", 3, "--max-grad-norm", max_norm]
    with UpdateRecorder() as updates:
        run_main(tmp_path, *args)
    norms = [float(grad.norm()) for grad in updates.grads]
    assert len(norms) == 3
    for update, norm in enumerate(norms, 1):
        message = f"update {update}: gradient norm {norm:.3g}, expected {max_norm}"
        assert abs(norm - max_norm) < 1e-3 * max_norm, message
