"""Shared pieces of the benchmark scripts: machine description, statistics, tables, rendering.

The benchmark scripts are plain programs (not tests) and never judge timings themselves; they
print and write markdown that a person reads. Run them from a scaffold source checkout.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
if str(REPO) not in sys.path:  # import scaffold from this checkout even if it is not installed
    sys.path.insert(1, str(REPO))

# The generated projects the training benchmarks use (image-classification task).
# "all-ddp": every feature except ddp (ddp is a launcher feature; see gpu.py for DDP) and
# pretrained (it swaps the model for a downloaded one).
PROJECT_FEATURES = {
    "minimal": [],
    "amp+grad-accum": ["amp", "grad-accum"],
}


def all_but_ddp() -> list[str]:
    """The `all` example's features (every from-scratch feature of the training loop: no
    trackers or sweeps, which write outside --out-dir) without ddp."""
    from scaffold.examples import ALL

    return [name for name in ALL if name != "ddp"]


def project_features(name: str) -> list[str]:
    if name == "all-ddp":
        return all_but_ddp()
    return list(PROJECT_FEATURES[name])


def render_project(root: Path, name: str, features=None, task: str = "image-classification") -> Path:
    """Render a project with scaffold's own renderer into root/name (once; reused if there)."""
    from scaffold.answers import Answers
    from scaffold.render import project_files
    from scaffold.write import write_new_project

    dest = Path(root) / name
    if (dest / "train.py").is_file():
        return dest
    features = project_features(name) if features is None else list(features)
    project_name = "bench-" + "".join(c if c.isalnum() else "-" for c in name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    files = project_files(Answers(project_name=project_name, task=task, features=features))
    write_new_project(dest, files)
    return dest


@contextlib.contextmanager
def scratch(args, prefix: str):
    """Set args.work to a scratch folder: the one given (kept), or a temporary one (removed)."""
    if args.work:
        Path(args.work).mkdir(parents=True, exist_ok=True)
        yield Path(args.work)
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        args.work = tmp
        yield Path(tmp)


# --- machine and load ------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def version_of(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_times() -> tuple[float, float]:
    """(total, steal) jiffies of all CPUs since boot (Linux; zeros elsewhere)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        values = [float(v) for v in fields]
        return sum(values[:8]), values[7] if len(values) > 7 else 0.0
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0


class LoadMonitor:
    """Load average and CPU steal time over a benchmark: numbers taken on a busy machine say so."""

    def __init__(self):
        self.start = cpu_times()
        self.load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")

    def summary(self) -> str:
        total0, steal0 = self.start
        total1, steal1 = cpu_times()
        steal = 100.0 * (steal1 - steal0) / (total1 - total0) if total1 > total0 else float("nan")
        load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        cores = os.cpu_count() or 1
        note = ""
        # The benchmark itself keeps about one core busy: the end (and during) load includes it.
        if self.load_start > 0.5 * cores or load_end > cores - 0.5 or steal > 5:
            note = " **(busy machine: treat these numbers as rough)**"
        return (
            f"Load average (1 min) {self.load_start:.2f} at start, {load_end:.2f} at end "
            f"on {cores} cores; CPU steal {steal:.1f}% during the run{note}."
        )


def header(title: str) -> str:
    import scaffold

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    lines = [
        f"# {title}",
        "",
        f"- Date: {now}",
        (
            f"- Machine: {cpu_model()}, {os.cpu_count()} logical cores ({affinity} usable), "
            f"{platform.system()} {platform.release()}"
        ),
        (
            f"- Python {platform.python_version()}; torch {version_of('torch')}; "
            f"lightning {version_of('lightning')}; copier {version_of('copier')}; "
            f"scaffold {scaffold.__version__}"
        ),
        f"- Command: `{' '.join([Path(sys.argv[0]).name, *sys.argv[1:]])}`",
        "",
    ]
    return "\n".join(lines)


# --- statistics and tables -------------------------------------------------------------------


def summarize(values: list[float]) -> dict:
    """Median and range of repeated measurements (medians: robust to a noisy neighbour)."""
    if not values:
        return {"n": 0, "median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {
        "n": len(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def md_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join(lines) + "\n"


def fmt(value: float, digits: int = 3) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"


def write_report(path: str | None, text: str) -> None:
    print(text)
    if path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"written to {out}", file=sys.stderr)


def lightning_available() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("lightning") is not None
    except (ImportError, ValueError):
        return False


class Stopwatch:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start
        return False
