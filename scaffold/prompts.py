"""The questions `scaffold new` asks on a terminal: a task choice and a feature checkbox.

questionary (which copier brings in) draws them; it is imported only when a question is asked,
so `scaffold --help` stays fast. A wrong name typed as a flag opens the same question with the
near miss corrected instead of exiting, so nothing typed so far is lost.
"""

from __future__ import annotations

from scaffold.catalogue import FEATURES, TASKS, Feature, closest, did_you_mean


def feature_problem(names, catalogue: dict[str, Feature] | None = None) -> str | None:
    """Why a set of ticked features cannot be generated (one line saying what to tick), or None."""
    catalogue = FEATURES if catalogue is None else catalogue
    ticked = set(names)
    for name in [n for n in catalogue if n in ticked]:
        for needed in catalogue[name].requires:
            if needed not in ticked:
                return f"{name} needs {needed}: tick {needed} too, or untick {name}"
        for other in catalogue[name].conflicts:
            if other in ticked:
                return f"{name} and {other} exclude each other: untick one of them"
    return None


def split_known(
    names: list[str], catalogue: dict[str, Feature] | None = None
) -> tuple[list[str], list[str]]:
    """(known feature names, one note per unknown name with its correction ticked if close)."""
    catalogue = FEATURES if catalogue is None else catalogue
    known, notes = [], []
    for name in names:
        if name in catalogue:
            known.append(name)
            continue
        close = closest(name, catalogue)
        if close:
            known.append(close)
        notes.append(f"unknown feature {name!r}{did_you_mean(name, catalogue)}")
    return known, notes


def ask_task(default: str, note: str = "") -> str:
    import questionary

    if note:
        print(note)
    return questionary.select(
        "Task",
        choices=[
            questionary.Choice(t.name, value=t.name, description=t.help) for t in TASKS.values()
        ],
        default=default if default in TASKS else None,
    ).unsafe_ask()


def ask_features(
    ticked: list[str], note: str = "", catalogue: dict[str, Feature] | None = None
) -> list[str]:
    """The feature checkbox: scaffold's features, and a layer's when `catalogue` has them."""
    import questionary

    catalogue = FEATURES if catalogue is None else catalogue
    if note:
        print(note)

    def validate(names: list[str]) -> bool | str:
        return feature_problem(names, catalogue) or True

    return questionary.checkbox(
        "Features (space to tick, enter when done)",
        choices=[
            questionary.Choice(f.name, value=f.name, checked=f.name in ticked, description=f.help)
            for f in catalogue.values()
        ],
        validate=validate,
    ).unsafe_ask()
