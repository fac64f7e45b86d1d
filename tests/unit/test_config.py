"""Settings from the environment, and what of them may be written down."""

import asyncio

import pytest

from bb_environments.entrypoints.config import (
    ConfigError,
    Settings,
    hook_limits,
    hook_record_sync,
    url_without_credentials,
)
from bb_environments.entrypoints.event_store import event_store_environment
from bb_environments.handlers.application import Environments
from bb_environments.handlers.store import Store
from bb_environments.providers.host.containment import Limits


def test_credentials_in_a_nats_url_are_never_written_down():
    assert url_without_credentials("nats://user:secret@127.0.0.1:4222") == "nats://127.0.0.1:4222"
    assert url_without_credentials("tls://token@nats.example:4443") == "tls://nats.example:4443"
    assert url_without_credentials("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"


@pytest.mark.parametrize("raw, expected", [(None, None), ("0", (0,)), ("250", (250,)), ("null", (None,))])
def test_retire_grace_override(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv("BB_RETIRE_GRACE_MS", raising=False)
    else:
        monkeypatch.setenv("BB_RETIRE_GRACE_MS", raw)
    assert Settings.load("/tmp/bb-config-test").retire_grace_override == expected


def test_the_data_dir_is_taken_absolute_with_home_and_symlinks_resolved(monkeypatch, tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert Settings.load("~/link/bb").data_root == str(tmp_path.resolve() / "real" / "bb")
    assert Settings.load("link/bb/").data_dir == tmp_path.resolve() / "real" / "bb"


def test_a_data_dir_in_a_home_that_cannot_be_found_is_refused(monkeypatch, tmp_path):
    """Not taken as a directory named `~` under wherever the command was started."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="'~no-such-user-here/bb' names a home directory that cannot be found"):
        Settings.load("~no-such-user-here/bb")


def test_a_malformed_setting_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("BB_RETIRE_GRACE_MS", "soon")
    with pytest.raises(ConfigError, match="BB_RETIRE_GRACE_MS"):
        Settings.load("/tmp/bb-config-test")


def test_thread_events_are_kept_a_week_and_a_gibibyte_unless_configured(monkeypatch):
    monkeypatch.delenv("BB_THREADS_MAX_AGE_S", raising=False)
    monkeypatch.delenv("BB_THREADS_MAX_BYTES", raising=False)
    defaults = Settings.load("/tmp/bb-config-test")
    assert (defaults.threads_max_age_s, defaults.threads_max_bytes) == (7 * 24 * 3600, 1 << 30)

    monkeypatch.setenv("BB_THREADS_MAX_AGE_S", "3600")
    monkeypatch.setenv("BB_THREADS_MAX_BYTES", "1048576")
    configured = Settings.load("/tmp/bb-config-test")
    assert (configured.threads_max_age_s, configured.threads_max_bytes) == (3600, 1048576)


def test_hook_records_of_removed_environments_are_kept_a_week_unless_configured(monkeypatch):
    monkeypatch.delenv("BB_REMOVED_RETENTION_S", raising=False)
    assert Settings.load("/tmp/bb-config-test").removed_retention_s == 7 * 24 * 3600
    monkeypatch.setenv("BB_REMOVED_RETENTION_S", "60")
    assert Settings.load("/tmp/bb-config-test").removed_retention_s == 60


def test_saved_work_is_kept_thirty_days_unless_configured(monkeypatch):
    monkeypatch.delenv("BB_SAVED_REF_RETENTION_S", raising=False)
    assert Settings.load("/tmp/bb-config-test").saved_ref_retention_s == 2592000
    monkeypatch.setenv("BB_SAVED_REF_RETENTION_S", "3600")
    assert Settings.load("/tmp/bb-config-test").saved_ref_retention_s == 3600


@pytest.mark.parametrize("name", ["BB_THREADS_MAX_AGE_S", "BB_REMOVED_RETENTION_S", "BB_SAVED_REF_RETENTION_S"])
@pytest.mark.parametrize("raw", ["0", "-1", "inf", "a week"])
def test_a_retention_limit_must_be_one(monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ConfigError, match=name):
        Settings.load("/tmp/bb-config-test")


def test_an_environments_hooks_may_have_4096_processes_and_8_gib_unless_configured(monkeypatch):
    monkeypatch.delenv("BB_MAX_PIDS_PER_ENVIRONMENT", raising=False)
    monkeypatch.delenv("BB_MAX_MEMORY_PER_ENVIRONMENT", raising=False)
    assert hook_limits(Settings.load("/tmp/bb-config-test")) == Limits(4096, 8 << 30)
    monkeypatch.setenv("BB_MAX_PIDS_PER_ENVIRONMENT", "100")
    monkeypatch.setenv("BB_MAX_MEMORY_PER_ENVIRONMENT", str(1 << 30))
    assert hook_limits(Settings.load("/tmp/bb-config-test")) == Limits(100, 1 << 30)


def test_saved_work_keeps_files_up_to_ten_mebibytes_unless_configured(monkeypatch):
    monkeypatch.delenv("BB_SAVED_WORK_MAX_BYTES", raising=False)
    assert Settings.load("/tmp/bb-config-test").saved_work_max_bytes == 10 << 20
    monkeypatch.setenv("BB_SAVED_WORK_MAX_BYTES", "1000")
    assert Settings.load("/tmp/bb-config-test").saved_work_max_bytes == 1000


def test_workspaces_are_measured_every_ten_minutes_without_a_budget_unless_configured(monkeypatch):
    monkeypatch.delenv("BB_DISK_SCAN_INTERVAL_S", raising=False)
    monkeypatch.delenv("BB_MAX_DISK_BYTES_PER_PROJECT", raising=False)
    settings = Settings.load("/tmp/bb-config-test")
    assert (settings.disk_scan_interval_s, settings.max_disk_bytes_per_project) == (600, None)
    monkeypatch.setenv("BB_DISK_SCAN_INTERVAL_S", "1.5")
    monkeypatch.setenv("BB_MAX_DISK_BYTES_PER_PROJECT", str(20 << 30))
    settings = Settings.load("/tmp/bb-config-test")
    assert (settings.disk_scan_interval_s, settings.max_disk_bytes_per_project) == (1.5, 20 << 30)


@pytest.mark.parametrize("raw", ["0", "-5", "a while"])
def test_a_disk_scan_interval_must_be_one(monkeypatch, raw):
    monkeypatch.setenv("BB_DISK_SCAN_INTERVAL_S", raw)
    with pytest.raises(ConfigError, match="^BB_DISK_SCAN_INTERVAL_S must be a number of seconds greater than 0"):
        Settings.load("/tmp/bb-config-test")


@pytest.mark.parametrize(
    ("name", "raw", "allowed"),
    [
        ("BB_MAX_PIDS_PER_ENVIRONMENT", "15", "a number of processes, at least 16"),
        ("BB_MAX_PIDS_PER_ENVIRONMENT", "many", "a number of processes, at least 16"),
        ("BB_MAX_MEMORY_PER_ENVIRONMENT", "8G", "a number of bytes, at least 67108864"),
        ("BB_MAX_MEMORY_PER_ENVIRONMENT", "-1", "a number of bytes, at least 67108864"),
        ("BB_SAVED_WORK_MAX_BYTES", "0", "a number of bytes greater than 0"),
        ("BB_SAVED_WORK_MAX_BYTES", "10M", "a number of bytes greater than 0"),
        ("BB_MAX_DISK_BYTES_PER_PROJECT", "0", "a whole number greater than 0"),
        ("BB_MAX_DISK_BYTES_PER_PROJECT", "20G", "a whole number greater than 0"),
    ],
)
def test_a_limit_that_cannot_be_held_is_refused_naming_what_is_allowed(monkeypatch, name, raw, allowed):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ConfigError, match=f"^{name} '{raw}' is not allowed: use {allowed}$"):
        Settings.load("/tmp/bb-config-test")


@pytest.mark.parametrize("raw, synced", [(None, False), ("normal", False), ("FULL", True)])
async def test_the_event_store_fsyncs_a_batch_of_commits_only_when_asked(monkeypatch, tmp_path, fsynced, raw, synced):
    """`normal` survives a kill -9 without an fsync; `full` survives power loss too, with one fsync
    of the write-ahead log per batch of commands rather than one per commit."""
    if raw is None:
        monkeypatch.delenv("BB_EVENT_STORE_SYNC", raising=False)
    else:
        monkeypatch.setenv("BB_EVENT_STORE_SYNC", raw)
    store = Store(Environments(env=event_store_environment(f"sqlite:///{tmp_path / 'events.sqlite'}")))
    try:
        await asyncio.gather(
            *(store.run(store.app.register_thread, f"t{i}", None, None, "local", None) for i in range(50))
        )
        with store.app.recorder.datastore.transaction(commit=False) as cursor:
            cursor.execute("PRAGMA synchronous")
            assert cursor.fetchone()[0] == 1  # NORMAL: a commit does not wait for the disk itself
    finally:
        store.close()
    write_ahead_log = str(tmp_path / "events.sqlite-wal")
    assert all(path == write_ahead_log for path in fsynced)
    if synced:
        assert 1 <= len(fsynced) < 50
    else:
        assert fsynced == []


@pytest.mark.parametrize("raw, level", [(None, "normal"), ("normal", "normal"), (" Full ", "full")])
def test_the_hook_record_sync_level_defaults_to_normal(monkeypatch, raw, level):
    if raw is None:
        monkeypatch.delenv("BB_HOOK_RECORD_SYNC", raising=False)
    else:
        monkeypatch.setenv("BB_HOOK_RECORD_SYNC", raw)
    assert hook_record_sync() == level


def test_an_unknown_hook_record_sync_level_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("BB_HOOK_RECORD_SYNC", "always")
    with pytest.raises(ConfigError, match="BB_HOOK_RECORD_SYNC 'always' is not allowed: use normal or full"):
        hook_record_sync()


def test_an_unknown_event_store_sync_level_is_refused_by_name(monkeypatch, tmp_path):
    monkeypatch.setenv("BB_EVENT_STORE_SYNC", "off")
    with pytest.raises(ConfigError, match="BB_EVENT_STORE_SYNC 'off' is not allowed: use normal or full"):
        event_store_environment(f"sqlite:///{tmp_path / 'events.sqlite'}")


def test_the_nats_port_is_the_flag_s_else_the_variable_s_else_left_to_the_data_dir(monkeypatch):
    monkeypatch.delenv("BB_NATS_PORT", raising=False)
    assert Settings.load("/tmp/bb-config-test").nats_port is None
    monkeypatch.setenv("BB_NATS_PORT", "")
    assert Settings.load("/tmp/bb-config-test").nats_port is None
    monkeypatch.setenv("BB_NATS_PORT", "4222")
    assert Settings.load("/tmp/bb-config-test").nats_port == 4222
    assert Settings.load("/tmp/bb-config-test", nats_port="65535").nats_port == 65535
    with pytest.raises(ConfigError, match=r"^--nats-port '' is not allowed: use a port number from 1 to 65535$"):
        Settings.load("/tmp/bb-config-test", nats_port="")


def test_the_default_host_is_none_unless_set_and_a_malformed_one_is_refused_by_name(monkeypatch):
    monkeypatch.delenv("BB_DEFAULT_HOST", raising=False)
    assert Settings.load("/tmp/bb-config-test").default_host is None
    monkeypatch.setenv("BB_DEFAULT_HOST", "build-1")
    assert Settings.load("/tmp/bb-config-test").default_host == "build-1"
    monkeypatch.setenv("BB_DEFAULT_HOST", "a/b")
    with pytest.raises(ConfigError, match="BB_DEFAULT_HOST"):
        Settings.load("/tmp/bb-config-test")
