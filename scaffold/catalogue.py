"""The feature and task catalogue, read by the CLI, the renderer and the tests.

A feature is a folder, `templates/features/NAME/` (its `feature.toml` is the catalogue's entry);
a team layer's features come in through scaffold/layers.py, in the same form. A task is a folder
too, `templates/tasks/NAME/` (`task.toml`, and the task's data.py and model.py templates).
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass
from pathlib import Path

from scaffold.errors import ScaffoldError, UsageError
from scaffold.paths import template_dir


@dataclass(frozen=True)
class Feature:
    name: str
    help: str
    requires: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    # requirement lines the generated project then needs (its requirements.txt is built from them)
    packages: tuple[str, ...] = ()
    layer: str = ""  # the team layer that defines it (scaffold/layers.py); "" for scaffold's own
    config: tuple[str, ...] = ()  # the Config fields of train.py it adds
    task_packages: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (task, lines): one task only

    @property
    def tag(self) -> str:
        """What its lines are tagged with: `[amp]`, or `[LAYER:NAME]` for a layer's feature."""
        return f"{self.layer}:{self.name}" if self.layer else self.name


@dataclass(frozen=True)
class Task:
    name: str
    help: str
    packages: tuple[str, ...] = ()  # requirement lines, as for a feature


def _strings(value, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of strings")
    return tuple(value)


def load_features(templates: Path) -> dict[str, Feature]:
    """scaffold's own features, read from `templates/features/NAME/feature.toml`, in their
    `order`. A feature folder also holds the lines it puts at the core templates' points
    (`blocks/FILE/POINT.jinja`) and the files it adds (`files/`): see scaffold/blocks.py."""
    found = []
    for path in sorted((templates / "features").glob("*/feature.toml")):
        name = path.parent.name
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
            unknown = set(data) - _FEATURE_KEYS
            if unknown:
                raise ValueError(f"unknown key {sorted(unknown)[0]!r}")
            if not isinstance(data.get("order"), int) or not isinstance(data.get("help"), str):
                raise ValueError("'order' (a number) and 'help' (a string) are required")
            task_packages = data.get("task_packages", {})
            if not isinstance(task_packages, dict):
                raise ValueError("task_packages must be a table")
            feature = Feature(
                name,
                data["help"],
                requires=_strings(data.get("requires", []), "requires"),
                conflicts=_strings(data.get("conflicts", []), "conflicts"),
                packages=_strings(data.get("packages", []), "packages"),
                config=_strings(data.get("config", []), "config"),
                task_packages=tuple(
                    (task, _strings(lines, f"task_packages.{task}"))
                    for task, lines in task_packages.items()
                ),
            )
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError) as exc:
            raise ScaffoldError(
                f"{path} is damaged ({exc}): reinstall scaffold, or fix the feature folder"
            ) from None
        found.append((data["order"], name, feature))
    return {name: feature for _, name, feature in sorted(found)}


_FEATURE_KEYS = {"order", "help", "requires", "conflicts", "packages", "config", "task_packages"}
FEATURES: dict[str, Feature] = load_features(template_dir())


def load_tasks(templates: Path) -> dict[str, Task]:
    """scaffold's tasks, read from `templates/tasks/NAME/task.toml` (order, help, packages), in
    their `order`. A task folder also holds the task's `data.py.jinja` and `model.py.jinja`,
    which the core templates of the same names include."""
    found = []
    for path in sorted((templates / "tasks").glob("*/task.toml")):
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
            unknown = set(data) - {"order", "help", "packages"}
            if unknown:
                raise ValueError(f"unknown key {sorted(unknown)[0]!r}")
            if not isinstance(data.get("order"), int) or not isinstance(data.get("help"), str):
                raise ValueError("'order' (a number) and 'help' (a string) are required")
            packages = _strings(data.get("packages", []), "packages")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError) as exc:
            raise ScaffoldError(
                f"{path} is damaged ({exc}): reinstall scaffold, or fix the task folder"
            ) from None
        found.append(
            (data["order"], path.parent.name, Task(path.parent.name, data["help"], packages))
        )
    return {name: task for _, name, task in sorted(found)}


TASKS: dict[str, Task] = load_tasks(template_dir())

DEFAULT_TASK = "image-classification"

# What every generated project needs, around the task's and the features' own packages.
CORE_PACKAGES = ("torch>=2.4",)
LOOP_PACKAGES = (
    "tqdm>=4.60",
    "matplotlib>=3.7  # plot.py: curves and confusion matrices",
    "scikit-learn>=1.3  # evaluate.py: per-class metrics, confusion matrix",
)
TEST_PACKAGES = ("pytest>=8  # runs tests/",)


def closest(name: str, choices) -> str | None:
    """The choice `name` was probably meant to be (a typo), or None."""
    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(name: str, choices) -> str:
    """' (did you mean 'early-stopping'?)' for a near miss among `choices`, else ''."""
    close = closest(name, choices)
    return f" (did you mean {close!r}?)" if close else ""


def check_task(task: str) -> str:
    if task not in TASKS:
        raise UsageError(
            f"unknown task {task!r}{did_you_mean(task, TASKS)}: choose one of {', '.join(TASKS)}"
        )
    return task


def resolve_features(
    names: list[str] | tuple[str, ...], catalogue: dict[str, Feature] | None = None
) -> list[str]:
    """Validate feature names against the catalogue; return them de-duplicated in catalogue order.

    Raises UsageError for an unknown name, a missing requirement or a conflict.
    """
    catalogue = FEATURES if catalogue is None else catalogue
    chosen = set()
    for name in names:
        if name not in catalogue:
            raise UsageError(
                f"unknown feature {name!r}{did_you_mean(name, catalogue)}: "
                f"run 'scaffold features' to list them ({', '.join(catalogue)})"
            )
        chosen.add(name)
    for name in sorted(chosen, key=list(catalogue).index):
        feature = catalogue[name]
        for needed in feature.requires:
            if needed not in chosen:
                raise UsageError(f"feature {name!r} requires {needed!r}: add '--feature {needed}'")
        for other in feature.conflicts:
            if other in chosen:
                raise UsageError(f"features {name!r} and {other!r} conflict: choose one of them")
    return [name for name in catalogue if name in chosen]


def requirements(task: str, features, catalogue: dict[str, Feature] | None = None) -> list[str]:
    """The lines of a generated project's requirements.txt: one source of truth, this catalogue
    (scaffold's, or one with a layer's features added)."""
    catalogue = FEATURES if catalogue is None else catalogue
    lines = [*CORE_PACKAGES, *TASKS[task].packages, *LOOP_PACKAGES]
    for name in features:
        feature = catalogue[name]
        packages = (*feature.packages, *dict(feature.task_packages).get(task, ()))
        lines += [f"{package}  # [{feature.tag}]" for package in packages]
    return [*lines, *TEST_PACKAGES]
