"""The `scaffold` command line. typer lives here and nowhere else.

Every command reports a ScaffoldError as one `error: ...` line through `@reports_errors`. Heavy
modules (copier, black, jinja2, questionary) are imported only where they are used, so
`scaffold --help` answers at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperArgument, TyperCommand

from scaffold import __version__, layers, prompts
from scaffold.answers import DEFAULT_DESCRIPTION, Answers, check_description, check_name
from scaffold.catalogue import DEFAULT_TASK, FEATURES, TASKS, closest, did_you_mean
from scaffold.errors import ScaffoldError, UsageError
from scaffold.merge import change_feature, feature_diff, find_project, project_status
from scaffold.project import new_project
from scaffold.upgrade import check_project, upgrade_diff, upgrade_project

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


class PlainHelp(TyperCommand):
    """Help that names arguments as the README does: `scaffold new [OPTIONS] PATH`, and a `PATH`
    row without typer's `{braces}` and `<type>`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperArgument):
                param.display_type_rich = lambda ctx: None

    def collect_usage_pieces(self, ctx):
        return [piece.strip("{}") for piece in super().collect_usage_pieces(ctx)]


INTERRUPTED = "error: interrupted; no file was changed: run the command again"


def _one_line(text: str) -> str:
    """Escape newlines and other unprintable characters (from paths, records): one line."""
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
        for c in text
    )


def reports_errors(command):
    """A ScaffoldError becomes one `error:` line and its exit code; Ctrl-C exits 130.

    Ctrl-C can only land before the first write: writes hold it until they are complete.
    """

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except ScaffoldError as exc:
            typer.echo(f"error: {_one_line(str(exc))}", err=True)
            raise typer.Exit(code=exc.code) from None
        except KeyboardInterrupt:
            typer.echo(INTERRUPTED, err=True)
            raise typer.Exit(code=130) from None

    return run


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"scaffold {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="Show the version."
        ),
    ] = False,
) -> None:
    """Generate explicit, plain-PyTorch training projects; add or remove features later."""


def _note(line: str) -> None:
    """A note from a read-only command (waiting for the project): on stderr, off its output."""
    typer.echo(line, err=True)


def _on_terminal() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


@app.command(cls=PlainHelp)
@reports_errors
def new(
    path: Annotated[
        Path,
        typer.Argument(metavar="PATH", help="Directory to create; its name is the project name."),
    ],
    task: Annotated[
        str | None,
        typer.Option(
            "--task",
            "-t",
            metavar="TASK",
            help=f"{DEFAULT_TASK} (default), " + ", ".join(t for t in TASKS if t != DEFAULT_TASK),
        ),
    ] = None,
    feature: Annotated[
        list[str] | None,
        typer.Option(
            "--feature",
            "-f",
            metavar="NAME",
            help="A feature to include; repeat for more, or NAME,NAME (see 'scaffold features').",
        ),
    ] = None,
    defaults: Annotated[
        bool, typer.Option("--defaults", help="Ask nothing; use defaults for everything not given.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Write into an existing non-empty directory.")
    ] = False,
    description: Annotated[
        str | None,
        typer.Option("--description", metavar="TEXT", help="One line describing the project."),
    ] = None,
    layer: Annotated[
        list[str] | None,
        typer.Option(
            "--layer",
            "-l",
            metavar="LAYER",
            help="A team layer: a directory, or a git URL#REF; repeat for more "
            f"(default: ${layers.ENV_VAR}, else 'layers' in {layers.config_file()}).",
        ),
    ] = None,
    no_layer: Annotated[
        bool, typer.Option("--no-layer", help="Use no layer, not even the team default.")
    ] = False,
) -> None:
    """Generate a new training project at PATH.

    On a terminal without --task/--feature it asks for both; a mistyped name is asked again.
    """
    names = [n.strip() for item in feature or () for n in item.split(",") if n.strip()]
    interactive = _on_terminal() and not defaults
    try:
        resolved = Path(path).resolve()
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            os.stat(Path(path).parent)  # a loop: Python 3.13's resolve() no longer raises
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise UsageError(f"cannot use {path} ({exc}): choose another path") from None
    check_name(resolved.name)  # before a layer is fetched
    sources = [] if no_layer else (layer or layers.default_sources())
    loaded = [layers.load(layers.normalise(source)) for source in sources]
    layer_description = next((x.description for x in reversed(loaded) if x.description), None)
    answers = Answers(
        project_name=resolved.name,
        task=task or DEFAULT_TASK,
        features=tuple(names),
        description=description
        if description is not None
        else (layer_description or DEFAULT_DESCRIPTION),
        layers=tuple(x.pin for x in loaded),
    )
    if interactive:
        check_name(answers.project_name)  # before any question: answers are never asked in vain
        check_description(answers.description)
        answers = _ask(answers, ask_all=task is None and not names)
    answers = answers.validated()
    files = new_project(Path(path), answers, force=force)
    typer.echo(
        f"created {path} ({answers.task}; features: {', '.join(answers.features) or 'none'}, "
        f"{len(files)} files)"
    )
    for pin in answers.layers:
        typer.echo(f"layer: {pin.name} {pin.version} ({pin.source})")
    typer.echo(f"next: cd {path} && python train.py")


def _ask(answers: Answers, ask_all: bool) -> Answers:
    """Ask for the task and features on a terminal: all of them, or only the mistyped ones."""
    task = answers.task
    if ask_all or task not in TASKS:
        note = "" if task in TASKS else f"unknown task {task!r}{did_you_mean(task, TASKS)}"
        task = prompts.ask_task(closest(task, TASKS) or task, note)
    catalogue = answers.catalogue()
    features, notes = prompts.split_known(list(answers.features), catalogue)
    if ask_all or notes or prompts.feature_problem(features, catalogue):
        features = prompts.ask_features(features, "; ".join(notes), catalogue)
    return dataclasses.replace(answers, task=task, features=tuple(features))


LayerOption = Annotated[
    list[str] | None,
    typer.Option(
        "--layer", "-l", metavar="LAYER", help="Also a layer's (default: the team default)."
    ),
]


@app.command(cls=PlainHelp)
@reports_errors
def features(layer: LayerOption = None) -> None:
    """List the features: name, description, requires, conflicts (and a layer's, marked)."""
    sources = layer or layers.default_sources()
    catalogue = layers.catalogue([layers.load(layers.normalise(s)) for s in sources])
    rows = [("name", "description", "requires", "conflicts")]
    for f in catalogue.values() if sources else FEATURES.values():
        name = f"{f.name} ({f.layer})" if f.layer else f.name
        rows.append((name, f.help, ", ".join(f.requires) or "-", ", ".join(f.conflicts) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


@app.command(cls=PlainHelp)
def tasks() -> None:
    """List the tasks a project can be generated for."""
    for t in TASKS.values():
        mark = " (default)" if t.name == DEFAULT_TASK else ""
        typer.echo(f"{t.name}{mark}: {t.help}")


@app.command("layers", cls=PlainHelp)
@reports_errors
def list_layers() -> None:
    """Show the team default layer and the git layers in scaffold's cache."""
    sources = layers.default_sources()
    where = f"${layers.ENV_VAR}" if os.environ.get(layers.ENV_VAR) is not None else None
    typer.echo(
        f"default: {', '.join(sources)} (from {where or layers.config_file()})"
        if sources
        else f"default: none (set ${layers.ENV_VAR} or 'layers' in {layers.config_file()})"
    )
    for source in sources:
        typer.echo(f"  {layers.load(layers.normalise(source)).label()}")
    cached = layers.cached()
    typer.echo("cached git layers:" if cached else "cached git layers: none")
    for line in cached:
        typer.echo(f"  {line}")


def _project_dir(project: Path | None) -> Path:
    """--project DIR, else the generated project this folder is in (searched upwards)."""
    return Path(project) if project is not None else find_project(Path("."))


# Options shared by the project commands (add, remove, diff, status).
Project = Annotated[
    Path | None,
    typer.Option("--project", "-p", metavar="DIR", help="The project directory (default: here)."),
]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the diff; write nothing.")]
AllowDirty = Annotated[
    bool,
    typer.Option("--allow-dirty", help="Run even with uncommitted changes to tracked files."),
]


Wait = Annotated[
    float | None,
    typer.Option(
        "--wait",
        metavar="SECONDS",
        help="How long to wait while another scaffold command holds the project "
        "(default: 10 s to change it, 60 s to read it).",
    ),
]


FeatureToAdd = Annotated[str, typer.Argument(metavar="NAME", help="The feature to add.")]
FeatureToRemove = Annotated[str, typer.Argument(metavar="NAME", help="The feature to remove.")]
FeatureToShow = Annotated[str, typer.Argument(metavar="NAME", help="The feature to show.")]


@add_app.command("feature", cls=PlainHelp)
@reports_errors
def add_feature(
    name: FeatureToAdd,
    project: Project = None,
    dry_run: DryRun = False,
    allow_dirty: AllowDirty = False,
    wait: Wait = None,
) -> None:
    """Merge a feature into this project, keeping your edits (three-way merge)."""
    _change_feature(name, project, dry_run, allow_dirty, wait, add=True)


@remove_app.command("feature", cls=PlainHelp)
@reports_errors
def remove_feature(
    name: FeatureToRemove,
    project: Project = None,
    dry_run: DryRun = False,
    allow_dirty: AllowDirty = False,
    wait: Wait = None,
) -> None:
    """Take a feature out of this project, keeping your edits (three-way merge)."""
    _change_feature(name, project, dry_run, allow_dirty, wait, add=False)


def _change_feature(name, project, dry_run, allow_dirty, wait, add):
    result = change_feature(
        _project_dir(project),
        name,
        add=add,
        dry_run=dry_run,
        allow_dirty=allow_dirty,
        echo=typer.echo,
        wait=wait,
    )
    if result.exit_code:
        raise typer.Exit(code=result.exit_code)


@diff_app.command("feature", cls=PlainHelp)
@reports_errors
def diff_feature(
    name: FeatureToShow,
    project: Project = None,
    color: Annotated[
        bool | None,
        typer.Option("--color/--no-color", help="Colour the diff (default: on a terminal)."),
    ] = None,
    wait: Wait = None,
) -> None:
    """Show the patch that a feature contributes to this project."""
    text = feature_diff(_project_dir(project), name, wait=wait, echo=_note)
    _echo_diff(text, color)


def _echo_diff(text: str, color: bool | None) -> None:
    use_color = sys.stdout.isatty() if color is None else color
    for line in text.splitlines():
        if use_color and line.startswith("+") and not line.startswith("+++"):
            line = typer.style(line, fg="green")
        elif use_color and line.startswith("-") and not line.startswith("---"):
            line = typer.style(line, fg="red")
        elif use_color and line.startswith("@@"):
            line = typer.style(line, fg="cyan")
        typer.echo(line)


@app.command(cls=PlainHelp)
@reports_errors
def status(project: Project = None, wait: Wait = None) -> None:
    """Show the scaffold version, task, features and which generated files you changed."""
    for line in project_status(_project_dir(project), wait=wait, echo=_note):
        typer.echo(line)


@app.command(cls=PlainHelp)
@reports_errors
def upgrade(
    project: Project = None,
    dry_run: DryRun = False,
    allow_dirty: AllowDirty = False,
    wait: Wait = None,
) -> None:
    """Merge the installed templates into this project, keeping your edits (three-way merge)."""
    result = upgrade_project(
        _project_dir(project), dry_run=dry_run, allow_dirty=allow_dirty, echo=typer.echo, wait=wait
    )
    if result.change.exit_code:
        raise typer.Exit(code=result.change.exit_code)


@app.command(cls=PlainHelp)
def check(project: Project = None, wait: Wait = None) -> None:
    """Exit 0 if the project has the installed templates, 1 if an upgrade is available, 2 if its
    record is missing or damaged. For CI."""
    try:
        code, lines = check_project(_project_dir(project), wait=wait, echo=_note)
    except ScaffoldError as exc:  # no project, or one this scaffold cannot judge: exit 2
        typer.echo(f"error: {_one_line(str(exc))}", err=True)
        raise typer.Exit(code=2) from None
    except KeyboardInterrupt:
        typer.echo(INTERRUPTED, err=True)
        raise typer.Exit(code=130) from None
    for line in lines:
        typer.echo(line)
    raise typer.Exit(code=code)


@diff_app.command("upgrade", cls=PlainHelp)
@reports_errors
def diff_upgrade(
    project: Project = None,
    color: Annotated[
        bool | None,
        typer.Option("--color/--no-color", help="Colour the diff (default: on a terminal)."),
    ] = None,
    wait: Wait = None,
) -> None:
    """Show the patch 'scaffold upgrade' would apply to this project's pristine files."""
    migrations, text = upgrade_diff(_project_dir(project), wait=wait, echo=_note)
    for line in migrations:
        typer.echo(f"# migration: {line}")
    if not text:
        _note("# no changes: the project has the installed templates")
    _echo_diff(text, color)


def main() -> None:
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
