"""The tables `bb` prints for a person (`environment list`, `thread list`, `environment providers`):
every cell whole and in its column, whatever the service's answer holds."""

from __future__ import annotations

from bb_environments.entrypoints.cli.environment import _print_environment
from bb_environments.entrypoints.cli.support import print_table


def test_columns_line_up_and_no_cell_is_cut(capsys):
    long_path = "/work/" + "deep/" * 40 + "workspace"
    print_table(("ID", "STATUS", "PATH"), [["3f2a", "ready", long_path], ["7c", "provisioning", "-"]])

    lines = capsys.readouterr().out.splitlines()
    assert lines == ["ID    STATUS        PATH",
                     f"3f2a  ready         {long_path}",
                     "7c    provisioning  -"]


def test_an_empty_listing_is_its_header(capsys):
    print_table(("THREAD", "STATUS"), [])

    assert capsys.readouterr().out == "THREAD  STATUS\n"


def test_markup_is_shown_as_written_and_control_characters_escaped(capsys):
    print_table(("PATH",), [["/tmp/a[/]b [bold]x"], ["/tmp/\x1b[2Jwiped\nline"]])

    out = capsys.readouterr().out
    assert out.splitlines() == ["PATH", "/tmp/a[/]b [bold]x", "/tmp/\\x1b[2Jwiped\\nline"]
    assert "\x1b" not in out


def test_a_non_ascii_cell_stays_readable_beside_an_escaped_character(capsys):
    print_table(("PATH",), [["/home/josé/a\tb"]])

    assert capsys.readouterr().out.splitlines()[1] == "/home/josé/a\\tb"


def test_show_prints_what_the_service_said_as_plain_text(capsys):
    environment = {
        "id": "3f2a", "status": "error", "statusMessage": "git push: ! [rejected] main (a [/] b)\x1b[2J",
        "providerId": "git-worktree", "hostId": "local", "projectPath": "/p[bold]", "path": "/w/\x1b]0;x\x07",
        "ownsPath": True, "threadIds": ["t1"],
        "hooks": {"setup": {"status": "failed"}, "teardown": {"status": None}},
        "transcript": ["» Running .bb-env-setup.sh", "[red]fake[/red]\x1b[31m"],
    }
    _print_environment(environment)

    out = capsys.readouterr().out
    assert "3f2a  error — git push: ! [rejected] main (a [/] b)\\x1b[2J" in out
    assert "/p[bold]" in out and "/w/\\x1b]0;x\\x07" in out
    assert "│ [red]fake[/red]\\x1b[31m" in out
    assert "\x1b" not in out
