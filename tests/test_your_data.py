"""Issue 40 (d): `pytest --data-dir=DATA` runs a generated project's own suite on the user's data.

- test_suite_passes_on_your_data[NAME]: a copy of generated_examples/NAME, `python -m pytest
  --data-dir=DATA --basetemp B` with DATA on disk in the task's format (an ImageFolder of PNG and
  JPEG files, a CSV with a byte-order mark and quoted commas, a CoNLL file): every generated test
  passes, the header names DATA and its sizes, and the run of test_core's first test trained on
  DATA (its final.pt records DATA as --data-dir and DATA's classes or tags, not the built-in
  ones). `ddp` also runs its torchrun workers on DATA.
- test_bad_data_stops_the_suite_with_one_line[CASE]: no folder, a folder train.py cannot read,
  and too few samples each give exit status 4 (pytest's usage error), one `ERROR: --data-dir`
  line that names the problem, no traceback, and no test run.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scaffold.examples import ROOT
from test_tasks import COLOURS, conll_tags, conll_text, text_rows, write_csv, write_image_folder

pytestmark = pytest.mark.slow

TIMEOUT = 1200  # seconds for one suite


def image_data(root: Path) -> set[str]:
    write_image_folder(root, {"train": 25, "val": 6}, size=24)  # 75 and 18 images
    return set(COLOURS)


def text_data(root: Path) -> set[str]:
    write_csv(root / "train.csv", text_rows(90, 1))
    write_csv(root / "val.csv", text_rows(24, 2))
    return {row["label"] for row in text_rows(90, 1)}


def token_data(root: Path) -> set[str]:
    train = conll_text(90, 1)
    (root / "train.txt").write_text(train)
    (root / "val.txt").write_text(conll_text(24, 2))
    return conll_tags(train)


# snapshot -> (writer of DATA, the data_info key that must hold what the writer returned)
SUITES = {
    "minimal": (image_data, "classes"),
    "text-classification-minimal": (text_data, "classes"),
    "token-classification-minimal": (token_data, "tags"),
    "text-classification-pretrained": (text_data, "classes"),  # a tokenizer builds the datasets
    "ddp": (image_data, "classes"),  # torchrun workers read DATA too
}


def run_pytest(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],  # not -q: the header
        cwd=project, capture_output=True, text=True, timeout=TIMEOUT,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def copy_of(name: str, dest: Path) -> Path:
    shutil.copytree(ROOT / name, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="module")
def suites(tmp_path_factory):
    """Every suite at once, one subprocess per CPU."""
    tmp = tmp_path_factory.mktemp("your-data")
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(max(2, os.cpu_count() or 1)) as pool:
        for name, (writer, key) in SUITES.items():
            data = tmp / name / "DATA"
            data.mkdir(parents=True)
            expected = writer(data)
            project = copy_of(name, tmp / name / "project")
            base = tmp / name / "basetemp"
            future = pool.submit(run_pytest, project, f"--data-dir={data}", "--basetemp", str(base))
            jobs[name] = (future, data, base, key, expected)
        return {name: (future.result(), *rest) for name, (future, *rest) in jobs.items()}


@pytest.mark.parametrize("name", list(SUITES))
def test_suite_passes_on_your_data(suites, name):
    proc, data, base, key, expected = suites[name]
    output = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, f"the suite of {name} fails on its --data-dir:\n{output}"
    assert " passed" in proc.stdout
    assert f"--data-dir {data}: " in proc.stdout, output  # the header line
    final = base / "test_a_few_steps_run_and_write0" / "final.pt"  # pytest cuts long names
    meta = torch.load(final, map_location="cpu", weights_only=True)
    assert meta["config"]["data_dir"] == str(data.resolve())
    assert set(meta["data"][key]) - {"O"} == expected - {"O"}, meta["data"][key]


def no_folder(root: Path) -> tuple[Path, str]:
    return root / "nowhere", "not a folder"


def unreadable(root: Path) -> tuple[Path, str]:
    write_image_folder(root, {"train": 25, "val": 6}, size=8)
    (root / "train" / "green" / "broken.png").write_text("this is text, not a PNG\n")
    return root, "not a readable image"


def too_few(root: Path) -> tuple[Path, str]:
    write_image_folder(root, {"train": 20, "val": 6}, size=8)  # 60 training images
    return root, "60 training and 18 validation samples; the tests need at least 72 and 16"


BAD = {"no-folder": no_folder, "unreadable-image": unreadable, "too-few-samples": too_few}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_data_stops_the_suite_with_one_line(case, tmp_path):
    project = copy_of("minimal", tmp_path / "project")
    (tmp_path / "DATA").mkdir()
    data, reason = BAD[case](tmp_path / "DATA")
    proc = run_pytest(project, f"--data-dir={data}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 4, output  # pytest's usage error: nothing ran
    errors = [line for line in output.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and errors[0].startswith(f"ERROR: --data-dir {data}: "), output
    assert reason in errors[0], output
    assert "Traceback" not in output and " passed" not in output, output
