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

# The experiment features (trackers, sweeps) talk to a store outside the loop and import
# large packages: they have their own examples, and `all` is every from-scratch feature of
# the training loop, so that it stays fast to run and writes nowhere but its --out-dir.
# ddp and fsdp conflict: `all` takes ddp, `all-fsdp` takes fsdp; `pretrained` swaps the
# model and has its own examples.
EXPERIMENT_FEATURES = ("mlflow", "wandb", "sweep")
LOOP_FEATURES = [f for f in FEATURES if f not in EXPERIMENT_FEATURES]
ALL = [f for f in LOOP_FEATURES if f not in ("fsdp", "pretrained")]
ALL_FSDP = [f for f in LOOP_FEATURES if f not in ("ddp", "pretrained")]

# name -> (task, features)
EXAMPLES: dict[str, tuple[str, list[str]]] = {
    "minimal": ("image-classification", []),
    **{name: ("image-classification", [name]) for name in [*ALL, "fsdp", *EXPERIMENT_FEATURES]},
    "amp+grad-accum": ("image-classification", ["amp", "grad-accum"]),
    "resume+amp+grad-accum": ("image-classification", ["amp", "grad-accum", "resume"]),
    "callbacks+early-stopping": ("image-classification", ["callbacks", "early-stopping"]),
    "ddp+grad-accum": ("image-classification", ["ddp", "grad-accum"]),
    "ddp+resume": ("image-classification", ["ddp", "resume"]),
    "fsdp+grad-accum": ("image-classification", ["fsdp", "grad-accum"]),
    "fsdp+resume": ("image-classification", ["fsdp", "resume"]),
    "resume+mlflow+wandb": ("image-classification", ["resume", "mlflow", "wandb"]),
    "text-classification-sweep": ("text-classification", ["sweep"]),
    "all": ("image-classification", ALL),
    "all-fsdp": ("image-classification", ALL_FSDP),
    "text-classification-minimal": ("text-classification", []),
    "text-classification-all": ("text-classification", ALL),
    "text-classification+export": ("text-classification", ["export"]),
    "token-classification-minimal": ("token-classification", []),
    "token-classification-all": ("token-classification", ALL),
    "image-classification-pretrained": ("image-classification", ["pretrained"]),
    "image-classification-pretrained+export": ("image-classification", ["pretrained", "export"]),
    "text-classification-pretrained": ("text-classification", ["pretrained"]),
    "token-classification-pretrained": ("token-classification", ["pretrained"]),
    "token-classification-pretrained-fsdp": (
        "token-classification",
        ["pretrained", "fsdp", "amp", "grad-accum", "resume", "export"],
    ),
    "token-classification-pretrained-all": (
        "token-classification",
        [f for f in LOOP_FEATURES if f != "fsdp"],
    ),
}

# name -> (task, features, layer): rendered with a team layer of examples/layers/, named by its
# path relative to this repository (so the snapshot's record is the same on every machine)
LAYERED_EXAMPLES: dict[str, tuple[str, list[str], str]] = {
    "layer-acme": ("image-classification", ["amp", "jsonl-log"], "examples/layers/acme"),
}

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "generated_examples"


def render_example(name: str) -> dict[str, bytes]:
    import os

    from scaffold.answers import Answers
    from scaffold.layers import Pin
    from scaffold.render import project_files

    if name in LAYERED_EXAMPLES:
        task, features, layer = LAYERED_EXAMPLES[name]
        here = os.getcwd()
        os.chdir(REPO)  # the layer's recorded source is relative to the repository
        try:
            return project_files(
                Answers(
                    project_name=_project_name(name),
                    task=task,
                    features=features,
                    layers=(Pin(layer),),
                )
            )
        finally:
            os.chdir(here)
    task, features = EXAMPLES[name]
    return project_files(Answers(project_name=_project_name(name), task=task, features=features))


def _project_name(name: str) -> str:
    return "example-" + name.replace("+", "-")


def main(argv: list[str] | None = None) -> None:
    from scaffold.write import write_new_project

    names = (argv if argv is not None else sys.argv[1:]) or [*EXAMPLES, *LAYERED_EXAMPLES]
    ROOT.mkdir(exist_ok=True)
    for stale in ROOT.iterdir():
        if stale.is_dir() and stale.name not in EXAMPLES and stale.name not in LAYERED_EXAMPLES:
            shutil.rmtree(stale)
    for name in names:
        dest = ROOT / name
        if dest.exists():
            shutil.rmtree(dest)
        write_new_project(dest, render_example(name))
        print(f"wrote {dest}")


if __name__ == "__main__":
    main()
