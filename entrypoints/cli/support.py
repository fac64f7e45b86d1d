"""What every `bb` command shares: output consoles, --json, errors as one sentence and an exit code,
and the ids it checks before it sends them."""

from __future__ import annotations

import functools
import importlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TextIO

import click

from bb_environments.bus.wire.service_errors import ServiceError
from bb_environments.domain.ids import (
    HOST_ID_PATTERN,
    HOST_ID_RULE,
    ID_PATTERN,
    ID_RULE,
    is_environment_id_prefix,
    quoted,
)
from bb_environments.domain.request_errors import EXIT_CODES, one_line
from bb_environments.entrypoints.config import ConfigError

if TYPE_CHECKING:
    import asyncio

    from rich.console import Console


class _LazyConsole:
    """A rich Console, made when something is first printed with it: importing rich is a good part
    of `bb`'s start-up, and a command that prints JSON uses none of it."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def print(self, *objects: Any, **options: Any) -> None:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        self._console.print(*objects, **options)


stdout = _LazyConsole(highlight=False, soft_wrap=True)
stderr = _LazyConsole(stderr=True, highlight=False, soft_wrap=True)


TABLE_WIDTH_OFF_A_TERMINAL = 80
"""The width a table fits when stdout is no terminal (a pipe, a file): what a terminal opens with."""


def print_table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], shrink: Mapping[str, Literal["start", "end"]] | None = None
) -> None:
    """A listing for a person, as plain columns: each as wide as its widest cell, two spaces apart,
    fitted to the terminal by cutting the columns `shrink` names (keeping the start or the end of
    their cells, with an ellipsis where the rest was), widest first: one long path or refusal must
    not push every row past the screen. Other cells are never cut: ids are copied from here.

    Not rich's Table: importing rich and laying out a hundred rows took longer than the rest of
    `bb environment list`, and it reads every cell as markup, so that a path holding `[/]` ended
    the command. A cell with characters that are not printable (the service's answer is untrusted)
    is shown escaped rather than sent to the terminal."""
    lines = [list(headers), *([one_line(cell) for cell in row] for row in rows)]
    widths = [max(len(line[column]) for line in lines) for column in range(len(headers))]
    kept = {headers.index(header): end for header, end in (shrink or {}).items()}
    excess = sum(widths) + 2 * (len(widths) - 1) - _table_width()
    while excess > 0:
        # A header is never cut.
        widest = max((c for c in kept if widths[c] > len(headers[c])), key=lambda c: widths[c], default=None)
        if widest is None:
            break
        widths[widest] -= 1
        excess -= 1
    for line in lines[1:]:
        for column, end in kept.items():
            line[column] = _shortened(line[column], widths[column], end)
    print("\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines))


def _table_width() -> int:
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else TABLE_WIDTH_OFF_A_TERMINAL


def fitted(prefix: str, text: str, indent: int | None = None, stream: TextIO | None = None) -> str:
    """`prefix` and `text` as lines that fit the terminal `stream` (stdout unless given) is: the
    text wrapped at its spaces, or within a word longer than a line, each further line indented
    under the first's text (or by `indent`), so that a long hook's line reads as a paragraph
    rather than the terminal's fold. Off a terminal (a pipe, a file) the line stays whole, for
    grep to find."""
    import textwrap  # only the commands that print lines of text import it

    text = one_line(text)
    width = terminal_width(stream or sys.stdout)
    if width is None or len(prefix) + len(text) <= width:
        return prefix + text
    return "\n".join(
        textwrap.wrap(
            text,
            max(width, len(prefix) + 20),
            initial_indent=prefix,
            subsequent_indent=" " * (len(prefix) if indent is None else indent),
            break_on_hyphens=False,
        )
    )


def terminal_width(stream: TextIO) -> int | None:
    """How wide the terminal `stream` prints on is, None when it is no terminal."""
    return shutil.get_terminal_size().columns if stream.isatty() else None


def clock(instant: str, today: datetime | None = None) -> str:
    """An ISO-8601 instant as a person reads it in every listing of times (`history`, `logs`,
    `events tail`): the local time to the millisecond, `14:03:07.215`, with the date before it
    when it is not today (`2026-11-30 14:03:07.215`). `--json` keeps the instant as it came."""
    try:
        local = datetime.fromisoformat(instant).astimezone()
    except ValueError:  # not an instant (an event is untrusted): shown as it came
        return one_line(instant)
    shown = local.strftime("%H:%M:%S.%f")[:-3]
    if local.date() != (today or datetime.now().astimezone()).date():
        return f"{local:%Y-%m-%d} {shown}"
    return shown


def duration(milliseconds: int | None) -> str:
    """How long something took as a person reads it: `70 ms`, `1.2 s`, `3 min 4 s`; `-` when unknown."""
    if milliseconds is None:
        return "-"
    if milliseconds < 1000:
        return f"{milliseconds} ms"
    if milliseconds < 60_000:
        return f"{milliseconds / 1000:.1f} s"
    minutes, seconds = divmod(milliseconds // 1000, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    return f"{minutes // 60} h {minutes % 60} min"


def port_range(ports: dict[str, int] | None) -> str | None:
    """`first-last`, as the hooks' BB_PORTS has it."""
    return f"{ports['first']}-{ports['first'] + ports['count'] - 1}" if ports else None


def _shortened(cell: str, width: int, end: Literal["start", "end"]) -> str:
    if len(cell) <= width:
        return cell
    return cell[: width - 1] + "…" if end == "start" else "…" + cell[len(cell) - width + 1 :]


class Failure(Exception):
    def __init__(self, code: str, message: str, document: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.document = code, message, document


def run_command(body: Callable[..., Coroutine[Any, Any, Any] | None]) -> Callable[..., None]:
    """Run a command, on an event loop if it is async (a command that only sends requests is not:
    see connection.requests_to); turn its failures into a one-sentence error and the
    SPEC's exit code."""

    @functools.wraps(body)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        as_json = kwargs.get("as_json", False)
        try:
            running = body(*args, **kwargs)
            if running is not None:
                with event_loop() as loop:
                    loop.run(running)
        except (Failure, ServiceError) as failure:
            fail(failure.code, failure.message, as_json, getattr(failure, "document", None))
        except ConfigError as bad:
            fail("invalid_input", str(bad), as_json)
        except BrokenPipeError:
            raise  # the reader of stdout left (`| head`): not the bus; run_cli ends quietly
        except Exception as error:
            # Imported here: it loads nats-py, which a command imports only once it knows the URL.
            from bb_environments.bus.health import describe, unavailable

            # Still one sentence: the bus went away under the command, or (a bug) anything else;
            # the traceback is for whoever asks for it.
            if unavailable(error):
                fail("unreachable", f"lost the connection to the bb service ({describe(error)})", as_json)
            if os.environ.get("BB_LOG_LEVEL", "").upper() == "DEBUG":
                import traceback

                traceback.print_exc()
            fail(
                "failed",
                f"the command failed unexpectedly ({describe(error)}; BB_LOG_LEVEL=DEBUG shows where)",
                as_json,
            )

    return wrapper


def event_loop() -> asyncio.Runner:
    """What asyncio.run runs on, imported only by a command that needs it, with the asyncio logger
    quieted: it warns on stderr when a TLS server closes a refused connection, and the command
    says why itself."""
    import asyncio
    import logging

    logging.getLogger("asyncio").setLevel(logging.ERROR)
    return asyncio.Runner()


def run_cli(group: click.Group, args: list[str]) -> None:
    """Run the command line; click's own usage errors (an unknown option, a missing argument, a bad
    value) end like every other error: one sentence, exit 2, and the error document with --json."""
    try:
        exit_code = group.main(args, prog_name="bb", standalone_mode=False)
        sys.stdout.flush()  # here, where a reader that left is handled below, not at exit
    except click.exceptions.NoArgsIsHelpError as asked_for_help:  # `bb environment` alone: the help is the answer
        asked_for_help.show()
        sys.exit(asked_for_help.exit_code)
    except click.UsageError as error:
        usage = f" (see '{error.ctx.command_path} --help')" if error.ctx is not None else ""
        fail(
            "invalid_input",
            error.format_message().removesuffix(".") + usage,
            _json_asked(args, error.ctx.command if error.ctx is not None else None),
        )
    except click.ClickException as error:
        fail("failed", error.format_message(), _json_asked(args, None))
    except click.Abort:
        fail("failed", "aborted", _json_asked(args, None))
    except BrokenPipeError:
        # The reader left (`bb events export | head`): end quietly, as click does, not with a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    sys.exit(exit_code if isinstance(exit_code, int) else 0)


def _json_asked(args: list[str], command: click.Command | None) -> bool:
    """Whether the words ask for --json, where parsing stopped before it could say: `--json` as
    the value of an option (`--prompt --json`) is not the flag, and `--` as one (`--prompt --`)
    ends nothing."""
    takes_value = {
        name
        for param in (command.params if command is not None else ())
        if isinstance(param, click.Option) and not param.is_flag and not param.count
        for name in param.opts
    }
    follows_option = False
    for word in args:
        if word == "--" and not follows_option:  # what follows is arguments, whatever it looks like
            return False
        if word == "--json" and not follows_option:
            return True
        follows_option = word in takes_value and not follows_option
    return False


def fail(code: str, message: str, as_json: bool, document: dict[str, Any] | None = None) -> None:
    message = one_line(message)  # click quotes a stray argument as it was given, line breaks and all
    stderr.print(f"bb: {message}", markup=False)
    if as_json:
        print(json.dumps(document if document is not None else {"error": {"code": code, "message": message}}))
    sys.exit(EXIT_CODES.get(code, 1))


def emit(document: Any, as_json: bool, human: Callable[[Any], None]) -> None:
    if as_json:
        print(json.dumps(document))
    else:
        human(document)


def print_accepted(doc: dict[str, Any]) -> None:
    """An answer that says the service took a request: the environment and its status."""
    stdout.print(f"{doc.get('environmentId') or '-'}  {doc.get('status') or ''}", markup=False)


def environment_id_argument(value: str) -> str:
    """An environment id, or the start of one, which the service resolves (ambiguous: exit 2)."""
    from uuid import UUID  # here: only commands that take an id pay for the module

    if is_environment_id_prefix(value):
        return value
    try:
        return str(UUID(value))
    except ValueError:
        raise Failure("invalid_input", f"environment id {quoted(value)} is not a valid id (expected a UUID)") from None


def id_argument(what: str, value: str) -> str:
    """A thread id, checked as the service checks it: a malformed one is the caller's to fix (exit
    2) whether the service is up or not, as a malformed environment id is."""
    if not re.match(ID_PATTERN, value):
        raise Failure("invalid_input", f"{what} {quoted(value)} is not allowed: use {ID_RULE}")
    return value


def host_id_argument(value: str) -> str:
    """A host id, checked as `id_argument` checks a thread id."""
    if not re.match(HOST_ID_PATTERN, value):
        raise Failure("invalid_input", f"host id {quoted(value)} is not allowed: use {HOST_ID_RULE}")
    return value


class LazyGroup(click.Group):
    """A group whose named sub-commands are imported only when one of them is run or listed
    (click's LazyGroup pattern): no other command pays for loading them."""

    def __init__(self, *args: Any, lazy_subcommands: dict[str, str], **kwargs: Any) -> None:
        """`lazy_subcommands`: command name -> "module:attribute" of the click command."""
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = lazy_subcommands

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy_subcommands])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy_subcommands:
            return super().get_command(ctx, cmd_name)
        module, attribute = self.lazy_subcommands[cmd_name].split(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.lazy_subcommands[cmd_name]} is not a click command")
        return command


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
json_lines_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON lines on stdout: one JSON document per line, as it comes."
)
"""--json of a command that streams: a document per line, each printed as soon as it is read."""
wait_json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON document on stdout (with --wait, once the wait ends; the "
    "transcript streams to stderr as plain lines meanwhile).",
)
"""--json of a command that can --wait: still one document, not JSON lines."""


class Seconds(click.FloatRange):
    """A duration in seconds, more than 0 and at most `longest`; click's FloatRange alone lets 'nan' through."""

    name = "number of seconds"

    def __init__(self, longest: float) -> None:
        super().__init__(min=0, min_open=True, max=longest)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if seconds != seconds:  # NaN is the one float unequal to itself
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds
