"""Start-up: time from process start to the end of the first optimizer update.

    python benchmarks/startup.py --out bench-results/startup.md
    python benchmarks/startup.py --quick

Each measurement starts a fresh process: the parent notes time.time(), starts
`python benchmarks/_first_step.py SCRIPT ARGS`, and the child writes time.time() when its first
optimizer.step() returns, then exits at once. So it counts interpreter start, imports, data and
model set-up and one training step, and nothing after. Scripts, all on the same model and data
(the generated project's built-in synthetic images and small CNN, its default sizes, CPU, one
thread via OMP_NUM_THREADS, one epoch):
- scaffold's generated `python train.py` of `minimal` and of `all` minus `ddp` (--no-compile:
  torch.compile would add its compile time to the first step);
- `python benchmarks/lightning_train.py` (Lightning's Trainer on the same project's data.py and
  model.py);
- `python -c "import torch"` for reference (process start to the end of the import).
Repeats are interleaved round-robin; medians and min-max. Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

WRAPPER = common.BENCH_DIR / "_first_step.py"
LIGHTNING_SCRIPT = common.BENCH_DIR / "lightning_train.py"
IMPORT_TORCH = (
    "import os, time, torch; "
    "open(os.environ['BENCH_FIRST_STEP_FILE'], 'w').write(repr(time.time())); os._exit(0)"
)


def commands(projects: dict[str, Path], size_args: list[str], with_lightning: bool) -> dict:
    common_args = ["--epochs", "1", *size_args]
    gen = ["--device", "cpu", *common_args]
    rows = {
        "scaffold `minimal`: python train.py": (
            [sys.executable, str(WRAPPER), "train.py", *gen],
            projects["minimal"],
        ),
    }
    if "all-ddp" in projects:
        rows["scaffold `all-ddp`: python train.py"] = (
            [sys.executable, str(WRAPPER), "train.py", *gen, "--no-compile", "--resume", "never"],
            projects["all-ddp"],
        )
    if with_lightning:
        rows["Lightning Trainer (like `minimal`)"] = (
            [sys.executable, str(WRAPPER), str(LIGHTNING_SCRIPT),
             "--project", str(projects["minimal"]), *common_args],
            projects["minimal"],
        )  # fmt: skip
    if "all-ddp" in projects:  # not with --quick
        rows["`python -c 'import torch'` (reference)"] = ([sys.executable, "-c", IMPORT_TORCH], None)
    return rows


def time_once(argv: list[str], cwd: Path | None, threads: int, timeout: float) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        stamp = Path(tmp) / "first-step"
        env = {
            **os.environ,
            "BENCH_FIRST_STEP_FILE": str(stamp),
            "OMP_NUM_THREADS": str(threads),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        argv = [*argv, "--out-dir", str(Path(tmp) / "run")] if cwd else argv
        start = time.time()
        proc = subprocess.run(
            argv, cwd=cwd or tmp, env=env, capture_output=True, text=True, timeout=timeout,
            check=False,
        )
        if proc.returncode != 0 or not stamp.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"exit {proc.returncode}: {' / '.join(tail)[:300]}")
        return float(stamp.read_text()) - start


def run_benchmark(args) -> str:
    monitor = common.LoadMonitor()
    work = Path(args.work)
    names = ["minimal"] if args.quick else ["minimal", "all-ddp"]
    projects = {name: common.render_project(work / "projects", name) for name in names}
    with_lightning = not args.no_lightning and common.lightning_available()
    if args.quick:
        size_args = ["--synthetic-train-size", "32", "--synthetic-val-size", "8",
                     "--batch-size", "8", "--image-size", "8"]  # fmt: skip
    else:
        size_args = ["--batch-size", str(args.batch_size)]
    rows = commands(projects, size_args, with_lightning)
    results = {label: [] for label in rows}
    errors = {label: [] for label in rows}
    labels = list(rows)
    for r in range(args.repeats):
        shift = r % len(labels)
        for label in labels[shift:] + labels[:shift]:
            argv, cwd = rows[label]
            try:
                seconds = time_once(argv, cwd, args.threads, args.timeout)
                results[label].append(seconds)
                print(f"round {r + 1}/{args.repeats} {label}: {seconds:.2f} s", file=sys.stderr)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                errors[label].append(str(exc))
                print(f"round {r + 1}/{args.repeats} {label}: FAILED {exc}", file=sys.stderr)

    parts = [] if args.no_header else [common.header("scaffold benchmarks: start-up")]
    parts.append("## Start-up: process start to the end of the first optimizer update\n")
    parts.append(
        f"Fresh process each time; {args.repeats} interleaved repeat(s); "
        f"OMP_NUM_THREADS={args.threads}; the generated project's built-in synthetic data and "
        f"small CNN ({' '.join(size_args)}; other sizes at the generated defaults), CPU.\n"
    )
    table = []
    for label in labels:
        st = common.summarize(results[label])
        if results[label]:
            table.append([label, f"{st['median']:.2f}", f"{st['min']:.2f}-{st['max']:.2f}", st["n"]])
        if errors[label]:
            table.append([label, "failed", "-", errors[label][0]])
    parts.append(common.md_table(["script", "seconds (median)", "min-max", "runs"], table))
    gen = common.summarize(results.get("scaffold `minimal`: python train.py", []))["median"]
    light = common.summarize(results.get("Lightning Trainer (like `minimal`)", []))["median"]
    if not (math.isnan(gen) or math.isnan(light)):
        parts.append(
            f"scaffold `minimal` reaches its first update {light - gen:.2f} s before Lightning "
            f"does (Lightning takes {light / gen:.2f}x as long).\n"
        )
    if not with_lightning:
        parts.append("Lightning row skipped: lightning is not installed (`pip install -e '.[bench]'`).\n")
    parts.append(monitor.summary() + "\n")
    return "\n".join(parts)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="also write the markdown report to this file")
    p.add_argument("--quick", action="store_true", help="tiny data, one repeat: checks it runs")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--timeout", type=float, default=300, help="seconds per process")
    p.add_argument("--no-lightning", action="store_true")
    p.add_argument("--work", help="scratch folder for rendered projects (default: a temp folder)")
    p.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = 1
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    with common.scratch(args, "bench-startup-"):
        report = run_benchmark(args)
    common.write_report(args.out, report)


if __name__ == "__main__":
    main()
