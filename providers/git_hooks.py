"""BB_GIT_HOOKS, read where the providers' git commands and the settings both need it, without
loading what running git needs (a `bb` command that only sends a request reads the settings)."""

from __future__ import annotations

import os

GIT_HOOKS_MODES = ("off", "run")


def git_hooks_mode() -> str:
    """BB_GIT_HOOKS: `off` (the default) or `run`; ValueError naming what is allowed otherwise.

    Either way our git commands run with the repository's hooks off. With `run`, a checkout that
    git would have followed with the repository's post-checkout hook leaves that hook owed to the
    workspace's setup, whose supervisor runs it before the setup script (hooks/supervisor.py), so
    it gets a setup's timeout, transcript, containment and user, which a hook run by our git
    inside the provider's call could not have."""
    raw = (os.environ.get("BB_GIT_HOOKS") or "off").strip().lower()
    if raw not in GIT_HOOKS_MODES:
        raise ValueError(f"BB_GIT_HOOKS {raw!r} is not allowed: use {' or '.join(GIT_HOOKS_MODES)}")
    return raw
