"""The console's HTML, rendered on the server: the pages' shells, and the parts of them (fragments,
by element id) that the live feeds send again whenever what they show changed. Every text that
comes from the service (a path, a hook's status message, a provider's id) is escaped here."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import quote

from bb_environments.domain.request_errors import one_line
from bb_environments.entrypoints.cli.support import clock, duration, port_range

Parts = dict[str, str]
"""HTML fragments by the id of the element each fills."""

HOOK_RUNS = {
    "setup_started": ("setup", ("setup_succeeded", "setup_failed")),
    "teardown_started": ("teardown", ("teardown_finished",)),
}
"""The events that start a hook's run, with the hook's name and the events that end it."""

UNDER_WAY = ("creating", "provisioning", "removing")
ENVIRONMENT_COLUMNS = ("Environment", "Status", "Provider", "Host", "Project", "Threads", "Age", "Ports", "Disk")


def page(title: str, live: str, body: str, problem: str = "") -> str:
    """A whole page: its parts update from the server-sent events at `live`; `problem` (HTML) says
    why what it shows may not be current."""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · bb console</title>
<link rel="stylesheet" href="/static/console.css">
<script src="/static/console.js" defer></script>
</head>
<body data-live="{escape(live)}">
<header><a class="home" href="/">bb console</a><span id="live-state" class="connecting">connecting</span></header>
<p id="problem" role="alert">{problem}</p>
<main>
{body}
</main>
</body>
</html>
"""


def fleet_page(parts: Parts) -> str:
    filters = "".join(
        f'<label>{label} <select id="filter-{key}" data-filter="{key}"><option value="">all</option></select></label>'
        for key, label in (("status", "Status"), ("host", "Host"), ("project", "Project"))
    )
    head = "".join(f"<th>{column}</th>" for column in ENVIRONMENT_COLUMNS)
    body = f"""<section>
<h1>Environments <span id="summary" class="muted">{parts["summary"]}</span></h1>
<form class="filters">{filters}</form>
<table class="environments"><thead><tr>{head}</tr></thead><tbody id="environments">{parts["environments"]}</tbody></table>
</section>
<section>
<h2>Hosts</h2>
<table class="hosts"><thead><tr><th>Host</th><th>Status</th><th>Last seen</th><th>Environments</th></tr></thead>
<tbody id="hosts">{parts["hosts"]}</tbody></table>
</section>
<section id="replicas">{parts["replicas"]}</section>
<section id="pools">{parts["pools"]}</section>"""
    return page("fleet", "/live/fleet", body, parts["problem"])


def fleet_parts(
    environments: Sequence[dict[str, Any]],
    machines: Sequence[dict[str, Any]],
    replicas: Sequence[dict[str, Any]] | None,
    pools: Sequence[dict[str, Any]] | None,
    now: datetime,
) -> Parts:
    by_status: dict[str, int] = {}
    for environment in environments:
        by_status[environment["status"]] = by_status.get(environment["status"], 0) + 1
    summary = ", ".join(f"{count} {status}" for status, count in sorted(by_status.items())) or "none"
    return {
        "summary": escape(summary),
        "environments": "".join(_environment_row(e, now) for e in environments)
        or f'<tr class="empty"><td colspan="{len(ENVIRONMENT_COLUMNS)}">No environments.</td></tr>',
        "hosts": "".join(_host_row(m, now) for m in machines),
        "replicas": _replicas(replicas, now),
        "pools": _pools(pools),
        "problem": "",
    }


def _environment_row(e: dict[str, Any], now: datetime) -> str:
    project = e.get("projectPath") or ""
    cells = (
        ("Environment", f'<a href="/environments/{quote(e["id"])}">{escape(e["id"])}</a>'),
        ("Status", _status(e["status"]) + (' <span class="badge pooled">pooled</span>' if e.get("pooled") else "")),
        ("Provider", escape(e["providerId"])),
        ("Host", escape(e["hostId"])),
        ("Project", f'<span class="path">{escape(project or "-")}</span>'),
        ("Threads", escape(", ".join(e["threadIds"]) or "-")),
        ("Age", _since(e["createdAt"], now)),
        ("Ports", escape(port_range(e.get("ports")) or "-")),
        ("Disk", escape(_bytes(e.get("diskBytes")))),
    )
    return (
        f'<tr data-status="{escape(e["status"])}" data-host="{escape(e["hostId"])}" data-project="{escape(project)}">'
        + "".join(_cell(label, html) for label, html in cells)
        + "</tr>"
    )


def _host_row(m: dict[str, Any], now: datetime) -> str:
    seen = m.get("lastSeenAt")
    name = escape(m["id"]) + (' <span class="muted">(this service)</span>' if m.get("own") else "")
    cells = (
        ("Host", name),
        ("Status", _status(m["status"])),
        ("Last seen", _since(seen, now, " ago") if seen else "never"),
        ("Environments", str(int(m.get("environments", 0)))),
    )
    return "<tr>" + "".join(_cell(label, html) for label, html in cells) + "</tr>"


def _replicas(replicas: Sequence[dict[str, Any]] | None, now: datetime) -> str:
    """The core replicas' section: those running, and those this console saw that ended (offline)."""
    if replicas is None:
        return ""
    rows = "".join(
        "<tr>"
        + _cell("Replica", escape(r["replicaId"]))
        + _cell("Status", _status(r["status"]))
        + _cell("Machine", escape(f"{r['machine']} (pid {r['pid']})"))
        + _cell("Store", escape(r["store"]))
        + _cell("Started", _since(r["startedAt"], now, " ago"))
        + _cell("Last seen", _since(r["lastSeenAt"], now, " ago"))
        + "</tr>"
        for r in replicas
    )
    return (
        "<h2>Replicas</h2><table><thead><tr><th>Replica</th><th>Status</th><th>Machine</th><th>Store</th>"
        f"<th>Started</th><th>Last seen</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _pools(pools: Sequence[dict[str, Any]] | None) -> str:
    """The pools' section, empty when the service has no pools to list (SPEC §10)."""
    if pools is None:
        return ""
    rows = "".join(
        "<tr>"
        + _cell("Pool", escape(str(p.get("id", ""))))
        + _cell("Host", escape(str(p.get("hostId", ""))))
        + _cell("Project", f'<span class="path">{escape(str(p.get("projectPath", "")))}</span>')
        + _cell("Provider", escape(str(p.get("providerId", ""))))
        + _cell("Members", escape(_members(p)))
        + _cell("Paused", escape(one_line((p.get("paused") or {}).get("reason") or "-")))
        + "</tr>"
        for p in pools
    )
    empty = '<tr class="empty"><td colspan="6">No pools.</td></tr>'
    return (
        "<h2>Pools</h2><table><thead><tr><th>Pool</th><th>Host</th><th>Project</th><th>Provider</th>"
        f"<th>Members</th><th>Paused</th></tr></thead><tbody>{rows or empty}</tbody></table>"
    )


def _members(pool: dict[str, Any]) -> str:
    members = pool.get("members") or {}
    counts = ", ".join(f"{members[k]} {k}" for k in ("ready", "preparing", "stale") if k in members)
    return f"{counts or '-'} of {pool.get('size', '?')}"


def environment_page(environment_id: str, parts: Parts) -> str:
    body = f"""<p><a href="/">← fleet</a></p>
<h1 id="headline">{parts["headline"]}</h1>
<section><dl id="facts" class="facts">{parts["facts"]}</dl></section>
<section><h2>Timeline</h2><div id="timeline" class="timeline">{parts["timeline"]}</div></section>
<section><h2>Transcript</h2><pre id="transcript" class="transcript"></pre></section>"""
    return page(environment_id, f"/live/environments/{quote(environment_id)}", body)


def environment_parts(e: dict[str, Any], history: Sequence[dict[str, Any]], now: datetime) -> Parts:
    message = f' <span class="message">{escape(one_line(e["statusMessage"]))}</span>' if e.get("statusMessage") else ""
    headline = f"{escape(e['id'])} {_status(e['status'])}{message}"
    saved = e.get("savedRef")
    facts = (
        ("Provider", e["providerId"]),
        ("Host", e["hostId"]),
        ("Project", e.get("projectPath")),
        ("Path", e.get("path")),
        ("Claim", e.get("claimedPath") or e.get("pathKey")),
        ("Slug", e.get("slug")),
        ("Ports", port_range(e.get("ports"))),
        ("Threads", ", ".join(e["threadIds"])),
        ("Disk", _bytes(e.get("diskBytes"))),
        ("Pooled", "yes" if e.get("pooled") else "no"),
        ("Setup", e["hooks"]["setup"].get("status")),
        ("Teardown", e["hooks"]["teardown"].get("status")),
        ("Saved work", f"{saved}  (git worktree add <dir> {saved})" if saved else None),
        ("Created", clock(e["createdAt"])),
    )
    return {
        "headline": headline,
        "facts": "".join(f"<dt>{label}</dt><dd>{escape(one_line(str(value or '-')))}</dd>" for label, value in facts),
        # Under way, the time runs on to now; settled, the scale ends at the last event, so that a
        # long-ready environment still shows where its preparation's time went.
        "timeline": timeline(history, now if e["status"] in UNDER_WAY else None),
        "problem": "",
    }


def timeline(history: Sequence[dict[str, Any]], now: datetime | None) -> str:
    """The events on one time axis, to scale: each a bar as long as the time to the next event (the
    last, while the environment lives, until `now`), and each hook's run a bar above them."""
    if not history:
        return '<p class="muted">No events yet.</p>'
    instants = [_parsed(e["occurredAt"]) for e in history]
    start = instants[0]
    end = max(instants[-1], now) if now is not None else instants[-1]
    span_ms = max(_ms(end - start), 1)

    def bar(begin: datetime, length_ms: float, kind: str, title: str) -> str:
        left = _ms(begin - start) / span_ms * 100
        width = min(length_ms / span_ms * 100, 100 - left)
        return f'<span class="bar {kind}" style="left:{left:.3f}%;width:{width:.3f}%" title="{escape(title)}"></span>'

    rows = []
    for run in _hook_runs(history, instants, end):
        name, begin, finish, outcome = run
        took = duration(_ms(finish - begin))
        rows.append(
            f'<li class="hook {outcome}"><span class="what">{name} hook</span>'
            f'<span class="lane">{bar(begin, _ms(finish - begin), "hook " + outcome, f"{name}: {took}")}</span>'
            f'<span class="took">{escape(took)} {outcome}</span></li>'
        )
    for event, at in zip(history, instants):
        last = event is history[-1]
        length = event["durationMs"] if event["durationMs"] is not None else _ms(end - at)
        took = duration(length) + (" so far" if last and now is not None else "")
        if last and now is None:
            took = "latest"
        rows.append(
            f'<li class="event" data-type="{escape(event["type"])}"><span class="what">'
            f'<span class="version">{int(event["version"])}</span> {escape(event["type"])}</span>'
            f'<span class="lane">{bar(at, length, "event", event["type"])}</span>'
            f'<span class="took" title="{escape(clock(event["occurredAt"]))}">{escape(took)}</span></li>'
        )
    axis = (
        f'<div class="axis"><span>{escape(clock(history[0]["occurredAt"]))}</span>'
        f"<span>{escape(duration(span_ms))}</span></div>"
    )
    return f'{axis}<ol class="events">{"".join(rows)}</ol>'


def _hook_runs(
    history: Sequence[dict[str, Any]], instants: Sequence[datetime], end: datetime
) -> Iterable[tuple[str, datetime, datetime, str]]:
    """Each hook run: its name, start, end (`end` while it runs) and outcome."""
    for index, event in enumerate(history):
        if event["type"] not in HOOK_RUNS:
            continue
        name, endings = HOOK_RUNS[event["type"]]
        finished = next(
            ((later, at) for later, at in zip(history[index + 1 :], instants[index + 1 :]) if later["type"] in endings),
            None,
        )
        if finished is None:
            yield name, instants[index], end, "running"
        else:
            yield name, instants[index], finished[1], "failed" if finished[0]["type"].endswith("failed") else "done"


def problem_parts(message: str) -> Parts:
    return {"problem": escape(message)}


def _status(status: str) -> str:
    return f'<span class="badge status-{escape(status)}">{escape(status)}</span>'


def _cell(label: str, html: str) -> str:
    """A table cell; on a phone, a card's line: the label, then the content (one element)."""
    return f'<td data-label="{label}"><div>{html}</div></td>'


def _since(instant: str, now: datetime, suffix: str = "") -> str:
    """How long ago `instant` was: kept current by the page's script between two reads."""
    said = duration(max(_ms(now - _parsed(instant)), 0)) + suffix
    return f'<time datetime="{escape(instant)}" data-suffix="{escape(suffix)}">{escape(said)}</time>'


def _bytes(count: int | None) -> str:
    """A size as a person reads it; `-` until measured (or from a service that does not measure)."""
    if count is None:
        return "-"
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _parsed(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def _ms(delta: Any) -> int:
    return int(delta.total_seconds() * 1000)
