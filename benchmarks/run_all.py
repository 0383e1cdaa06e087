"""Run every CPU benchmark and write one markdown report.

    python benchmarks/run_all.py --out bench-results/cpu.md     # about 10 minutes on 2 cores
    python benchmarks/run_all.py --quick --out /tmp/cpu.md       # checks that everything runs

Runs, one after another, each in its own process: train_throughput.py (CPU training throughput
against a hand-written loop and Lightning), startup.py (process start to first update),
cli_latency.py and upgrade_latency.py (scaffold against copier) and `gpu.py --cpu-sharding` (FSDP
against DDP on the CPU, 2 ranks: time per update and memory per rank). The projects they train are
rendered once. The GPU
benchmark is separate: benchmarks/gpu.py. Run on a quiet machine; the report prints the load.
With --quick the three run side by side (their numbers then mean nothing: it only checks that
everything runs).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

SCRIPTS = {
    "throughput": ["train_throughput.py"],
    "startup": ["startup.py"],
    "cli": ["cli_latency.py"],
    "upgrade": ["upgrade_latency.py"],
    "sharding": ["gpu.py", "--cpu-sharding"],
}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench-results/cpu.md", help="the markdown report")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one repeat each")
    p.add_argument("--repeats", type=int, help="repeats for every benchmark (default: theirs)")
    p.add_argument("--no-lightning", action="store_true", help="skip the Lightning variants")
    p.add_argument("--skip", nargs="*", default=[], choices=list(SCRIPTS))
    args = p.parse_args(argv)

    monitor = common.LoadMonitor()
    sections, failed = [], []
    with tempfile.TemporaryDirectory(prefix="bench-all-") as tmp:
        for name in ("minimal", "amp+grad-accum", "all-ddp"):  # once, for every script
            common.render_project(Path(tmp) / "projects", name)
        runs = []
        for name, (script, *extra) in SCRIPTS.items():
            if name in args.skip:
                continue
            section = Path(tmp) / f"{name}.md"
            cmd = [sys.executable, str(common.BENCH_DIR / script), *extra, "--no-header",
                   "--out", str(section), "--work", tmp]  # fmt: skip
            if args.quick:
                cmd.append("--quick")
            if args.repeats and not args.quick:
                cmd += ["--repeats", str(args.repeats)]
            if args.no_lightning and name not in ("cli", "upgrade"):
                cmd.append("--no-lightning")
            print(f"== {script}", file=sys.stderr, flush=True)
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
            if not args.quick:  # measure one at a time; --quick only checks that they run
                proc.wait()
            runs.append((script, section, proc))
        for script, section, proc in runs:
            if proc.wait() != 0 or not section.exists():
                failed.append(f"{script} failed (exit {proc.returncode}); see its output above")
                continue
            sections.append(section.read_text())
    text = common.header("scaffold benchmarks (CPU)") + "\n" + "\n".join(sections)
    if failed:
        text += "\n" + "\n".join(f"- {line}" for line in failed) + "\n"
    text += "\nWhole run: " + monitor.summary() + "\n"
    common.write_report(args.out, text)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
