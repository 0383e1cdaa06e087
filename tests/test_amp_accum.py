"""Features `amp` and `grad-accum` (issue 3), proven by running a generated train.py on CPU.

Every training run is a fork of ONE driver process that imported torch once (`import torch` costs
several seconds here); each child imports the project's own train.py, may install one probe (an
injected inf gradient, a NaN output, a recorder of the gradients the optimizer receives) and runs
train.main(args). The parent records each child's exit status. The child also writes final.pt
(loaded with weights_only=True) and the recorded gradients as JSON lists of floats (float32 values
are exact in JSON), so this test process never imports torch.

The model is the text classifier with --dropout 0: it has no BatchNorm, whose running statistics
depend on the micro-batch size, so K micro-batches of b and one batch of K*b are the same
computation up to float rounding (padding is masked out of attention and pooling). (The image
task's BatchNorm would make that comparison inexact by design, not by a bug.)
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import render_project

pytestmark = pytest.mark.slow

DRIVER = r'''
import json, os, sys, traceback

import torch  # imported once, before any fork

# The first optimizer imports torch._dynamo (seconds): do it here once, not in every child.
torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
from torch.optim.optimizer import register_optimizer_step_pre_hook


def install_probe(train, probe, log):
    kind = probe["kind"]
    if kind == "record_grads":  # the gradients each optimizer.step() receives (after clipping)
        recorded = []

        def pre_hook(optimizer, args, kwargs):
            params = [p for group in optimizer.param_groups for p in group["params"]]
            recorded.append(torch.cat([
                (p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten().double()
                for p in params
            ]))
        register_optimizer_step_pre_hook(pre_hook)
        def finish():
            with open(log + ".grads.json", "w") as f:
                json.dump([g.tolist() for g in recorded], f)
        return finish
    build_model, calls = train.build_model, [0]
    if kind == "record_init":  # the weights before the first update
        def build_and_record(*args, **kwargs):
            model = build_model(*args, **kwargs)
            with open(log + ".init.json", "w") as f:
                json.dump({k: {"values": v.flatten().tolist()} for k, v in model.state_dict().items()}, f)
            return model
        train.build_model = build_and_record
        return lambda: None
    # Both other probes act at the n-th training forward pass (micro-batch), counted from 1.

    def build_model_with_probe(*args, **kwargs):
        model = build_model(*args, **kwargs)

        def hook(module, inputs, output):
            if not module.training:
                return None
            calls[0] += 1
            if calls[0] != probe["n"]:
                return None
            if kind == "inf_grad":  # finite loss, one infinite gradient: an fp16 overflow
                output.register_hook(lambda grad: torch.full_like(grad, float("inf")))
                return None
            if kind == "nan_output":  # a non-finite loss
                return output * float("nan")
            raise ValueError(kind)
        model.register_forward_hook(hook)
        return model
    train.build_model = build_model_with_probe
    return lambda: None


def child(job):
    for fd, suffix in ((1, ".out"), (2, ".err")):
        os.dup2(os.open(job["log"] + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.path.insert(0, job["project"])
    os.chdir(job["project"])
    import train

    finish, code = (lambda: None), 0
    try:
        if job.get("probe"):
            finish = install_probe(train, job["probe"], job["log"])
        metrics = train.main(job["args"])
        with open(job["log"] + ".json", "w") as f:
            json.dump(metrics, f)
    except SystemExit as exc:  # what the interpreter does with an uncaught SystemExit
        if isinstance(exc.code, int) or exc.code is None:
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finish()
    final = os.path.join(job["args"][job["args"].index("--out-dir") + 1], "final.pt")
    if os.path.exists(final):
        state = torch.load(final, map_location="cpu", weights_only=True)
        state["model"] = {k: {"dtype": str(v.dtype), "values": v.flatten().tolist()} for k, v in state["model"].items()}
        with open(job["log"] + ".final.json", "w") as f:
            json.dump({"step": state["step"], "model": state["model"]}, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main():
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    statuses = []
    for job in jobs:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                child(job)
            finally:
                os._exit(99)
        statuses.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    with open(sys.argv[2], "w") as f:
        json.dump(statuses, f)


main()
'''

TRAIN_SIZE, WARMUP, EPOCHS, LR = 52, 3, 2, 1e-3
COMMON = [
    "--synthetic-train-size", str(TRAIN_SIZE), "--synthetic-val-size", "8",
    "--encoder", "transformer", "--embed-dim", "32", "--num-heads", "2", "--num-layers", "1",
    "--max-length", "16", "--dropout", "0", "--warmup-steps", str(WARMUP), "--epochs", str(EPOCHS), "--lr", str(LR),
    "--log-every", "1",
]


def micro(batch, accum, precision="fp32"):
    return COMMON + ["--batch-size", str(batch), "--grad-accum-steps", str(accum), "--precision", precision]


# 52 samples in micro-batches of 4: 13 per epoch, not a multiple of K=4, so each epoch has 4 updates
# and ends with a window of ONE micro-batch (4 samples); batches of 16: 4 per epoch, the last of 4.
UPDATES_PER_EPOCH = 4
# Clipping far below the gradient norm, so every update is clipped.
CLIP = micro(4, 4) + ["--max-grad-norm", "0.01", "--max-steps", "2"]
RECORD = {"kind": "record_grads"}
# name: (project, args, probe). Projects: "amp+accum" (the features under test); "plain" (no
# features: one batch, mean loss, the loop as a user would write it); "no-unscale" (amp+accum with
# the scaler.unscale_ line deleted).
JOBS = {
    "accum-4x4": ("amp+accum", micro(4, 4), {"kind": "record_init"}),
    "plain-batch-16": ("plain", COMMON + ["--batch-size", "16"], None),
    "batch-4": ("amp+accum", micro(4, 1), None),
    "accum-4x4-max-steps": ("amp+accum", micro(4, 4) + ["--max-steps", "5"], None),
    "fp16": ("amp+accum", micro(4, 4, "fp16"), None),
    "bf16": ("amp+accum", micro(4, 4, "bf16"), None),
    # micro-batch 10 is the 2nd of the 3rd window: update 3 overflows
    "fp16-overflow": ("amp+accum", micro(4, 4, "fp16"), {"kind": "inf_grad", "n": 10}),
    # micro-batch 6 is in the 2nd window; no scaler (fp32, bf16): the run must stop there
    "fp32-nan-loss": ("amp+accum", micro(4, 4), {"kind": "nan_output", "n": 6}),
    "bf16-nan-loss": ("amp+accum", micro(4, 4, "bf16"), {"kind": "nan_output", "n": 6}),
    "clip-fp32": ("amp+accum", CLIP, RECORD),
    "clip-fp16": ("amp+accum", CLIP + ["--precision", "fp16"], RECORD),  # the last --precision wins
    "clip-fp16-without-unscale": ("no-unscale", CLIP + ["--precision", "fp16"], RECORD),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("amp_accum")
    projects = {
        "amp+accum": render_project(tmp / "amp-accum", "text-classification", ["amp", "grad-accum"]),
        "plain": render_project(tmp / "plain", "text-classification", []),
    }
    # The same project with the unscale_ call deleted: the clipping test must catch it.
    mutant = projects["no-unscale"] = Path(shutil.copytree(projects["amp+accum"], tmp / "no-unscale"))
    source, count = re.subn(r"scaler\.unscale_\(\s*optimizer\s*\)", "pass", (mutant / "train.py").read_text())
    assert count == 1
    (mutant / "train.py").write_text(source)

    names, jobs = list(JOBS), []
    for name, (project, args, probe) in JOBS.items():
        jobs.append({"project": str(projects[project]), "args": args + ["--out-dir", str(tmp / name)], "probe": probe, "log": str(tmp / f"{name}-log")})
    (tmp / "driver.py").write_text(DRIVER)
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    # One intra-op thread: identical arithmetic in every run, and no spinning threads on a busy machine.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(tmp / "driver.py"), str(tmp / "jobs.json"), str(tmp / "statuses.json")],
        capture_output=True, text=True, timeout=1200, env=env, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    statuses = json.loads((tmp / "statuses.json").read_text())
    result = {}
    for name, status, job in zip(names, statuses, jobs):
        log, out = job["log"], Path(job["args"][job["args"].index("--out-dir") + 1])
        rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines())) if (out / "metrics.csv").exists() else []
        result[name] = {
            "status": status,
            "out": out,
            "stdout": Path(f"{log}.out").read_text(),
            "stderr": Path(f"{log}.err").read_text(),
            "metrics": json.loads(Path(f"{log}.json").read_text()) if Path(f"{log}.json").exists() else None,
            "train_rows": [r for r in rows if r["train_loss"]],
            "grads": Path(f"{log}.grads.json"),
            "final": Path(f"{log}.final.json"),
            "init": Path(f"{log}.init.json"),
        }
    return result


def ok(run):
    assert run["status"] == 0, f"exit status {run['status']}\n{run['stdout'][-2000:]}\n{run['stderr'][-3000:]}"
    return run


def weights(run):
    """final.pt: {"step": N, "model": {name: {"dtype": ..., "values": [floats]}}}."""
    return json.loads(ok(run)["final"].read_text())


def norm(values):
    return math.sqrt(sum(v * v for v in values))


def relative_difference(values, reference):
    return norm([a - b for a, b in zip(values, reference, strict=True)]) / max(norm(reference), 1e-12)


def comparable(key, values):
    """Drop the attention's key bias: its gradient is exactly zero in exact arithmetic (adding q.b_k
    to every score of a query's row does not change the softmax), so its values are rounding noise
    that AdamW normalises to lr-sized steps, different in any two runs."""
    if key.endswith("self_attn.in_proj_bias"):
        width = len(values) // 3
        return values[:width] + values[2 * width :]
    return values


def largest_difference(model, reference):
    """(largest relative difference over the tensors, its name)."""
    assert model.keys() == reference.keys()
    return max(
        (relative_difference(comparable(k, model[k]["values"]), comparable(k, reference[k]["values"])), k)
        for k in reference
    )


def update_difference(model, reference, initial):
    """How far one training's total update (final - initial weights, all tensors) is from another's,
    relative to the size of the other."""
    def update(m):
        return [a - b for k in sorted(initial) for a, b in zip(comparable(k, m[k]["values"]), comparable(k, initial[k]["values"]))]
    mine, theirs = update(model), update(reference)
    return relative_difference(mine, theirs)


def train_losses(run):
    return [float(row["train_loss"]) for row in run["train_rows"]]


def schedule(update: int, total: int) -> float:
    """The lr of optimizer update `update` (1-based): linear warmup over WARMUP updates to LR, then
    cosine decay to zero at update `total` (written here independently of train.py)."""
    if update <= WARMUP:
        return LR * update / WARMUP
    return LR * 0.5 * (1 + math.cos(math.pi * (update - 1 - WARMUP) / (total - WARMUP)))


def test_accumulating_k_micro_batches_equals_one_batch_of_k_times_b(runs):
    """4 micro-batches of 4 with grad-accum == batches of 16 in the plain loop (mean loss), including
    each epoch's short last window; the reference is the plain project, so a wrong scaling of the
    short window cannot cancel out on both sides."""
    accum, batch = weights(runs["accum-4x4"]), weights(runs["plain-batch-16"])
    assert accum["step"] == batch["step"] == math.ceil(TRAIN_SIZE / 16) * EPOCHS
    difference, key = largest_difference(accum["model"], batch["model"])
    assert difference <= 1e-5, f"{key}: relative difference {difference:.2e}"
    # The tolerance tells trainings apart: batches of 4 without accumulation end far away.
    assert largest_difference(weights(runs["batch-4"])["model"], batch["model"])[0] > 1e-3
    # The logged loss of an update is the loss of the whole window (here: of the big batch).
    rows_a, rows_b = runs["accum-4x4"]["train_rows"], runs["plain-batch-16"]["train_rows"]
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b]
    for a, b in zip(rows_a, rows_b):
        assert float(a["lr"]) == float(b["lr"])
        assert math.isclose(float(a["train_loss"]), float(b["train_loss"]), rel_tol=1e-5), (a, b)


@pytest.mark.parametrize(
    "name, updates_per_epoch, total",
    [
        ("batch-4", 13, 13 * EPOCHS),  # K=1: one update per micro-batch
        ("accum-4x4", UPDATES_PER_EPOCH, UPDATES_PER_EPOCH * EPOCHS),  # K=4: ceil(13 / 4), not 13
        ("accum-4x4-max-steps", UPDATES_PER_EPOCH, 5),  # --max-steps counts updates too
    ],
)
def test_lr_schedule_and_step_count_optimizer_updates(runs, name, updates_per_epoch, total):
    run = ok(runs[name])
    rows = run["train_rows"]
    assert [int(r["step"]) for r in rows] == list(range(1, total + 1))  # every update logged once
    for row in rows:
        update = int(row["step"])
        assert int(row["epoch"]) == (update - 1) // updates_per_epoch + 1
        assert math.isclose(float(row["lr"]), schedule(update, total), rel_tol=1e-9, abs_tol=1e-15), row
    assert f"{total} optimizer updates" in run["stdout"]
    assert weights(run)["step"] == total


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_trains(runs, precision):
    run, fp32 = ok(runs[precision]), ok(runs["accum-4x4"])
    assert f"precision: {precision}" in run["stdout"]
    assert "update skipped" not in run["stdout"]
    state = weights(run)
    assert state["step"] == UPDATES_PER_EPOCH * EPOCHS
    for key, tensor in state["model"].items():
        assert tensor["dtype"] == "torch.float32", key  # parameters stay float32 under autocast
        assert all(math.isfinite(v) for v in tensor["values"]), key
    # The same training as in fp32, up to low-precision rounding: every update's loss agrees, and
    # the weights moved as in fp32 (total update within 10%; stopping 3 updates early is not).
    assert train_losses(run) != train_losses(fp32)  # autocast really ran in low precision
    for mine, reference in zip(train_losses(run), train_losses(fp32), strict=True):
        assert math.isclose(mine, reference, rel_tol=1e-2)
    initial, reference = json.loads(fp32["init"].read_text()), weights(fp32)["model"]
    difference = update_difference(state["model"], reference, initial)
    shorter = update_difference(weights(runs["accum-4x4-max-steps"])["model"], reference, initial)
    assert difference < 0.1 < shorter, (difference, shorter)


def test_fp16_overflow_skips_the_update_without_moving_schedule_or_step(runs):
    run = ok(runs["fp16-overflow"])
    skipped = [line for line in run["stdout"].splitlines() if "update skipped" in line]
    assert len(skipped) == 1 and skipped[0].startswith("step 3: update skipped"), run["stdout"][-2000:]
    assert "loss scale now 32768" in skipped[0]  # GradScaler halved its scale (from 65536)
    total = UPDATES_PER_EPOCH * EPOCHS  # sized before training; one window fewer gets applied
    rows = run["train_rows"]
    assert [int(r["step"]) for r in rows] == list(range(1, total))  # no gap, no repeated step
    for row in rows:  # the update after the skipped one uses the lr the skipped one would have used
        assert math.isclose(float(row["lr"]), schedule(int(row["step"]), total), rel_tol=1e-9, abs_tol=1e-15), row
    state = weights(run)
    assert state["step"] == total - 1
    assert all(math.isfinite(v) for tensor in state["model"].values() for v in tensor["values"])
    # Updates 1 and 2 are unaffected by the overflow: same logged losses as the run without it.
    assert train_losses(run)[:2] == train_losses(runs["fp16"])[:2]


@pytest.mark.parametrize("name", ["fp32-nan-loss", "bf16-nan-loss"])
def test_non_finite_loss_without_scaler_stops_naming_the_step(runs, name):
    run = runs[name]
    assert run["status"] != 0
    last_line = run["stderr"].strip().splitlines()[-1]
    assert "train loss is nan at step 2" in last_line, run["stderr"][-3000:]
    assert not (run["out"] / "final.pt").exists()
    assert [int(r["step"]) for r in run["train_rows"]] == [1]  # the bad window was never applied


def clipped_gradients(run):
    return json.loads(ok(run)["grads"].read_text())


def check_same_clipped_update(fp32_grads, fp16_grads, max_norm=0.01):
    """The gradient each update applies: clipped to max_norm, in fp16 exactly as in fp32.
    (We look at what the optimizer receives rather than at the weights: AdamW's first update is
    about lr * sign(gradient), which would hide a gradient that is wrong by a constant factor.)"""
    assert len(fp32_grads) == len(fp16_grads) == 2
    for g32, g16 in zip(fp32_grads, fp16_grads):
        assert math.isclose(norm(g32), max_norm, rel_tol=1e-4)
        assert math.isclose(norm(g16), max_norm, rel_tol=1e-4), f"fp16 clipped norm {norm(g16):.3g}"
    # Same starting weights, same data: the first clipped updates point the same way.
    first32, first16 = fp32_grads[0], fp16_grads[0]
    cosine = sum(a * b for a, b in zip(first32, first16, strict=True)) / (norm(first32) * norm(first16))
    assert cosine > 0.99, cosine


def test_clipping_with_fp16_clips_the_unscaled_gradients(runs):
    check_same_clipped_update(clipped_gradients(runs["clip-fp32"]), clipped_gradients(runs["clip-fp16"]))


def test_the_clipping_check_fails_without_unscale(runs):
    """Negative control: in a copy of train.py without scaler.unscale_, the check above fails
    (clip_grad_norm_ clips the scaled gradients, and scaler.step then divides by the scale)."""
    with pytest.raises(AssertionError, match="fp16 clipped norm"):
        check_same_clipped_update(clipped_gradients(runs["clip-fp32"]), clipped_gradients(runs["clip-fp16-without-unscale"]))
