"""GPU training throughput of the generated `amp` project: fp32 against bf16, DDP and FSDP on every GPU.

    python benchmarks/gpu.py --out bench-results/gpu.md        # about 3-5 minutes
    python benchmarks/gpu.py --quick                           # tiny sizes: checks that it runs
    python benchmarks/gpu.py --cpu-dry-run                     # the GPU mode, end to end on the CPU
    python benchmarks/gpu.py --cpu-sharding                    # FSDP against DDP on the CPU, 2 ranks

Without CUDA it prints a message and exits with status 0, having run nothing (except with
--cpu-dry-run or --cpu-sharding, which need no GPU).

What runs:
- scaffold renders `amp` and `amp+ddp` (image classification) into a scratch folder;
- single GPU: one worker process runs the generated `train.main(argv)` for each precision in
  --precisions (default fp32, bf16), interleaved, --repeats times;
- DDP: `torchrun --standalone --nproc-per-node=<all visible GPUs>` runs the generated `amp+ddp`
  train.py (through the same worker) once per precision in --ddp-precisions (default bf16);
  FSDP: the same with the generated `amp+fsdp` train.py (fully_shard per block).
- Memory per rank: "state MiB" is what the rank stores of parameters, gradients and AdamW state
  (local shards under FSDP), measured at the last update; "peak" is torch.cuda.max_memory_allocated
  on a GPU, the process's peak resident set (ru_maxrss, torch itself included) on the CPU; the
  largest over the ranks is shown.
- --cpu-sharding: FSDP against DDP on the CPU (gloo, 2 processes), fp32, --arch resnet18 at 64x64,
  batch 16 per rank by default: time per update and memory per rank (run_all.py runs this).
- Model: --arch (default resnet50, random init) at --image-size (default 128), micro-batch
  --batch-size per GPU (default 256), --updates optimizer updates (default 150), one epoch.
  The data are random images kept on the GPU (a fixed pool of --pool images, indexed modulo its
  size), returned by a dataset with __getitems__, so the generated DataLoader loop is measured
  without a CPU data pipeline in the way (the generated built-in data augment each image on the
  CPU, which would hide the GPU). The generated `build_datasets` is swapped for it in the worker.
- Timing: an optimizer-step hook synchronises CUDA after update --warmup-updates and after the
  last update; images/s = global batch x timed updates / elapsed. The generated loop reads the
  loss with .item() every update, so the GPU never runs far ahead of the clock anyway.
- A deadline (--budget seconds, default 280) skips what is left once reached, and says so.
cuDNN TF32 (on by default in PyTorch, used by fp32 convolutions) and matmul TF32 (off by
default) are left as they are and printed in the header.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

THIS = Path(__file__).resolve()
PROJECT_MODULES = ("train", "data", "model", "callbacks")
CLASSES = ["a", "b", "c", "d"]


# --- worker: runs inside one process (or one torchrun rank) --------------------------------------


def stored_bytes(optimizer) -> int:
    """Bytes this rank stores of parameters, gradients and optimizer state (local shards)."""

    def local(tensor):
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    tensors = [p for group in optimizer.param_groups for p in group["params"]]
    tensors += [p.grad for p in tensors if p.grad is not None]
    tensors += [v for state in optimizer.state.values() for v in state.values() if hasattr(v, "numel")]
    return sum(local(t).numel() * t.element_size() for t in tensors)


def peak_rss_gib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def gpu_dataset(pool: int, length: int, image_size: int, device):
    import torch
    from torch.utils.data import Dataset

    class GpuImages(Dataset):
        """`length` samples drawn from a pool of random images that live on the GPU."""

        def __init__(self):
            g = torch.Generator().manual_seed(0)
            self.x = torch.randn(pool, 3, image_size, image_size, generator=g).to(device)
            self.y = torch.randint(0, len(CLASSES), (pool,), generator=g).to(device)

        def __len__(self):
            return length

        def __getitem__(self, index):
            return self.x[index % pool], self.y[index % pool]

        def __getitems__(self, indices):  # one gather per batch instead of one per sample
            index = torch.as_tensor(indices, device=device) % pool
            return list(zip(self.x[index], self.y[index]))

    return GpuImages()


def worker(job_path: str) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    job = json.loads(Path(job_path).read_text())
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = job["device"] == "cuda"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    warmup, updates = job["warmup"], job["updates"]
    marks: list[float] = []
    count = [0]

    state_bytes = [0]

    def hook(optimizer, args, kwargs):
        count[0] += 1
        if count[0] in (warmup, updates):
            if cuda:
                torch.cuda.synchronize()
            marks.append(time.perf_counter())
        if count[0] == updates:
            state_bytes[0] = stored_bytes(optimizer)

    register_optimizer_step_post_hook(hook)
    batch = job["batch_size"]
    train_set = gpu_dataset(job["pool"], batch * updates * world, job["image_size"], device)
    val_set = gpu_dataset(job["pool"], 2 * batch * world, job["image_size"], device)
    results = []
    sys.path.insert(0, job["project"])
    for precision in job["precisions"]:
        for name in PROJECT_MODULES:
            sys.modules.pop(name, None)
        import data
        import train

        def build_datasets(cfg):
            return train_set, val_set, {"classes": list(CLASSES)}

        data.build_datasets = train.build_datasets = build_datasets
        marks.clear()
        count[0] = 0
        gc.collect()  # the previous run's model and optimizer
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        out_dir = tempfile.mkdtemp(prefix="bench-gpu-")
        argv = [
            "--epochs", "1", "--batch-size", str(batch), "--precision", precision,
            "--arch", job["arch"], "--image-size", str(job["image_size"]),
            "--synthetic-train-size", str(len(train_set)), "--synthetic-val-size", str(len(val_set)),
            "--log-every", "50", "--warmup-steps", "10", "--out-dir", out_dir,
        ]  # fmt: skip
        if not cuda:
            argv += ["--device", "cpu"]
        error = ""
        try:
            train.main(argv)
        except BaseException as exc:  # noqa: BLE001 (reported, then the next precision runs)
            error = f"{type(exc).__name__}: {exc}"
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)
        result = {"precision": precision, "world_size": world, "error": error}
        if not error and len(marks) == 2 and count[0] == updates:
            seconds = marks[1] - marks[0]
            timed = updates - warmup
            result.update(
                images_per_s=timed * batch * world / seconds,
                ms_per_update=1e3 * seconds / timed,
                peak_gib=torch.cuda.max_memory_allocated(device) / 2**30 if cuda else peak_rss_gib(),
                state_mib=state_bytes[0] / 2**20,
            )
        elif not error:
            result["error"] = f"expected {updates} updates, saw {count[0]}"
        results.append(result)
    # rank 0's file is the result; the others add their memory (the driver keeps the largest)
    Path(job["result"] + ("" if rank == 0 else f".rank{rank}")).write_text(json.dumps(results))
    sys.stdout.flush()
    os._exit(0)


# --- driver ----------------------------------------------------------------------------------------


def run_worker(job: dict, nproc: int | None, timeout: float) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-gpu-job-") as tmp:
        job = {**job, "result": str(Path(tmp) / "result.json")}
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(job))
        if nproc:
            argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc-per-node={nproc}", str(THIS), "--worker", str(job_path)]  # fmt: skip
        else:
            argv = [sys.executable, str(THIS), "--worker", str(job_path)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        result_file = Path(job["result"])
        if proc.returncode != 0 or not result_file.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-4:]
            raise RuntimeError(f"exit {proc.returncode}: {' / '.join(tail)[:400]}")
        results = json.loads(result_file.read_text())
        for other in result_file.parent.glob(result_file.name + ".rank*"):
            for result, theirs in zip(results, json.loads(other.read_text())):
                for key in ("peak_gib", "state_mib"):
                    if key in result and key in theirs:
                        result[key] = max(result[key], theirs[key])
        return results


def gpu_header(dry_run: bool) -> str:
    import torch

    if dry_run:
        return "- CPU dry run (--cpu-dry-run): checks the script end to end; the numbers mean nothing\n"
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return (
        f"- GPUs: {len(names)} x {names[0] if len(set(names)) == 1 else ', '.join(names)}; "
        f"CUDA {torch.version.cuda}; cuDNN {torch.backends.cudnn.version()}; "
        f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}, "
        f"matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}\n"
    )


def run_benchmark(args) -> str:
    import torch

    deadline = time.monotonic() + args.budget
    gpus = 2 if args.cpu_dry_run else torch.cuda.device_count()
    work = Path(args.work)
    single = common.render_project(work / "projects", "amp", ["amp"])
    parallel = {
        "DDP": common.render_project(work / "projects", "amp+ddp", ["amp", "ddp"]),
        "FSDP": common.render_project(work / "projects", "amp+fsdp", ["amp", "fsdp"]),
    }
    job = {
        "arch": args.arch, "image_size": args.image_size, "batch_size": args.batch_size,
        "updates": args.updates, "warmup": args.warmup_updates, "pool": args.pool,
        "device": "cpu" if args.cpu_dry_run else "cuda",
    }  # fmt: skip
    rows, notes = [], []

    def remaining() -> float:
        return deadline - time.monotonic()

    precisions = [p for _ in range(args.repeats) for p in args.precisions]  # interleaved
    if remaining() > 0:
        try:
            results = run_worker({**job, "project": str(single), "precisions": precisions},
                                 None, max(1.0, remaining()))  # fmt: skip
            rows += [("1 GPU", r) for r in results]
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            notes.append(f"single-GPU run failed or ran out of time: {exc}")
    for precision in args.ddp_precisions:
        for name, project in parallel.items():
            if remaining() <= 10:
                notes.append(f"{name} {precision} skipped: the {args.budget:.0f} s budget was used up")
                continue
            try:
                results = run_worker({**job, "project": str(project), "precisions": [precision]},
                                     gpus, remaining())  # fmt: skip
                rows += [(f"{name}, {gpus} GPU(s), torchrun", r) for r in results]
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                notes.append(f"{name} {precision} failed or ran out of time: {exc}")

    table, best = [], {}
    for setup in dict.fromkeys(s for s, _ in rows):
        for precision in dict.fromkeys(r["precision"] for s, r in rows if s == setup):
            runs = [r for s, r in rows if s == setup and r["precision"] == precision]
            ok = [r for r in runs if not r["error"]]
            if ok:
                st = common.summarize([r["images_per_s"] for r in ok])
                best[(setup, precision)] = st["median"]
                table.append([setup, precision, f"{st['median']:.0f}",
                              f"{st['min']:.0f}-{st['max']:.0f}",
                              common.fmt(common.summarize([r["ms_per_update"] for r in ok])["median"]),
                              f"{max(r['peak_gib'] for r in ok):.1f}",
                              f"{max(r['state_mib'] for r in ok):.0f}", len(ok)])  # fmt: skip
            for r in runs:
                if r["error"]:
                    table.append([setup, precision, "failed", "-", "-", "-", "-", r["error"][:200]])

    parts = [] if args.no_header else [common.header("scaffold benchmarks: GPU training throughput")]
    parts.append(gpu_header(args.cpu_dry_run))
    parts.append("## GPU throughput of the generated `amp` project (images/s)\n")
    parts.append(
        f"{args.arch} (random init) at {args.image_size}x{args.image_size}, micro-batch "
        f"{args.batch_size} per GPU, {args.updates} updates per run (the first "
        f"{args.warmup_updates} not timed), random images resident on the GPU; single-GPU "
        f"precisions interleaved, {args.repeats} repeat(s).\n"
    )
    parts.append(
        common.md_table(
            ["setup", "precision", "images/s (median)", "min-max", "ms/update", "peak GiB per rank",
             "state MiB per rank", "runs"],  # fmt: skip
            table,
        )
    )
    fp32, bf16 = best.get(("1 GPU", "fp32")), best.get(("1 GPU", "bf16"))
    if fp32 and bf16:
        parts.append(f"bf16 / fp32 on one GPU: {bf16 / fp32:.2f}x.\n")
    for precision in args.ddp_precisions:
        for name in parallel:
            rate = best.get((f"{name}, {gpus} GPU(s), torchrun", precision))
            one = best.get(("1 GPU", precision))
            if rate and one:
                parts.append(
                    f"{name} {precision} on {gpus} GPU(s): {rate / one:.2f}x one GPU "
                    f"(scaling efficiency {rate / (gpus * one):.0%}).\n"
                )
    for note in notes:
        parts.append(f"- {note}\n")
    return "\n".join(parts)


def run_sharding(args) -> str:
    """FSDP against DDP on the CPU: 2 ranks (gloo), fp32, interleaved --repeats times."""
    work = Path(args.work)
    projects = {
        "DDP": common.render_project(work / "projects", "amp+ddp", ["amp", "ddp"]),
        "FSDP": common.render_project(work / "projects", "amp+fsdp", ["amp", "fsdp"]),
    }
    job = {
        "arch": args.arch, "image_size": args.image_size, "batch_size": args.batch_size,
        "updates": args.updates, "warmup": args.warmup_updates, "pool": args.pool, "device": "cpu",
        "precisions": ["fp32"],
    }  # fmt: skip
    results, notes = {name: [] for name in projects}, []
    for _ in range(args.repeats):
        for name, project in projects.items():
            try:
                results[name] += run_worker({**job, "project": str(project)}, 2, args.budget)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                notes.append(f"{name} failed: {exc}")
    table = []
    for name, runs in results.items():
        ok = [r for r in runs if not r["error"]]
        if not ok:
            table.append([f"{name}, 2 CPU processes (gloo)", "failed", "-", "-", "-", "-"])
            continue
        st = common.summarize([r["ms_per_update"] for r in ok])
        table.append([f"{name}, 2 CPU processes (gloo)", common.fmt(st["median"]),
                      f"{common.fmt(st['min'])}-{common.fmt(st['max'])}",
                      f"{max(r['state_mib'] for r in ok):.0f}", f"{max(r['peak_gib'] for r in ok):.2f}",
                      len(ok)])  # fmt: skip
        notes += [f"{name}: {r['error'][:200]}" for r in runs if r["error"]]
    parts = [] if args.no_header else [common.header("scaffold benchmarks: FSDP against DDP on the CPU")]
    parts.append("## FSDP against DDP on the CPU (2 ranks, gloo)\n")
    parts.append(
        f"The generated `amp+fsdp` and `amp+ddp` projects, fp32, {args.arch} (random init) at "
        f"{args.image_size}x{args.image_size}, batch {args.batch_size} per rank, {args.updates} "
        f"updates per run (the first {args.warmup_updates} not timed), interleaved, "
        f"{args.repeats} repeat(s). State: parameters, gradients and AdamW state one rank stores; "
        "peak RSS includes torch itself (`python benchmarks/gpu.py --cpu-sharding`).\n"
    )
    parts.append(common.md_table(
        ["setup", "ms/update (median)", "min-max", "state MiB per rank", "peak RSS GiB per rank", "runs"],
        table))  # fmt: skip
    parts += [f"- {note}\n" for note in notes]
    return "\n".join(parts)


def cuda_available() -> bool:
    # No GPU device node: no CUDA, and no need to spend seconds importing torch to learn it.
    nodes = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")
    if sys.platform.startswith("linux") and not any(Path(node).exists() for node in nodes):
        return False
    import torch

    return torch.cuda.is_available()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="also write the markdown report to this file")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that it runs")
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=256, help="per GPU")
    p.add_argument("--updates", type=int, default=150)
    p.add_argument("--warmup-updates", type=int, default=20)
    p.add_argument("--pool", type=int, default=2048, help="distinct images kept on each GPU")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"],
                   choices=["fp32", "bf16", "fp16"])  # fmt: skip
    p.add_argument("--ddp-precisions", nargs="*", default=["bf16"], choices=["fp32", "bf16", "fp16"])
    p.add_argument("--budget", type=float, default=280, help="seconds; skip what is left after")
    p.add_argument("--work", help="scratch folder for rendered projects (default: a temp folder)")
    p.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--no-lightning", action="store_true", help=argparse.SUPPRESS)  # run_all.py's
    p.add_argument("--cpu-sharding", action="store_true",
                   help="FSDP against DDP on the CPU (2 processes, gloo): time and memory per rank")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="run everything on the CPU (DDP: 2 processes, gloo) with --quick sizes, "
                        "to check the script without a GPU")  # fmt: skip
    args = p.parse_args(argv)
    if args.cpu_sharding and not (args.quick or args.cpu_dry_run):
        defaults = {"arch": "resnet50", "image_size": 128, "batch_size": 256, "updates": 150,
                    "warmup_updates": 20, "pool": 2048, "repeats": 2}  # fmt: skip
        cpu = {"arch": "resnet18", "image_size": 64, "batch_size": 16, "updates": 14,
               "warmup_updates": 4, "pool": 256, "repeats": 2}  # fmt: skip
        for name, value in cpu.items():  # the GPU defaults, unless given, are too big for a CPU
            if getattr(args, name) == defaults[name]:
                setattr(args, name, value)
    if args.quick or args.cpu_dry_run:
        args.arch, args.image_size, args.batch_size = "small-cnn", 32, 32
        args.updates, args.warmup_updates, args.pool, args.repeats = 12, 4, 64, 1
    if args.updates <= args.warmup_updates:
        p.error("--updates must be larger than --warmup-updates")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker)
        return
    if args.cpu_sharding:
        with common.scratch(args, "bench-sharding-"):
            report = run_sharding(args)
        common.write_report(args.out, report)
        return
    if not args.cpu_dry_run and not cuda_available():
        print("CUDA is not available: the GPU benchmark needs an NVIDIA GPU; nothing was run.")
        return
    with common.scratch(args, "bench-gpu-"):
        report = run_benchmark(args)
    common.write_report(args.out, report)


if __name__ == "__main__":
    main()
