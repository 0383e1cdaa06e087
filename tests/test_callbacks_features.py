"""Features callbacks, early-stopping, tensorboard and compile, proved by running generated code.

All training runs of this file go through ONE runner process (one `import torch`), started by the
module fixture `runs`; only the exception test is a real `python train.py`, because its exit
status and stderr are what it checks. It runs alongside the runner.

- callbacks: a recording callback (`Recorder`, appended to a generated project's callbacks.py and
  to `callbacks` in its train.py) logs every hook call; the order must be exactly the one
  callbacks.py documents, a stop request (and the shipped TimeLimit) must end training at that
  update, and an exception must reach on_exception, then on_train_end, then the shell with its
  traceback.
- early-stopping: with --min-delta larger than any possible change of the monitored metric, no
  epoch after the first improves, so a run with --patience P validates exactly 1 + P times, also
  when stopped and resumed in between, and best.pt must hold the first epoch's weights.
  --warmup-steps is larger than the run, so every update's lr is the same in a one-epoch
  reference run, whose final.pt is exactly those weights. Plain lines and the callback path.
- tensorboard: the event files, read by tensorboard's own EventAccumulator, hold exactly the
  numbers of metrics.csv (rounded to float32, as tensorboard stores them) and the config text.
- compile: a checkpoint chain eager -> compiled -> eager through --resume PATH, compared with an
  uninterrupted eager run; checkpoints hold the plain module's keys.
"""

from __future__ import annotations

import csv
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import render_project, run_jobs

pytestmark = pytest.mark.slow

TRAIN_SIZE, BATCH = 48, 16
UPDATES_PER_EPOCH = math.ceil(TRAIN_SIZE / BATCH)  # 3
# One thread per process: with OpenMP's default (a thread per core) on a machine busy with other
# work, the waiting threads spin and a tiny run costs several times the CPU time.
ENV = {"OMP_NUM_THREADS": "1"}
SMALL = ["--synthetic-train-size", str(TRAIN_SIZE), "--synthetic-val-size", "40",
         "--batch-size", str(BATCH)]

# A test callback: every hook call becomes one JSON line in <out-dir>/hooks.jsonl. It reads
# <out-dir>/probe.json (if present) for {"stop_at": N} (on_step_end returns True at update N)
# or {"raise_at": N} (on_step_end raises at update N).
RECORDER = '''

import json
from pathlib import Path


class Recorder:
    def __init__(self, out_dir):
        self.log = Path(out_dir) / "hooks.jsonl"
        probe = Path(out_dir) / "probe.json"
        plan = json.loads(probe.read_text()) if probe.exists() else {}
        self.stop_at, self.raise_at = plan.get("stop_at"), plan.get("raise_at")

    def write(self, hook, **fields):
        with open(self.log, "a") as f:
            f.write(json.dumps({"hook": hook, **fields}) + "\\n")

    def on_train_start(self, cfg, step):
        self.write("on_train_start", step=step, out_dir=cfg.out_dir)

    def on_step_end(self, step, metrics):
        self.write("on_step_end", step=step, metrics=metrics)
        if step == self.raise_at:
            raise RuntimeError(f"recorder failure at step {step}")
        return step == self.stop_at

    def on_validation_end(self, epoch, step, metrics):
        self.write("on_validation_end", epoch=epoch, step=step, metrics=metrics)

    def on_epoch_end(self, epoch, step):
        self.write("on_epoch_end", epoch=epoch, step=step)

    def on_exception(self, exc):
        self.write("on_exception", type=type(exc).__name__, message=str(exc))

    def on_train_end(self, step):
        self.write("on_train_end", step=step)
'''
CALLBACKS_LINE = "    callbacks = [cb.ThroughputMonitor(), cb.TimeLimit(cfg.max_hours)]\n"


def edit(path: Path, old: str, new: str) -> None:
    """Replace exactly one occurrence of `old` in a generated file (fails if the anchor moved)."""
    text = path.read_text()
    assert text.count(old) == 1, f"anchor not found exactly once in {path.name}: {old!r}"
    path.write_text(text.replace(old, new))


def add_recorder(project: Path) -> None:
    (project / "callbacks.py").write_text((project / "callbacks.py").read_text() + RECORDER)
    edit(project / "train.py", CALLBACKS_LINE,
         CALLBACKS_LINE + "    callbacks.append(cb.Recorder(cfg.out_dir))  # test probe\n")


def read_rows(out_dir: Path) -> tuple[list[dict], list[dict]]:
    """metrics.csv as (training rows, validation rows), numbers parsed, empty cells dropped."""
    with open(out_dir / "metrics.csv", newline="") as f:
        rows = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    return [r for r in rows if "train_loss" in r], [r for r in rows if "val_loss" in r]


def read_hooks(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "hooks.jsonl").read_text().splitlines()]


def expected_hooks(updates: list[int]) -> list[tuple]:
    """The documented order (callbacks.py docstring) for epochs that end after the given updates."""
    calls, step = [("on_train_start", 0)], 0
    for epoch, last_update in enumerate(updates, start=1):
        while step < last_update:
            step += 1
            calls.append(("on_step_end", step))
        calls += [("on_validation_end", epoch, step), ("on_epoch_end", epoch, step)]
    return calls + [("on_train_end", step)]


def summary(hooks: list[dict]) -> list[tuple]:
    return [(h["hook"], *[h[k] for k in ("epoch", "step") if k in h]) for h in hooks]


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Render four projects, start the `python train.py` exception run, run everything else in
    one runner process (rendering and `import torch` dominate the cost, so projects are shared)."""
    tmp = tmp_path_factory.mktemp("callbacks_features")
    p = {
        "cb": render_project(tmp / "cb", features=["callbacks", "tensorboard"]),
        "es": render_project(tmp / "es", features=["early-stopping", "resume"]),
        "cbes": render_project(tmp / "cbes", features=["callbacks", "early-stopping", "resume"]),
        "cr": render_project(tmp / "cr", features=["compile", "resume"]),
    }
    add_recorder(p["cb"])
    for name, plan in {"raise": {"raise_at": 2}, "stop": {"stop_at": 4}}.items():
        (p["cb"] / name).mkdir()
        (p["cb"] / name / "probe.json").write_text(json.dumps(plan))

    # The exception run is a real process: its exit status and stderr are the point.
    failing = subprocess.Popen(
        [sys.executable, "train.py", *SMALL, "--epochs", "2", "--out-dir", "raise"],
        cwd=p["cb"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **ENV},
    )
    jobs = {
        "order": (p["cb"], [*SMALL, "--epochs", "2", "--log-every", "2", "--out-dir", "order"]),
        "stop": (p["cb"], [*SMALL, "--epochs", "3", "--log-every", "1", "--out-dir", "stop"]),
        "time-limit": (p["cb"], [*SMALL, "--epochs", "3", "--max-hours", "1e-12", "--out-dir", "time"]),
        "tb": (p["cb"], [*SMALL, "--epochs", "2", "--log-every", "2", "--out-dir", "tb-run"]),
    }

    # Early stopping: min_delta beyond any possible change, so only epoch 1 counts as improving.
    no_improvement = {
        "es": ["--monitor", "val_loss", "--mode", "min", "--min-delta", "100"],  # 0 <= val_loss < 100
        "cbes": ["--monitor", "val_acc", "--mode", "max", "--min-delta", "1.0"],  # 0 <= val_acc <= 1
    }
    flat_lr = ["--warmup-steps", "1000"]  # lr of update s is (s+1)/1000 * lr, whatever --epochs is
    for name in ("es", "cbes"):
        args = [*SMALL, "--epochs", "6", "--patience", "2", *flat_lr, *no_improvement[name]]
        jobs[name] = (p[name], [*args, "--out-dir", "run"])
        # The same run stopped after 2 epochs (--max-steps) and resumed: the epochs without
        # improvement counted before the restart must still count.
        jobs[f"{name}-start"] = (p[name], [*args, "--max-steps", str(2 * UPDATES_PER_EPOCH), "--out-dir", "split"])
        jobs[f"{name}-resumed"] = (p[name], [*args, "--out-dir", "split"])
        jobs[f"{name}-ref"] = (p[name], [*SMALL, "--epochs", "1", *flat_lr, "--out-dir", "ref"])

    # compile: a checkpoint chain eager -> compiled -> eager (--resume PATH), and the same run
    # uninterrupted. Only the middle link compiles: torch.compile on CPU costs tens of seconds.
    # Each link ends at an epoch boundary, where a --max-steps run and an uninterrupted one have
    # done the same work (both validated); the default warmup (10 updates) outlasts the 9 updates,
    # so the lr does not depend on the schedule length that --max-steps sets.
    chain = [*SMALL, "--epochs", "3", "--log-every", "1"]
    jobs |= {
        "eager-start": (p["cr"], [*chain, "--no-compile", "--max-steps", "3", "--out-dir", "c"]),
        "compiled": (p["cr"], [*chain, "--compile", "--max-steps", "6", "--resume", "c/last.pt", "--out-dir", "a"]),
        "eager-end": (p["cr"], [*chain, "--no-compile", "--resume", "a/last.pt", "--out-dir", "b"]),
        "eager-whole": (p["cr"], [*chain, "--no-compile", "--out-dir", "u"]),
    }
    # TORCH_TRACE: dynamo writes a structured trace of every frame it compiles, so the compiled
    # run can be shown to have compiled (a warm inductor cache leaves no other trace).
    env = {**ENV, "TORCH_TRACE": str(tmp / "torch_trace")}
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            results = run_jobs([{"project": proj, "args": args} for proj, args in jobs.values()], tmp)
    finally:
        try:
            stdout, stderr = failing.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            failing.kill()
            raise
    out = dict(zip(jobs, results))
    out["raise"] = {"returncode": failing.returncode, "stdout": stdout, "stderr": stderr}
    return {"projects": p, "results": out, "tmp": tmp}


def ok(runs, name: str) -> dict:
    result = runs["results"][name]
    assert result["ok"], f"{name} failed: {result['error']}{result['exit_code']}\n{result['stdout']}"
    return result


# --- callbacks ---------------------------------------------------------------------------------


def test_hooks_are_called_in_the_documented_order(runs):
    ok(runs, "order")
    out = runs["projects"]["cb"] / "order"
    hooks = read_hooks(out)
    assert summary(hooks) == expected_hooks([UPDATES_PER_EPOCH, 2 * UPDATES_PER_EPOCH])
    assert hooks[0]["out_dir"] == "order"  # on_train_start got the run's Config

    # on_step_end gets step, epoch, lr (+ train_loss and samples_per_s on logging steps: the loss
    # is read from the device only there, issue 22): the row that metrics.csv stores;
    # on_validation_end gets the validation metrics of that row.
    train_rows, val_rows = read_rows(out)
    logged = {int(r["step"]): r for r in train_rows}
    assert sorted(logged) == [2, 4, 6]  # --log-every 2
    for h in (h for h in hooks if h["hook"] == "on_step_end"):
        metrics = h["metrics"]
        expected_keys = {"step", "epoch", "lr"} | ({"train_loss", "samples_per_s"} if h["step"] in logged else set())
        assert set(metrics) == expected_keys, h
        assert metrics["step"] == h["step"] and metrics["epoch"] == math.ceil(h["step"] / UPDATES_PER_EPOCH)
        if h["step"] in logged:
            assert metrics == pytest.approx(logged[h["step"]], rel=1e-12)
    validations = [h for h in hooks if h["hook"] == "on_validation_end"]
    assert [{"step": h["step"], "epoch": h["epoch"], **h["metrics"]} for h in validations] == [
        pytest.approx(r, rel=1e-12) for r in val_rows
    ]


def test_stop_request_ends_training_at_that_update(runs):
    import torch

    ok(runs, "stop")
    out = runs["projects"]["cb"] / "stop"
    stop_at = json.loads((out / "probe.json").read_text())["stop_at"]
    assert UPDATES_PER_EPOCH < stop_at < 3 * UPDATES_PER_EPOCH  # mid-run, mid-epoch, of a 3-epoch run
    # The update finishes, the epoch is validated, the hooks end as documented; nothing trains after.
    assert summary(read_hooks(out)) == expected_hooks([UPDATES_PER_EPOCH, stop_at])
    train_rows, val_rows = read_rows(out)
    assert [int(r["step"]) for r in train_rows] == list(range(1, stop_at + 1))
    assert [int(r["step"]) for r in val_rows] == [UPDATES_PER_EPOCH, stop_at]
    assert torch.load(out / "final.pt", weights_only=True)["step"] == stop_at


def test_time_limit_callback_stops_cleanly(runs):
    import torch

    result = ok(runs, "time-limit")
    out = runs["projects"]["cb"] / "time"
    # --max-hours 1e-12 has passed after the first update: TimeLimit stops there, cleanly.
    assert "time limit (--max-hours) reached" in result["stdout"]
    assert summary(read_hooks(out)) == expected_hooks([1])
    assert torch.load(out / "final.pt", weights_only=True)["step"] == 1


def test_exception_calls_on_exception_then_on_train_end_and_propagates(runs):
    result = runs["results"]["raise"]
    out = runs["projects"]["cb"] / "raise"
    raise_at = json.loads((out / "probe.json").read_text())["raise_at"]
    assert result["returncode"] not in (0, None), result["stdout"][-2000:]
    # The original traceback reaches the shell: the raising line and the message.
    stderr = result["stderr"]
    assert "Traceback (most recent call last)" in stderr, stderr[-3000:]
    assert f"RuntimeError: recorder failure at step {raise_at}" in stderr, stderr[-3000:]
    assert 'raise RuntimeError(f"recorder failure at step {step}")' in stderr
    assert "train.py" in stderr and "callbacks.py" in stderr
    hooks = read_hooks(out)
    assert summary(hooks) == [("on_train_start", 0), *[("on_step_end", s) for s in range(1, raise_at + 1)],
                              ("on_exception",), ("on_train_end", raise_at)]
    assert hooks[-2]["type"] == "RuntimeError" and hooks[-2]["message"] == f"recorder failure at step {raise_at}"
    assert not (out / "final.pt").exists()  # a failed run does not write final weights


# --- early-stopping ----------------------------------------------------------------------------


@pytest.mark.parametrize("split", [False, True], ids=["whole", "resumed"])
@pytest.mark.parametrize("name", ["es", "cbes"], ids=["plain", "callback"])
def test_early_stopping_stops_at_the_predicted_epoch_and_keeps_the_first(runs, name, split):
    import torch

    result = ok(runs, f"{name}-resumed" if split else name)
    ok(runs, f"{name}-ref")
    project = runs["projects"][name]
    out = project / ("split" if split else "run")
    if split:
        ok(runs, f"{name}-start")
        assert f"resumed from {out.name}/last.pt: step {2 * UPDATES_PER_EPOCH}" in result["stdout"]
    config = json.loads((out / "config.json").read_text())
    patience, epochs = config["patience"], config["epochs"]
    assert 1 + patience < epochs  # the stop must come from early stopping, not the epoch count
    _, val_rows = read_rows(out)
    assert [int(r["epoch"]) for r in val_rows] == list(range(1, 1 + patience + 1))
    assert [int(r["step"]) for r in val_rows] == [e * UPDATES_PER_EPOCH for e in range(1, patience + 2)]
    assert f"early stopping: {config['monitor']} has not improved for {patience} epochs" in result["stdout"]

    best = torch.load(out / "best.pt", weights_only=True)
    final = torch.load(out / "final.pt", weights_only=True)
    reference = torch.load(project / "ref" / "final.pt", weights_only=True)  # after exactly epoch 1
    assert best["epoch"] == 1 and final["step"] == (1 + patience) * UPDATES_PER_EPOCH
    assert best["metrics"] == pytest.approx({k: v for k, v in val_rows[0].items() if k.startswith("val_")})
    assert best["model"].keys() == reference["model"].keys()
    for key, tensor in best["model"].items():
        assert torch.equal(tensor, reference["model"][key]), key
    assert any(not torch.equal(t, final["model"][k]) for k, t in best["model"].items())  # it trained on


# --- tensorboard -------------------------------------------------------------------------------


def test_tensorboard_scalars_equal_metrics_csv_and_hold_the_config(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ok(runs, "tb")
    out = runs["projects"]["cb"] / "tb-run"
    assert len(list((out / "tb").glob("events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()

    with open(out / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    columns = [c for c in rows[0] if c not in ("step", "epoch")]
    assert sorted(events.Tags()["scalars"]) == sorted(columns)
    for column in columns:
        from_csv = [(int(r["step"]), f32(float(r[column]))) for r in rows if r[column] != ""]
        from_tb = [(e.step, e.value) for e in events.Scalars(column)]
        assert from_tb == from_csv, column
    assert len(events.Scalars("val_loss")) == 2 and [e.step for e in events.Scalars("train_loss")] == [2, 4, 6]

    config = json.loads((out / "config.json").read_text())
    (text_event,) = events.Tensors("config/text_summary")
    text = text_event.tensor_proto.string_val[0].decode()
    assert text_event.step == 0
    for key, value in config.items():
        assert f"{key} = {value!r}" in text, key


# --- compile -----------------------------------------------------------------------------------


def test_compiled_run_trains_and_checkpoints_cross_load(runs):
    import torch

    for name in ("eager-start", "compiled", "eager-end", "eager-whole"):
        ok(runs, name)
    project = runs["projects"]["cr"]
    results = runs["results"]
    # Each link resumed from the previous one's checkpoint: eager -> compiled -> eager.
    assert f"resumed from c/last.pt: step {UPDATES_PER_EPOCH}" in results["compiled"]["stdout"]
    assert f"resumed from a/last.pt: step {2 * UPDATES_PER_EPOCH}" in results["eager-end"]["stdout"]
    # The compiled run did compile (dynamo traced frames in the runner process).
    traces = list((runs["tmp"] / "torch_trace").glob("*"))
    assert traces and any("dynamo_start" in t.read_text(errors="replace") for t in traces)

    # Checkpoints hold the plain module's keys, compiled run or not.
    whole = torch.load(project / "u" / "final.pt", weights_only=True)
    for path in ("c/last.pt", "a/last.pt", "a/final.pt", "b/final.pt"):
        state = torch.load(project / path, weights_only=True)
        assert not any(k.startswith("_orig_mod.") for k in state["model"]), path
        assert list(state["model"]) == list(whole["model"]), path

    # The chain trained like the uninterrupted run: same steps and lrs, and losses equal up to the
    # rounding of compiled kernels (not bitwise: inductor fuses and reorders float operations, and
    # Adam's first updates amplify that a little). A lost or misapplied link would be far off:
    # training moves val_loss far more than the tolerance (checked).
    chain = [row for d in "cab" for row in read_rows(project / d)[0]]
    train_whole, _ = read_rows(project / "u")
    assert [(r["step"], r["lr"]) for r in chain] == [(r["step"], r["lr"]) for r in train_whole]
    assert [r["train_loss"] for r in chain] == pytest.approx([r["train_loss"] for r in train_whole], rel=2e-3)
    val_end, val_whole = (results[n]["metrics"]["val_loss"] for n in ("eager-end", "eager-whole"))
    assert val_end == pytest.approx(val_whole, rel=2e-2)
    val_first = read_rows(project / "c")[1][0]["val_loss"]
    assert abs(val_first - val_whole) > 10 * 2e-2 * val_whole  # so the tolerance above means something
    end = torch.load(project / "b" / "final.pt", weights_only=True)
    assert end["step"] == whole["step"] == 3 * UPDATES_PER_EPOCH
