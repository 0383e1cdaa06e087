"""Fails (exit 1) unless every package installed in this environment is in the lock, at the
lock's version; the project itself (installed editable) aside. Usage: python check_lock.py LOCK"""

import re
import sys
from importlib.metadata import distributions


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(lock_file: str) -> int:
    locked = {}
    for line in open(lock_file, encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            locked[canonical(name)] = version.strip()
    problems = []
    for dist in distributions():
        name = canonical(dist.metadata["Name"])
        if name in ("scaffold-train", "pip", "setuptools", "wheel"):
            continue
        if name not in locked:
            problems.append(f"{name} {dist.version} is installed but not in {lock_file}")
        elif locked[name] != dist.version:
            problems.append(f"{name} {dist.version} is installed, {lock_file} has {locked[name]}")
    for problem in sorted(problems):
        print(f"CI: {problem}", file=sys.stderr)
    if problems:
        print("CI: run .ci/refresh-lock to write a lock that holds what the suite installs",
              file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
