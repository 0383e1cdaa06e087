"""The template ships inside the wheel: install into a fresh venv and render from elsewhere."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import venv
import zipfile

import pytest

from conftest import REPO


def _dependency_dirs() -> list[str]:
    """The site-packages folders of the interpreter running the tests, wherever it lives: a
    virtual environment, a conda environment or a system install (no network: the fresh venv
    borrows scaffold's dependencies from here)."""
    dirs = [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    # a venv made with --system-site-packages reaches the base interpreter's folders via sys.path
    dirs += [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    return list(dict.fromkeys(d for d in dirs if os.path.isdir(d)))


@pytest.mark.slow
def test_wheel_in_fresh_venv_renders_outside_the_repo(tmp_path):
    wheel_dir = tmp_path / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-w", str(wheel_dir), str(REPO)],
        check=True, capture_output=True,
    )
    wheel = next(wheel_dir.glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "scaffold/templates/copier.yml" in names
    assert "scaffold/templates/project/train.py.jinja" in names

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)  # isolated: sees neither the repo nor any site-packages
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    # Plain path lines: appended after the venv's own site-packages, so the wheel's scaffold wins,
    # and no .pth file in those folders runs (an editable scaffold there stays invisible).
    with open(os.path.join(purelib, "borrowed-dependencies.pth"), "w") as pth:
        pth.write("".join(f"{d}\n" for d in _dependency_dirs()))
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)],
        check=True, capture_output=True,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    code = "import scaffold.render as r; print(r.template_dir())"
    where = subprocess.run(
        [python, "-c", code], cwd=elsewhere, capture_output=True, text=True, env=env
    )
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(purelib), where.stdout
    result = subprocess.run(
        [python, "-m", "scaffold", "new", "proj", "--defaults"],
        cwd=elsewhere, capture_output=True, text=True, env=env,
    )
    assert result.returncode == 0, result.stderr
    assert (elsewhere / "proj" / "train.py").is_file()
