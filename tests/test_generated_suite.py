"""Every generated project ships its own pytest suite (templates/project/tests/): it must pass on
the snapshots, and it must FAIL, naming the broken guarantee, when a small edit breaks one.

- test_generated_suite_passes[NAME]: `python -m pytest -q` in a copy of generated_examples/NAME, as
  a user runs it. Always for the snapshots in ALWAYS below (every loop feature for each task, the
  plain loop, the experiment features, pretrained for each task, fsdp alone and with pretrained);
  the other snapshots only with SCAFFOLD_ALL_SUITES=1 (their code paths are in those, and they do
  not fit the time budget).
- test_mutation_is_caught[ID]: a copy of a snapshot with one breaking edit (MUTATIONS below); the
  generated test for that guarantee (`pytest -x -q -k TEST`) must fail, and the failing test's
  name must be the guarantee's. The unedited snapshots pass the same tests (the suites above), so
  each failure is the edit's doing.

One module fixture starts everything at once, one subprocess per CPU. The mutants run in a few
processes through this file's __main__ (pytest.main per mutant, the project's modules purged in
between), which saves a torch import per mutant.
"""

from __future__ import annotations

import ast
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from scaffold.examples import EXAMPLES, ROOT

pytestmark = pytest.mark.slow

# every feature for each task, and the plain loop; the rest only with SCAFFOLD_ALL_SUITES=1
ALWAYS = ["all", "text-classification-all", "token-classification-all", "minimal"]
ALWAYS += ["resume+mlflow+wandb", "text-classification-sweep"]  # the experiment features
# [pretrained] every feature with a pretrained (tiny, offline) transformer and sub-word tokens
ALWAYS += ["token-classification-pretrained-all"]
# [pretrained] a timm backbone (with export), and a sequence classifier: evaluate, predict
ALWAYS += ["image-classification-pretrained+export", "text-classification-pretrained"]
# [fsdp] sharded: every loop feature (all-fsdp), and a transformer fine-tuned sharded
ALWAYS += ["all-fsdp", "token-classification-pretrained-fsdp"]
SUITES = list(EXAMPLES) if os.environ.get("SCAFFOLD_ALL_SUITES") else ALWAYS
TIMEOUT = 1200  # seconds for any one subprocess; a hang is a failure, not a stuck run


# --- edits that break one guarantee each -------------------------------------------------------


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _statements(source: str, needle: str) -> list[ast.stmt]:
    """Simple (non-block) statements whose code contains `needle`, whitespace ignored (black
    may split a statement over several lines)."""
    return [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.stmt)
        and not hasattr(node, "body")
        and _squash(needle) in _squash(ast.get_source_segment(source, node))
    ]


def _one_statement(source: str, needle: str) -> ast.stmt:
    found = _statements(source, needle)
    assert len(found) == 1, f"expected one statement containing {needle!r}, found {len(found)}"
    return found[0]


def drop_statement(needle: str) -> Callable[[str], str]:
    """Replace the statement containing `needle` with `pass` (keeps every block non-empty)."""

    def edit(source: str) -> str:
        node = _one_statement(source, needle)
        lines = source.splitlines(keepends=True)
        indent = lines[node.lineno - 1][: node.col_offset]
        lines[node.lineno - 1 : node.end_lineno] = [f"{indent}pass\n"]
        return "".join(lines)

    return edit


def edit_statement(needle: str, old: str, new: str) -> Callable[[str], str]:
    """Replace `old` with `new` inside the one statement containing `needle`."""

    def edit(source: str) -> str:
        node = _one_statement(source, needle)
        lines = source.splitlines(keepends=True)
        start = sum(len(line) for line in lines[: node.lineno - 1])
        end = sum(len(line) for line in lines[: node.end_lineno])
        segment = source[start:end]
        assert old in segment, f"{old!r} not in the statement containing {needle!r}"
        return source[:start] + segment.replace(old, new) + source[end:]

    return edit


def replace_pattern(pattern: str, new: str) -> Callable[[str], str]:
    """Replace the one match of a regular expression."""

    def edit(source: str) -> str:
        result, count = re.subn(pattern, new, source)
        assert count == 1, f"expected one match of {pattern!r}, found {count}"
        return result

    return edit


def move_statement_after(needle: str, anchor: str) -> Callable[[str], str]:
    """Move the statement containing `needle` to just after the one containing `anchor`."""

    def edit(source: str) -> str:
        moved = ast.get_source_segment(source, _one_statement(source, needle))
        source = drop_statement(needle)(source)
        node = _one_statement(source, anchor)
        lines = source.splitlines(keepends=True)
        indent = lines[node.lineno - 1][: node.col_offset]
        lines.insert(node.end_lineno, f"{indent}{moved}\n")
        return "".join(lines)

    return edit


@dataclass
class Mutation:
    example: str  # the snapshot in generated_examples/ to copy
    file: str  # the file to edit, or "*" for whichever of train.py/callbacks.py contains it
    edit: Callable[[str], str]
    test: str  # FILE::NAME in the project's tests/: the guarantee's test, which must fail


MUTATIONS = {
    # core: same seed, same weights
    "core-unseeded": Mutation(
        "minimal", "train.py", drop_statement("torch.manual_seed(cfg.seed)"),
        "test_core.py::test_same_seed_gives_bitwise_identical_weights",
    ),
    # core: a few steps run and write every output
    "core-no-final-weights": Mutation(
        "minimal", "train.py", drop_statement('out_dir / "final.pt"'),
        "test_core.py::test_a_few_steps_run_and_write_every_output",
    ),
    # core: the loss goes down
    "core-no-optimizer-step": Mutation(
        "minimal", "train.py", drop_statement("optimizer.step()"),
        "test_core.py::test_loss_goes_down",
    ),
    # core: weight decay on the weights only (issue 29): a mutant that decays every parameter
    "core-decays-biases-too": Mutation(
        "text-classification-all", "train.py",
        edit_statement("groups = decay_groups(", "decay_groups(model.parameters(), cfg.weight_decay)",
                       '[{"params": list(model.parameters()), "weight_decay": cfg.weight_decay}]'),
        "test_core.py::test_weight_decay_spares_biases_and_normalisation_weights",
    ),
    # core: a bad flag value is rejected naming the flag
    "core-config-errors-swallowed": Mutation(
        "minimal", "train.py",
        replace_pattern(r"(return Config\(\*\*values\)\n    except ValueError as exc:\n) +parser\.error\(str\(exc\)\)",
                        r"\1        pass"),
        "test_core.py::test_bad_setting_is_rejected_naming_the_flag",
    ),
    # core (after training): evaluate.py reads the data as validation does, no augmentation
    "core-evaluate-with-augmentation": Mutation(
        "minimal", "data.py", edit_statement("transform = transforms(cfg.image_size)", "cfg.image_size)", "cfg.image_size, cfg.augment)"),
        "test_after_training.py::test_evaluate_on_val_gives_exactly_the_numbers_training_logged",
    ),
    # core (after training): predict.py uses the evaluation transforms, as evaluate.py does
    "core-predict-with-augmentation": Mutation(
        "minimal", "predict.py", edit_statement("transform = transforms(", "cfg.image_size)", "cfg.image_size, cfg.augment)"),
        "test_after_training.py::test_predict_agrees_with_evaluate",
    ),
    # core (ddp's sampler): every epoch in a new order
    "ddp-forgets-set-epoch": Mutation(
        "all", "train.py", drop_statement("set_epoch("),
        "test_core.py::test_every_epoch_sees_every_sample_once_in_a_new_order",
    ),
    # image task: PNG folders load
    "image-class-folders-from-root": Mutation(
        "minimal", "data.py", edit_statement("folder = root / split", "root / split", "root"),
        "test_data.py::test_png_image_folders_load_and_train",
    ),
    # text task: CSV files load (text and label by column name)
    "text-columns-swapped": Mutation(
        "text-classification-all", "data.py",
        edit_statement('(row["text"], row["label"]', '"text"], row["label"', '"label"], row["text"'),
        "test_data.py::test_csv_files_load_and_train",
    ),
    # token task: CoNLL files load (the tag is the last column)
    "tokens-tag-from-second-column": Mutation(
        "token-classification-all", "data.py", edit_statement("columns[-1]", "[-1]", "[1]"),
        "test_data.py::test_conll_files_load_and_train",
    ),
    # grad-accum: the scheduler counts updates
    "grad-accum-scheduler-per-micro-batch": Mutation(
        "all", "train.py", move_statement_after("scheduler.step()", ".backward()"),
        "test_grad_accum.py::test_schedule_step_and_logs_count_updates_not_micro_batches",
    ),
    # grad-accum: a shorter last window is scaled by its real size
    "grad-accum-last-window-scaled-as-full": Mutation(
        "all", "train.py",
        edit_statement(
            "for batch in window", "sum(loss_count(batch, loss_args) for batch in window)",
            "cfg.batch_size * cfg.grad_accum_steps",
        ),
        "test_grad_accum.py::test_shorter_last_window_is_scaled_by_its_real_size",
    ),
    # grad-accum (tokens): the loss is divided by the tokens of the whole window
    "tokens-loss-divided-per-micro-batch": Mutation(
        "token-classification-all", "train.py",
        edit_statement(
            "/ denominator", "/ denominator", "/ loss_count(batch, loss_args) / len(window)"
        ),
        "test_grad_accum.py::test_k_micro_batches_give_the_gradient_of_one_batch_of_k_times_b",
    ),
    # amp: fp16 uses an enabled GradScaler
    "amp-scaler-disabled": Mutation(
        "all", "train.py", edit_statement("GradScaler(", 'enabled=precision == "fp16"', "enabled=False"),
        "test_amp.py::test_fp16_with_grad_scaler_trains",
    ),
    # amp: a skipped update moves neither the schedule nor step
    "amp-skip-not-detected": Mutation(
        "all", "train.py", replace_pattern(r"if \(now := scaler\.get_scale\(\)\) < scale:", "if False:"),
        "test_amp.py::test_skipped_fp16_update_leaves_schedule_and_step_unmoved",
    ),
    # amp: clipping sees unscaled gradients
    "amp-no-unscale": Mutation(
        "all", "train.py", drop_statement("unscale_("),
        "test_amp.py::test_clipping_acts_on_unscaled_gradients",
    ),
    # resume: the RNG state is restored
    "resume-no-rng-restore": Mutation(
        "all", "train.py", drop_statement("set_rng_states(state"),
        "test_resume.py::test_stopped_and_resumed_run_ends_bitwise_equal_to_uninterrupted_run",
    ),
    # resume: checkpoints hold plain data only (weights_only=True loads them)
    "resume-pickled-object-in-checkpoint": Mutation(
        "all", "train.py", edit_statement('out_dir / "final.pt"', "step=step", "step=step, path=out_dir"),
        "test_resume.py::test_checkpoints_load_with_weights_only_and_fit_the_model",
    ),
    # ddp: the loss is compensated for DDP's averaging over ranks
    "ddp-no-world-size-compensation": Mutation(
        "all", "train.py", edit_statement("return totals[0] / world_size", "/ world_size", ""),
        "test_ddp.py::test_two_ranks_make_the_updates_of_one_process_with_twice_the_batch",
    ),
    # fsdp: the loss is compensated for FSDP's averaging of the gradient shards over ranks
    "fsdp-no-world-size-compensation": Mutation(
        "fsdp", "train.py", edit_statement("return totals[0] / world_size", "/ world_size", ""),
        "test_fsdp.py::test_two_ranks_make_the_updates_of_one_process_with_twice_the_batch",
    ),
    # callbacks: on_train_end always runs, last
    "callbacks-no-train-end": Mutation(
        "all", "train.py", drop_statement('"on_train_end"'),
        "test_callbacks.py::test_hooks_run_in_the_documented_order",
    ),
    # early-stopping: stop after exactly --patience bad epochs
    "early-stopping-off-by-one": Mutation(
        "all", "*", replace_pattern(r">= (self|cfg)\.patience", r"> \1.patience"),
        "test_early_stopping.py::test_training_stops_after_patience_epochs_without_improvement",
    ),
    # tensorboard: the event files hold the metrics
    "tensorboard-no-scalars": Mutation(
        "all", "train.py", drop_statement("add_scalar("),
        "test_tensorboard.py::test_event_files_hold_the_metrics_csv_numbers",
    ),
    # core: the forward run again in backward by --activation-checkpointing leaves
    # BatchNorm's running statistics alone
    "core-recompute-updates-buffers": Mutation(
        "minimal", "train.py",
        edit_statement("second = BuffersKept", "BuffersKept(buffer_ids) if buffer_ids else ", ""),
        "test_core.py::test_activation_checkpointing_changes_no_weight_and_no_buffer",
    ),
    # the loss: with class weights a batch is divided by its weights' sum, not its samples
    "core-loss-divided-by-samples-not-weights": Mutation(
        "text-classification-minimal", "train.py",
        edit_statement("loss = loss_sum / count", "loss_sum / count", "loss_sum / len(batch[1])"),
        "test_loss.py::test_an_update_follows_the_weighted_mean_over_its_samples",
    ),
    "loss-count-ignores-class-weights": Mutation(
        "minimal", "model.py",
        edit_statement("return len(targets) if weight is None", "weight[targets].sum()", "len(targets)"),
        "test_loss.py::test_the_loss_is_the_weighted_mean_however_the_batch_is_split",
    ),
    "tokens-loss-count-ignores-tag-weights": Mutation(
        "token-classification-minimal", "model.py",
        edit_statement("return weight[targets[real]].sum()", "weight[targets[real]].sum()", "real.sum()"),
        "test_loss.py::test_the_loss_is_the_weighted_mean_however_the_batch_is_split",
    ),
    "grad-accum-window-count-ignores-class-weights": Mutation(
        "all", "train.py",
        edit_statement("for batch in window", "loss_count(batch, loss_args)", "loss_count(batch, {})"),
        "test_loss.py::test_an_update_follows_the_weighted_mean_over_its_samples",
    ),
    # evaluate.py weights the loss with the checkpoint's class weights, as validation does
    "evaluate-ignores-class-weights": Mutation(
        "text-classification-minimal", "evaluate.py",
        edit_statement("loss_args = {\"weight\": class_weight(", "class_weight(data_info, device)", "None"),
        "test_loss.py::test_evaluate_reports_the_weighted_loss_training_logged",
    ),
    # profiler: the profiler steps once per optimizer update
    "profiler-no-step": Mutation(
        "all", "train.py", drop_statement("profiler.step()"),
        "test_profiler.py::test_the_trace_holds_the_updates_of_the_window",
    ),
    # export: the ONNX file accepts any batch size
    "export-onnx-fixed-batch": Mutation(
        "all", "export.py", edit_statement("onnx_axes = {0:", '{0: "batch"}', "{}"),
        "test_export.py::test_exported_model_gives_pytorchs_outputs",
    ),
    # compile: checkpoints hold the plain module's keys
    "compile-saves-wrapper-keys": Mutation(
        "all", "train.py", edit_statement('out_dir / "final.pt"', "raw_model", "model"),
        "test_compile.py::test_compiled_run_saves_plain_module_keys",
    ),
    # mlflow: the run holds the metrics.csv numbers
    "mlflow-no-metrics": Mutation(
        "resume+mlflow+wandb", "train.py", drop_statement("mlflow.log_metrics("),
        "test_mlflow.py::test_run_holds_the_config_the_metrics_and_the_weights",
    ),
    # wandb: a resumed run continues the same W&B run
    "wandb-resume-new-run": Mutation(
        "resume+mlflow+wandb", "train.py",
        edit_statement("wandb_run = open_wandb(", "wandb_id)", "None)"),
        "test_wandb.py::test_stopped_and_resumed_run_continues_the_run_no_step_twice",
    ),
    # sweep: every epoch's metric reaches the trial (pruning)
    "sweep-no-report": Mutation(
        "text-classification-sweep", "train.py", drop_statement("report(epoch + 1, metrics)"),
        "test_sweep.py::test_three_trials_finish_and_the_best_config_replays",
    ),
    # [pretrained] the backbone starts from the pretrained weights, only the head is new
    "pretrained-random-backbone": Mutation(
        "token-classification-pretrained-all", "model.py",
        replace_pattern(r"return PretrainedTagger\(transformer,",
                        "return PretrainedTagger(type(transformer)(transformer.config),"),
        "test_pretrained.py::test_backbone_starts_from_the_pretrained_weights_only_the_head_is_new",
    ),
    # [pretrained] --freeze-backbone-epochs keeps the backbone's lr at 0
    "pretrained-freeze-ignored": Mutation(
        "token-classification-pretrained-all", "train.py", replace_pattern(r"if step >= frozen_steps else 0\.0", "if True else 0.0"),
        "test_pretrained.py::test_frozen_backbone_is_not_updated_but_the_head_is",
    ),
}


def apply_mutation(mutation: Mutation, dest: Path) -> Path:
    shutil.copytree(ROOT / mutation.example, dest, ignore=shutil.ignore_patterns("__pycache__"))
    if mutation.file == "*":
        names = [name for name in ("train.py", "callbacks.py") if (dest / name).exists()]
        edited = []
        for name in names:
            try:
                edited.append((name, mutation.edit((dest / name).read_text())))
            except AssertionError:
                continue
        assert len(edited) == 1, f"the edit applies to {len(edited)} of {names}"
        name, text = edited[0]
    else:
        name, text = mutation.file, mutation.edit((dest / mutation.file).read_text())
    assert text != (dest / name).read_text(), "the edit changed nothing"
    ast.parse(text)  # still valid Python: the suite must fail on behaviour, not syntax
    (dest / name).write_text(text)
    return dest


# --- running suites ---------------------------------------------------------------------------


def _env() -> dict:
    # the generated suites import only the project's own modules, never scaffold
    return {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}


def run_suite(project: Path) -> dict:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project, capture_output=True, text=True, timeout=TIMEOUT, env=_env(),
    )
    output = proc.stdout[-6000:] + proc.stderr[-3000:]
    return {"exit_code": proc.returncode, "output": output, "seconds": time.perf_counter() - start}


def run_mutants(jobs: list[dict], tmp: Path) -> list[dict]:
    jobs_file = tmp / f"jobs-{id(jobs)}.json"
    results_file = jobs_file.with_suffix(".results.json")
    jobs_file.write_text(json.dumps(jobs))
    proc = subprocess.run(
        [sys.executable, __file__, str(jobs_file), str(results_file)],
        capture_output=True, text=True, timeout=TIMEOUT, env=_env(),
    )
    if not results_file.exists():
        raise AssertionError(f"mutant runner failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(results_file.read_text())


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Start every suite and every mutant at once, one subprocess per CPU; collect the results."""
    tmp = tmp_path_factory.mktemp("generated-suites")
    workers = max(2, os.cpu_count() or 1)
    mutant_jobs = [[] for _ in range(workers)]
    for i, (name, mutation) in enumerate(MUTATIONS.items()):
        project = apply_mutation(mutation, tmp / "mutants" / name)
        job = {"id": name, "project": str(project), "args": ["-x", "-q", f"tests/{mutation.test}"]}
        mutant_jobs[i % workers].append(job)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        # the longest jobs first: the mutant runners, then the suites of the most features
        mutants = [pool.submit(run_mutants, jobs, tmp) for jobs in mutant_jobs if jobs]
        suites = {}
        for name in SUITES:
            copy = tmp / "suites" / name
            shutil.copytree(ROOT / name, copy, ignore=shutil.ignore_patterns("__pycache__"))
            suites[name] = pool.submit(run_suite, copy)
        suite_results = {name: future.result() for name, future in suites.items()}
        mutant_results = {r["id"]: r for future in mutants for r in future.result()}
    timings = {**suite_results, **mutant_results}
    print("\nseconds per suite / mutant:", {k: round(v["seconds"], 1) for k, v in timings.items()})
    return suite_results, mutant_results


@pytest.mark.parametrize("name", SUITES)
def test_generated_suite_passes(results, name):
    result = results[0][name]
    assert result["exit_code"] == 0, f"the generated suite of {name} fails:\n{result['output']}"
    assert " passed" in result["output"]


@pytest.mark.parametrize("mutation_id", list(MUTATIONS))
def test_mutation_is_caught(results, mutation_id):
    mutation, result = MUTATIONS[mutation_id], results[1][mutation_id]
    summary = f"{mutation_id}: exit {result['exit_code']}, failed {result['failed']}\n{result['output']}"
    assert result["exit_code"] == 1, f"the generated suite did not catch the edit. {summary}"
    assert any(nodeid.startswith(f"tests/{mutation.test}") for nodeid in result["failed"]), summary


def test_every_feature_and_task_has_a_mutation():
    """Each feature's guarantees (and each task's data format) are guarded by a mutant above."""
    from scaffold.catalogue import FEATURES

    prefixes = {mutation_id.split("-")[0] for mutation_id in MUTATIONS}
    for feature in FEATURES:
        assert feature.split("-")[0] in prefixes, f"no mutation breaks a {feature} guarantee"
    assert {"core", "image", "text", "tokens"} <= prefixes


# --- the mutant runner: python tests/test_generated_suite.py JOBS.json RESULTS.json ------------


def _run_mutant(job: dict) -> dict:
    """pytest.main in the mutant's folder, with every module of an earlier project forgotten."""
    project = job["project"]
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if name in ("train", "data", "model", "callbacks", "conftest") or path.startswith(
            str(Path(project).parent)
        ):
            del sys.modules[name]
    failed = []

    class Collector:
        def pytest_runtest_logreport(self, report):
            if report.failed:
                failed.append(report.nodeid)

        def pytest_collectreport(self, report):
            if report.failed:
                failed.append(report.nodeid or "collection")

    import contextlib
    import io

    old_cwd, old_path = os.getcwd(), list(sys.path)
    output, start = io.StringIO(), time.perf_counter()
    try:
        os.chdir(project)
        with contextlib.redirect_stdout(output):
            exit_code = int(pytest.main([*job["args"], "-p", "no:cacheprovider"], plugins=[Collector()]))
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path
    return {
        "id": job["id"],
        "exit_code": exit_code,
        "failed": failed,
        "output": output.getvalue()[-4000:],
        "seconds": time.perf_counter() - start,
    }


if __name__ == "__main__":
    jobs = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps([_run_mutant(job) for job in jobs]))
    sys.stdout.flush()
    os._exit(0)  # skip the slow interpreter teardown after torch
