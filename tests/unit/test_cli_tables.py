"""The tables `bb` prints for a person (`environment list`, `thread list`, `environment providers`):
every cell whole and in its column, whatever the service's answer holds."""

from __future__ import annotations

from bb_environments.entrypoints.cli_support import print_table


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
