"""Hypothesis strategies for what a stranger can send us, shared by every fuzz test.

Two kinds, because they find different bugs: documents of the right shape whose values are
hostile (they get past the decoder and test the checks behind it), and raw bytes (they test the
decoder and what happens when it gives up). Strategies that name things of a test's world (paths,
recorded ids) take them as arguments, so the hostile variants are built around things that exist.
"""

from __future__ import annotations

import json
import string
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

CANARY = "CANARY-7f3a"
"""Planted in prompts and in values no struct declares: content that must never reach a log line."""

# Values that have broken parsers, shells, git and loggers before; each is a reason, not a guess.
HOSTILE_WORDS = (
    "",
    " ",
    "-",
    "--",
    "--json",
    "--help",
    "-h",
    "--upload-pack=touch /tmp/pwned",
    "--exec=id",
    "-b",
    "..",
    ".",
    "../x",
    "../../etc/passwd",
    "/",
    "//",
    "\\",
    "~",
    "~root",
    "$HOME",
    "$(id)",
    "`id`",
    "|id",
    "refs/heads/main",
    "refs/heads/../x",
    "refs/tags/v1",
    "HEAD",
    "@",
    "x@{1}",
    "main~1",
    "HEAD^",
    "a..b",
    "x.lock",
    "a//b",
    "has space",
    "t1\n",
    "\nforged log line",
    "a\rb",
    "\x00",
    "a\x00b",
    "\x1b[31mred",
    "\u202egnp.exe",
    "\ufeff",
    "ﬁ",
    "é",
    "\U0001f600",
    "NaN",
    "Infinity",
    "-Infinity",
    "null",
    "true",
    "{}",
    "[]",
    '{"a": 1}',
    "bb.api.>",
    "*",
    ">",
    "a.b",
    "%s%s%n",
    "{0}",
    "'; DROP TABLE events; --",
    "local",
    "elsewhere",
    "git-worktree",
    "personal-workspace",
    "project-checkout",
    "modal-sandbox",
)

HUGE_SIZES = (128, 129, 4096, 4097, 65_536, 70_000)


@cache
def hostile_words() -> SearchStrategy[str]:
    return st.sampled_from(HOSTILE_WORDS)


@cache
def huge_text() -> SearchStrategy[str]:
    """Around the limits that matter: 128 (ids), 4096 (PATH_MAX), 64 KiB (an API request)."""
    return st.builds(
        lambda unit, size: (unit * size)[:size],
        st.sampled_from(("a", "/", "é", "../", "\x00")),
        st.sampled_from(HUGE_SIZES),
    )


@cache
def any_text() -> SearchStrategy[str]:
    """Every code point hypothesis knows, control characters included (surrogates come via raw JSON)."""
    return st.text(st.characters(codec=None, exclude_categories=("Cs",)), max_size=40)


@cache
def hostile_text() -> SearchStrategy[str]:
    return st.one_of(
        hostile_words(), any_text(), huge_text(), st.builds(lambda a, b: a + b, hostile_words(), hostile_words())
    )


@cache
def json_values() -> SearchStrategy[Any]:
    """Any JSON value Python can write: NaN and Infinity tokens and integers past 64 bits included.
    Where a string is expected, most of these are of the wrong type."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**80), max_value=2**80),
        st.floats(allow_nan=True, allow_infinity=True),
        hostile_text(),
    )
    # Two levels at most, not st.recursive: that costs twice as much, and depth is nested_lists' job.
    return st.one_of(
        scalars,
        st.lists(scalars, max_size=3),
        st.dictionaries(hostile_text(), scalars, max_size=2),
        st.lists(st.lists(scalars, max_size=2), max_size=2),
    )


@cache
def nested_lists() -> SearchStrategy[Any]:
    """Lists nested around the API's limit of 32 levels of inputs; nesting deeper than Python's
    json can write comes as bytes (raw_payloads)."""

    def nest(depth: int, inner: Any) -> Any:
        for _ in range(depth):
            inner = [inner]
        return inner

    return st.builds(nest, st.sampled_from((31, 32, 33, 34, 64, 400)), st.sampled_from(({}, [], "x", None)))


# -- documents of the right shape ------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """A field as a well-meaning sender fills it, and as a hostile one does."""

    valid: SearchStrategy[Any]
    hostile: SearchStrategy[Any]
    required: bool = False


def documents(shape: dict[str, Field], fixed: dict[str, Any] | None = None, spoil: int = 2) -> SearchStrategy[dict]:
    """Documents of the right shape with up to `spoil` fields spoiled (hostile, a good value with a
    splinter in it, of the wrong type, or missing) and the rest as a careful sender writes them, so
    that a hostile value meets every check behind the decoder and not only the first. Sometimes
    with fields no struct declares."""
    # Built once: a thousand examples spend their time drawing, not building strategies.
    spoiled = st.sets(st.sampled_from(sorted(shape)), max_size=spoil) if shape and spoil else st.just(frozenset())
    splinters = {name: splintered(values.valid) for name, values in shape.items()}

    @st.composite
    def document(draw: st.DrawFn) -> dict[str, Any]:
        drawn = dict(fixed or {})
        spoilt = draw(spoiled)
        for name, values in shape.items():
            if name not in spoilt:
                if values.required or draw(_QUARTERS):
                    drawn[name] = draw(values.valid)
                continue
            how = draw(_TENTHS)
            if how < 4:
                drawn[name] = draw(values.hostile)
            elif how < 8:
                drawn[name] = draw(splinters[name])
            elif how == 8:
                drawn[name] = draw(json_values())
        if spoil and draw(_TENTHS) == 0:
            drawn.update({k: v for k, v in draw(unknown_fields()).items() if k not in drawn})
        return drawn

    return document()


_QUARTERS, _TENTHS, _ANYWHERE = st.integers(0, 3), st.integers(0, 9), st.integers(0, 2**32)


@cache
def unknown_fields() -> SearchStrategy[dict[str, Any]]:
    """Fields no struct declares: hostile names, values carrying the canary."""
    names = st.one_of(hostile_text(), splintered(st.sampled_from(("apiKey", "sandbox", "colour", "__proto__"))))
    return st.dictionaries(
        names, st.just(CANARY) | st.builds(lambda v: {"secret": CANARY, "v": v}, json_values()), min_size=1, max_size=2
    )


# -- the values inbound payloads carry -------------------------------------------------------------

ALPHANUMERIC = string.ascii_letters + string.digits


@cache
def fresh_ids() -> SearchStrategy[str]:
    """Ids of the form the service accepts (short: lengths are hostile_text's business). Not
    st.from_regex: that costs more than the rest of an example."""
    return st.builds(str.__add__, st.sampled_from(ALPHANUMERIC), st.text(ALPHANUMERIC + "_-", max_size=20))


@cache
def valid_ids(known: tuple[str, ...] = ()) -> SearchStrategy[str]:
    """Thread and host ids the service accepts, the world's own among them."""
    return st.one_of(st.sampled_from(known), fresh_ids()) if known else fresh_ids()


@cache
def hostile_ids(known: tuple[str, ...] = ()) -> SearchStrategy[str]:
    """Near misses of the world's ids (a line break, a traversal, a case change) and hostile text."""
    near = [s for k in known for s in (k.upper(), "../" + k, k + "/..", "-" + k)]
    spoilt = splintered(st.sampled_from(known) if known else fresh_ids())
    return st.one_of(hostile_text(), spoilt, *([st.sampled_from(near)] if near else []))


# NUL and line breaks first: they are what a check most often forgets, and what breaks most when it does.
SPLINTERS = (
    "\x00",
    "\n",
    "\x00",
    "\n",
    "\r",
    "\u2028",
    "\x85",
    "/../",
    "/./",
    "//",
    " ",
    "\t",
    "`",
    "$(",
    "'",
    '"',
    "\\",
    "*",
)


def splintered(values: SearchStrategy[Any]) -> SearchStrategy[Any]:
    """A good value with one splinter driven in somewhere (a text value; others stay as they are):
    the NUL or line break a check forgot."""
    return st.builds(_splinter, values, st.integers(0, 2**16), st.sampled_from(SPLINTERS))


def _splinter(value: Any, at: int, splinter: str) -> Any:
    if not isinstance(value, str):
        return value
    at %= len(value) + 1
    return value[:at] + splinter + value[at:]


@cache
def ids(known: tuple[str, ...] = (), required: bool = False) -> Field:
    return Field(valid_ids(known), hostile_ids(known), required)


UUID_SPELLINGS = (
    lambda u: str(u).upper(),
    lambda u: u.hex,
    lambda u: f"{{{u}}}",
    lambda u: u.urn,
    lambda u: str(u) + "\n",
    lambda u: str(u)[:-1],
    lambda u: str(u) + "0",
    lambda u: " " + str(u),
)


@cache
def uuids(known: tuple[str, ...] = ()) -> SearchStrategy[uuid.UUID]:
    return st.one_of(st.uuids(), st.sampled_from([uuid.UUID(k) for k in known])) if known else st.uuids()


@cache
def environment_ids(known: tuple[str, ...] = (), required: bool = False) -> Field:
    """Environment ids: canonical UUIDs (the world's or none's); hostile are the other spellings
    uuid.UUID reads, near misses of them, and hostile text."""
    spelled = st.builds(lambda u, spell: spell(u), uuids(known), st.sampled_from(UUID_SPELLINGS))
    return Field(uuids(known).map(str), st.one_of(spelled, hostile_text()), required)


@cache
def path_variants(anchors: tuple[str, ...]) -> SearchStrategy[str]:
    """Paths built around directories that exist: aliases, traversals, NULs, relative paths,
    lengths past PATH_MAX; plus paths of no anchor at all."""

    def variants(anchor: str) -> list[str]:
        return [
            anchor + "/",
            anchor + "/.",
            anchor + "/../" + anchor.rsplit("/", 1)[-1],
            anchor + "/..",
            anchor + "/../../../../../../..",
            anchor + "/.git",
            anchor + "/.git/refs",
            anchor + "\x00",
            anchor + "\x00/../x",
            anchor + "/missing",
            anchor + "\n",
            anchor.lstrip("/"),
            "//" + anchor,
            anchor + "/" + "a" * 300,
            anchor + "/a" * 2100,
        ]

    fixed = [v for a in anchors for v in variants(a)] + ["/", "/.", "/..", "x", "./x", "/proc/self/cwd", "/dev/null"]
    existing = st.sampled_from(list(anchors) or ["/"])
    return st.one_of(
        st.sampled_from(fixed),
        splintered(existing),
        splintered(existing),
        hostile_text(),
        st.builds(lambda a, s: a + "/" + s, existing, hostile_text()),
    )


@cache
def paths(anchors: tuple[str, ...], required: bool = False) -> Field:
    return Field(st.sampled_from(anchors), path_variants(anchors), required)


@cache
def timestamps() -> Field:
    """occurredAt: RFC 3339, and what merely looks like it."""
    hostile = st.one_of(
        hostile_text(),
        st.sampled_from(
            (
                "2026-13-45T00:00:00Z",
                "0000-00-00T00:00:00Z",
                "9999-12-31T23:59:59+25:00",
                "2026-12-01",
                "2026-12-01T12:00:00.123456789Z",
                "2026-12-01 12:00:00",
                "1e9",
            )
        ),
    )
    return Field(st.datetimes(timezones=st.just(None)).map(lambda t: t.isoformat() + "Z"), hostile)


@cache
def prompts() -> SearchStrategy[str]:
    """A message's text: content this service never reads, keeps or logs."""
    return st.builds(lambda before, after: before + CANARY + after, hostile_text(), st.sampled_from(("", "\n", "\x00")))


@cache
def hosts() -> Field:
    """Host ids: this service serves `local` only; `elsewhere` is well-formed and still refused."""
    return Field(st.just("local"), st.one_of(st.just("elsewhere"), hostile_ids(("local",))))


PROVIDER_IDS = ("git-worktree", "project-checkout", "personal-workspace", "modal-sandbox")


@cache
def provider_ids(required: bool = False) -> Field:
    return Field(st.sampled_from(PROVIDER_IDS), hostile_text(), required)


@cache
def branch_names() -> SearchStrategy[str]:
    """What git reads as an option, a revision expression or a ref outside refs/heads."""
    return st.one_of(
        hostile_text(),
        st.sampled_from(
            (
                "refs/heads/refs/heads/x",
                "refs/remotes/origin/main",
                "--upload-pack=touch /tmp/pwned",
                "-D",
                "--orphan",
                "HEAD",
                "@{-1}",
                "main~1",
                "HEAD^",
                "x^{tree}",
                "a:b",
                "a?b",
                "a*b",
                "a[b",
                "x/",
                "/x",
                ".hidden",
                "x/.y",
            )
        ),
    )


@cache
def branch_choices(spoil: int) -> SearchStrategy[dict]:
    """A provider's `branch` input: each kind with its own fields."""
    plain = st.sampled_from(("main", "feature/x", "refs/heads/main", "bb/t1", "fix-1"))
    named = {"name": Field(plain, branch_names(), required=True), "base": Field(plain, branch_names())}
    kinds = [
        documents({}, {"kind": "default"}, spoil),
        documents({}, {"kind": "current"}, spoil),
        documents({"name": named["name"]}, {"kind": "existing"}, spoil),
        documents(named, {"kind": "new"}, spoil),
    ]
    if spoil:
        kinds.append(documents({"kind": Field(st.sampled_from(("default", "current")), hostile_text()), **named}))
    return st.one_of(kinds)


@cache
def provider_inputs(spoil: int) -> SearchStrategy[Any]:
    """Inputs of each built-in provider (a branch, a checkout subdirectory, Modal's sizes)."""
    branch = Field(branch_choices(0), branch_choices(2))
    numbers = st.one_of(
        st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True, allow_infinity=True)
    )
    modal = {
        name: Field(st.sampled_from(good), numbers)
        for name, good in (("cpu", (0.25, 2.0, 16)), ("memoryMib", (512, 4096)), ("timeoutHours", (1, 24)))
    }
    shaped = [
        documents({"branch": branch}, spoil=spoil),
        documents(
            {"branch": branch, "path": Field(st.sampled_from(("sub", ".", "a/b")), path_variants(()))}, spoil=spoil
        ),
        documents(modal, spoil=spoil),
        st.none(),
        st.just({}),
    ]
    return st.one_of(*shaped, json_values(), nested_lists()) if spoil else st.one_of(shaped)


@cache
def inputs() -> Field:
    return Field(provider_inputs(0), provider_inputs(2))


@cache
def environment_intents(environment_ids_known: tuple[str, ...], spoil: int) -> SearchStrategy[Any]:
    """`environment` of a created thread event: a provider on a machine, or an existing environment."""
    machine = Field(
        documents({"hostId": Field(st.just("local"), hostile_ids(("local",)))}, {"type": "existing"}, 0),
        documents({"type": Field(st.just("existing"), hostile_text(), required=True), "hostId": hosts()}),
    )
    provider = documents(
        {"environmentProviderId": provider_ids(required=True), "machine": machine, "inputs": inputs()},
        {"type": "provider"},
        spoil,
    )
    existing = documents(
        {"environmentId": environment_ids(environment_ids_known, required=True)}, {"type": "existing"}, spoil
    )
    if not spoil:
        return st.one_of(provider, existing)
    return st.one_of(provider, existing, documents({"type": Field(st.just("provider"), hostile_text())}), json_values())


# -- inbound thread events (bb.threads.<threadId>.<kind>) ------------------------------------------

THREAD_EVENT_KINDS = ("created", "message", "archived", "unarchived", "message_cancelled")


@cache
def thread_event_documents(
    thread_ids: tuple[str, ...], environment_ids_known: tuple[str, ...], projects: tuple[str, ...]
) -> SearchStrategy[dict]:
    """Each kind with its own fields, or a type nobody declares."""
    common = {"threadId": ids(thread_ids, required=True), "occurredAt": timestamps()}
    intent = Field(environment_intents(environment_ids_known, 0), environment_intents(environment_ids_known, 2))
    created = documents(
        {
            **common,
            "projectPath": paths(projects),
            "parentThreadId": ids(thread_ids),
            "hostId": hosts(),
            "environment": intent,
        },
        {"type": "created"},
    )
    message = documents({**common, "text": Field(prompts(), json_values())}, {"type": "message"})
    others = [documents(common, {"type": kind}) for kind in THREAD_EVENT_KINDS[2:]]
    untyped = documents({**common, "type": Field(st.sampled_from(THREAD_EVENT_KINDS), hostile_text(), required=True)})
    return st.one_of(created, created, message, *others, untyped)


@cache
def thread_events(
    thread_ids: tuple[str, ...], environment_ids_known: tuple[str, ...], projects: tuple[str, ...]
) -> SearchStrategy[tuple[str, bytes]]:
    """(subject, payload) as a publisher on bb.threads.> can send them; one in ten names another
    thread in its subject than in its payload."""
    documents_ = thread_event_documents(thread_ids, environment_ids_known, projects)

    @st.composite
    def addressed(draw: st.DrawFn) -> tuple[str, bytes]:
        document, other = draw(documents_), draw(valid_ids())
        subject = f"bb.threads.{other}.created" if draw(_TENTHS) == 0 else thread_event_subject(document, other)
        return subject, encoded(draw, document)

    return addressed()


def thread_event_subject(document: Any, other: str) -> str:
    """The subject a publisher would use; `other` stands in for a thread id no subject can carry."""
    fields = document if isinstance(document, dict) else {}
    thread_id, kind = fields.get("threadId"), fields.get("type")
    token = thread_id if isinstance(thread_id, str) and _subject_token(thread_id) else other
    return f"bb.threads.{token}.{kind if isinstance(kind, str) and _subject_token(kind) else 'created'}"


def _subject_token(text: str) -> bool:
    return bool(text) and not any(c in text for c in ". *>") and text.isprintable()


# -- on the wire -----------------------------------------------------------------------------------


def to_wire(document: Any, ascii_only: bool) -> bytes:
    """JSON as Python writes it: NaN and Infinity become bare tokens; without `ascii_only` a lone
    surrogate becomes bytes that are not UTF-8 at all."""
    return json.dumps(document, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def nested_json(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth if depth % 2 else b"[" * depth + b"]" * depth


def mutated(draw: st.DrawFn, wire: bytes) -> bytes:
    """A real document broken the ways a stream or a careless publisher breaks one."""
    how, at = draw(st.integers(0, 6)), draw(_ANYWHERE) % max(1, len(wire))
    if not wire or how == 0:
        return wire[:at]  # truncated
    if how == 1:
        return wire[:at] + bytes([draw(st.integers(0, 255))]) + wire[at + 1 :]  # one byte changed
    if how == 2:
        return wire[:at] + draw(_BREAKERS) + wire[at:]
    if how == 3:
        return b"\xef\xbb\xbf" + wire  # a byte order mark
    if how == 4:
        return wire + draw(st.sampled_from((b" ", b"\n", b"x", b"{}", b"\x00")))  # trailing garbage
    if how == 5 and wire.startswith(b"{") and len(wire) > 2:
        return wire[:-1] + b"," + wire[1:]  # every field twice
    return wire * 2


_BREAKERS = st.sampled_from((b"NaN", b"-Infinity", b"1e999", b"\\ud800", b'"', b",", b"\x00", b"\xff", b"\xc3", b"}"))


@cache
def raw_payloads() -> SearchStrategy[bytes]:
    """Bytes that are not a document: nothing, noise, JSON of the wrong kind, nesting deep enough
    to exhaust a recursive decoder, strings past the size limits."""
    return st.one_of(
        st.binary(max_size=64),
        st.sampled_from(
            (
                b"",
                b" ",
                b"null",
                b"true",
                b"0",
                b"-0",
                b"1e999",
                b"NaN",
                b'"x"',
                b"[]",
                b"{}",
                b"[{}]",
                b'{"type": null}',
                b'{"type": 1}',
                b"\xff\xfe{\x00}\x00",
                b'"\\ud800"',
                b"{" * 3,
                b'{"a": 1, "a": 2}',
            )
        ),
        st.builds(nested_json, st.sampled_from((33, 500, 1_000, 20_000, 65_000))),
        st.builds(lambda n: b'"' + b"a" * n + b'"', st.sampled_from((65_535, 65_537, 200_000))),
        any_text().map(lambda text: text.encode("utf-8")),
    )


def encoded(draw: st.DrawFn, document: Any) -> bytes:
    """A document as a careful publisher writes it, as a careless one does, broken, or replaced by noise."""
    how = draw(st.integers(0, 4))
    if how < 3:
        return to_wire(document, ascii_only=how != 2)
    return mutated(draw, to_wire(document, ascii_only=True)) if how == 3 else draw(raw_payloads())


@cache
def payloads(documents_: SearchStrategy[Any], subject: str) -> SearchStrategy[tuple[str, bytes]]:
    """(subject, payload) for documents sent on one subject."""
    return st.composite(lambda draw: (subject, encoded(draw, draw(documents_))))()


# -- API requests (bb.api.<area>.<verb>) -----------------------------------------------------------

ENVIRONMENT_STATUSES = ("creating", "provisioning", "ready", "error", "retiring", "removing", "removed")


@cache
def api_requests(
    thread_ids: tuple[str, ...], environment_ids_known: tuple[str, ...], projects: tuple[str, ...], head: int
) -> SearchStrategy[tuple[str, bytes]]:
    """(subject, payload) for every endpoint of the `bb-environments` micro service; `head` is the
    log's last position, the furthest a read may ask to wait for."""
    position = Field(
        st.integers(0, head),
        st.one_of(
            st.sampled_from((head + 1, head + 10**6, 2**63 - 1, 2**63, 2**64, -1)),
            st.integers(min_value=-(2**70), max_value=2**70),
            st.floats(allow_nan=True),
            hostile_text(),
        ),
    )
    environment_ref = {"environmentId": environment_ids(environment_ids_known, required=True), "minPosition": position}
    thread_ref = {"threadId": ids(thread_ids, required=True)}
    # A past version or instant: the log's own, those around them, and what is neither.
    at = Field(
        st.one_of(st.integers(1, 12), st.datetimes(timezones=st.just(UTC)).map(datetime.isoformat)),
        st.one_of(
            st.sampled_from((0, -1, 2**63, 2**64, True, "2026-01-31T12:00:00", "yesterday")),
            st.datetimes().map(datetime.isoformat),
            st.floats(allow_nan=True),
            hostile_text(),
        ),
    )
    history = {
        "environmentId": environment_ids(environment_ids_known, required=True),
        "after": Field(st.integers(0, 12), st.one_of(st.integers(min_value=-(2**70), max_value=2**70), hostile_text())),
        "limit": Field(st.integers(1, 1000), st.one_of(st.sampled_from((0, 1001, -1)), hostile_text())),
    }
    secret_ref = {
        "projectPath": paths(projects, required=True),
        "name": Field(st.sampled_from(("API_TOKEN", "NPM_TOKEN")), hostile_text(), True),
    }
    spawn = {
        "threadId": ids(thread_ids),
        "environmentProvider": provider_ids(),
        "environmentInputs": inputs(),
        "environmentId": environment_ids(environment_ids_known),
        "projectPath": paths(projects),
        "hostId": hosts(),
        "parentThreadId": ids(thread_ids),
        "prompt": Field(prompts(), json_values()),
    }
    # A spawn names where the thread runs in one of three ways; the others' fields are its spoilers.
    ways = [
        ("environmentProvider", "environmentInputs", "projectPath"),
        ("environmentId",),
        ("parentThreadId", "projectPath"),
    ]
    spawns = [
        documents(
            {
                name: Field(field.valid, field.hostile, required=name == way[0])
                for name, field in spawn.items()
                if name in (*way, "threadId", "hostId", "prompt")
            }
        )
        for way in ways
    ] + [documents(spawn)]
    shapes: dict[str, dict[str, Field]] = {
        "environments.providers": {},
        "environments.list": {
            "status": Field(st.sampled_from(ENVIRONMENT_STATUSES), hostile_text()),
            "provider": provider_ids(),
        },
        "environments.show": {**environment_ref, "at": at},
        "environments.history": history,
        "environments.delete": environment_ref,
        "environments.retry": environment_ref,
        "threads.spawn": spawn,
        "threads.list": {"environmentId": environment_ids(environment_ids_known)},
        "threads.archive": thread_ref,
        "threads.unarchive": thread_ref,
        "threads.cancel": thread_ref,
        "events.replay": {},
        # Only examinations: a fix removes orphans (the seeded world has one, seeded-gone's
        # directory) and writes nothing for that, which this fuzz would take for a refusal's damage.
        "doctor.run": {"fix": Field(st.just(False), hostile_text())},
        "secrets.set": {**secret_ref, "value": Field(st.sampled_from(("tok-1", "x" * 200)), hostile_text(), True)},
        "secrets.list": {"projectPath": paths(projects, required=True)},
        "secrets.remove": secret_ref,
    }
    requests = {name: documents(shape) for name, shape in shapes.items()}
    # A spawn has the most fields and the most checks behind them: it gets the most examples.
    requests["threads.spawn"] = st.one_of(spawns)
    weights = {"threads.spawn": 3, "environments.show": 2}
    return st.one_of(
        [payloads(request, f"bb.api.{name}") for name, request in requests.items() for _ in range(weights.get(name, 1))]
    )


# -- host agent requests (bb.hosts.<hostId>.hooks.<verb>) ------------------------------------------


@cache
def host_agent_requests(
    operations: tuple[str, ...], environment_ids_known: tuple[str, ...], workspaces: tuple[str, ...]
) -> SearchStrategy[tuple[str, bytes]]:
    """(subject, payload) aimed at hook operations the log recorded: their ids, kinds, workspaces and
    environments shuffled together, near misses of each, and hostile text."""
    operation = Field(st.sampled_from(operations), hostile_ids(operations), required=True)
    start = documents(
        {
            "operationId": operation,
            "kind": Field(st.sampled_from(("setup", "teardown")), hostile_text(), required=True),
            "workspace": paths(workspaces, required=True),
            "environmentId": environment_ids(environment_ids_known, required=True),
        }
    )
    ref = documents({"operationId": operation})
    verbs = [("start", start), ("start", start), ("status", ref), ("cancel", ref)]
    return st.one_of([payloads(request, f"bb.hosts.local.hooks.{verb}") for verb, request in verbs])


# -- command lines (`bb ...`) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Invocation:
    """A `bb` command line, with what a test needs to judge its answer."""

    command: tuple[str, ...]
    options: tuple[tuple[str, str], ...]
    """Options given a value, as the command reads them (`--wait` and `--json` are flags)."""
    argument: str | None
    """The command's one positional argument, if it takes one."""
    as_json: bool
    clean: bool
    """Every value came from the well-meaning side: the CLI has nothing to refuse."""
    args: tuple[str, ...]


def argv_text(text: str) -> str:
    """What a shell can pass: no NUL (argv is C strings). At most 8 KiB, past every limit the CLI
    checks itself (the API's 64 KiB is the service's to check): a longer one costs time, not cases."""
    return text.replace("\x00", "")[:8192]


UNDECODABLE = ("\udcff", "\udc80", "\udce9")
"""Bytes of argv that are not UTF-8, as Python hands them over (surrogateescape)."""


@cache
def argv_values(values: SearchStrategy[str]) -> SearchStrategy[str]:
    return st.one_of(
        values.map(argv_text),
        st.builds(_splinter, values.map(argv_text), st.integers(0, 2**16), st.sampled_from(UNDECODABLE)),
    )


@cache
def input_texts(spoil: int) -> SearchStrategy[str]:
    """--environment-inputs: JSON of provider inputs; hostile also JSON that Python reads and JSON
    does not (NaN, Infinity, 1e999), JSON broken, nested past any reader's recursion, and not JSON."""
    written = provider_inputs(spoil).map(lambda value: json.dumps(value))
    if not spoil:
        return written
    broken = st.composite(lambda draw: mutated(draw, draw(written).encode()).decode("utf-8", "replace"))()
    return st.one_of(
        written,
        broken,
        hostile_text(),
        st.builds(lambda depth: nested_json(depth).decode(), st.sampled_from((33, 999, 1_001, 5_000))),
        st.sampled_from(("{not json", "", "[1e999]", '{"n": NaN}', "-Infinity", '"\\ud800"', "[" * 50)),
    )


def _from_argv(field: Field) -> Field:
    return Field(field.valid, argv_values(field.hostile), field.required)


@cache
def _option_fields(projects: tuple[str, ...]) -> dict[str, Field]:
    return {
        "--environment-provider": _from_argv(provider_ids()),
        "--environment-inputs": Field(input_texts(0), input_texts(2)),
        "--environment": _from_argv(environment_ids()),
        "--project": _from_argv(paths(projects)),
        "--thread-id": _from_argv(ids()),
        "--parent": _from_argv(ids()),
        "--host": _from_argv(hosts()),
        "--prompt": Field(prompts().map(argv_text), argv_values(hostile_text())),
        "--timeout": Field(
            st.sampled_from(("1", "900", "0.5")),
            st.sampled_from(("nan", "inf", "-1", "abc", "", "1e999", "0x10", " 1")),
        ),
    }


SPAWN_WAYS = (
    ("--environment-provider", "--environment-inputs", "--project"),
    ("--environment",),
    ("--parent", "--project"),
)


@st.composite
def spawn_invocations(draw: st.DrawFn, projects: tuple[str, ...]) -> Invocation:
    """`bb thread spawn`: one way of saying where the thread runs, its options well-meant or
    hostile, given as `--opt value` or `--opt=value`, in any order."""
    fields = _option_fields(projects)
    way = draw(st.sampled_from(SPAWN_WAYS))
    common = ("--thread-id", "--host", "--prompt", "--timeout")
    options, clean = [], True
    for name, field in fields.items():
        role = draw(st.integers(0, 11))  # one draw per option: generating a thousand of these is the slow part
        spoiled = role < 3
        expected = name == way[0] or (name in way + common and role >= 8)
        if role == 0:
            expected = not expected  # an option this way does not take, or one it needs left out
        if expected:
            options.append((name, draw(field.hostile if spoiled else field.valid)))
        clean = clean and not spoiled
    flags = [flag for flag in ("--wait", "--json") if draw(st.booleans())]
    return _assembled(draw, ("thread", "spawn"), options, flags, None, clean)


@st.composite
def argument_invocations(draw: st.DrawFn) -> Invocation:
    """`bb environment show|delete|retry ENV_ID` and `bb thread archive|unarchive|cancel T`."""
    command = draw(
        st.sampled_from(
            (
                ("environment", "show"),
                ("environment", "delete"),
                ("environment", "retry"),
                ("thread", "archive"),
                ("thread", "unarchive"),
                ("thread", "cancel"),
            )
        )
    )
    field = environment_ids() if command[0] == "environment" else ids()
    spoiled = draw(st.integers(0, 2)) > 0
    argument = draw(argv_values(field.hostile) if spoiled else field.valid)
    flags = ["--json"] if draw(st.booleans()) else []
    return _assembled(draw, command, [], flags, argument, not spoiled)


def _assembled(
    draw: st.DrawFn,
    command: tuple[str, ...],
    options: list[tuple[str, str]],
    flags: list[str],
    argument: str | None,
    clean: bool,
) -> Invocation:
    words: list[list[str]] = [[name, value] if draw(st.booleans()) else [f"{name}={value}"] for name, value in options]
    words += [[flag] for flag in flags]
    words = draw(st.permutations(words)) if words else words
    args = [*command, *(word for group in words for word in group)]
    if argument is not None:
        # A value that starts with '-' reaches the command only after '--'; before it, it is an option.
        args += ["--", argument] if argument.startswith("-") or draw(st.booleans()) else [argument]
    return Invocation(command, tuple(options), argument, "--json" in flags, clean, tuple(args))


@cache
def noise_invocations() -> SearchStrategy[Invocation]:
    """A real command followed by hostile words: unknown options, options missing their value,
    stray arguments. `--help` and `-h` are left out: help is an answer, not an error."""
    words = argv_values(hostile_text()).filter(lambda word: word not in ("--help", "-h"))
    commands = st.sampled_from((("thread", "spawn"), ("environment", "show"), ("thread", "archive")))
    return st.builds(
        lambda command, tail, as_json: Invocation(
            command, (), None, as_json, False, (*command, *(["--json"] if as_json else []), *tail)
        ),
        commands,
        st.lists(words, min_size=1, max_size=4),
        st.booleans(),
    )


@cache
def cli_invocations(projects: tuple[str, ...]) -> SearchStrategy[Invocation]:
    return st.one_of(
        spawn_invocations(projects), spawn_invocations(projects), argument_invocations(), noise_invocations()
    )
