"""The feature and task catalogue: data in one place, read by the CLI, the renderer and the tests.

The template's `copier.yml` lists the same names (a test keeps the two in step).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from scaffold.errors import UsageError


@dataclass(frozen=True)
class Feature:
    name: str
    help: str
    requires: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    # requirement lines the generated project then needs (its requirements.txt is built from them)
    packages: tuple[str, ...] = ()
    layer: str = ""  # the team layer that defines it (scaffold/layers.py); "" for scaffold's own

    @property
    def tag(self) -> str:
        """What its lines are tagged with: `[amp]`, or `[LAYER:NAME]` for a layer's feature."""
        return f"{self.layer}:{self.name}" if self.layer else self.name


@dataclass(frozen=True)
class Task:
    name: str
    help: str
    packages: tuple[str, ...] = ()  # requirement lines, as for a feature


FEATURES: dict[str, Feature] = {
    f.name: f
    for f in (
        Feature(
            "amp",
            "Mixed precision (bf16/fp16 autocast, GradScaler for fp16, unscale before clipping).",
        ),
        Feature(
            "grad-accum",
            "Gradient accumulation over K micro-batches, exact window-size loss scaling.",
        ),
        Feature(
            "resume",
            "Atomic checkpoints, exact mid-epoch resume, SIGTERM/SIGUSR1 preemption.",
        ),
        Feature(
            "callbacks",
            "callbacks.py with plain hook objects called from visible lines in the loop.",
        ),
        Feature(
            "early-stopping",
            "Stop when a validation metric stops improving (--patience, --min-delta).",
        ),
        Feature(
            "tensorboard",
            "TensorBoard event files under <out-dir>/tb (loss, lr, throughput, validation).",
            packages=("tensorboard>=2.14",),
        ),
        Feature(
            "compile",
            "torch.compile the model (--compile/--no-compile); checkpoints keep plain keys.",
        ),
        Feature(
            "ddp",
            "DistributedDataParallel with torchrun, one node or many (gloo on CPU, nccl on CUDA).",
            conflicts=("fsdp",),
        ),
        Feature(
            "fsdp",
            "FSDP2 (fully_shard per block) with torchrun: sharded weights, gradients, optimizer "
            "state and checkpoints; --activation-checkpointing.",
            conflicts=("ddp",),
        ),
        Feature(
            "mlflow",
            "MLflow tracking: config, metrics by update step, best/final weights (sqlite default).",
            packages=("mlflow>=2.14",),
        ),
        Feature(
            "wandb",
            "Weights & Biases tracking: config, metrics by update step, optional weights artifact.",
            packages=("wandb>=0.17",),
        ),
        Feature(
            "sweep",
            "sweep.py: an Optuna study over train.py (median pruning, resumable SQLite study).",
            packages=("optuna>=3.6",),
        ),
        Feature(
            "export",
            "export.py: ONNX (checked with onnxruntime), TorchScript, torch.export program.",
            packages=("onnx>=1.17", "onnxscript>=0.3", "onnxruntime>=1.20"),
        ),
        Feature(
            "pretrained",
            "Fine-tune a pretrained backbone: timm for images, Hugging Face transformers for text.",
        ),
    )
}

TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            "image-classification",
            "ImageFolder images, torchvision transforms, a small CNN or a torchvision model.",
            packages=("torchvision>=0.19",),
        ),
        Task(
            "text-classification",
            "CSV/JSONL text and label, word vocabulary, transformer encoder, masked pooling.",
        ),
        Task(
            "token-classification",
            "CoNLL token/tag files, BIO tags, token accuracy and entity-level F1.",
        ),
    )
}

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


# Packages a feature needs only for some tasks: (feature, task) -> requirement lines
TASK_FEATURE_PACKAGES: dict[tuple[str, str], tuple[str, ...]] = {
    ("pretrained", "image-classification"): ("timm>=1.0", "safetensors>=0.4"),
    ("pretrained", "text-classification"): (
        "transformers>=4.40",
        "tokenizers>=0.19",
        "safetensors>=0.4",
    ),
    ("pretrained", "token-classification"): (
        "transformers>=4.40",
        "tokenizers>=0.19",
        "safetensors>=0.4",
    ),
}


def requirements(task: str, features, catalogue: dict[str, Feature] | None = None) -> list[str]:
    """The lines of a generated project's requirements.txt: one source of truth, this catalogue
    (scaffold's, or one with a layer's features added)."""
    catalogue = FEATURES if catalogue is None else catalogue
    lines = [*CORE_PACKAGES, *TASKS[task].packages, *LOOP_PACKAGES]
    for name in features:
        feature = catalogue[name]
        packages = (*feature.packages, *TASK_FEATURE_PACKAGES.get((name, task), ()))
        lines += [f"{package}  # [{feature.tag}]" for package in packages]
    return [*lines, *TEST_PACKAGES]
