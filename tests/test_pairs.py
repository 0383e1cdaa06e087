"""Every pair of features, for every task, renders a project that lints clean in its own folder
(issue 41, item 4; cookiecutter-django renders every combination the same way): `ruff check`
under the project's own pyproject.toml, `ruff check --select E,F,W,I,B` and `black --check`, no
training. The snapshots of tests/test_examples.py cover 37 combinations and train them; this
covers the rest of the pairs, where a feature's block could meet another's and leave an unused
import, a name defined twice or a line too long. A pair that cannot be combined is refused with
the catalogue's message, as `scaffold new` refuses it."""

from __future__ import annotations

import itertools
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from scaffold.answers import Answers
from scaffold.catalogue import DEFAULT_TASK, FEATURES, TASKS
from scaffold.errors import UsageError
from scaffold.paths import in_record_dir
from scaffold.render import render


def render_into(job: tuple[str, tuple[str, ...], str]) -> str:
    """Render one project's files (its record aside) into a folder of its own."""
    task, features, dest = job
    for rel, data in render(Answers(project_name="pair", task=task, features=features)).items():
        if not in_record_dir(rel):
            path = Path(dest) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return dest


# the default task's 90 pairs are in the fast subset (about 150 s of CPU with black's cache
# cold, two render processes); the other tasks' in the slow one
PAIR_TASKS = [task if task == DEFAULT_TASK else pytest.param(task, marks=pytest.mark.slow)
              for task in TASKS]


@pytest.mark.parametrize("task", PAIR_TASKS)
def test_every_pair_of_features_renders_lint_clean(tmp_path, task):
    jobs, refused = [], []
    for pair in itertools.combinations(FEATURES, 2):
        try:
            answers = Answers(project_name="pair", task=task, features=pair).validated()
        except UsageError as exc:
            refused.append((task, pair, str(exc)))
            continue
        jobs.append((task, answers.features, str(tmp_path / task / "+".join(pair))))
    conflicts = {(name, other) for name, f in FEATURES.items() for other in f.conflicts}
    assert refused == [
        (task, pair, f"features {pair[0]!r} and {pair[1]!r} conflict: choose one of them")
        for pair in itertools.combinations(FEATURES, 2)
        if pair in conflicts
    ]
    assert len(jobs) + len(refused) == len(FEATURES) * (len(FEATURES) - 1) // 2
    with ProcessPoolExecutor(2) as pool:
        assert len(list(pool.map(render_into, jobs, chunksize=8))) == len(jobs)

    # one ruff run over every project: each file is checked under the settings of the nearest
    # pyproject.toml, its own project's (ruff's hierarchical configuration)
    ruff = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise"]
    for command in ([*ruff, "."], [*ruff, "--select", "E,F,W,I,B", "."],
                    [sys.executable, "-m", "black", "--check", "-q", "."]):
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0, f"{' '.join(command[2:])}:\n{result.stdout}{result.stderr}"
    checked = len(list(tmp_path.glob("*/*/train.py")))  # every pair was there to check
    assert checked == len(jobs)


@pytest.mark.parametrize("task", list(TASKS))
def test_the_nearest_projects_settings_apply_to_a_pair(tmp_path, task):
    """The check above can fail: a file of one pair with an unsorted import block and a zip()
    without strict= is reported under that project's own settings."""
    project = Path(render_into((task, ("amp", "resume"), str(tmp_path / "amp+resume"))))
    mine = "import torch\nimport os\n\nprint(list(zip(os.sep, torch.ones(1))))\n"
    (project / "mine.py").write_text(mine)
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format",
                             "concise", "."], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1
    assert "mine.py:1:1: I001" in result.stdout and "B905" in result.stdout, result.stdout
