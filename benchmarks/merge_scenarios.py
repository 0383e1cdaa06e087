"""The measure of `scaffold add/remove feature`: scripted user edits x every feature.

Each scenario is a script of edits a user makes to a generated project (renames, reformatting,
own blocks, CRLF, another encoding, moved feature code...). For each scenario and each feature,
a fresh project gets the edits, then `add feature X` (from a project without X) or `remove feature
X` (from a project with every feature), in-process. Each outcome is judged from the files, not
from the command's own words:

  clean      exit 0, nothing to do by hand
  auto       exit 0, both sides inserted at one place and both were kept
  conflict   exit 1: markers, or names the merge left undefined, listed
  leftover   exit 1: lines of the removed feature listed for deletion
  refused    exit 2, nothing written
  LOST       a line of the user's edit is gone from the files            (target 0)
  SILENT     exit 0, but a removed feature's tagged lines remain          (target 0)
  BROKEN     exit 0, but the files have an undefined name they did not    (target 0)
  HALF       the record lists the added feature, no file has any of it and no marker (target 0)

    python benchmarks/merge_scenarios.py            # the table
    python benchmarks/merge_scenarios.py --only tabs --features amp

Nothing is trained; the projects live in a temporary folder.
"""

from __future__ import annotations

import argparse
import functools
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # this checkout's scaffold, unless PYTHONPATH names another one
    sys.path.append(str(REPO))

NAME = "proj"
OUTCOMES = ("clean", "auto", "conflict", "leftover", "refused", "LOST", "SILENT", "BROKEN", "HALF")


@dataclass
class Scenario:
    name: str
    edit: Callable[[dict[str, bytes], Path], dict[str, bytes]]  # the user's files after the edit
    marks: list[tuple[str, str]] = field(default_factory=list)  # (file, text) that must survive
    modes: tuple[str, ...] = ("add", "remove")
    start: tuple[str, ...] = ()  # remove mode: start from these features (default: all)
    features: tuple[str, ...] = ()  # only these features (default: all)
    kind: str = "edit"  # edit, format, insert: the last two must never conflict
    check: Callable[[dict, dict], str] | None = None  # (edited, after) -> what was lost, or ""


def _sub(files, rel, old, new, count=None):
    text = files[rel].decode()
    if isinstance(old, str):
        n = text.count(old)
        text = text.replace(old, new)
    else:
        text, n = old.subn(new, text)
    assert n >= 1 and (count is None or n == count), (rel, old, n)
    return {**files, rel: text.encode()}


# --- the edits -------------------------------------------------------------------------------


def scripted(files, project):
    files = _sub(files, "model.py", "self.head", "self.classifier")
    files = _sub(files, "train.py", re.compile(r"    epochs: int = \d+  #"), "    epochs: int = 5  #", 1)
    files = _sub(files, "train.py", "    torch.manual_seed(cfg.seed)\n",
                 "    torch.manual_seed(cfg.seed)\n    torch.backends.cudnn.benchmark = True  # my speed-up\n", 1)
    files["augment.py"] = b'"""My own augmentation."""\n\n\ndef flip(images):\n    return images.flip(-1)\n'
    return files


def label_smoothing(files, project):
    """The user's own loss, in model.py's summed_loss (the task's loss, which the loop calls):
    label smoothing always on, whatever --label-smoothing says."""
    return _sub(files, "model.py", "        label_smoothing=label_smoothing,\n",
                "        label_smoothing=0.1,\n", 1)


def own_metric(files, project):
    """The user's own validation metric, in model.py's validation_metrics (the task's metrics,
    which train.py's evaluate() returns), and its column in train.py's METRIC_COLUMNS."""
    files = _sub(files, "model.py", 'return {"val_loss": loss / weights, "val_acc": correct / count}',
                 'return {"val_loss": loss / weights, "val_acc": correct / count, '
                 '"val_error": 1 - correct / count}', 1)
    return _sub(files, "train.py", '    "val_acc",\n]', '    "val_acc",\n    "val_error",\n]', 1)


def readme_block(first_line: str) -> str:
    """The code block of README.md whose first line is `first_line` (the worked example of
    one's own head: the README shows exactly the code this scenario applies)."""
    readme = (REPO / "README.md").read_text()
    start = readme.index(f"```python\n{first_line}\n") + len("```python\n")
    return readme[readme.index("\n", start) + 1 : readme.index("```", start)]


def multi_label(files, project):
    """The README's worked example: a multi-label head (one logit per tag, BCEWithLogitsLoss),
    dict batches from a Tagged dataset in data.py, and a val_f1 column. tests/test_loss.py,
    which tests the single-label cross-entropy (its class weights and smoothing), is deleted."""
    files = {rel: data for rel, data in files.items() if rel != "tests/test_loss.py"}
    files = _sub(files, "data.py", "def build_datasets(cfg):", "def build_class_datasets(cfg):", 1)
    files = {**files, "data.py": files["data.py"] + b"\n\n" + readme_block("# data.py: at the end").encode()}
    files = _sub(files, "model.py", 'num_classes = len(data_info["classes"])',
                 'num_classes = len(data_info["tags"])', 1)
    model = files["model.py"].decode()
    start, end = model.index("def compute_loss(model, batch, loss_args: dict):"), model.index("def load_trained(")
    section = readme_block("# model.py: in place of compute_loss, summed_loss, loss_count, "
                           "validation_sums, validation_metrics")
    files = {**files, "model.py": (model[:start] + section + "\n\n" + model[end:]).encode()}
    files = _sub(files, "train.py", '    "val_acc",\n]', '    "val_acc",\n    "val_f1",\n]', 1)
    return multi_label_evaluation(files)


def multi_label_evaluation(files):
    """The worked example, after training: evaluate.py scores tags (the README's code), predict.py
    uses the sigmoid, and test_after_training.py checks per-tag numbers and val_f1."""
    files = _sub(files, "data.py", "def build_eval_set(", "def build_class_eval_set(", 1)
    files = {**files, "data.py": files["data.py"] + b"\n\n" + readme_block("# data.py: after Tagged").encode()}
    files = _sub(files, "evaluate.py", "from sklearn.metrics import classification_report, confusion_matrix\n",
                 "from sklearn.metrics import classification_report\n", 1)
    text = files["evaluate.py"].decode()
    start, end = text.index("@torch.no_grad()\ndef predict_split("), text.index("def main(")
    text = text[:start] + readme_block("# evaluate.py: in place of predict_split and main's scoring") + "\n\n" + text[end:]
    start = text.index('    classes = data_info["classes"]\n    loss_args = {"weight": class_weight(')
    end = text.index("    return results\n", start) + len("    return results\n")
    text = text[:start] + "    return score(args, data_info, names, *predict_split(model, loader, device))\n" + text[end:]
    files = {**files, "evaluate.py": text.encode()}
    files = _sub(files, "evaluate.py", "import best_device, class_weight, load_trained,",
                 "import best_device, load_trained,", 1)
    files = _sub(files, "predict.py", ".float().softmax(-1)", ".float().sigmoid()", 1)
    rel = "tests/test_after_training.py"
    files = _sub(files, rel, '    assert results["accuracy"] == logged["val_acc"]\n',
                 '    assert results["accuracy"] == logged["val_acc"]\n'
                 '    assert results["micro_f1"] == pytest.approx(logged["val_f1"], abs=1e-12)\n', 1)
    text = files[rel].decode()
    start = text.index('    classes = list(results["per_class"])\n')
    end = text.index('    assert results["accuracy"] == accuracy\n', start)
    text = text[:start] + PER_TAG_CHECK + text[end:]
    return {**files, rel: text.encode()}


PER_TAG_CHECK = """    tags = list(results["per_class"])
    y_true = [[tag in row["target"] for tag in tags] for row in rows]
    y_pred = [[tag in row["predicted"] for tag in tags] for row in rows]
    precision, recall, f1, support = precision_recall_fscore_support(
        y_true, y_pred, zero_division=0
    )
    for i, name in enumerate(tags):
        scores = results["per_class"][name]
        assert scores["precision"] == pytest.approx(precision[i], abs=1e-12)
        assert scores["recall"] == pytest.approx(recall[i], abs=1e-12)
        assert scores["f1"] == pytest.approx(f1[i], abs=1e-12)
        assert scores["support"] == support[i]
    accuracy = sum(t == p for t, p in zip(y_true, y_pred, strict=True)) / len(rows)
"""


def crlf(files, project):
    return {**files, "train.py": files["train.py"].replace(b"\n", b"\r\n")}


def crlf_mixed(files, project):
    lines = files["train.py"].split(b"\n")
    lines = [line + (b"\n" if i % 17 == 5 else b"\r\n") for i, line in enumerate(lines[:-1])]
    return {**files, "train.py": b"".join(lines)}


def lf_lines_kept(edited, after) -> str:
    """Each line the user ended with LF (in a CRLF file) that is still there still ends with LF."""
    import difflib

    def split(data):
        lines = data.split(b"\n")[:-1]
        return [line.rstrip(b"\r") for line in lines], [line.endswith(b"\r") for line in lines]

    old, old_cr = split(edited["train.py"])
    new, new_cr = split(after.get("train.py", b""))
    changed = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            changed += sum(old_cr[i1 + k] != new_cr[j1 + k] for k in range(i2 - i1))
    return f"{changed} kept lines changed their line ending" if changed else ""


def no_final_newline(files, project):
    return {**files, "train.py": files["train.py"].rstrip(b"\n") + b"  # mine"}


def rename_optimizer(files, project):
    files = _sub(files, "train.py", re.compile(r"\boptimizer\b(?=\s*[=.,)])"), "opt")
    return _sub(files, "train.py", re.compile(r"\bscheduler\b(?=\s*[=.,)])"), "sched")


def tb_writer_line(files, project):
    return _sub(files, "train.py", "                progress.update()\n",
                "                progress.update()\n"
                "                tb_writer.add_scalar(\"my/lr\", lr, step)  # my curve\n", 1)


def scaler_line(files, project):
    return _sub(files, "train.py", "                progress.update()\n",
                "                progress.update()\n"
                "                if step % 50 == 0:\n"
                "                    print(\"scale\", scaler.get_scale())  # my check\n", 1)


def moved_amp(files, project):
    """amp's setup call moved below the data section, setup_precision moved to the end."""
    text = files["train.py"].decode()
    call = re.search(r"    autocast, scaler = setup_precision\(.*?\n", text).group(0)
    text = text.replace(call, "")
    text = text.replace("    # --- model and optimizer ---\n",
                        call + "\n    # --- model and optimizer ---\n", 1)
    helper = re.search(r"def setup_precision\(.*?\n\n\n", text, re.S).group(0)
    text = text.replace(helper, "")
    text = text.replace('\n\nif __name__ == "__main__":', "\n\n" + helper.rstrip("\n")
                        + '\n\n\nif __name__ == "__main__":', 1)
    return {**files, "train.py": text.encode()}


def config_block(files, project):
    return _sub(files, "train.py", re.compile(r"(    log_every: int = \d+  #[^\n]*\n)"),
                r"\1\n    # mine: my own settings\n    label_smoothing: float = 0.0  # my regulariser\n", 1)


def post_init_check(files, project):
    text = files["train.py"].decode()
    start = text.index("    def __post_init__(self):")
    end = text.index("\n\n\ndef ", start)
    text = text[:end] + "\n        if self.batch_size > 4096:  # my check\n" \
        "            raise ValueError(\"--batch-size is too large for my GPU\")" + text[end:]
    return {**files, "train.py": text.encode()}


def _tool(files, project, *command, config=""):
    tmp = project.parent / (project.name + "-fmt")
    tmp.mkdir(exist_ok=True)
    for rel, data in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(data)
    if config:
        (tmp / "pyproject.toml").write_text(with_settings(files["pyproject.toml"].decode(), config))
    subprocess.run([sys.executable, "-m", *command, "."], cwd=tmp, check=True, capture_output=True)
    out = {rel: (tmp / rel).read_bytes() for rel in files}
    return out


def with_settings(pyproject: str, config: str) -> str:
    """`config`'s tables added to a pyproject.toml; a table it already has (a generated project's
    `[tool.ruff]`) gets the settings at its top, as a user would write them."""
    for table, settings in re.findall(r"(?m)^(\[[^\]\n]+\]\n)((?:(?!\[).*\n)*)", config):
        if table in pyproject:
            pyproject = pyproject.replace(table, table + settings.rstrip("\n") + "\n", 1)
        else:
            pyproject += "\n" + table + settings
    return pyproject


def black_100(files, project):
    return _tool(files, project, "black", "-q", "-l", "100")


RUFF_100 = "\n[tool.ruff]\nline-length = 100\n"
RUFF_GOOGLE = '\n[tool.ruff.lint.isort]\nforce-single-line = true\nforce-sort-within-sections = true\nsingle-line-exclusions = ["typing"]\norder-by-type = false\n'


def ruff_format_100(files, project):
    return _tool(files, project, "ruff", "format", "-q", "--no-cache", config=RUFF_100)


def isort_google(files, project):
    return _tool(files, project, "ruff", "check", "-q", "--no-cache", "--select", "I", "--fix",
                 config=RUFF_GOOGLE)


def tabs(files, project):
    out = dict(files)
    for rel, data in files.items():
        if rel.endswith(".py"):
            lines = []
            for line in data.decode().splitlines(keepends=True):
                stripped = line.lstrip(" ")
                n = len(line) - len(stripped)
                lines.append("\t" * (n // 4) + " " * (n % 4) + stripped)
            out[rel] = "".join(lines).encode()
    return out


def cp1252(files, project):
    text = files["train.py"].decode()
    text = "# -*- coding: cp1252 -*-\n" + text.replace(
        "    torch.manual_seed(cfg.seed)\n", "    torch.manual_seed(cfg.seed)  # Graine fixée\n", 1)
    return {**files, "train.py": text.encode("cp1252")}


def readme_rewrite(files, project):
    return {**files, "README.md": b"# My project\n\nOur team's notes, nothing else.\n"}


def no_tests(files, project):
    return {rel: data for rel, data in files.items() if not rel.startswith("tests/")}


SCENARIOS = [
    Scenario("scripted-edits", scripted, [("model.py", "self.classifier"), ("train.py", "# my speed-up"),
                                          ("augment.py", "def flip")]),
    Scenario("label-smoothing", label_smoothing, [("model.py", "label_smoothing=0.1")],
             modes=("add",)),
    Scenario("own-metric", own_metric, [("model.py", '"val_error"'), ("train.py", '"val_error"')],
             modes=("add",)),
    Scenario("multi-label", multi_label, [("model.py", "binary_cross_entropy_with_logits"),
                                          ("data.py", "class Tagged"), ("train.py", '"val_f1"'),
                                          ("evaluate.py", "def score(")],
             modes=("add",)),
    Scenario("crlf", crlf, [("train.py", "\r\n")]),
    Scenario("crlf-mixed", crlf_mixed, [], check=lf_lines_kept),
    Scenario("no-final-newline", no_final_newline, [("train.py", "# mine")]),
    Scenario("rename-optimizer", rename_optimizer, [("train.py", "opt.step()")], modes=("add",)),
    Scenario("tb-writer-line", tb_writer_line, [("train.py", "# my curve")], modes=("remove",),
             start=("tensorboard",), features=("tensorboard",)),
    Scenario("scaler-line", scaler_line, [("train.py", "# my check")], modes=("remove",),
             start=("amp",), features=("amp",)),
    Scenario("moved-amp", moved_amp, [], modes=("remove",), start=("amp",), features=("amp",)),
    Scenario("config-block", config_block, [("train.py", "# mine: my own settings")], kind="insert"),
    Scenario("post-init-check", post_init_check, [("train.py", "# my check")], kind="insert"),
    Scenario("black-100", black_100, [], kind="format"),
    Scenario("ruff-format-100", ruff_format_100, [], kind="format"),
    Scenario("isort-google", isort_google, [], kind="format"),
    Scenario("tabs", tabs, [], kind="format"),
    Scenario("cp1252", cp1252, [("train.py", "Graine fix")]),
    Scenario("readme-rewrite", readme_rewrite, [("README.md", "Our team's notes")], kind="prose"),
    Scenario("no-tests", no_tests, [], modes=("add",)),
]


# --- running ---------------------------------------------------------------------------------

_RENDERS: dict = {}


def render(features) -> dict[str, bytes]:
    """A render with memo (the renderer is deterministic per answers and templates)."""

    key = tuple(sorted(features))
    if key not in _RENDERS:
        from scaffold.render import Answers

        _RENDERS[key] = _REAL_RENDER(Answers(NAME, "image-classification", list(features)))
    return dict(_RENDERS[key])


_REAL_RENDER = None


def _install_memo():
    """Route scaffold's renders of the scenario projects through the memo; returns an undo."""
    global _REAL_RENDER
    import scaffold.render as render_mod

    if _REAL_RENDER is not None:
        return lambda: None
    _REAL_RENDER = previous = render_mod.render
    _RENDERS.clear()
    fingerprint = render_mod.template_fingerprint()

    def memo(answers, templates=None):
        if (answers.project_name == NAME and answers.task == "image-classification"
                and templates is None and render_mod.template_fingerprint() == fingerprint):
            return render(answers.features)
        return previous(answers, templates)

    render_mod.render = memo

    def undo():
        global _REAL_RENDER
        render_mod.render = previous
        _REAL_RENDER = None

    return undo


def _undefined(files: dict[str, bytes]) -> set[tuple[str, str]]:
    import ast
    import io
    import tokenize

    from pyflakes.checker import Checker

    found = set()
    for rel, data in files.items():
        if rel.endswith(".py"):
            try:
                encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
                tree = ast.parse(data.decode(encoding))
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            found |= {(rel, str(m.message_args[0])) for m in Checker(tree).messages
                      if type(m).__name__ in ("UndefinedName", "UndefinedLocal")}
    return found


@functools.cache
def _feature_homes(feature: str) -> frozenset[str]:
    """train.py if a fresh project with the feature has it there, else the Python files
    that have it (export: export.py and its test)."""
    from scaffold.answers import Answers
    from scaffold.catalogue import resolve_features
    from scaffold.render import render

    files = render(Answers(NAME, "image-classification", resolve_features([feature])))
    texts = {rel: data if isinstance(data, bytes) else data.encode() for rel, data in files.items()
             if rel.endswith(".py")}
    if _has_feature({"train.py": texts["train.py"]}, feature):
        return frozenset({"train.py"})
    return frozenset(rel for rel in texts if _has_feature({rel: texts[rel]}, feature))


def _has_feature(files, feature) -> bool:
    """Any line of any text file is the feature's (scaffold.tags: comments, docstrings,
    whole files such as export.py)."""
    from scaffold.tags import feature_lines

    for rel, data in files.items():
        try:
            # a project in another encoding (cp1252): its tags are ASCII all the same
            if feature_lines(rel, data.decode("utf-8", "replace")).get(feature):
                return True
        except (SyntaxError, ValueError):
            continue
    return False


def _tags(files, feature) -> bool:
    import io
    import tokenize

    for rel, data in files.items():
        if rel.endswith(".py"):
            try:
                text = data.decode("utf-8", "replace")
                for tok in tokenize.generate_tokens(io.StringIO(text).readline):
                    if tok.type == tokenize.COMMENT and f"[{feature}]" in tok.string:
                        return True
            except (tokenize.TokenError, SyntaxError):
                pass
    return False


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.relative_to(root).as_posix().startswith(".scaffold/")}


def run_one(scenario: Scenario, mode: str, feature: str, workdir: Path) -> tuple[str, str]:
    """(outcome, detail) of one scenario x feature."""
    from scaffold.answers import Answers
    from scaffold.catalogue import FEATURES, resolve_features
    from scaffold.errors import ScaffoldError
    from scaffold.merge import change_feature
    from scaffold.write import write_new_project

    if mode == "add":
        need = [r for r in FEATURES[feature].requires]
        start = resolve_features(need) if need else []
    else:
        start = resolve_features(list(scenario.start)) if scenario.start else _every_feature_with(feature)
        start = resolve_features(start)
    import scaffold.render as render_mod

    project = workdir / f"{scenario.name}-{mode}-{feature}"
    write_new_project(project, render_mod.project_files(Answers(NAME, "image-classification", start)))
    files = _tree(project)
    try:
        edited = scenario.edit(files, project)
    except AssertionError:
        return "n/a", "the edit does not apply"
    for rel in files.keys() - edited.keys():
        (project / rel).unlink()
    for rel, data in edited.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_bytes(data)
    before_undefined = _undefined(edited)
    try:
        result = change_feature(project, feature, add=mode == "add", echo=lambda line: None)
    except ScaffoldError as exc:
        return "refused", str(exc)[:120]
    after = _tree(project)
    code = getattr(result, "exit_code", 1 if result.conflicts else 0)
    for rel, text in scenario.marks:
        data = after.get(rel)
        if data is None or text.encode("cp1252" if scenario.name == "cp1252" else "utf-8") not in data:
            return "LOST", f"{rel}: {text!r}"
    lost = scenario.check(edited, after) if scenario.check else ""
    if lost:
        return "LOST", lost
    # the files where a fresh project has the feature (train.py; export.py for export)
    homes = _feature_homes(feature)
    if mode == "add" and result.written and not any(b"<<<<<<<" in after.get(rel, b"") for rel in homes) \
            and not _has_feature({rel: after[rel] for rel in homes if rel in after}, feature):
        return "HALF", f"the record lists it; {', '.join(sorted(homes))} {'has' if len(homes) == 1 else 'have'} none of it"
    leftovers = getattr(result, "leftovers", [])
    if code:
        return ("leftover" if leftovers and not result.conflicts else "conflict"), \
            "; ".join((result.conflicts + getattr(result, "problems", []) + leftovers)[:2])[:160]
    if mode == "remove" and _tags(after, feature):
        return "SILENT", "tagged lines remain"
    new_undefined = _undefined(after) - before_undefined
    if new_undefined:
        return "BROKEN", ", ".join(sorted(f"{r}:{n}" for r, n in new_undefined))
    if mode == "add" and "tests/test_core.py" not in after and f"tests/test_{feature}.py" in after:
        return "BROKEN", "a lone test file in a deleted tests/"
    if getattr(result, "auto_resolved", []):
        return "auto", result.auto_resolved[0][:160]
    return "clean", ""


def run(only=None, features=None, verbose=False, workdir=None):
    """{(scenario, mode, feature): (outcome, detail)}."""

    results = {}
    undo = _install_memo()
    try:
        _run_all(results, only, features, verbose, workdir)
    finally:
        undo()
    return results


def _every_feature_with(feature: str) -> list[str]:
    """`feature` and every feature that combines with it. ddp, fsdp (two processes) and
    pretrained (a downloaded model) join only when they are the feature itself."""
    from scaffold.catalogue import FEATURES

    chosen = [feature]
    for name in FEATURES:
        if name in chosen or (name in ("ddp", "fsdp", "pretrained") and name != feature):
            continue
        if not any(name in FEATURES[c].conflicts or c in FEATURES[name].conflicts for c in chosen):
            chosen.append(name)
    return chosen


def _run_all(results, only, features, verbose, workdir):
    from scaffold.catalogue import FEATURES

    with tempfile.TemporaryDirectory(prefix="merge-scenarios-", dir=workdir) as tmp:
        for scenario in SCENARIOS:
            if only and scenario.name not in only:
                continue
            for mode in scenario.modes:
                names = scenario.features or tuple(FEATURES)
                for feature in names:
                    if features and feature not in features and not scenario.features:
                        continue
                    if mode == "remove" and not scenario.start and any(
                            feature in FEATURES[f].requires for f in FEATURES if f != "ddp"):
                        continue  # another feature needs it: not removable alone
                    outcome = run_one(scenario, mode, feature, Path(tmp))
                    results[scenario.name, mode, feature] = outcome
                    if verbose:
                        print(scenario.name, mode, feature, *outcome, file=sys.stderr)


def table(results) -> str:
    rows = ["| scenario | " + " | ".join(OUTCOMES) + " |", "|---" * (len(OUTCOMES) + 1) + "|"]
    by = {}
    for (scenario, mode, feature), (outcome, _) in results.items():
        by.setdefault(f"{scenario} ({mode})", Counter())[outcome] += 1
    total = Counter()
    for name, counts in by.items():
        total += counts
        rows.append(f"| {name} | " + " | ".join(str(counts[o] or "") for o in OUTCOMES) + " |")
    rows.append("| **total** | " + " | ".join(str(total[o]) for o in OUTCOMES) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="scenario names")
    parser.add_argument("--features", nargs="*")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    results = run(args.only, args.features, args.verbose)
    print(table(results))
    details = [f"{s} ({m}) {f}: {o} {d}" for (s, m, f), (o, d) in results.items() if d and o != "clean"]
    if details:
        print("\n" + "\n".join(details))
    print(f"\n{len(results)} merges in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
