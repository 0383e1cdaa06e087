"""The rendered snapshots in `generated_examples/`: one named combination per folder.

Regenerate them all after a template change with:

    python -m scaffold.examples

Tests render each combination again and compare every file byte for byte.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from scaffold.catalogue import FEATURES

# name -> (task, features)
EXAMPLES: dict[str, tuple[str, list[str]]] = {
    "minimal": ("image-classification", []),
    **{name: ("image-classification", [name]) for name in FEATURES},
    "amp+grad-accum": ("image-classification", ["amp", "grad-accum"]),
    "resume+amp+grad-accum": ("image-classification", ["amp", "grad-accum", "resume"]),
    "callbacks+early-stopping": ("image-classification", ["callbacks", "early-stopping"]),
    "ddp+grad-accum": ("image-classification", ["ddp", "grad-accum"]),
    "ddp+resume": ("image-classification", ["ddp", "resume"]),
    "all": ("image-classification", list(FEATURES)),
    "text-classification-minimal": ("text-classification", []),
    "text-classification-all": ("text-classification", list(FEATURES)),
    "text-classification+export": ("text-classification", ["export"]),
    "token-classification-minimal": ("token-classification", []),
    "token-classification-all": ("token-classification", list(FEATURES)),
}

ROOT = Path(__file__).resolve().parent.parent / "generated_examples"


def render_example(name: str) -> dict[str, bytes]:
    from scaffold.answers import Answers
    from scaffold.render import render

    task, features = EXAMPLES[name]
    return render(Answers(project_name=_project_name(name), task=task, features=features))


def _project_name(name: str) -> str:
    return "example-" + name.replace("+", "-")


def main(argv: list[str] | None = None) -> None:
    from scaffold.write import write_new_project

    names = (argv if argv is not None else sys.argv[1:]) or list(EXAMPLES)
    ROOT.mkdir(exist_ok=True)
    for stale in ROOT.iterdir():
        if stale.is_dir() and stale.name not in EXAMPLES:
            shutil.rmtree(stale)
    for name in names:
        dest = ROOT / name
        if dest.exists():
            shutil.rmtree(dest)
        write_new_project(dest, render_example(name))
        print(f"wrote {dest}")


if __name__ == "__main__":
    main()
