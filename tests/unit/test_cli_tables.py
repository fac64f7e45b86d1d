"""The tables `bb` prints for a person (`environment list`, `thread list`, `environment providers`):
every cell in its column, whatever the service's answer holds, and the table within the screen."""

from __future__ import annotations

from bb_environments.entrypoints.cli.environment import _print_environment, _threads_cell
from bb_environments.entrypoints.cli.support import print_table


def test_columns_line_up_and_a_long_path_shrinks_to_fit_80_columns_off_a_terminal(capsys):
    long_path = "/work/" + "deep/" * 40 + "workspace"
    print_table(
        ("ID", "STATUS", "PATH"), [["3f2a", "ready", long_path], ["7c", "provisioning", "-"]], shrink={"PATH": "end"}
    )

    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "ID    STATUS        PATH",
        "3f2a  ready         …" + long_path[-(80 - 21) :],
        "7c    provisioning  -",
    ]
    assert max(map(len, lines)) == 80


def test_one_long_value_does_not_widen_the_other_rows_and_ids_are_never_cut(capsys):
    long_id = "t-" + "x" * 100
    refusal = "placement refused: " + "the reason, at length; " * 10
    print_table(
        ("THREAD", "REFUSAL", "PATH"),
        [[long_id, refusal, "/w/a"], ["t2", "-", "/w/b"]],
        shrink={"REFUSAL": "start", "PATH": "end"},
    )

    first, second = capsys.readouterr().out.splitlines()[1:]
    assert first.startswith(long_id + "  ")  # whole, though it alone is wider than the screen
    assert first.split()[1] == refusal[:6] + "…" and first.split()[2] == "/w/a"
    assert second.split() == ["t2", "-", "/w/b"]


def test_an_environment_many_threads_share_names_the_first_and_counts_the_rest():
    assert _threads_cell(["t1", "t2", "t3"]) == "t1 +2"
    assert _threads_cell(["t-f33f6c8947714ed6"]) == "t-f33f6c8947714ed6"
    assert _threads_cell([]) == "-"


def test_a_table_that_fits_is_left_whole(capsys):
    print_table(("ID", "PATH"), [["3f2a", "/w/" + "p" * 60]], shrink={"PATH": "end"})

    assert capsys.readouterr().out.splitlines()[1] == "3f2a  /w/" + "p" * 60


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
        "id": "3f2a",
        "status": "error",
        "statusMessage": "git push: ! [rejected] main (a [/] b)\x1b[2J",
        "providerId": "git-worktree",
        "hostId": "local",
        "projectPath": "/p[bold]",
        "path": "/w/\x1b]0;x\x07",
        "ownsPath": True,
        "threadIds": ["t1"],
        "hooks": {"setup": {"status": "failed"}, "teardown": {"status": None}},
        "transcript": ["» Running .bb-env-setup.sh", "[red]fake[/red]\x1b[31m"],
    }
    _print_environment(environment)

    out = capsys.readouterr().out
    assert "3f2a  error — git push: ! [rejected] main (a [/] b)\\x1b[2J" in out
    assert "/p[bold]" in out and "/w/\\x1b]0;x\\x07" in out
    assert "│ [red]fake[/red]\\x1b[31m" in out
    assert "\x1b" not in out


def test_show_prints_nothing_as_a_dash_and_a_flag_as_yes_or_no(capsys):
    environment = {
        "id": "3f2a",
        "status": "preparing",
        "providerId": "personal-workspace",
        "hostId": "local",
        "projectPath": None,
        "path": None,
        "ownsPath": True,
        "threadIds": [],
        "hooks": {"setup": {"status": None}, "teardown": {"status": None}},
    }
    _print_environment(environment)
    _print_environment({**environment, "ownsPath": False})

    out = capsys.readouterr().out
    assert "None" not in out and "True" not in out and "False" not in out
    fields = [
        line.split(None, 1) if not line.startswith("  owns") else ["owns path", line.split()[-1]]
        for line in out.splitlines()
        if line.startswith("  ")
    ]
    assert ["project", "-"] in fields and ["path", "-"] in fields and ["threads", "-"] in fields
    assert ["setup", "-"] in fields
    assert ["owns path", "yes"] in fields and ["owns path", "no"] in fields
