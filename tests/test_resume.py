"""Feature `resume` (issue 4), proven by running a generated train.py on CPU.

A run killed with SIGKILL at many different points and started again must end bitwise equal to
an uninterrupted run; so must a run killed while it writes a checkpoint, and one stopped by
SIGTERM. Bad --resume files stop with one clear line.

Cost: `import torch` takes several seconds here, so every training run is a fork of ONE driver
process that imported torch once (see DRIVER). Each run is a real child process: the killed ones
really die from the signal, and the parent reads their exit status from waitpid. At the end the
driver loads every checkpoint the runs left, with torch.load(weights_only=True), and describes it
as JSON with a sha256 of each tensor's bytes (bitwise equal <=> same digest, dtype and shape), so
this test process never imports torch.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import render_project

pytestmark = pytest.mark.slow

# The driver: `python driver.py JOBS.json STATUSES.json`. For each job it forks a child that imports
# the project's own train.py, optionally installs one kill hook, and runs train.main(args); the
# parent records the child's exit status (negative: killed by that signal).
DRIVER = r'''
import glob, hashlib, io, json, os, shutil, signal, sys, traceback

import torch  # imported once, before any fork

# The first optimizer imports torch._dynamo (seconds): do it here once, not in every child.
torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
from torch.optim.optimizer import register_optimizer_step_post_hook


def install_hook(train, hook):
    """Send `signal` to this process at the n-th occurrence of an event."""
    kind, n, signum = hook["kind"], hook["n"], getattr(signal, hook.get("signal", "SIGKILL"))
    calls = [0]

    def nth():
        calls[0] += 1
        return calls[0] == n

    if kind == "optimizer_step":  # right after the n-th optimizer.step(), before the scheduler
        def post_hook(optimizer, args, kwargs):
            if nth():
                os.kill(os.getpid(), signum)
        register_optimizer_step_post_hook(post_hook)
    elif kind in ("train_forward", "eval_forward"):  # at the start of the n-th forward pass
        build_model = train.build_model

        def build_model_with_hook(*args, **kwargs):
            model = build_model(*args, **kwargs)

            def pre_hook(module, inputs):
                if module.training == (kind == "train_forward") and nth():
                    os.kill(os.getpid(), signum)
            model.register_forward_pre_hook(pre_hook)
            return model
        train.build_model = build_model_with_hook
    elif kind == "replaced_last":  # right after the n-th os.replace(..., last.pt)
        replace = os.replace

        def replace_then_kill(src, dst, *args, **kwargs):
            replace(src, dst, *args, **kwargs)
            if str(dst).endswith("last.pt") and nth():
                os.kill(os.getpid(), signum)
        os.replace = replace_then_kill
    elif kind == "writing_last":  # die in the middle of writing the n-th last.pt.tmp
        save = torch.save

        def save_half_then_kill(obj, f, *args, **kwargs):
            if str(getattr(f, "name", "")).endswith("last.pt.tmp") and nth():
                buffer = io.BytesIO()
                save(obj, buffer, *args, **kwargs)
                data = buffer.getvalue()
                f.write(data[: len(data) // 2])
                f.flush()
                os.fsync(f.fileno())
                os.kill(os.getpid(), signum)
            return save(obj, f, *args, **kwargs)
        torch.save = save_half_then_kill
    else:
        raise ValueError(kind)


def child(job):
    for fd, suffix in ((1, ".out"), (2, ".err")):
        os.dup2(os.open(job["log"] + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.path.insert(0, job["project"])
    os.chdir(job["project"])
    import train

    code = 0
    try:
        if job.get("hook"):
            install_hook(train, job["hook"])
        metrics = train.main(job["args"])
        with open(job["log"] + ".json", "w") as f:
            json.dump(metrics, f)
    except SystemExit as exc:  # exactly what the interpreter does with an uncaught SystemExit
        if isinstance(exc.code, int) or exc.code is None:
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def describe(obj):
    """A checkpoint as JSON: each tensor becomes its dtype, shape and the sha256 of its bytes."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous().reshape(-1)
        return {"dtype": str(obj.dtype), "shape": list(obj.shape), "sha256": hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()}
    if isinstance(obj, dict):
        return {str(k): describe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [describe(v) for v in obj]
    return obj


def main():
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    statuses = []
    for job in jobs:
        for src, dst in job.get("copy_before", []):  # keep evidence of what a killed run left
            if os.path.exists(src):
                shutil.copyfile(src, dst)
        for src, dst in job.get("truncate_before", []):
            with open(src, "rb") as f:
                data = f.read()
            with open(dst, "wb") as f:
                f.write(data[: len(data) // 2])
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                child(job)
            finally:
                os._exit(99)
        statuses.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    files = {}
    for job in jobs:
        out_dir = job["args"][job["args"].index("--out-dir") + 1]
        for path in sorted(glob.glob(os.path.join(out_dir, "*.pt")) + glob.glob(os.path.join(out_dir, "*.after-kill"))):
            try:
                files[path] = describe(torch.load(path, map_location="cpu", weights_only=True))
            except Exception as exc:
                files[path] = {"error": f"{type(exc).__name__}: {exc}"}
    with open(sys.argv[2], "w") as f:
        json.dump({"statuses": statuses, "files": files}, f)


main()
'''

# Tiny text-classification runs: dropout stays on (0.1), so the RNG state must be restored too.
DATA = [
    "--synthetic-train-size", "100", "--synthetic-val-size", "24", "--batch-size", "8",
    "--embed-dim", "32", "--num-heads", "2", "--num-layers", "1", "--max-length", "16",
    "--warmup-steps", "3", "--log-every", "1",
]
BATCHES_PER_EPOCH = math.ceil(100 / 8)  # 13: not a multiple of the accumulation steps below
# A: fp32, no accumulation, 2 epochs: 26 updates; last.pt at steps 5, 10, 13 (epoch end), 15, 20,
# 25, 26 (the end); step-N.pt files too, of which --keep-checkpoints 2 keeps the newest two.
CONFIG_A = DATA + ["--epochs", "2", "--precision", "fp32", "--checkpoint-every", "5", "--keep-checkpoints", "2"]
# B: bf16 autocast and 3 micro-batches per update: 5 updates per epoch (windows of 3,3,3,3,1),
# cut by --max-steps 14 in the middle of epoch 3; last.pt at 5 (epoch end), 7, 10 (epoch end) and
# 14 (after the final validation; the last update itself writes none, see train.py).
CONFIG_B = DATA + ["--epochs", "3", "--precision", "bf16", "--grad-accum-steps", "3", "--max-steps", "14", "--checkpoint-every", "7"]

KILLS = {
    # name: (config, hook). Each run is killed, then resumed with --resume auto in the same out dir.
    "A-between-optimizer-and-scheduler-step-mid-epoch": ("A", {"kind": "optimizer_step", "n": 7}),
    "A-right-after-checkpoint": ("A", {"kind": "replaced_last", "n": 2}),
    "A-during-final-validation": ("A", {"kind": "eval_forward", "n": 4}),  # 3 val batches per epoch
    "A-last-epoch": ("A", {"kind": "optimizer_step", "n": 22}),
    "A-while-writing-checkpoint": ("A", {"kind": "writing_last", "n": 4}),  # step 15's last.pt
    "B-inside-accumulation-window": ("B", {"kind": "train_forward", "n": 18}),  # 2nd of step 7's 3
    "B-right-after-checkpoint": ("B", {"kind": "replaced_last", "n": 2}),  # step 7
    "B-last-epoch": ("B", {"kind": "optimizer_step", "n": 12}),
    "B-during-final-validation": ("B", {"kind": "eval_forward", "n": 7}),  # 3 per epoch before
    "B-after-final-checkpoint-before-final-pt": ("B", {"kind": "replaced_last", "n": 4}),
    "B-sigterm": ("B", {"kind": "optimizer_step", "n": 9, "signal": "SIGTERM"}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Render once, run everything in one driver process; return {name: {status, out, stdout, ...}}."""
    tmp = tmp_path_factory.mktemp("resume")
    project = render_project(tmp / "proj", "text-classification", ["amp", "grad-accum", "resume"])
    configs = {"A": CONFIG_A, "B": CONFIG_B}
    jobs, names = [], []

    def add(name, args, hook=None, **extra):
        names.append(name)
        jobs.append({"project": str(project), "args": args, "hook": hook, "log": str(tmp / name), **extra})

    for key, config in configs.items():
        add(f"uninterrupted-{key}", config + ["--out-dir", str(tmp / f"out-uninterrupted-{key}")])
    for name, (key, hook) in KILLS.items():
        args = configs[key] + ["--out-dir", str(tmp / f"out-{name}")]
        add(f"{name}-killed", args, hook)
        evidence = [(str(tmp / f"out-{name}" / f), str(tmp / f"out-{name}" / f"{f}.after-kill")) for f in ("last.pt", "last.pt.tmp", "final.pt")]
        add(f"{name}-resumed", args, copy_before=evidence)
    # SIGUSR1 (SLURM's warning, same handler as SIGTERM) during the very last update: the run just
    # finishes (validation, last.pt, final.pt) instead of saving a checkpoint that skips validation.
    add("B-sigusr1-in-last-update", CONFIG_B + ["--out-dir", str(tmp / "out-B-sigusr1-last")],
        {"kind": "optimizer_step", "n": 14, "signal": "SIGUSR1"})
    # Another precision is allowed: B's bf16 checkpoint at step 7 (no GradScaler state) continued in fp16.
    add("bf16-checkpoint-continued-in-fp16", CONFIG_B + ["--out-dir", str(tmp / "out-fp16"), "--precision", "fp16",
        "--resume", str(tmp / "out-B-right-after-checkpoint" / "last.pt.after-kill")])
    # Bad --resume files: missing, truncated, another model, another meaning of `step`.
    last_a = tmp / "out-uninterrupted-A" / "last.pt"
    add("missing", CONFIG_A + ["--out-dir", str(tmp / "e1"), "--resume", str(tmp / "no-such.pt")])
    add("truncated", CONFIG_A + ["--out-dir", str(tmp / "e2"), "--resume", str(tmp / "truncated.pt")],
        truncate_before=[(str(last_a), str(tmp / "truncated.pt"))])
    add("other-model", CONFIG_A + ["--out-dir", str(tmp / "e3"), "--resume", str(last_a), "--embed-dim", "16"])
    add("other-accumulation", CONFIG_A + ["--out-dir", str(tmp / "e4"), "--resume", str(tmp / "out-uninterrupted-B" / "last.pt")])

    (tmp / "driver.py").write_text(DRIVER)
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    # One intra-op thread: the same arithmetic in every run, and no spinning threads on a busy machine.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(tmp / "driver.py"), str(tmp / "jobs.json"), str(tmp / "statuses.json")],
        capture_output=True, text=True, timeout=1200, env=env, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp / "statuses.json").read_text())
    statuses = report["statuses"]
    CHECKPOINTS.clear()
    CHECKPOINTS.update(report["files"])
    result = {}
    for name, status, job in zip(names, statuses, jobs):
        log = Path(job["log"])
        out_dir = Path(job["args"][job["args"].index("--out-dir") + 1])
        result[name] = {
            "status": status,
            "out": out_dir,
            "stdout": Path(f"{log}.out").read_text(),
            "stderr": Path(f"{log}.err").read_text(),
            "metrics": json.loads(Path(f"{log}.json").read_text()) if Path(f"{log}.json").exists() else None,
        }
    return result


CHECKPOINTS: dict = {}  # path -> described checkpoint (see DRIVER), filled by the fixture


def load(path):
    """The checkpoint at `path` as the driver loaded it with torch.load(weights_only=True)."""
    state = CHECKPOINTS[str(path)]
    if "error" in state:
        raise ValueError(f"{path} did not load: {state['error']}")
    return dict(state)


def is_tensor(value):
    return isinstance(value, dict) and value.keys() == {"dtype", "shape", "sha256"}


def assert_same(a, b, where="state"):
    """Bitwise equality of nested checkpoint contents (tensors by dtype, shape and digest)."""
    if is_tensor(a):
        assert a == b, f"{where} differs: {a} != {b}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys differ"
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: length differs"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_ok(run):
    assert run["status"] == 0, f"exit status {run['status']}\n{run['stdout'][-2000:]}\n{run['stderr'][-3000:]}"


def assert_ends_like_uninterrupted(resumed, reference, same_metrics=True):
    """Same final weights (bitwise), same last checkpoint (optimizer, scheduler, scaler, RNG, counters),
    same best.pt, and the same final validation metrics returned by main()."""
    assert_ok(resumed)
    assert_ok(reference)
    final, final_ref = load(resumed["out"] / "final.pt"), load(reference["out"] / "final.pt")
    assert final["model"].keys() == final_ref["model"].keys()
    for key in final_ref["model"]:
        assert final["model"][key] == final_ref["model"][key], f"final.pt weight {key} differs"
    assert final["step"] == final_ref["step"]
    last, last_ref = load(resumed["out"] / "last.pt"), load(reference["out"] / "last.pt")
    last.pop("config"), last_ref.pop("config")  # only --out-dir differs
    assert_same(last, last_ref, "last.pt")
    best, best_ref = load(resumed["out"] / "best.pt"), load(reference["out"] / "best.pt")
    assert_same(best["model"], best_ref["model"], "best.pt model")
    assert best["epoch"] == best_ref["epoch"]
    assert reference["metrics"]
    if same_metrics:
        assert resumed["metrics"] == reference["metrics"], (resumed["metrics"], reference["metrics"])


@pytest.mark.parametrize("name", list(KILLS))
def test_killed_run_resumes_bitwise_equal(runs, name):
    killed, resumed = runs[f"{name}-killed"], runs[f"{name}-resumed"]
    expected = 75 if name.endswith("sigterm") else -9  # -9: the child really died from SIGKILL
    assert killed["status"] == expected, f"{name}: status {killed['status']}\n{killed['stderr'][-2000:]}"
    if expected == -9:
        assert "done:" not in killed["stdout"]
    assert "resumed from" in resumed["stdout"]  # every kill point comes after a checkpoint
    # Killed after the final checkpoint, the resumed run has nothing left to train or validate: it
    # only writes final.pt, and main() has no fresh validation metrics to return.
    finished = name == "B-after-final-checkpoint-before-final-pt"
    assert_ends_like_uninterrupted(resumed, runs[f"uninterrupted-{KILLS[name][0]}"], same_metrics=not finished)


def test_kill_points_hit_what_they_claim(runs):
    """The evidence copied right after each kill: the checkpoint the resumed run started from."""
    step_at = {name: load(runs[f"{name}-killed"]["out"] / "last.pt.after-kill")["step"] for name in KILLS}
    assert step_at["A-between-optimizer-and-scheduler-step-mid-epoch"] == 5  # killed during update 7
    assert step_at["A-right-after-checkpoint"] == 10
    assert step_at["A-during-final-validation"] == 25  # the validation after update 26 had started
    assert step_at["A-last-epoch"] == 20  # killed during update 22 of 26
    assert step_at["B-inside-accumulation-window"] == 5  # killed in update 7's window, after update 6
    assert step_at["B-right-after-checkpoint"] == 7
    assert step_at["B-last-epoch"] == 10
    assert step_at["B-during-final-validation"] == 10
    b_final = load(runs["B-after-final-checkpoint-before-final-pt-killed"]["out"] / "last.pt.after-kill")
    assert b_final["step"] == 14 and b_final["batches_done"] == 4 * 3  # stopped by --max-steps in epoch 3
    assert not (runs["B-after-final-checkpoint-before-final-pt-killed"]["out"] / "final.pt.after-kill").exists()
    assert step_at["B-sigterm"] == 9


def test_crash_while_writing_checkpoint_leaves_previous_one_loadable(runs):
    out = runs["A-while-writing-checkpoint-killed"]["out"]
    # The process died with a half-written temporary file next to the intact previous checkpoint.
    with pytest.raises(ValueError, match="did not load"):
        load(out / "last.pt.tmp.after-kill")
    previous = load(out / "last.pt.after-kill")
    assert previous["step"] == BATCHES_PER_EPOCH and previous["epoch"] == 1 and previous["batches_done"] == 0
    # (and test_killed_run_resumes_bitwise_equal[A-while-writing-checkpoint] resumes from it)


def test_sigterm_saves_at_the_next_update_and_exits_75(runs):
    killed = runs["B-sigterm-killed"]
    assert killed["status"] == 75
    assert "step 9: stop signal received" in killed["stdout"]
    state = load(killed["out"] / "last.pt.after-kill")
    assert state["step"] == 9 and state["epoch"] == 1 and state["batches_done"] == 4 * 3
    assert not (killed["out"] / "final.pt.after-kill").exists()


def test_checkpoint_format(runs):
    state = load(runs["uninterrupted-B"]["out"] / "last.pt")  # weights_only=True
    assert {"model", "optimizer", "scheduler", "step", "epoch", "config"} <= state.keys()
    assert "scaler" in state and "rng" in state and "batches_done" in state
    assert state["step"] == 14 and state["config"]["grad_accum_steps"] == 3


def test_keep_checkpoints_keeps_the_newest_step_files(runs):
    # Config A saves at every 5th update and at every epoch end; --keep-checkpoints 2.
    saved = sorted({s for s in range(1, 26) if s % 5 == 0} | {13, 26})
    expected = [f"step-{s:07d}.pt" for s in saved[-2:]]
    for name in ("uninterrupted-A", "A-last-epoch-resumed"):
        out = runs[name]["out"]
        assert sorted(p.name for p in out.glob("step-*")) == expected, name
        assert load(out / expected[-1])["step"] == 26


@pytest.mark.parametrize(
    "name, words",
    [
        ("missing", ["no-such.pt", "no such checkpoint file"]),
        ("truncated", ["truncated.pt", "cannot load checkpoint"]),
        ("other-model", ["--embed-dim 32", "16"]),
        ("other-accumulation", ["--grad-accum-steps 3", "1"]),
    ],
)
def test_bad_resume_file_is_one_clear_line(runs, name, words):
    run = runs[name]
    assert run["status"] != 0
    lines = run["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), run["stderr"][-3000:]
    for word in words:
        assert word in lines[0], lines[0]
    assert not (run["out"] / "final.pt").exists()


def test_signal_in_the_last_update_lets_the_run_finish(runs):
    run = runs["B-sigusr1-in-last-update"]
    assert_ends_like_uninterrupted(run, runs["uninterrupted-B"])
    assert "stop signal received" not in run["stdout"]


def test_checkpoint_without_scaler_state_continues_in_fp16(runs):
    run = runs["bf16-checkpoint-continued-in-fp16"]
    assert_ok(run)
    assert "precision: fp16" in run["stdout"] and "step 7, epoch 2" in run["stdout"]
    assert load(run["out"] / "final.pt")["step"] == 14
