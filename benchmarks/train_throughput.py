"""CPU training throughput: scaffold's generated train.py against a hand-written loop and Lightning.

    python benchmarks/train_throughput.py --out bench-results/throughput.md
    python benchmarks/train_throughput.py --quick          # seconds: checks that it runs

What runs (all in this one process, one after another, interleaved round-robin over the variants,
the starting variant rotated each round; an untimed warm-up round first):
- the same model (the generated project's own `model.py`, small CNN), the same data (one set of
  in-memory random images, a TensorDataset; the generated script's `build_datasets` is replaced
  by one returning it, so its per-sample augmentation does not count), the same micro-batch size,
  the same number of optimizer updates (one epoch), AdamW with the same lr, cross-entropy, fp32,
  and the same number of threads (torch.set_num_threads, default 1);
- workload "plain": one micro-batch per update, no gradient clipping;
  workload "accum": K micro-batches per update (default 2), clipping at 1.0, warmup+cosine schedule;
- variants: (1) a hand-written loop, the floor (DataLoader, forward, loss, backward, step);
  (1b, plain only, for information) the same without a DataLoader (index the tensors);
  (2) scaffold's generated train.py for `minimal`, `amp+grad-accum` and `all` minus `ddp`
  (rendered with scaffold.render, run through `train.main(argv)`; --precision fp32, since
  bf16 autocast is slower on CPUs without bf16 instructions; --no-compile; --resume never;
  --checkpoint-every 50 (one periodic checkpoint inside the timed window); every other
  feature at its default, e.g. TensorBoard, callbacks);
  (3) Lightning's Trainer on the same model/data (benchmarks/lightning_train.py), configured
  like `minimal` and like `all` (loggers, checkpoints, early stopping).

How time is measured: a global optimizer-step hook (torch.optim.optimizer.
register_optimizer_step_post_hook) records time.perf_counter() after every optimizer.step() in
every variant, Lightning included. Time per update = (end of the last update - end of update W)
/ (updates - W), W warm-up updates (default 10) excluded: start-up, data set-up, validation (after
the last update) and teardown are outside the window; everything the loop does per update
(logging, schedule, checkpoints, callbacks) is inside it. Reported: median over repeats, min-max,
and the ratio of medians to (1). Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

PROJECT_MODULES = ("train", "data", "model", "callbacks")
CLASSES = ["a", "b", "c", "d"]
STEP_TIMES: list[float] = []


@dataclass
class Settings:
    batch_size: int
    image_size: int
    updates: int
    warmup_updates: int
    accum: int
    log_every: int
    threads: int
    checkpoint_every: int
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup_steps: int = 10  # the LR schedule's warmup, same in every variant


@dataclass
class Variant:
    key: str
    label: str
    workload: str  # "plain" or "accum"
    run: object  # callable(ctx, out_dir) -> None
    is_floor: bool = False
    results: list = field(default_factory=list)  # seconds per update, one per repeat
    errors: list = field(default_factory=list)


class Context:
    """The shared model code, data tensors and settings every variant uses."""

    def __init__(self, settings: Settings, projects: dict[str, Path]):
        import torch
        from torch.utils.data import TensorDataset

        self.s = settings
        self.projects = projects
        g = torch.Generator().manual_seed(0)
        size = settings.batch_size * settings.updates * settings.accum
        shape = (3, settings.image_size, settings.image_size)
        self.x = torch.randn(size, *shape, generator=g)
        self.y = torch.randint(0, len(CLASSES), (size,), generator=g)
        vx = torch.randn(2 * settings.batch_size, *shape, generator=g)
        vy = torch.randint(0, len(CLASSES), (2 * settings.batch_size,), generator=g)
        self.val_set = TensorDataset(vx, vy)
        self.train_sets = {}
        for workload, k in (("plain", 1), ("accum", settings.accum)):
            n = settings.batch_size * settings.updates * k  # the same number of updates
            self.train_sets[workload] = TensorDataset(self.x[:n], self.y[:n])  # views, no copy

    def train_set(self, workload: str):
        return self.train_sets[workload]

    def build_model(self):
        """The generated project's own model, built in a fresh import of its model.py."""
        import torch

        with project_modules(self.projects["minimal"]):
            import model as model_module

            torch.manual_seed(0)
            cfg = _ModelConfig(self.s.image_size)
            return model_module.build_model(cfg, {"classes": CLASSES})


class _ModelConfig:
    arch = "small-cnn"

    def __init__(self, image_size: int):
        self.image_size = image_size


@contextlib.contextmanager
def project_modules(project: Path):
    """Import a generated project's train/data/model/callbacks fresh, from `project`."""
    for name in PROJECT_MODULES:
        sys.modules.pop(name, None)
    old_path = list(sys.path)
    sys.path.insert(0, str(project))
    try:
        yield
    finally:
        sys.path[:] = old_path
        for name in PROJECT_MODULES:
            sys.modules.pop(name, None)


# --- the variants ------------------------------------------------------------------------------


def run_floor(ctx: Context, out_dir: Path, workload: str = "plain") -> None:
    """(1) The floor: the shortest correct loop (for "accum": plus accumulation, clipping, schedule)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    s = ctx.s
    k = s.accum if workload == "accum" else 1
    model = ctx.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    scheduler = None
    if workload == "accum":
        from lightning_train import lr_factor

        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_factor(step, s.warmup_steps, s.updates)
        )
    loader = DataLoader(
        ctx.train_set(workload),
        batch_size=s.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    model.train()
    step = 0
    for i, (inputs, targets) in enumerate(loader):
        loss = F.cross_entropy(model(inputs), targets) / k
        loss.backward()
        if (i + 1) % k:
            continue
        if scheduler is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % s.log_every == 0:
            print(f"step {step}: loss {loss.item() * k:.4f}")


def run_floor_no_loader(ctx: Context, out_dir: Path) -> None:
    """(1b) The floor without a DataLoader: batches by indexing the tensors (information only)."""
    import torch
    import torch.nn.functional as F

    s = ctx.s
    model = ctx.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    n = s.batch_size * s.updates
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    model.train()
    for step, start in enumerate(range(0, n, s.batch_size), 1):
        index = order[start : start + s.batch_size]
        loss = F.cross_entropy(model(ctx.x[index]), ctx.y[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % s.log_every == 0:
            print(f"step {step}: loss {loss.item():.4f}")


def generated_args(ctx: Context, project_name: str, workload: str, out_dir: Path) -> list[str]:
    s = ctx.s
    k = s.accum if workload == "accum" else 1
    features = set(common.project_features(project_name))
    args = [
        "--device", "cpu",
        "--epochs", "1",
        "--batch-size", str(s.batch_size),
        "--image-size", str(s.image_size),
        "--synthetic-train-size", str(len(ctx.train_set(workload))),
        "--synthetic-val-size", str(len(ctx.val_set)),
        "--lr", str(s.lr),
        "--weight-decay", str(s.weight_decay),
        "--warmup-steps", str(s.warmup_steps),
        "--max-grad-norm", "1.0" if workload == "accum" else "0",
        "--log-every", str(s.log_every),
        "--seed", "0",
        "--out-dir", str(out_dir),
    ]  # fmt: skip
    if "amp" in features:
        args += ["--precision", "fp32"]
    if "grad-accum" in features:
        args += ["--grad-accum-steps", str(k)]
    elif k != 1:
        raise ValueError(f"{project_name} has no grad-accum feature; it cannot run workload accum")
    if "compile" in features:
        args += ["--no-compile"]
    if "resume" in features:
        args += ["--resume", "never", "--checkpoint-every", str(s.checkpoint_every)]
    return args


def run_generated(ctx: Context, out_dir: Path, project_name: str, workload: str) -> None:
    """(2) The generated train.py, through its own main(argv), on the shared tensors."""
    project = ctx.projects[project_name]
    train_set, val_set = ctx.train_set(workload), ctx.val_set

    def build_datasets(cfg):
        return train_set, val_set, {"classes": list(CLASSES)}

    old_cwd = os.getcwd()
    with project_modules(project):
        os.chdir(out_dir)
        try:
            import data
            import train

            data.build_datasets = build_datasets
            train.build_datasets = build_datasets
            train.main(generated_args(ctx, project_name, workload, out_dir / "run"))
        finally:
            os.chdir(old_cwd)


def run_lightning(ctx: Context, out_dir: Path, like: str, workload: str) -> None:
    """(3) Lightning's Trainer on the same model and data."""
    import lightning_train

    s = ctx.s
    lightning_train.fit(
        ctx.build_model(),
        ctx.train_set(workload),
        ctx.val_set,
        out_dir,
        batch_size=s.batch_size,
        like=like,
        lr=s.lr,
        weight_decay=s.weight_decay,
        warmup_steps=s.warmup_steps,
        log_every=s.log_every,
        grad_accum=s.accum if workload == "accum" else 1,
        clip=1.0 if workload == "accum" else 0.0,
        checkpoint_every=s.checkpoint_every,
    )


def make_variants(with_lightning: bool, accum: int) -> list[Variant]:
    v = [
        Variant("floor", "(1) hand-written loop", "plain", lambda c, o: run_floor(c, o), is_floor=True),
        Variant("floor-noloader", "(1b) hand-written, no DataLoader (info)", "plain",
                run_floor_no_loader),
    ]  # fmt: skip
    for name in ("minimal", "amp+grad-accum", "all-ddp"):
        v.append(Variant(f"gen-{name}", f"(2) scaffold `{name}`", "plain",
                         lambda c, o, n=name: run_generated(c, o, n, "plain")))  # fmt: skip
    if with_lightning:
        for like in ("minimal", "all"):
            v.append(Variant(f"lightning-{like}", f"(3) Lightning, like `{like}`", "plain",
                             lambda c, o, lk=like: run_lightning(c, o, lk, "plain")))  # fmt: skip
    if accum > 1:
        v.append(Variant("floor-accum", "(1) hand-written loop + accumulation, clipping, schedule",
                         "accum", lambda c, o: run_floor(c, o, "accum"), is_floor=True))  # fmt: skip
        for name in ("amp+grad-accum", "all-ddp"):
            v.append(Variant(f"gen-{name}-accum", f"(2) scaffold `{name}`", "accum",
                             lambda c, o, n=name: run_generated(c, o, n, "accum")))  # fmt: skip
        if with_lightning:
            for like in ("minimal", "all"):
                v.append(Variant(f"lightning-{like}-accum", f"(3) Lightning, like `{like}`", "accum",
                                 lambda c, o, lk=like: run_lightning(c, o, lk, "accum")))  # fmt: skip
    return v


# --- running and timing ------------------------------------------------------------------------


def time_one(ctx: Context, variant: Variant, updates: int, warmup: int) -> float:
    """Run a variant once; return seconds per optimizer update (see the module docstring)."""
    import torch

    torch.set_num_threads(ctx.s.threads)
    out_dir = Path(tempfile.mkdtemp(prefix=f"bench-{variant.key}-"))
    STEP_TIMES.clear()
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            variant.run(ctx, out_dir)
    except SystemExit as exc:
        raise RuntimeError(f"exited with {exc.code}: {captured.getvalue()[-1500:]}") from None
    except Exception:  # noqa: BLE001 (any failure becomes a row in the report)
        raise RuntimeError(traceback.format_exc(limit=6) + captured.getvalue()[-1500:]) from None
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    times = list(STEP_TIMES)
    if torch.get_num_threads() != ctx.s.threads:
        raise RuntimeError(f"the run changed the thread count to {torch.get_num_threads()}")
    if len(times) != updates:
        raise RuntimeError(f"expected {updates} optimizer updates, saw {len(times)}")
    return (times[-1] - times[warmup - 1]) / (len(times) - warmup)


def run_benchmark(args) -> str:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    monitor = common.LoadMonitor()
    torch.set_num_threads(args.threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(args.threads)
    register_optimizer_step_post_hook(
        lambda optimizer, a, kw: STEP_TIMES.append(time.perf_counter())
    )
    settings = Settings(
        batch_size=args.batch_size,
        image_size=args.image_size,
        updates=args.updates,
        warmup_updates=args.warmup_updates,
        accum=args.accum,
        log_every=args.log_every,
        threads=args.threads,
        checkpoint_every=args.checkpoint_every,
    )
    if settings.updates <= settings.warmup_updates:
        sys.exit("error: --updates must be larger than --warmup-updates")
    work = Path(args.work)
    projects = {
        name: common.render_project(work / "projects", name)
        for name in ("minimal", "amp+grad-accum", "all-ddp")
    }
    ctx = Context(settings, projects)
    with_lightning = not args.no_lightning and common.lightning_available()
    variants = make_variants(with_lightning, settings.accum)
    if args.only:
        variants = [v for v in variants if v.key in args.only or v.is_floor]

    def log(message):
        print(message, file=sys.stderr, flush=True)

    if not args.quick:  # warm-up round: first-use costs (imports, allocator) land here, untimed
        log("warm-up round")
        for v in variants:
            try:
                time_one(ctx, v, settings.updates, settings.warmup_updates)
            except RuntimeError as exc:
                v.errors.append(str(exc))
                log(f"  {v.key}: FAILED\n{exc}")
    variants = [v for v in variants if not v.errors] + [v for v in variants if v.errors]
    active = [v for v in variants if not v.errors]
    for r in range(args.repeats if active else 0):
        shift = r % len(active)
        order = active[shift:] + active[:shift]  # round-robin, starting one later each round
        for v in order:
            try:
                seconds = time_one(ctx, v, settings.updates, settings.warmup_updates)
                v.results.append(seconds)
                log(f"round {r + 1}/{args.repeats} {v.key}: {seconds * 1e3:.2f} ms/update")
            except RuntimeError as exc:
                v.errors.append(str(exc))
                log(f"round {r + 1}/{args.repeats} {v.key}: FAILED\n{exc}")

    return report(args, settings, variants, with_lightning, monitor)


def report(args, s: Settings, variants: list[Variant], with_lightning: bool, monitor) -> str:
    parts = [] if args.no_header else [common.header("scaffold benchmarks: CPU training throughput")]
    parts.append("## Training throughput on CPU (time per optimizer update)\n")
    parts.append(
        f"Small CNN (the generated `model.py`), {s.image_size}x{s.image_size} in-memory random "
        f"images, micro-batch {s.batch_size}, {s.updates} optimizer updates per run (the first "
        f"{s.warmup_updates} not timed), {s.threads} thread(s), fp32, AdamW; {args.repeats} "
        f"interleaved repeat(s){'' if args.quick else ' after an untimed warm-up round'}; "
        "median and min-max of the time per update. "
        "Time per update: between optimizer.step() calls, read by one global step hook in every "
        "variant (start-up, validation and teardown excluded).\n"
    )
    workloads = {
        "plain": "Workload **plain**: one micro-batch per update, no clipping.",
        "accum": f"Workload **accum**: {s.accum} micro-batches per update (gradient accumulation), "
        "clipping at 1.0, warmup + cosine schedule; the floor does the same by hand.",
    }
    summary = []
    for workload, title in workloads.items():
        group = [v for v in variants if v.workload == workload]
        if not group:
            continue
        floor = next((v for v in group if v.is_floor), None)
        floor_median = common.summarize(floor.results)["median"] if floor else float("nan")
        rows = []
        for v in group:
            st = common.summarize(v.results)
            ratio = st["median"] / floor_median  # nan without a floor
            if v.results:
                rows.append([
                    v.label,
                    common.fmt(st["median"] * 1e3),
                    f"{common.fmt(st['min'] * 1e3)}-{common.fmt(st['max'] * 1e3)}",
                    common.fmt(1 / st["median"]),
                    f"{ratio:.3f}",
                    st["n"],
                ])  # fmt: skip
            if v.errors:
                first = v.errors[0].strip().splitlines()[-1][:160]
                rows.append([v.label, "failed", "-", "-", "-", f"{len(v.errors)} failed: {first}"])
        parts.append(title + "\n")
        parts.append(
            common.md_table(
                ["variant", "ms/update (median)", "min-max", "updates/s", "vs (1)", "runs"], rows
            )
        )
        lightning = [v for v in group if v.key.startswith("lightning") and v.results]
        for v in group:
            if not v.key.startswith("gen-") or not v.results or math.isnan(floor_median):
                continue
            med = common.summarize(v.results)["median"]
            line = (
                f"- {workload}: scaffold {v.label.split('`')[1]} is "
                f"{100 * (med / floor_median - 1):+.1f}% vs the floor (goal: within +3%, issue 22)"
            )
            for lv in lightning:
                lmed = common.summarize(lv.results)["median"]
                line += f"; Lightning {lv.label.split(', ')[1]} takes {lmed / med:.2f}x as long"
            summary.append(line)
        parts.append("")
    if summary:
        parts.append("Against the goals (ratios of medians):\n")
        parts.append("\n".join(summary) + "\n")
    if not with_lightning:
        parts.append(
            "Lightning rows skipped: lightning is not installed (`pip install -e '.[bench]'`; "
            "check first with `pip install --dry-run lightning` that torch stays).\n"
        )
    parts.append(monitor.summary() + "\n")
    return "\n".join(parts)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="also write the markdown report to this file")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one repeat: checks it runs")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--updates", type=int, default=100, help="optimizer updates per run")
    p.add_argument("--warmup-updates", type=int, default=10, help="updates not timed")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=8,
                   help="small images keep compute per update short, so loop overhead shows")  # fmt: skip
    p.add_argument("--accum", type=int, default=2, help="micro-batches per update in workload accum (1: skip it)")
    p.add_argument("--log-every", type=int, default=50, help="log/print every N updates (all variants)")
    p.add_argument("--threads", type=int, default=1, help="torch threads, the same for all variants")
    p.add_argument("--checkpoint-every", type=int, default=50,
                   help="periodic checkpoints of `all` and Lightning like `all` (generated "
                        "default 100; 50 puts one inside the timed window)")  # fmt: skip
    p.add_argument("--no-lightning", action="store_true", help="skip the Lightning variants")
    p.add_argument("--only", nargs="*", help="variant keys to run (the floors always run)")
    p.add_argument("--work", help="scratch folder for rendered projects (default: a temp folder)")
    p.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.updates, args.warmup_updates = 1, 8, 2
        args.batch_size, args.image_size, args.log_every, args.checkpoint_every = 4, 8, 4, 4
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    with common.scratch(args, "bench-throughput-"):
        report = run_benchmark(args)
    common.write_report(args.out, report)
    sys.stdout.flush()
    os._exit(0)  # skip the slow interpreter teardown after torch


if __name__ == "__main__":
    main()
