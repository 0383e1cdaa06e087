"""Shared helpers: render projects, and run generated training code cheaply and for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# git with a fixed identity and no system config: tests that commit get the same repository
GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
}
RUNNER = Path(__file__).resolve().parent / "runner.py"

# Small, fast settings for generated train.py runs (built-in data).
TINY = [
    "--synthetic-train-size", "96",
    "--synthetic-val-size", "40",
    "--batch-size", "16",
    "--log-every", "1",
]


def render_project(dest: Path, task: str = "image-classification", features=(), name=None) -> Path:
    """Render a project with scaffold's own renderer and write it to `dest`; return `dest`."""
    from scaffold.answers import Answers
    from scaffold.render import project_files
    from scaffold.write import write_new_project

    answers = Answers(project_name=name or Path(dest).name, task=task, features=list(features))
    write_new_project(Path(dest), project_files(answers))
    return Path(dest)


def run_jobs(jobs: list[dict], tmp_path: Path, timeout: float = 900) -> list[dict]:
    """Run each job's `train.main(args)` in one subprocess (see tests/runner.py)."""
    jobs_file = tmp_path / f"jobs-{os.getpid()}-{id(jobs)}.json"
    results_file = jobs_file.with_suffix(".results.json")
    jobs_file.write_text(json.dumps([{**j, "project": str(j["project"])} for j in jobs]))
    proc = subprocess.run(
        [sys.executable, str(RUNNER), str(jobs_file), str(results_file)],
        capture_output=True, text=True, timeout=timeout,
    )
    if proc.returncode != 0 or not results_file.exists():
        raise AssertionError(f"runner failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(results_file.read_text())


def run_train(project: Path, args: list[str], timeout: float = 600, env=None, **kwargs):
    """`python train.py ARGS` in the project directory, as a user runs it."""
    return subprocess.run(
        [sys.executable, "train.py", *args],
        cwd=project, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})}, **kwargs,
    )


def scaffold_cli(*args: str, cwd=None, input=None, timeout: float = 120):
    """Run the installed CLI as a user does (python -m scaffold, same entry point)."""
    return subprocess.run(
        [sys.executable, "-m", "scaffold", *args],
        cwd=cwd, capture_output=True, text=True, input=input, timeout=timeout,
    )


@pytest.fixture
def tiny_args():
    return list(TINY)


def git(cwd, *args) -> str:
    """`git -C cwd ARGS` with GIT_ENV; its stdout."""
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True,
                          text=True, env=GIT_ENV).stdout


def commit_all(repo, message="edit"):
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
