"""The `scaffold` command line. typer lives here and nowhere else.

Heavy modules (copier, black, torch) are imported inside the commands that need them, so
`scaffold --help` answers at once.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from scaffold import __version__
from scaffold.errors import ScaffoldError, UsageError

app = typer.Typer(
    help="Generate explicit, plain-PyTorch training projects; add or remove features later.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
add_app = typer.Typer(help="Add something to an existing project.", no_args_is_help=True)
remove_app = typer.Typer(help="Remove something from an existing project.", no_args_is_help=True)
diff_app = typer.Typer(help="Show what something contributes to a project.", no_args_is_help=True)
app.add_typer(add_app, name="add")
app.add_typer(remove_app, name="remove")
app.add_typer(diff_app, name="diff")


def _one_line(text: str) -> str:
    """Escape newlines and other unprintable characters (from paths, records): one line."""
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
        for c in text
    )


def _fail(exc: ScaffoldError) -> typer.Exit:
    typer.echo(f"error: {_one_line(str(exc))}", err=True)
    return typer.Exit(code=exc.code)


INTERRUPTED = "error: interrupted; no file was changed: run the command again"


def _interrupted() -> typer.Exit:
    # Ctrl-C can only land before the first write: writes hold it until they are complete.
    typer.echo(INTERRUPTED, err=True)
    return typer.Exit(code=130)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"scaffold {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Show the version."
    ),
) -> None:
    """Generate explicit, plain-PyTorch training projects; add or remove features later."""


@app.command()
def new(
    path: Path = typer.Argument(..., help="Directory to create; its name is the project name."),
    task: Optional[str] = typer.Option(
        None, "--task", "-t", help="image-classification (default), text-classification, "
        "token-classification."
    ),
    feature: List[str] = typer.Option(
        [], "--feature", "-f", help="A feature to include; repeat for more (see 'scaffold features')."
    ),
    defaults: bool = typer.Option(
        False, "--defaults", help="Ask nothing; use defaults for everything not given."
    ),
    force: bool = typer.Option(
        False, "--force", help="Write into an existing non-empty directory."
    ),
    description: Optional[str] = typer.Option(
        None, "--description", help="One line describing the project."
    ),
) -> None:
    """Generate a new training project at PATH."""
    from scaffold.catalogue import DEFAULT_TASK
    from scaffold.render import DEFAULT_DESCRIPTION, Answers

    try:
        names = [n.strip() for item in feature for n in item.split(",") if n.strip()]
        asked = task is None and not names and not defaults and sys.stdin.isatty()
        try:
            resolved = Path(path).resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop
            raise UsageError(f"cannot use {path} ({exc}): choose another path") from None
        answers = Answers(
            project_name=resolved.name,
            task=task or DEFAULT_TASK,
            features=names,
            description=description if description is not None else DEFAULT_DESCRIPTION,
        )
        if asked:
            answers = _ask(answers)
        from scaffold.project import new_project

        files = new_project(Path(path), answers, force=force)
    except ScaffoldError as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:
        raise _interrupted() from None
    typer.echo(f"created {path} ({answers.task}; features: {', '.join(answers.features) or 'none'}, "
               f"{len(files)} files)")
    typer.echo(f"next: cd {path} && python train.py")


def _ask(answers):
    """Ask the template's questions on a terminal (task, features)."""
    from scaffold.catalogue import FEATURES, TASKS, resolve_features

    typer.echo("Tasks: " + ", ".join(TASKS))
    task = typer.prompt("Task", default=answers.task)
    typer.echo("Features: " + ", ".join(FEATURES))
    chosen = typer.prompt("Features (comma separated, empty for none)", default="", show_default=False)
    answers.task = task.strip()
    answers.features = resolve_features([n.strip() for n in chosen.split(",") if n.strip()])
    return answers


@app.command()
def features() -> None:
    """List the features: name, description, requires, conflicts."""
    from scaffold.catalogue import FEATURES

    rows = [("name", "description", "requires", "conflicts")]
    for f in FEATURES.values():
        rows.append((f.name, f.help, ", ".join(f.requires) or "-", ", ".join(f.conflicts) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


@app.command()
def tasks() -> None:
    """List the tasks a project can be generated for."""
    from scaffold.catalogue import DEFAULT_TASK, TASKS

    for t in TASKS.values():
        mark = " (default)" if t.name == DEFAULT_TASK else ""
        typer.echo(f"{t.name}{mark}: {t.help}")


_PROJECT = typer.Option(None, "--project", "-p", help="The project directory (default: here).")


@add_app.command("feature")
def add_feature(
    name: str = typer.Argument(..., help="The feature to add."),
    project: Optional[Path] = _PROJECT,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the diff; write nothing."),
    allow_dirty: bool = typer.Option(
        False, "--allow-dirty", help="Run even with uncommitted changes to tracked files."
    ),
) -> None:
    """Merge a feature into this project, keeping your edits (three-way merge)."""
    _change_feature(name, project, dry_run, allow_dirty, add=True)


@remove_app.command("feature")
def remove_feature(
    name: str = typer.Argument(..., help="The feature to remove."),
    project: Optional[Path] = _PROJECT,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the diff; write nothing."),
    allow_dirty: bool = typer.Option(
        False, "--allow-dirty", help="Run even with uncommitted changes to tracked files."
    ),
) -> None:
    """Take a feature out of this project, keeping your edits (three-way merge)."""
    _change_feature(name, project, dry_run, allow_dirty, add=False)


def _change_feature(name, project, dry_run, allow_dirty, add):
    from scaffold.merge import change_feature

    try:
        result = change_feature(
            Path(project or "."), name, add=add, dry_run=dry_run, allow_dirty=allow_dirty,
            echo=typer.echo,
        )
    except ScaffoldError as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:
        raise _interrupted() from None
    if result.conflicts:
        raise typer.Exit(code=1)


@diff_app.command("feature")
def diff_feature(
    name: str = typer.Argument(..., help="The feature to show."),
    project: Optional[Path] = _PROJECT,
    color: Optional[bool] = typer.Option(
        None, "--color/--no-color", help="Colour the diff (default: on a terminal)."
    ),
) -> None:
    """Show the patch that a feature contributes to this project."""
    from scaffold.merge import feature_diff

    try:
        text = feature_diff(Path(project or "."), name)
    except ScaffoldError as exc:
        raise _fail(exc) from None
    _echo_diff(text, color)


def _echo_diff(text: str, color: Optional[bool]) -> None:
    use_color = sys.stdout.isatty() if color is None else color
    for line in text.splitlines():
        if use_color and line.startswith("+") and not line.startswith("+++"):
            line = typer.style(line, fg="green")
        elif use_color and line.startswith("-") and not line.startswith("---"):
            line = typer.style(line, fg="red")
        elif use_color and line.startswith("@@"):
            line = typer.style(line, fg="cyan")
        typer.echo(line)


@app.command()
def status(project: Optional[Path] = _PROJECT) -> None:
    """Show the scaffold version, task, features and which generated files you changed."""
    from scaffold.merge import project_status
    from scaffold.record import load_record
    from scaffold.upgrade import template_status

    try:
        lines = project_status(Path(project or "."))
        lines.insert(2, template_status(load_record(Path(project or "."))))
        for line in lines:
            typer.echo(line)
    except ScaffoldError as exc:
        raise _fail(exc) from None


@app.command()
def upgrade(
    project: Optional[Path] = _PROJECT,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the diff; write nothing."),
    allow_dirty: bool = typer.Option(
        False, "--allow-dirty", help="Run even with uncommitted changes to tracked files."
    ),
) -> None:
    """Merge the installed templates into this project, keeping your edits (three-way merge)."""
    from scaffold.upgrade import upgrade_project

    try:
        result = upgrade_project(
            Path(project or "."), dry_run=dry_run, allow_dirty=allow_dirty, echo=typer.echo
        )
    except ScaffoldError as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:
        raise _interrupted() from None
    if result.change.conflicts:
        raise typer.Exit(code=1)


@app.command()
def check(project: Optional[Path] = _PROJECT) -> None:
    """Exit 0 if the project has the installed templates, 1 if an upgrade is available, 2 if its
    record is damaged or missing. For CI."""
    from scaffold.upgrade import check_project

    try:
        code, lines = check_project(Path(project or "."))
    except ScaffoldError as exc:
        _fail(exc)
        raise typer.Exit(code=2) from None
    for line in lines:
        typer.echo(line)
    raise typer.Exit(code=code)


@diff_app.command("upgrade")
def diff_upgrade(
    project: Optional[Path] = _PROJECT,
    color: Optional[bool] = typer.Option(
        None, "--color/--no-color", help="Colour the diff (default: on a terminal)."
    ),
) -> None:
    """Show the patch 'scaffold upgrade' would apply to this project's pristine files."""
    from scaffold.upgrade import upgrade_diff

    try:
        migrations, text = upgrade_diff(Path(project or "."))
    except ScaffoldError as exc:
        raise _fail(exc) from None
    for line in migrations:
        typer.echo(f"# migration: {line}")
    if not text:
        typer.echo("# no changes: the project has the installed templates", err=True)
    _echo_diff(text, color)


def main() -> None:
    import os

    try:
        app(prog_name="scaffold")
    except KeyboardInterrupt:
        typer.echo(INTERRUPTED, err=True)
        sys.exit(130)
    except Exception as exc:  # a bug: one line for the user, the traceback on request
        if os.environ.get("SCAFFOLD_DEBUG"):
            raise
        typer.echo(
            f"error: internal error ({type(exc).__name__}: {_one_line(str(exc))[:200]}): "
            "please report it; SCAFFOLD_DEBUG=1 shows the traceback",
            err=True,
        )
        sys.exit(1)
