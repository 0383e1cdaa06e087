"""Run several generated projects' `train.main(argv)` in ONE Python process.

`import torch` and the first optimizer cost about 5 s per process here, so tests batch their
training runs through this script instead of starting `python train.py` for each one. Each job
imports the project's own train.py/data.py/model.py fresh (the module cache is purged between
jobs), so what runs is exactly the generated code.

    python tests/runner.py JOBS.json RESULTS.json

JOBS.json: [{"project": DIR, "args": [...], "cwd": DIR?}, ...]
RESULTS.json: [{"ok": bool, "exit_code": int|null, "metrics": {...}, "error": str}, ...]
"""

import contextlib
import io
import json
import os
import sys
import traceback

PROJECT_MODULES = ("train", "data", "model", "callbacks")


def run_job(job: dict) -> dict:
    project = os.path.abspath(job["project"])
    for name in PROJECT_MODULES:
        sys.modules.pop(name, None)
    old_cwd, old_path = os.getcwd(), list(sys.path)
    os.chdir(job.get("cwd", project))
    sys.path.insert(0, project)
    out = io.StringIO()
    result = {"ok": False, "exit_code": None, "metrics": {}, "error": ""}
    try:
        with contextlib.redirect_stdout(out):
            import train

            if job.get("sync_counter"):  # tests/test_no_sync.py
                sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
                from sync_counter import SyncCounter

                with SyncCounter() as counter:
                    metrics = train.main(job["args"])
                result["syncs"] = counter.intervals
            else:
                metrics = train.main(job["args"])
        result.update(ok=True, metrics={k: float(v) for k, v in (metrics or {}).items()})
    except SystemExit as exc:
        result["exit_code"] = exc.code if isinstance(exc.code, int) else 1
        result["error"] = "" if isinstance(exc.code, int) else str(exc.code)
    except BaseException:
        result["error"] = traceback.format_exc()
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path
    result["stdout"] = out.getvalue()[-4000:]
    return result


def main() -> None:
    jobs_path, results_path = sys.argv[1], sys.argv[2]
    with open(jobs_path) as f:
        jobs = json.load(f)
    results = [run_job(job) for job in jobs]
    with open(results_path, "w") as f:
        json.dump(results, f)
    sys.stdout.flush()
    os._exit(0)  # skip the slow interpreter teardown after torch


if __name__ == "__main__":
    main()
