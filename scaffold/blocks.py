"""Feature folders: the lines a feature puts at the named points of the core templates, and the
files it adds. One mechanism for scaffold's own features and a team layer's:

    features/NAME/feature.toml            scaffold's (a layer's features are in its layer.toml)
    features/NAME/blocks/FILE/POINT.jinja lines for the `#@point POINT` line of FILE
    features/NAME/blocks/FILE/REGION.jinja  (scaffold's own only) the lines that replace the core's
                                          between `#@region REGION` and `#@end REGION`
    features/NAME/files/PATH[.jinja]      files the feature adds (its module, tests/test_*.py)

scaffold's own blocks are placed exactly as written (indented to the point, nothing added: the
generated code reads as if the core template had the lines); a layer's are set off by a blank
line and tagged `# [LAYER:FEATURE]` (scaffold/layers.py). A point with no block leaves nothing,
so a project without the feature renders as if the point were not there.
"""

from __future__ import annotations

import functools
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from scaffold.errors import ScaffoldError

# file -> its points, as `#@point NAME` lines of the core template; named for where they are
POINTS: dict[str, tuple[str, ...]] = {
    "train.py": (
        "features",  # the docstring's feature list: one line each
        "run_commands",  # the docstring's Run: commands, one line each
        "torch_imports",  # the end of the `from torch...` imports
        "imports",  # local-module imports, beside `from data import ...`
        "task_imports",  # the task's `from data import ...` and `from model import ...`
        "optional_imports",  # after the imports: a missing package is one line to stderr
        "constants",  # module constants, after METRIC_COLUMNS
        "task_config",  # Config: the task's data and model fields, after the synthetic sizes
        "feature_config",  # the features' Config fields, one paragraph each
        "config",  # extra Config fields, after scaffold's own
        "positive_fields",  # __post_init__: the task's `positive` list, features' `+= [...]` (> 0)
        "task_checks",  # ... after `non_negative = [...]`: the task's fields and checks
        "non_negative_fields",  # ... and `non_negative += [...]`, those that must be >= 0
        "task_value_checks",  # ... after the seed's check: the task's checks of values
        "config_checks",  # ... the end of the checks: one paragraph per check
        "setup_functions",  # top-level functions after select_device(): ddp's and fsdp's
        "after_setup_functions",  # ... after them: amp's setup_precision()
        "start_of_hold_out_dir",  # the first lines of hold_out_dir(out_dir)
        "start_of_save_config",  # the first lines of save_config(cfg, out_dir)
        "loader_arguments",  # make_loader(): the DataLoader's last arguments (the collate_fn)
        "before_loss_read",  # read_loss(): the losses stacked, before the host reads them
        "after_schedule",  # top-level functions after lr_factor(): grad-accum's windows()
        "before_validation_batches",  # evaluate(): the sums are zero, before the batches
        "after_validation_batches",  # evaluate(): after the batches, before the sums are read
        "start_of_log_metrics",  # the first lines of log_metrics(row, ...)
        "log_metrics",  # the end of log_metrics(row, ...): the row is in metrics.csv
        "after_log_metrics",  # top-level functions after log_metrics()
        "start_of_save_weights",  # the first lines of save_weights(path, model, ...)
        "after_save_weights",  # top-level functions after save_weights(): checkpoints
        "after_save_config",  # main(): the out-dir held, config.json written
        "after_data",  # main(): the datasets and meta made, before the loaders
        "after_total_steps",  # main(): the number of updates known
        "after_build_model",  # main(): the model built on its device
        "prepare_model",  # main(): resumed, compiled, wrapped for ddp (in that order)
        "after_model_wrap",  # main(): the model ready; the trackers' runs start here
        "after_setup",  # model, optimizer, resume ready; before the training loop
        "after_progress_bar",  # main(): the progress bar made, before the loop's state
        "after_stop_flag",  # main(): `stop` set, before the training loop
        "after_epoch_order",  # each epoch: `order`, the sample indices it trains on
        "after_update",  # after each optimizer update is logged: step, epoch, lr, train_loss, row
        "stop_decisions",  # ... the update's stop flags, before `step >= total_steps` ends the loop
        "after_stop_check",  # ... after it: the update's checkpoint
        "after_validation",  # after each validation is logged: epoch, step, metrics
        "epoch_stop_decisions",  # after best.pt: the epoch's stop decisions
        "end_of_epoch",  # the end of an epoch: validated, best.pt written, stop decided
        "after_epochs",  # inside the loop's `try:`, after the last epoch
        "except_clauses",  # the training loop's `except ...:` clauses, before its `finally:`
        "finally",  # the training loop's `finally:`, after the progress bar is closed
        "after_final_weights",  # main(): final.pt written, before the curves
        "after_plot",  # main(): after the final weights and the curves
        "end_of_training",  # after teardown and the final weights: step, metrics, out_dir
    ),
    "data.py": ("end",),
    "model.py": (
        "loss",  # after the model: the task's loss, what train.py's loop calls
        "end",
    ),
    "README.md": (
        "run",  # the end of the "Run" commands
        "outputs",  # the end of the "Outputs" list
        "after_training",  # the start of "After training"
        "after_training_commands",  # the end of its commands
        "after_training_items",  # the end of its list (evaluate.py, predict.py, plot.py)
        "files",  # the "Where things are" table: the files features add
        "features",  # the "Features" list: one item each
        "guarantees",  # the "What the tests guarantee" list: one item each
    ),
}
POINT_LINE = re.compile(rb"^([ \t]*)#@point ([a-z_]+)\n", re.M)

# file -> its regions: lines of the core template between `#@region NAME` and `#@end NAME`, which
# one of scaffold's own features may replace with its block of that name (a layer's may not)
REGIONS: dict[str, tuple[str, ...]] = {
    "train.py": (
        "lr_field",  # Config's lr: pretrained's default for a new head
        "make_loader_signature",  # make_loader(): pretrained text passes a collate object
        "build_optimizer",  # pretrained: head and backbone groups, a frozen backbone
        "finite_check",  # read_loss(): amp's scaler skips the non-finite updates itself
        "validation_sums_call",  # evaluate(): amp validates under autocast
        "save_weights_body",  # save_weights(): fsdp gathers the shards first
        "main_signature",  # main(): sweep's report callback
        "device_setup",  # main(): ddp and fsdp set up the process group
        "build_datasets_call",  # main(): pretrained text builds the tokenizer first
        "shard_data",  # main(): ddp and fsdp give each rank its shard
        "val_loader",  # main(): pretrained text passes its collate
        "total_steps",  # main(): grad-accum counts optimizer updates, not micro-batches
        "build_optimizer_call",  # main(): pretrained passes the frozen updates
        "show_progress",  # main(): ddp and fsdp show rank 0's bar only
        "stop_flag",  # main(): resume may start after the last update
        "epoch_range",  # main(): resume starts at its epoch
        "epoch_order",  # each epoch: ddp and fsdp take the rank's shard of the order
        "train_loader",  # each epoch: pretrained text passes its collate
        "improvement",  # after validation: early-stopping's --monitor and --min-delta
        "plot_call",  # main(): with ddp and fsdp, rank 0 draws the curves
        "release_out_dir",  # main(): with ddp and fsdp, rank 0 holds the out-dir lock
        "run_main",  # `if __name__ == "__main__":` fsdp runs main() on every rank
    ),
}
REGION = re.compile(rb"^([ \t]*)#@region ([a-z_]+)\n(.*?)^[ \t]*#@end \2\n", re.M | re.S)


@dataclass(frozen=True)
class Block:
    target: str  # the generated file: train.py
    point: str
    text: str  # rendered, relative to the point's indentation
    source: str  # where it came from, for messages: features/amp/blocks/train.py/config.jinja
    padded: bool = False  # a layer's: a blank line before and after


def folders(root: Path, names, task: str = "") -> list[Path]:
    """The task's folder under root/tasks (first: its lines come before the features' at a
    point), then each feature's in `names` that has one under root/features."""
    found = [root / "tasks" / task] if task and (root / "tasks" / task).is_dir() else []
    return found + [root / "features" / n for n in names if (root / "features" / n).is_dir()]


def paths_under(folder: Path):
    for path in sorted(folder.rglob("*")) if folder.is_dir() else ():
        if path.is_file() and "__pycache__" not in path.parts:
            yield path


def block_paths(folder: Path):
    """(target, point, path) of each block of a feature folder."""
    blocks = folder / "blocks"
    for path in paths_under(blocks):
        if path.name.endswith(".jinja"):
            target = path.parent.relative_to(blocks).as_posix()
            yield target, path.name[: -len(".jinja")], path


def unknown_point(target: str, point: str, points: dict | None = None) -> str | None:
    """Why (target, point) is not one of `points` (default: POINTS, a layer's), or None."""
    points = POINTS if points is None else points
    if point in points.get(target, ()):
        return None
    where = ", ".join(f"{f}: {' '.join(p)}" for f, p in points.items())
    return f"names no extension point ({target} {point}): use one of {where}"


@functools.cache
def core_points(templates: Path, pattern: re.Pattern = POINT_LINE) -> dict[str, tuple[str, ...]]:
    """The points of the core templates of `templates` (an older version's has its own);
    with `pattern=REGION`, their regions."""
    found: dict[str, tuple[str, ...]] = {}
    project = templates / "project"
    for path in sorted(project.rglob("*.jinja")):
        names = [match[1] for match in pattern.findall(path.read_bytes())]
        if names:
            target = path.relative_to(project).as_posix()[: -len(".jinja")]
            found[target] = tuple(name.decode() for name in names)
    return found


@functools.cache
def _environment(templates: Path):
    """scaffold's own templates are trusted: the environment copier renders them with. A block
    may `{% include "shared/..." %}` lines that two features share (ddp's and fsdp's helpers)."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    return Environment(
        loader=FileSystemLoader(templates),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _render_own(templates: Path, path: Path, context: dict) -> str:
    from jinja2 import TemplateError

    try:
        source = path.read_text(encoding="utf-8")
        return _environment(templates).from_string(source).render(context)
    except (OSError, UnicodeDecodeError, TemplateError) as exc:
        why = f"{path.relative_to(templates)}: {exc}"
        raise ScaffoldError(f"rendering the template failed: {why}") from None


def own(templates: Path, features, context: dict) -> tuple[list[Block], dict[str, bytes]]:
    """The blocks and files of the project's task and of scaffold's chosen features, from
    `templates/tasks/` and `templates/features/`."""
    blocks, files = [], {}
    context = {**context, "tags": functools.partial(tags, context["features"])}
    for folder in folders(templates, features, context.get("task", "")):
        for target, point, path in block_paths(folder):
            source = path.relative_to(templates).as_posix()
            regions = core_points(templates, REGION).get(target, ())
            why = point not in regions and unknown_point(target, point, core_points(templates))
            if why:
                raise ScaffoldError(f"template {source} {why} (report this bug)")
            blocks.append(Block(target, point, _render_own(templates, path, context), source))
        for path in paths_under(folder / "files"):
            rel = path.relative_to(folder / "files").as_posix()
            if rel.endswith(".jinja"):
                files[rel[: -len(".jinja")]] = _render_own(templates, path, context).encode()
            else:
                files[rel] = path.read_bytes()
    return blocks, files


def tags(features, names) -> str:
    """`  # [a] [b]` for those of `names` the project has: a line that several features share
    (the templates' `tags([...])`, as the core templates' macro of that name)."""
    present = [name for name in names if name in features]
    return f"  # [{'] ['.join(present)}]" if present else ""


def place(files: dict[str, bytes], blocks: list[Block]) -> dict[str, bytes]:
    """Each block at its point (in the order given); every point line goes. A block of scaffold's
    own whose point is not in the rendered file is an error: its lines would be lost."""
    out = dict(files)
    at: dict[tuple[str, str], list[Block]] = {}
    for block in blocks:
        at.setdefault((block.target, block.point), []).append(block)
    placed = set()
    for target in [path for path, data in out.items() if b"#@region " in data]:

        def replace(match, target=target):
            indent, region = match.group(1).decode(), match.group(2).decode()
            placed.add((target, region))
            here = [b for b in at.get((target, region), []) if b.text.strip()]
            if any(b.padded for b in here) or len(here) > 1:
                sources = ", ".join(b.source for b in here)
                raise ScaffoldError(
                    f"template {sources}: only one of scaffold's own features may replace "
                    f"the region {region!r} of {target} (report this bug)"
                )
            if not here:
                return match.group(3)  # the core's lines
            text = here[0].text
            return textwrap.indent(text if text.endswith("\n") else text + "\n", indent).encode()

        out[target] = REGION.sub(replace, out[target])
    for target in [path for path, data in out.items() if b"#@point " in data]:

        def put(match, target=target):
            indent, point = match.group(1).decode(), match.group(2).decode()
            placed.add((target, point))
            here = at.get((target, point), [])
            # a block is whole lines (a block ending in `{% endif %}` loses its last newline)
            text = "".join(
                textwrap.indent(b.text if b.text.endswith("\n") else b.text + "\n", indent)
                for b in here
                if not b.padded and b.text
            )
            padded = [b.text for b in here if b.padded]
            if padded and point == "imports":  # no blank line: one import section, as isort wants
                text += textwrap.indent("\n".join(padded), indent) + "\n"
            elif padded:
                text += "\n" + textwrap.indent("\n\n".join(padded), indent) + "\n\n"
            return text.encode()

        out[target] = POINT_LINE.sub(put, out[target])
    for block in blocks:
        if not block.padded and block.text and (block.target, block.point) not in placed:
            raise ScaffoldError(
                f"template {block.source}: the rendered {block.target} has no point "
                f"{block.point!r} (report this bug)"
            )
    return out
