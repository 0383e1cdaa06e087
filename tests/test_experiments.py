"""Config files and replay (core), features mlflow, wandb and sweep, proved by running generated code.

- config: `python train.py --config runs/a/config.json --out-dir runs/b` replays run a (bitwise
  on CPU); TOML and YAML files set fields, flags override them; --help lists every field and
  --config. (The generated test_core.py checks unknown keys and wrong types.)
- mlflow: a run killed with SIGKILL (os._exit, no cleanup) after its checkpoint and resumed is
  ONE MLflow run, read back with MlflowClient: no metric twice at a step, the values of
  metrics.csv at the same steps; last.pt names the run. An unreachable tracking URI is one line;
  W&B that cannot start ends the MLflow run it follows as KILLED.
- wandb: the same killed run's resumed W&B run keeps the run id (offline run directories).
- sweep: a sweep killed (SIGKILL) inside a trial and started again completes the study; the best
  trial's config file is accepted by train.py --config; a search over an unknown field and
  sweep.py under torchrun (ddp) are refused with one line, writing nothing.
- a project without a feature imports nothing of it; a missing package is one line.

The generated tests of each feature (test_mlflow.py, test_wandb.py, test_sweep.py) run in
tests/test_generated_suite.py.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_jobs

from scaffold.examples import EXAMPLES, ROOT

SMALL = ["--device", "cpu", "--synthetic-train-size", "96", "--synthetic-val-size", "16",
         "--batch-size", "8", "--image-size", "16", "--log-every", "1"]

# train.py with a kill -9 (os._exit: no finally, no atexit) just before update STOP
KILLER = """
import os, sys
from torch.optim.optimizer import register_optimizer_step_pre_hook
import train
updates = []
def hook(optimizer, args, kwargs):
    updates.append(1)
    if len(updates) == int(os.environ["KILL_BEFORE_UPDATE"]):
        sys.stdout.flush()
        os._exit(9)
register_optimizer_step_pre_hook(hook)
train.main(sys.argv[1:])
"""


def copy_example(name: str, dest: Path) -> Path:
    return Path(shutil.copytree(ROOT / name, dest, ignore=shutil.ignore_patterns("__pycache__")))


def one_line_error(stderr: str) -> str:
    """The one error line of a refusal (argparse's usage lines may come before it)."""
    lines = [line for line in stderr.splitlines() if "error:" in line]
    assert "Traceback" not in stderr, stderr[-2000:]
    assert len(lines) == 1, stderr[-2000:]
    return lines[0]


def test_projects_without_a_feature_import_nothing_of_it():
    packages = {"mlflow": "mlflow", "wandb": "wandb", "sweep": "optuna"}
    for name, (_task, features) in EXAMPLES.items():
        text = "\n".join(p.read_text() for p in (ROOT / name).rglob("*.py"))
        for feature, package in packages.items():
            assert (f"import {package}" in text) == (feature in features), (name, feature)
        requirements = (ROOT / name / "requirements.txt").read_text()
        for feature, package in packages.items():
            assert (package in requirements) == (feature in features), (name, feature)


# --- config files and replay --------------------------------------------------------------------


@pytest.mark.slow
def test_config_json_replays_a_run_and_files_set_fields(tmp_path):
    project = copy_example("minimal", tmp_path / "p")
    (project / "c.toml").write_text('epochs = 1\nmax-steps = 2\nlr = 1e-3\nseed = 7\n')
    (project / "c.yaml").write_text("epochs: 1\nmax_steps: 2\nlr: 1e-3\nseed: 7\n")  # 1e-3: a str to PyYAML
    jobs = [
        {"project": project, "args": [*SMALL, "--epochs", "2", "--max-steps", "5", "--seed", "3", "--out-dir", "runs/a"]},
        {"project": project, "args": ["--config", "runs/a/config.json", "--out-dir", "runs/b"]},
        {"project": project, "args": [*SMALL, "--config", "c.toml", "--out-dir", "runs/toml"]},
        {"project": project, "args": [*SMALL, "--config", "c.yaml", "--lr", "2e-3", "--out-dir", "runs/yaml"]},
        {"project": project, "args": ["--help"]},
    ]
    results = run_jobs(jobs, tmp_path)
    for result in results[:4]:
        assert result["ok"], result["error"] + result["stdout"]
    assert results[4]["exit_code"] == 0
    import torch

    a, b = (torch.load(project / "runs" / n / "final.pt", weights_only=True) for n in ("a", "b"))
    assert a["config"] == {**b["config"], "out_dir": "runs/a"}
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), "replay differs"
    toml = json.loads((project / "runs/toml/config.json").read_text())
    yaml = json.loads((project / "runs/yaml/config.json").read_text())
    assert (toml["epochs"], toml["max_steps"], toml["lr"], toml["seed"]) == (1, 2, 1e-3, 7)
    assert (yaml["lr"], yaml["seed"]) == (2e-3, 7)  # the flag overrides the file
    help_text = results[4]["stdout"]
    for field in a["config"]:
        assert "--" + field.replace("_", "-") in help_text, field
    assert "--config FILE" in help_text


# --- mlflow and wandb: killed, resumed, one run -------------------------------------------------


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


@pytest.mark.slow
def test_killed_and_resumed_run_is_one_tracked_run_without_duplicate_steps(tmp_path):
    project = copy_example("resume+mlflow+wandb", tmp_path / "p")
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    args = [*SMALL, "--epochs", "2", "--checkpoint-every", "4", "--out-dir", "run"]
    # an unreachable tracking server, at the same time: one line, nothing trained
    unreachable = subprocess.Popen(
        [sys.executable, "train.py", *SMALL, "--mlflow-uri", "http://127.0.0.1:9", "--out-dir", "bad"],
        cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**env, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"},
    )
    # killed before update 7: last.pt holds update 4; updates 5 and 6 are logged already
    killed = subprocess.run([sys.executable, "-c", KILLER, *args], cwd=project, capture_output=True,
                            text=True, env={**env, "KILL_BEFORE_UPDATE": "7"}, timeout=600)
    assert killed.returncode == 9, killed.stderr[-3000:]
    resumed = subprocess.run([sys.executable, "train.py", *args], cwd=project, capture_output=True,
                             text=True, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout

    rows = read_csv(project / "run" / "metrics.csv")
    train_steps = [int(r["step"]) for r in rows if "train_loss" in r]
    assert train_steps.count(5) == 2 and train_steps.count(6) == 2, "the kill left no repeated step"
    expected = {}  # name -> {step: value}; the repeated updates are bitwise the same
    for row in rows:
        for name, value in row.items():
            if name in ("step", "epoch"):
                continue
            step = int(row["step"])
            first = expected.setdefault(name, {}).setdefault(step, value)
            # samples_per_s is a timing: it differs between the two runs
            assert first == value or name == "samples_per_s", (name, step)

    import mlflow
    import torch

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert torch.load(project / "run" / "last.pt", weights_only=True)["mlflow_run_id"] == run.info.run_id
    assert set(run.data.metrics) == set(expected)
    for name, values in expected.items():
        history = client.get_metric_history(run.info.run_id, name)
        steps = [m.step for m in history]
        assert len(steps) == len(set(steps)), f"{name} logged twice at a step: {sorted(steps)}"
        assert set(steps) == set(values), name
        if name != "samples_per_s":
            assert {m.step: m.value for m in history} == values, name
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"best.pt", "final.pt"}

    # wandb: both starts wrote offline runs with the same id (the one last.pt names)
    folders = sorted((project / "run" / "wandb").glob("offline-run-*"))
    assert len(folders) == 2
    wandb_id = torch.load(project / "run" / "last.pt", weights_only=True)["wandb_run_id"]
    assert all(folder.name.endswith("-" + wandb_id) for folder in folders), folders

    _, stderr = unreachable.communicate(timeout=300)
    assert unreachable.returncode == 1
    assert one_line_error(stderr).startswith("error: cannot log to MLflow at http://127.0.0.1:9")
    assert not (project / "bad" / "metrics.csv").exists()


@pytest.mark.slow
def test_wandb_that_cannot_start_ends_the_mlflow_run_it_opened(tmp_path):
    """W&B online without an API key: one line, and the MLflow run opened before it ends as
    KILLED (not left running, not FINISHED by MLflow's exit hook)."""
    project = copy_example("resume+mlflow+wandb", tmp_path / "p")
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(MLFLOW_TRACKING_URI=uri, WANDB_MODE="online", HOME=str(tmp_path), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "train.py", *SMALL, "--out-dir", "run"], cwd=project,
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert one_line_error(proc.stderr).startswith("error: cannot start W&B (")
    assert not (project / "run" / "metrics.csv").exists()

    import mlflow

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [run.info.status for run in runs] == ["KILLED"]


# --- sweep --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_killed_sweep_continues_and_its_best_config_replays(tmp_path):
    project = copy_example("sweep", tmp_path / "p")
    ddp_sweep = tmp_path / "ddp"
    from conftest import render_project

    render_project(ddp_sweep, features=["ddp", "sweep"])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    sweep_args = ["--n-trials", "3", *[a for a in SMALL if a not in ("--batch-size", "8")], "--epochs", "2"]
    # refusals, at the same time: sweep.py under torchrun (ddp), a search over an unknown field
    under_torchrun = subprocess.Popen([sys.executable, "sweep.py", *sweep_args], cwd=ddp_sweep,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env={**env, "RANK": "0", "WORLD_SIZE": "1"})
    unknown = copy_example("sweep", tmp_path / "unknown")
    text = (unknown / "sweep.py").read_text()
    (unknown / "sweep.py").write_text(text.replace('"lr": trial.', '"lrr": trial.', 1))
    refused = subprocess.Popen([sys.executable, "sweep.py", *sweep_args], cwd=unknown,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    # kill -9 the sweep once its second trial has started
    sweep = subprocess.Popen([sys.executable, "sweep.py", *sweep_args], cwd=project,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 300
    while not (project / "runs/sweep/trial-0001/config.json").exists():
        assert sweep.poll() is None, sweep.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the second trial never started"
        time.sleep(0.05)
    sweep.kill()
    sweep.wait()
    again = subprocess.run([sys.executable, "sweep.py", *sweep_args], cwd=project,
                           capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]

    import optuna

    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{project / 'sweep.db'}")
    states = [t.state.name for t in study.get_trials()]
    assert states.count("FAIL") == 1 and states[1] == "FAIL", states  # the trial it killed
    assert len([s for s in states if s in ("COMPLETE", "PRUNED")]) == 3, states
    best = json.loads((project / "runs/sweep/best.json").read_text())
    for name, value in study.best_trial.params.items():
        assert best[name] == value
    replay = run_jobs([{"project": project, "args": ["--config", "runs/sweep/best.json", "--max-steps", "1"]}], tmp_path)
    assert replay[0]["ok"], replay[0]["error"]

    torchrun_error = under_torchrun.communicate(timeout=300)[1]
    refused_error = refused.communicate(timeout=300)[1]
    assert under_torchrun.returncode == 1
    assert "not torchrun" in one_line_error(torchrun_error)
    assert refused.returncode == 2
    assert "lrr" in one_line_error(refused_error)
    assert not (unknown / "sweep.db").exists() and not (unknown / "runs").exists()


@pytest.mark.slow
def test_a_missing_tracker_package_is_one_line(tmp_path):
    project = copy_example("mlflow", tmp_path / "p")
    blocker = "import sys; sys.modules['mlflow'] = None; sys.argv = ['train.py']; "
    proc = subprocess.run([sys.executable, "-c", blocker + "import runpy; runpy.run_path('train.py', run_name='__main__')"],
                          cwd=project, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert one_line_error(proc.stderr) == "error: feature mlflow needs mlflow: pip install -r requirements.txt"
    assert not (project / "runs").exists()
