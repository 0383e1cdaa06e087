"""The feature and task catalogue: data in one place, read by the CLI, the renderer and the tests.

The template's `copier.yml` lists the same names (a test keeps the two in step).
"""

from __future__ import annotations

from dataclasses import dataclass

from scaffold.errors import UsageError


@dataclass(frozen=True)
class Feature:
    name: str
    help: str
    requires: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()  # extra run-time packages the generated project then needs


@dataclass(frozen=True)
class Task:
    name: str
    help: str
    packages: tuple[str, ...] = ()


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
            packages=("tensorboard",),
        ),
        Feature(
            "compile",
            "torch.compile the model (--compile/--no-compile); checkpoints keep plain keys.",
        ),
        Feature(
            "ddp",
            "DistributedDataParallel with torchrun, one node or many (gloo on CPU, nccl on CUDA).",
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
            packages=("torchvision",),
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


def check_task(task: str) -> str:
    if task not in TASKS:
        raise UsageError(
            f"unknown task {task!r}: choose one of {', '.join(TASKS)}"
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
                f"unknown feature {name!r}: run 'scaffold features' to list them "
                f"({', '.join(catalogue)})"
            )
        chosen.add(name)
    for name in sorted(chosen, key=list(catalogue).index):
        feature = catalogue[name]
        for needed in feature.requires:
            if needed not in chosen:
                raise UsageError(
                    f"feature {name!r} requires {needed!r}: add '--feature {needed}'"
                )
        for other in feature.conflicts:
            if other in chosen:
                raise UsageError(
                    f"features {name!r} and {other!r} conflict: choose one of them"
                )
    return [name for name in catalogue if name in chosen]


# Packages a feature needs only for some tasks: (feature, task) -> packages
TASK_FEATURE_PACKAGES: dict[tuple[str, str], tuple[str, ...]] = {
    ("pretrained", "image-classification"): ("timm", "safetensors"),
    ("pretrained", "text-classification"): ("transformers", "tokenizers", "safetensors"),
    ("pretrained", "token-classification"): ("transformers", "tokenizers", "safetensors"),
}


def packages_for(task: str, features: list[str]) -> list[str]:
    """Run-time packages of a generated project besides torch and the standard library."""
    packages = ["tqdm", *TASKS[task].packages]
    for name in features:
        packages.extend(FEATURES[name].packages)
        packages.extend(TASK_FEATURE_PACKAGES.get((name, task), ()))
    return packages
