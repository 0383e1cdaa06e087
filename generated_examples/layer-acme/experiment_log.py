"""[acme:jsonl-log] The ACME experiment log: one JSON object per line in
<out-dir>/experiment.jsonl.

Every object has "event" ("start", "update", "validation" or "end") and the numbers
of that moment; the "start" object holds the whole config. A resumed run appends to
the same file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


def append(path: Path, event: str, **fields) -> None:
    """Append one event; the file is opened and closed each time, so a killed run loses
    nothing already written."""
    record = {"event": event, "time": round(time.time(), 3), **fields}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def read(path: Path) -> list[dict]:
    """Every event of the log, oldest first."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
