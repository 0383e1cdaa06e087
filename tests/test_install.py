"""The template ships inside the wheel: install into a fresh venv and render from elsewhere."""

from __future__ import annotations

import subprocess
import sys
import venv

import pytest

from conftest import REPO


@pytest.mark.slow
def test_wheel_in_fresh_venv_renders_outside_the_repo(tmp_path):
    wheel_dir = tmp_path / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheel_dir), str(REPO)],
        check=True, capture_output=True,
    )
    wheel = next(wheel_dir.glob("*.whl"))
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "scaffold/templates/copier.yml" in names
    assert "scaffold/templates/project/train.py.jinja" in names

    env_dir = tmp_path / "venv"
    # system site-packages provide the dependencies (no network); scaffold itself comes from the wheel
    venv.create(env_dir, with_pip=True, system_site_packages=True)
    python = env_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = "import scaffold.render as r; print(r.template_dir())"
    where = subprocess.run([python, "-c", code], cwd=elsewhere, capture_output=True, text=True, check=True)
    assert str(env_dir) in where.stdout, where.stdout
    result = subprocess.run([python, "-m", "scaffold", "new", "proj", "--defaults"], cwd=elsewhere, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (elsewhere / "proj" / "train.py").is_file()
