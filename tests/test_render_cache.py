"""The render caches (black's output, Jinja's compiled code) change nothing but the time a render
takes: the same bytes with the caches off, cold, warm, or damaged."""

from __future__ import annotations

import pytest

from scaffold import cache
from scaffold.answers import Answers
from scaffold.render import render

ANSWERS = Answers(project_name="cached", features=["amp", "resume"])


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    def use(value):
        monkeypatch.setenv("SCAFFOLD_CACHE_DIR", value)
        cache.cache_dir.cache_clear()

    yield use
    cache.cache_dir.cache_clear()


def test_caches_change_no_byte(tmp_path, cache_dir):
    cache_dir("")
    uncached = render(ANSWERS)
    assert not any(tmp_path.iterdir())

    cache_dir(str(tmp_path / "c"))
    cold = render(ANSWERS)
    black_entries = sorted((tmp_path / "c" / "black").iterdir())
    jinja_entries = sorted((tmp_path / "c" / "jinja").iterdir())
    py_files = [path for path in cold if path.endswith(".py")]
    assert len(black_entries) == len(py_files)
    assert len(jinja_entries) > len(cold)  # file names and question defaults are templates too
    warm = render(ANSWERS)
    assert uncached == cold == warm
    # a warm render reads the entries instead of writing new ones
    assert sorted((tmp_path / "c" / "black").iterdir()) == black_entries
    assert sorted((tmp_path / "c" / "jinja").iterdir()) == jinja_entries


def test_damaged_cache_entries_are_rebuilt(tmp_path, cache_dir):
    cache_dir(str(tmp_path / "c"))
    expected = render(ANSWERS)
    for i, entry in enumerate(sorted((tmp_path / "c").rglob("*.*"))):
        data = entry.read_bytes()
        # truncated, emptied, or a plausible-looking but altered black output
        entry.write_bytes([data[: len(data) // 2], b"", data.replace(b"def ", b"def  ")][i % 3])
    assert render(ANSWERS) == expected
    assert render(ANSWERS) == expected  # and the rebuilt entries are good
