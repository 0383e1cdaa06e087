"""CLI latency: scaffold's commands against copier doing the same job on the same template.

    python benchmarks/cli_latency.py --out bench-results/cli.md
    python benchmarks/cli_latency.py --quick

Pairs, each a whole process timed from start to exit (wall clock), interleaved round-robin:
- `scaffold --help`                     vs `copier --help`
- `scaffold new DIR --defaults`         vs `copier copy --defaults` of scaffold's template
  (the default project; scaffold also black-formats and writes its record, copier does not)
- `scaffold add feature amp` in a fresh default project in a clean git repository
                                        vs `copier update --defaults --vcs-ref=:current:
  --data 'features=["amp"]'` in a project copied from the same template held in a git repository
  with a tag (copier's update needs both; see ../shared/MERGE-NOTES.md).
The copier side uses a copy of templates/ with the one file copier's update needs added
(`{{ _copier_conf.answers_file }}.jinja`, the answers file). Projects are set up untimed before
each run. Commands run as the console scripts next to this Python (not through pyenv shims, which
add their own start-up). Goals (issue 9): --help < 0.3 s, new < 1.5 s, add feature < 2 s.

scaffold keeps black's output and Jinja's compiled templates in a cache (README "Rendering"):
the plain rows run with a warm cache, as every render after the first does; the "cold cache"
rows give each run an empty SCAFFOLD_CACHE_DIR, as a first run after installing does. copier
has no such cache.
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

GOALS = {"help": 0.3, "new": 1.5, "add": 2.0}
TAG = "v0.1.0"
ANSWERS_TEMPLATE = "{{ _copier_answers|to_nice_yaml -}}\n"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.invalid",
}


def console_script(name: str) -> list[str]:
    script = Path(sys.executable).parent / name
    return [str(script)] if script.is_file() else [sys.executable, "-m", name]


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args],
        cwd=cwd, check=True, capture_output=True, env={**os.environ, **GIT_ENV},
    )  # fmt: skip


def commit_all(repo: Path, message: str) -> None:
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


class Setup:
    """Templates and fresh projects; everything here is untimed."""

    def __init__(self, work: Path):
        from scaffold import __version__
        from scaffold.answers import Answers
        from scaffold.render import project_files, template_dir

        self.work = work
        self.version = __version__
        self.counter = 0
        self.template = work / "copier-template"
        self.git_template = work / "copier-template-git"
        for dest in (self.template, self.git_template):
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(template_dir(), dest, ignore=shutil.ignore_patterns("__pycache__"))
            (dest / "project" / "{{ _copier_conf.answers_file }}.jinja").write_text(ANSWERS_TEMPLATE)
        commit_all(self.git_template, "template")
        git(self.git_template, "tag", TAG)
        self.scaffold_files = project_files(Answers(project_name="cli-bench"))

    def fresh_dir(self, kind: str) -> Path:
        self.counter += 1
        path = self.work / f"{kind}-{self.counter}"
        if path.exists():
            shutil.rmtree(path)
        return path

    def copier_data(self, name: str) -> list[str]:
        return ["--data", f"project_name={name}", "--data", f"scaffold_version={self.version}"]

    def scaffold_project(self) -> Path:
        from scaffold.write import write_new_project

        dest = self.fresh_dir("scaffold-add")
        write_new_project(dest, self.scaffold_files)
        commit_all(dest, "generated")
        return dest

    def copier_project(self) -> Path:
        import copier

        dest = self.fresh_dir("copier-update")
        copier.run_copy(
            str(self.git_template), str(dest),
            data={"project_name": "cli-bench", "scaffold_version": self.version},
            defaults=True, quiet=True, vcs_ref=TAG,
        )  # fmt: skip
        commit_all(dest, "generated")
        return dest


def cases(setup: Setup) -> dict:
    """name -> (goal key, tool, prepare() -> (argv, cwd), check(cwd) -> error or None)."""
    scaffold, copier = console_script("scaffold"), console_script("copier")

    def has_amp(project: Path) -> str | None:
        text = (project / "train.py").read_text()
        return None if "[amp]" in text else "train.py has no [amp] lines afterwards"

    def cold(argv: list[str]) -> list[str]:
        cache = setup.fresh_dir("empty-cache")
        cache.mkdir()
        return ["env", f"SCAFFOLD_CACHE_DIR={cache}", *argv]

    def new_scaffold():
        dest = setup.fresh_dir("scaffold-new")
        return [*scaffold, "new", str(dest), "--defaults"], setup.work, dest

    def new_scaffold_cold():
        argv, cwd, dest = new_scaffold()
        return cold(argv), cwd, dest

    def new_copier():
        dest = setup.fresh_dir("copier-copy")
        argv = [*copier, "copy", "--quiet", "--defaults", *setup.copier_data(dest.name),
                str(setup.template), str(dest)]  # fmt: skip
        return argv, setup.work, dest

    def add_scaffold():
        project = setup.scaffold_project()
        return [*scaffold, "add", "feature", "amp"], project, project

    def add_scaffold_cold():
        argv, cwd, project = add_scaffold()
        return cold(argv), cwd, project

    def add_copier():
        project = setup.copier_project()
        argv = [*copier, "update", "--quiet", "--defaults", "--skip-tasks",
                "--vcs-ref=:current:", "--data", 'features=["amp"]', "."]  # fmt: skip
        return argv, project, project

    def made(path: Path) -> str | None:
        return None if (path / "train.py").is_file() else "no train.py written"

    table = {
        ("help", "scaffold"): ("scaffold --help", lambda: ([*scaffold, "--help"], setup.work, None), None),
        ("help", "copier"): ("copier --help", lambda: ([*copier, "--help"], setup.work, None), None),
        ("new", "scaffold"): ("scaffold new DIR --defaults", new_scaffold, made),
        ("new-cold", "scaffold"): ("scaffold new DIR --defaults, cold cache", new_scaffold_cold, made),
        ("new", "copier"): ("copier copy --defaults TEMPLATE DIR", new_copier, made),
        ("add", "copier"): (
            "copier update --defaults --vcs-ref=:current: --data features=[amp]",
            add_copier,
            has_amp,
        ),
    }
    table[("add", "scaffold")] = ("scaffold add feature amp", add_scaffold, has_amp)
    table[("add-cold", "scaffold")] = (
        "scaffold add feature amp, cold cache",
        add_scaffold_cold,
        has_amp,
    )
    return table


def time_case(prepare, check, timeout: float) -> float:
    argv, cwd, product = prepare()
    env = {**os.environ, **GIT_ENV}
    start = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
        raise RuntimeError(f"exit {proc.returncode}: {' / '.join(tail)[:300]}")
    error = check(product) if check and product else None
    if error:
        raise RuntimeError(error)
    return seconds


def run_benchmark(args) -> str:
    monitor = common.LoadMonitor()
    work = Path(args.work)
    setup = Setup(work / "cli")
    table = cases(setup)
    results = {key: [] for key in table}
    errors = {key: [] for key in table}
    keys = list(table)
    for r in range(args.repeats):
        shift = r % len(keys)
        for key in keys[shift:] + keys[:shift]:
            _, prepare, check = table[key]
            try:
                seconds = time_case(prepare, check, args.timeout)
                results[key].append(seconds)
                print(f"round {r + 1}/{args.repeats} {table[key][0]}: {seconds:.2f} s", file=sys.stderr)
            except (RuntimeError, subprocess.TimeoutExpired, subprocess.CalledProcessError) as exc:
                errors[key].append(str(exc))
                print(f"round {r + 1}/{args.repeats} {table[key][0]}: FAILED {exc}", file=sys.stderr)

    def cell(key) -> str:
        if key not in table:
            return "skipped"
        if not results[key]:
            return f"failed: {errors[key][0]}" if errors[key] else "-"
        st = common.summarize(results[key])
        text = f"{st['median']:.2f} ({st['min']:.2f}-{st['max']:.2f})"
        if errors[key]:
            text += f"; {len(errors[key])} failed: {errors[key][0]}"
        return text

    rows = []
    for row in ("help", "new", "new-cold", "add", "add-cold"):
        goal = row.removesuffix("-cold")
        s_key, c_key = (row, "scaffold"), (goal, "copier")
        s_med = common.summarize(results.get(s_key, []))["median"]
        c_med = common.summarize(results.get(c_key, []))["median"]
        ratio = f"{s_med / c_med:.2f}" if results.get(s_key) and results.get(c_key) else "-"
        met = "-" if not results.get(s_key) else ("yes" if s_med < GOALS[goal] else "no")
        label = table[s_key][0]
        rows.append([label, cell(s_key), table[c_key][0], cell(c_key), ratio,
                     f"< {GOALS[goal]} s: {met}"])  # fmt: skip

    parts = [] if args.no_header else [common.header("scaffold benchmarks: CLI latency")]
    parts.append("## CLI latency (whole process, seconds)\n")
    parts.append(
        f"Median (min-max) of {args.repeats} interleaved repeat(s); each command a fresh process "
        "started as the console script; projects set up untimed before each run.\n"
    )
    parts.append(
        common.md_table(
            ["scaffold", "seconds", "copier equivalent", "seconds", "scaffold/copier", "goal"], rows
        )
    )
    parts.append(monitor.summary() + "\n")
    return "\n".join(parts)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="also write the markdown report to this file")
    p.add_argument("--quick", action="store_true", help="one repeat: checks that it runs")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--timeout", type=float, default=120, help="seconds per command")
    p.add_argument("--work", help="scratch folder (default: a temp folder)")
    p.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = 1
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    with common.scratch(args, "bench-cli-"):
        report = run_benchmark(args)
    common.write_report(args.out, report)


if __name__ == "__main__":
    main()
