"""`bb console` (SPEC §12), against a real `bb serve` and nats-server: plain HTTP for the token, and
Debian's chromium driven by Playwright for what an operator sees, live. The browser tests write
each page's screenshot into docs/, so that the pictures there show the console as it is."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.async_api import BrowserContext, async_playwright, expect

from tests.integration.conftest import Service, write_hooks

DOCS = Path(__file__).resolve().parents[2] / "docs"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (`apt-get install chromium`; .ci/run does)"
)
# What lets chromium run here as root, in a container, without reaching out to the network.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LIVE_S = 30_000
"""How long (ms) the page has to show what happened, without a reload."""


@dataclass
class Console:
    url: str
    process: asyncio.subprocess.Process

    @property
    def base(self) -> str:
        return self.url.split("/?", 1)[0]

    @property
    def token(self) -> str:
        return self.url.rsplit("token=", 1)[1]


@pytest.fixture
async def console(service: Service) -> AsyncIterator[Console]:
    process = await asyncio.create_subprocess_exec(
        *service.cli(),
        "console",
        "--json",
        env=service.environment,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        first = await asyncio.wait_for(process.stdout.readline(), 60)
        assert first, f"bb console printed nothing: {(await process.stderr.read()).decode()}"
        announced = json.loads(first)
        assert urlsplit(announced["url"]).hostname == "127.0.0.1"
        yield Console(announced["url"], process)
    finally:
        with contextlib.suppress(ProcessLookupError):  # a test stopped it already
            os.killpg(process.pid, signal.SIGTERM)
        await process.wait()


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[BrowserContext]:
    async with async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            tmp_path / "chromium-profile",
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 800},
        )
        try:
            yield context
        finally:
            await context.close()


def get(console: Console, path: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    address = urlsplit(console.base)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
    connection.request("GET", path, headers=headers or {})
    return connection.getresponse()


async def test_without_the_token_every_page_and_feed_answers_401(service: Service, console: Console):
    for path in ("/", "/live/fleet", "/environments/0000", "/live/environments/0000", "/static/console.js"):
        for headers in ({}, {"Authorization": "Bearer not-the-token"}, {"Cookie": "bb-console-1=not-the-token"}):
            answer = await asyncio.to_thread(get, console, path, headers)
            assert answer.status == 401, (path, headers)
        assert (await asyncio.to_thread(get, console, path + "?token=" + console.token[:-1] + "x")).status == 401

    # The token in the URL is traded for a cookie, and the browser sent on without it in the address.
    welcomed = await asyncio.to_thread(get, console, "/?token=" + console.token)
    assert welcomed.status == 303 and welcomed.getheader("Location") == "/"
    cookie = welcomed.getheader("Set-Cookie").split(";", 1)[0]
    assert "HttpOnly" in welcomed.getheader("Set-Cookie")
    page = await asyncio.to_thread(get, console, "/", {"Cookie": cookie})
    assert page.status == 200 and "Environments" in page.read().decode()
    assert (await asyncio.to_thread(get, console, "/", {"Authorization": f"Bearer {console.token}"})).status == 200

    os.killpg(console.process.pid, signal.SIGTERM)
    logged = (await console.process.stderr.read()).decode()
    assert console.token not in logged


@needs_chromium
async def test_the_fleet_shows_a_spawned_thread_live(
    service: Service, console: Console, browser: BrowserContext, git_repo: Path, tmp_path: Path
):
    page = await browser.new_page()
    await page.goto(console.url)
    assert "token" not in page.url
    await expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_S)
    await expect(page.locator("#environments")).to_contain_text("No environments.")

    write_hooks(git_repo, tmp_path / "marker")
    spawned = await service.bb(
        "thread", "spawn", "--environment-provider", "git-worktree", "--project", str(git_repo), "--thread-id", "t1",
        "--json",
    )  # fmt: skip
    assert spawned.returncode == 0, spawned.stderr
    environment_id = spawned.json()["environmentId"]

    row = page.locator("#environments tr", has_text=environment_id)
    await expect(row).to_be_visible(timeout=LIVE_S)
    await expect(row.locator('[data-label="Status"]')).to_have_text("ready", timeout=LIVE_S)
    await expect(row.locator('[data-label="Threads"]')).to_have_text("t1")
    await expect(row.locator('[data-label="Host"]')).to_have_text("local")
    await expect(row.locator('[data-label="Disk"]')).not_to_be_empty()
    await expect(page.locator("#hosts")).to_contain_text("online")
    await expect(page.locator("#replicas")).to_contain_text("online")

    # Filtering by status hides what does not match; the filter's choices are what the rows hold.
    await page.select_option("#filter-status", "ready")
    await expect(row).to_be_visible()
    await page.select_option("#filter-project", str(git_repo))
    await expect(row).to_be_visible()
    await page.select_option("#filter-status", "")
    await page.select_option("#filter-project", "")
    await page.screenshot(path=DOCS / "console-fleet.png", full_page=True)

    await _on_a_phone(browser, console.base + "/", DOCS / "console-phone.png")


@needs_chromium
async def test_an_environments_page_shows_its_timeline_and_transcript_as_they_grow(
    service: Service, console: Console, browser: BrowserContext, git_repo: Path, tmp_path: Path
):
    hold = tmp_path / "hold"
    hold.touch()
    write_hooks(
        git_repo, tmp_path / "marker", setup=f"echo installing dependencies\nwhile [ -e {hold} ]; do sleep 0.05; done"
    )
    spawned = await service.bb(
        "thread", "spawn", "--environment-provider", "git-worktree", "--project", str(git_repo), "--thread-id", "t1",
        "--json",
    )  # fmt: skip
    assert spawned.returncode == 0, spawned.stderr
    environment_id = spawned.json()["environmentId"]

    page = await browser.new_page()
    await page.goto(console.url)
    await page.click(f"a[href='/environments/{environment_id}']")
    transcript = page.locator("#transcript")
    await expect(transcript).to_contain_text("installing dependencies", timeout=LIVE_S)
    timeline = page.locator("#timeline")
    await expect(timeline.locator("li.hook.running")).to_contain_text("setup hook", timeout=LIVE_S)
    await expect(timeline.locator("li.event[data-type=setup_started]")).to_contain_text("so far")

    hold.unlink()  # the setup ends: the page follows without a reload
    await expect(page.locator("#headline")).to_contain_text("ready", timeout=LIVE_S)
    await expect(timeline.locator("li.event[data-type=ready]")).to_be_visible(timeout=LIVE_S)
    await expect(timeline.locator("li.hook.done")).to_contain_text("setup hook")
    await expect(transcript).to_contain_text(".bb-env-setup.sh finished")
    shown = [await item.get_attribute("data-type") for item in await timeline.locator("li.event").all()]
    assert shown[0] == "claimed" and shown[-1] == "ready" and "setup_succeeded" in shown
    facts = page.locator("#facts")
    for fact in ("git-worktree", "t1", str(git_repo)):
        await expect(facts).to_contain_text(fact)
    await expect(facts.locator("dt:has-text('Ports') + dd")).to_have_text(_port_block())
    await page.screenshot(path=DOCS / "console-environment.png", full_page=True)

    await _on_a_phone(browser, page.url, DOCS / "console-environment-phone.png")


async def _on_a_phone(browser: BrowserContext, address: str, screenshot: Path) -> None:
    """The page reads at a phone's width: nothing wider than the screen."""
    phone = await browser.new_page()
    await phone.set_viewport_size({"width": 390, "height": 844})
    await phone.goto(address)
    await expect(phone.locator("#live-state")).to_have_text("live", timeout=LIVE_S)
    assert await phone.evaluate("document.documentElement.scrollWidth") <= 390
    await phone.screenshot(path=screenshot, full_page=True)
    await phone.close()


def _port_block() -> re.Pattern[str]:
    return re.compile(r"^\d+-\d+$")


@needs_chromium
async def test_the_page_says_when_the_service_is_away_and_catches_up_once_it_is_back(
    service: Service, console: Console, browser: BrowserContext, git_repo: Path, tmp_path: Path
):
    page = await browser.new_page()
    await page.goto(console.url)
    await expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_S)
    problem = page.locator("#problem")
    await expect(problem).to_be_hidden()

    await service.stop()
    await expect(problem).to_contain_text("unreachable", timeout=LIVE_S)

    await service.start()
    write_hooks(git_repo, tmp_path / "marker")
    spawned = await service.bb(
        "thread", "spawn", "--environment-provider", "git-worktree", "--project", str(git_repo), "--json",
    )  # fmt: skip
    assert spawned.returncode == 0, spawned.stderr
    await expect(page.locator("#environments")).to_contain_text(spawned.json()["environmentId"], timeout=LIVE_S)
    await expect(problem).to_be_hidden()
