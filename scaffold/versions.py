"""Template versions: which templates rendered a project, and what changed between two of them.

`TEMPLATE_VERSION` is the version of the templates this scaffold ships. `template_history.json`
(committed next to this module) maps every template version ever shipped to the fingerprint of its
`templates/` folder (`scaffold.render.template_fingerprint`), the commit of this repository that
holds it, and the migrations an upgrade to it applies before merging: data, never code.

    {"version": 7, "fingerprint": "...", "commit": "...",
     "migrations": [{"rename_file": {"from": "launch.sh", "to": "scripts/launch.sh"}},
                    {"rename_flag": {"from": "log_every", "to": "log_interval"}}]}

`rename_file` moves a generated file (your edits move with it); `rename_flag` renames a Config
field: the identifier `log_every` and the command-line flag `--log-every` in every generated text
file. tests/test_upgrade.py fails when the templates change without a new entry here, and when an
entry that was committed once changes.

A change to the templates that renders exactly what the version before rendered (moving a feature
into its folder, with every file of `generated_examples/` byte for byte the same) is not a new
version: its fingerprint goes into `same_output`, naming the version it renders,

    "same_output": [{"fingerprint": "...", "version": 24}]

and a project records the version's own fingerprint (`canonical`), so nothing changes for users.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from scaffold.errors import ScaffoldError

TEMPLATE_VERSION = 37
HISTORY_FILE = Path(__file__).resolve().parent / "template_history.json"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FILE_NAME = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")


@dataclass(frozen=True)
class Migration:
    """One declared change: kind is "rename_file" or "rename_flag"; old and new names."""

    version: int  # the template version that introduced it
    kind: str
    old: str
    new: str

    def describe(self) -> str:
        if self.kind == "rename_file":
            return f"renamed file {self.old} -> {self.new}"
        return (
            f"renamed Config field {self.old} -> {self.new} "
            f"(--{self.old.replace('_', '-')} -> --{self.new.replace('_', '-')})"
        )


@dataclass(frozen=True)
class Version:
    version: int
    fingerprint: str
    commit: str
    migrations: tuple[Migration, ...]


def parse_history(data) -> list[Version]:
    """Check and read the history's JSON data (a ValueError says what is wrong)."""
    if not isinstance(data, dict) or not isinstance(data.get("versions"), list):
        raise ValueError('expected {"versions": [...]}')
    versions = []
    for number, entry in enumerate(data["versions"], start=1):
        if not isinstance(entry, dict) or entry.get("version") != number:
            raise ValueError(f"entry {number} must be an object with version {number}")
        fingerprint = entry.get("fingerprint")
        if not isinstance(fingerprint, str) or not re.fullmatch(r"[0-9a-f]{16}", fingerprint):
            raise ValueError(f"version {number}: fingerprint must be 16 hex digits")
        migrations = []
        for item in entry.get("migrations", []):
            if not isinstance(item, dict) or len(item) != 1:
                raise ValueError(f"version {number}: a migration is one {{kind: {{from, to}}}}")
            ((kind, names),) = item.items()
            pattern = {"rename_file": _FILE_NAME, "rename_flag": _IDENTIFIER}.get(kind)
            if pattern is None:
                raise ValueError(f"version {number}: unknown migration {kind!r}")
            if (
                not isinstance(names, dict)
                or set(names) != {"from", "to"}
                or not all(
                    isinstance(v, str) and pattern.fullmatch(v) and ".." not in v.split("/")
                    for v in names.values()
                )
            ):
                raise ValueError(f"version {number}: {kind} needs 'from' and 'to' names")
            migrations.append(Migration(number, kind, names["from"], names["to"]))
        versions.append(
            Version(number, fingerprint, str(entry.get("commit", "")), tuple(migrations))
        )
    if len({v.fingerprint for v in versions}) != len(versions):
        raise ValueError("two versions with the same fingerprint")
    return versions


def parse_same_output(data, versions: list[Version]) -> dict[str, int]:
    """The `same_output` list: {fingerprint of restructured templates: the version they render}."""
    same = {}
    for item in data.get("same_output", []) if isinstance(data, dict) else ():
        if (
            not isinstance(item, dict)
            or set(item) != {"fingerprint", "version"}
            or not isinstance(item["fingerprint"], str)
            or not re.fullmatch(r"[0-9a-f]{16}", item["fingerprint"])
        ):
            raise ValueError('a same_output entry is {"fingerprint": 16 hex digits, "version": N}')
        if item["version"] not in {v.version for v in versions}:
            raise ValueError(f"same_output names version {item['version']!r}, not in the history")
        if item["fingerprint"] in same or item["fingerprint"] in {v.fingerprint for v in versions}:
            raise ValueError(f"fingerprint {item['fingerprint']} is listed twice")
        same[item["fingerprint"]] = item["version"]
    return same


@cache
def _read() -> tuple[tuple[Version, ...], dict[str, int]]:
    try:
        data = json.loads(HISTORY_FILE.read_text(encoding="utf-8"))
        versions = parse_history(data)
        return tuple(versions), parse_same_output(data, versions)
    except (OSError, ValueError) as exc:
        raise ScaffoldError(f"{HISTORY_FILE} is damaged ({exc}): reinstall scaffold") from None


def history() -> tuple[Version, ...]:
    return _read()[0]


def canonical(fingerprint: str) -> str:
    """The fingerprint a project records: the version's own, for templates listed in
    `same_output` (they render that version byte for byte); any other, unchanged."""
    number = _read()[1].get(fingerprint)
    return fingerprint if number is None else history()[number - 1].fingerprint


def describe(version: int | None, fingerprint: str) -> str:
    """ "version 7", or, for templates no release shipped, "unreleased templates <fingerprint>"."""
    return f"version {version}" if version is not None else f"unreleased templates {fingerprint}"


def version_of(fingerprint: str) -> int | None:
    """The template version with this fingerprint, or None (templates never shipped)."""
    for entry in history():
        if entry.fingerprint == fingerprint:
            return entry.version
    return None


def migrations_between(old: int, new: int) -> list[Migration]:
    """The migrations of the versions after `old` up to `new`, in order."""
    return [m for v in history() if old < v.version <= new for m in v.migrations]
