"""`bb doctor`: what every host holds that the log does not record, and what the log records that
a host no longer holds (SPEC §8.2); with `--fix`, both put right."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from bb_environments.bus.wire.api_messages import Examine
from bb_environments.entrypoints.cli.connection import call
from bb_environments.entrypoints.cli.support import json_option, print_table, run_command, stderr, stdout
from bb_environments.entrypoints.config import Settings


@click.command("doctor")
@click.option(
    "--fix",
    is_flag=True,
    help="Remove the orphans (their work saved first under refs/bb/saved/) and "
    "put each environment whose workspace is gone in error, for `bb environment retry`.",
)
@json_option
@click.pass_obj
@run_command
def doctor(settings: Settings, fix: bool, as_json: bool) -> None:
    """Compare the log with what exists on every host: orphans and missing workspaces.

    Exit 0 when nothing is found (with --fix: when everything found was fixed), 1 otherwise."""
    report = call(settings, "doctor", "run", Examine(fix=fix), changes=fix)
    orphans, missing = report["orphans"], report["missing"]
    failures = [o["failure"] for o in orphans if o.get("failure")]
    if as_json:
        print(
            json.dumps(
                {
                    "orphans": [{"hostId": o["hostId"], "path": o["path"], "kind": o["kind"]} for o in orphans],
                    "missing": [
                        {"environmentId": m["environmentId"], "hostId": m["hostId"], "path": m["path"]} for m in missing
                    ],
                }
            )
        )
    else:
        _print_human(orphans, missing, fix)
    for failure in failures:
        stderr.print(f"bb: {failure}", markup=False)
    if failures or (not fix and (orphans or missing)):
        sys.exit(1)


def _fixed(orphan: dict[str, Any]) -> str:
    """What the fix did with its work: where it was saved, nothing to save, or kept (stderr says why)."""
    if orphan.get("failure"):
        return "kept"
    return orphan.get("savedRef") or "-"


def _print_human(orphans: list[dict[str, Any]], missing: list[dict[str, Any]], fix: bool) -> None:
    if not orphans and not missing:
        stdout.print("nothing found", markup=False)
        return
    if orphans:
        stdout.print("orphans, each removed unless kept:" if fix else "orphans:", markup=False)
        print_table(
            ["HOST", "KIND", "PATH", "SAVED"] if fix else ["HOST", "KIND", "PATH"],
            [[o["hostId"], o["kind"], o["path"], *([_fixed(o)] if fix else [])] for o in orphans],
        )
    if missing:
        if orphans:
            print()
        stdout.print(
            "missing workspaces, now in error (retry creates them):" if fix else "missing workspaces:", markup=False
        )
        print_table(["ENVIRONMENT", "HOST", "PATH"], [[m["environmentId"], m["hostId"], m["path"]] for m in missing])
