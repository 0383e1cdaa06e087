"""Upgrade latency: `scaffold upgrade` against `copier update` on the same project and change.

    python benchmarks/upgrade_latency.py --out bench-results/upgrade.md
    python benchmarks/upgrade_latency.py --quick

Both sides upgrade the same project (the default image-classification project, or `--features`)
from the templates of an earlier template version (`--from-version`, default 4: its commit's
`templates/`, taken with `git archive` from this repository's history) to today's templates,
after the same user edit (a helper function appended to model.py, committed):
- scaffold: the project is rendered with the old templates (scaffold's renderer, untimed) in a
  clean git repository; timed: `scaffold upgrade` (a whole process, the console script).
- copier: the old and new templates are two tagged commits of a git repository (copier's update
  needs one) with the answers file added; the project is `copier copy --vcs-ref OLD-TAG` (untimed)
  in a clean git repository; timed: `copier update --defaults --skip-tasks` to the newest tag.
Each run is checked: exit 0, the user's edit kept, the new templates' lines present. One untimed
warm-up round, then `--repeats` rounds interleaved (the first side alternates). Goal (issue 18):
scaffold <= 0.5x copier's time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

GOAL = 0.5
ANSWERS_TEMPLATE = "{{ _copier_answers|to_nice_yaml -}}\n"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.invalid",
}
EDIT = "\n\ndef my_helper():\n    return 42\n"


def console_script(name: str) -> list[str]:
    script = Path(sys.executable).parent / name
    return [str(script)] if script.is_file() else [sys.executable, "-m", name]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args],
        cwd=cwd, check=True, capture_output=True, text=True, env={**os.environ, **GIT_ENV},
    ).stdout  # fmt: skip


def commit_all(repo: Path, message: str) -> None:
    if not (repo / ".git").exists():
        git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


class Setup:
    """Templates and fresh projects; everything here is untimed."""

    def __init__(self, work: Path, from_version: int, features: list[str]):
        from scaffold import __version__
        from scaffold.answers import Answers
        from scaffold.render import project_files, render, template_dir
        from scaffold.versions import TEMPLATE_VERSION, history

        self.work, self.version, self.counter = work, __version__, 0
        self.from_version, self.to_version = from_version, TEMPLATE_VERSION
        self.features = features
        entry = history()[from_version - 1]
        archive = subprocess.run(
            ["git", "-C", str(common.REPO), "archive", entry.commit, "templates"],
            capture_output=True, check=False,
        )  # fmt: skip
        if archive.returncode != 0:
            raise SystemExit(
                f"commit {entry.commit[:12]} (template version {from_version}) is not in this "
                "clone: run 'git fetch --unshallow'"
            )
        old = work / "old"
        old.mkdir(parents=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        self.old_templates = old / "templates"
        # copier's side: a template repository with the old and the new templates as tags
        self.copier_template = work / "copier-template"
        for tag, source in (("v1.0.0", self.old_templates), ("v2.0.0", template_dir())):
            if self.copier_template.exists():
                for child in self.copier_template.iterdir():
                    if child.name != ".git":
                        shutil.rmtree(child) if child.is_dir() else child.unlink()
            shutil.copytree(source, self.copier_template, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
            answers = self.copier_template / "project" / "{{ _copier_conf.answers_file }}.jinja"
            answers.write_text(ANSWERS_TEMPLATE)
            commit_all(self.copier_template, tag)
            git(self.copier_template, "tag", tag)
        answers = Answers(project_name="upgrade-bench", features=features)
        self.scaffold_old = project_files(answers, self.old_templates)
        self.scaffold_new = render(answers)
        self.new_line = _a_new_line(self.scaffold_old["train.py"], self.scaffold_new["train.py"])

    def fresh_dir(self, kind: str) -> Path:
        self.counter += 1
        return self.work / f"{kind}-{self.counter}" / "upgrade-bench"

    def scaffold_project(self) -> Path:
        from scaffold.write import write_new_project

        dest = self.fresh_dir("scaffold")
        dest.parent.mkdir(parents=True)
        write_new_project(dest, self.scaffold_old)
        commit_all(dest, "generated")
        _edit(dest)
        return dest

    def copier_project(self) -> Path:
        import copier

        dest = self.fresh_dir("copier")
        copier.run_copy(
            str(self.copier_template), str(dest),
            data={"project_name": "upgrade-bench", "features": self.features},
            defaults=True, quiet=True, vcs_ref="v1.0.0", unsafe=False, skip_tasks=True,
        )  # fmt: skip
        commit_all(dest, "generated")
        _edit(dest)
        return dest


def _a_new_line(old: bytes, new: bytes) -> str:
    """A line of the new train.py that the old one lacks (stripped: copier does not run black)."""
    old_lines = {line.strip() for line in old.decode().splitlines()}
    for line in new.decode().splitlines():
        text = line.strip()
        new_here = text not in old_lines and "(" not in line and "scaffold 0" not in text
        if len(text) > 30 and new_here:
            return line.strip()
    raise SystemExit("the two template versions render the same train.py: pick another version")


def _edit(project: Path) -> None:
    model = project / "model.py"
    model.write_text(model.read_text() + EDIT)
    commit_all(project, "my edit")


def cases(setup: Setup) -> dict:
    """side -> (label, prepare() -> (argv, project), check(project) -> error or None)."""
    scaffold, copier = console_script("scaffold"), console_script("copier")

    def check(project: Path) -> str | None:
        if not (project / "model.py").read_text().endswith(EDIT):
            return "the user's edit to model.py was lost"
        if setup.new_line not in (project / "train.py").read_text():
            return f"train.py lacks the new templates' line {setup.new_line!r}"
        if list(project.rglob("*.rej")):
            return ".rej files left behind"
        if any("<<<<<<<" in (project / f).read_text() for f in ("train.py", "model.py")):
            return "conflict markers left in train.py or model.py"
        return None

    def scaffold_case():
        project = setup.scaffold_project()
        return [*scaffold, "upgrade"], project

    def copier_case():
        project = setup.copier_project()
        # scaffold_version is a `when: false` value: copier's update renders its default on both
        # sides (passing it as data reaches only one side and makes a conflict of its own)
        argv = [*copier, "update", "--quiet", "--defaults", "--skip-tasks", "."]
        return argv, project

    return {
        "scaffold": ("scaffold upgrade", scaffold_case, check),
        "copier": ("copier update --defaults --skip-tasks", copier_case, check),
    }


def time_case(prepare, check, timeout: float) -> float:
    argv, project = prepare()
    start = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=project, env={**os.environ, **GIT_ENV}, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
        raise RuntimeError(f"exit {proc.returncode}: {' / '.join(tail)[:300]}")
    error = check(project)
    if error:
        raise RuntimeError(error)
    return seconds


def run_benchmark(args) -> str:
    monitor = common.LoadMonitor()
    features = [f for item in args.features for f in item.split(",") if f]
    setup = Setup(Path(args.work) / "upgrade", args.from_version, features)
    table = cases(setup)
    results = {key: [] for key in table}
    errors = {key: [] for key in table}
    for r in range(args.repeats + 1):  # round 0: warm-up, untimed
        keys = list(table) if r % 2 == 0 else list(table)[::-1]
        for key in keys:
            label, prepare, check = table[key]
            try:
                seconds = time_case(prepare, check, args.timeout)
            except (RuntimeError, subprocess.TimeoutExpired, subprocess.CalledProcessError) as exc:
                errors[key].append(str(exc))
                print(f"round {r}/{args.repeats} {label}: FAILED {exc}", file=sys.stderr)
                continue
            if r > 0:
                results[key].append(seconds)
            print(f"round {r}/{args.repeats} {label}: {seconds:.2f} s"
                  + (" (warm-up)" if r == 0 else ""), file=sys.stderr)  # fmt: skip

    def cell(key) -> str:
        if not results[key]:
            return f"failed: {errors[key][0]}" if errors[key] else "-"
        st = common.summarize(results[key])
        text = f"{st['median']:.2f} ({st['min']:.2f}-{st['max']:.2f})"
        return text + (f"; {len(errors[key])} failed: {errors[key][0]}" if errors[key] else "")

    ratio, met = "-", "-"
    if results["scaffold"] and results["copier"]:
        value = (common.summarize(results["scaffold"])["median"]
                 / common.summarize(results["copier"])["median"])  # fmt: skip
        ratio, met = f"{value:.2f}", "yes" if value <= GOAL else "no"
    parts = [] if args.no_header else [common.header("scaffold benchmarks: upgrade latency")]
    parts.append("## Upgrade latency (whole process, seconds)\n")
    parts.append(
        f"Template version {setup.from_version} -> {setup.to_version}, project features: "
        f"{', '.join(features) or 'none'}; median (min-max) of {args.repeats} interleaved "
        "repeat(s) after one warm-up round; projects set up untimed before each run.\n"
    )
    parts.append(common.md_table(
        ["scaffold", "seconds", "copier", "seconds", "scaffold/copier", "goal"],
        [[table["scaffold"][0], cell("scaffold"), table["copier"][0], cell("copier"), ratio,
          f"<= {GOAL}x: {met}"]],
    ))  # fmt: skip
    parts.append(monitor.summary() + "\n")
    return "\n".join(parts)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="also write the markdown report to this file")
    p.add_argument("--quick", action="store_true", help="one repeat: checks that it runs")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--from-version", type=int, default=4, help="template version to start from")
    p.add_argument("--features", action="append", default=[], help="features of the project")
    p.add_argument("--timeout", type=float, default=120, help="seconds per command")
    p.add_argument("--work", help="scratch folder (default: a temp folder)")
    p.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = 1
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    with common.scratch(args, "bench-upgrade-"):
        report = run_benchmark(args)
    common.write_report(args.out, report)


if __name__ == "__main__":
    main()
