"""The user that owns an agent's workspaces and runs their hooks (BB_WORKSPACE_USER, SPEC 9).

The agent's own user keeps its credentials, stores and state to itself (the data dir is 0700);
a hook runs as another user, so it can read none of them. That user owns each workspace its
agent creates (`hand_over`), so its own git commands work there: git trusts a worktree whose
directory, `.git` file and admin dir (in the project's `.git/worktrees/`) are the user's. bb's own
git commands need the same of the agent's user, so removal takes those three back first
(`take_back`), once the environment's processes have ended.

The workspaces live below the data dir, so the user must pass through it: the service then
creates everything with umask 077 (entrypoints/serve.py), and the data dir and each directory on
the way to a workspace (and to its admin dir) let the user's group pass, nothing more (0710:
`open_data_dir`, `hand_over`). So the user can reach a file of the service's only by name, and
none is readable to it.

Standard library only: the hook supervisor, run without site-packages, imports `WorkspaceUser`.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WorkspaceUser:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @classmethod
    def named(cls, name: str) -> WorkspaceUser:
        """The user by its name, or ValueError saying there is none."""
        import pwd

        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise ValueError(f"BB_WORKSPACE_USER {name!r} names no user on this machine") from None
        if entry.pw_uid == 0:
            raise ValueError(f"BB_WORKSPACE_USER {name!r} is root: name an unprivileged user")
        return cls(
            entry.pw_name, entry.pw_uid, entry.pw_gid, tuple(os.getgrouplist(entry.pw_name, entry.pw_gid)), entry.pw_dir
        )

    def hook_environment(self) -> dict[str, str]:
        """What a hook's environment says of the user it runs as, as a login would."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}

    def hand_over(self, workspace: Path, project: str | None, data_dir: Path) -> None:
        """Make the user own the new workspace and its git admin dir, and able to reach them from
        the data dir and the project. Blocking.

        Run right after the provider made it, before any hook: what its `.git` says is still git's.
        Symbolic links are changed themselves, never followed.
        """
        roots = [workspace]
        admin_dir = _git_admin_dir(workspace)
        if admin_dir is not None and project is not None and _is_admin_dir_of(admin_dir, project):
            roots.append(admin_dir)
            self._let_pass(admin_dir.parent)
        for passage in reversed(workspace.parents):
            if passage.is_relative_to(data_dir) and passage != data_dir:
                self._let_pass(passage)
        for root in roots:
            os.chown(root, self.uid, self.gid, follow_symlinks=False)
            for directory, dirs, files in os.walk(root):
                for name in dirs + files:
                    os.chown(os.path.join(directory, name), self.uid, self.gid, follow_symlinks=False)

    def take_back(self, workspace: Path, project: str | None) -> None:
        """Give the workspace, its `.git` and its git admin dir back to this process's user, so
        that bb's own git trusts them. Blocking; only what the user owns, and an admin dir only
        inside the project's `.git/worktrees/`: the user may have rewritten `.git` since."""
        owner = os.getuid(), os.getgid()
        candidates = [workspace, workspace / ".git"]
        admin_dir = _git_admin_dir(workspace)
        if admin_dir is not None and project is not None and _is_admin_dir_of(admin_dir, project):
            candidates.append(admin_dir)
        for path in candidates:
            try:
                if os.lstat(path).st_uid == self.uid:
                    os.chown(path, *owner, follow_symlinks=False)
            except FileNotFoundError:
                continue

    def open_data_dir(self, data_dir: Path) -> None:
        """Let the user's group pass through the data dir (0710) to the workspaces below it."""
        os.chown(data_dir, -1, self.gid)
        os.chmod(data_dir, stat.S_IRWXU | stat.S_IXGRP)

    def _let_pass(self, directory: Path) -> None:
        """The user's group may pass through `directory`, as it may through the data dir; one the
        user can pass already (made before umask 077, say) is left as it is."""
        info = os.stat(directory)
        if info.st_mode & stat.S_IXOTH or (info.st_gid == self.gid and info.st_mode & stat.S_IXGRP):
            return
        os.chown(directory, -1, self.gid)
        os.chmod(directory, stat.S_IMODE(info.st_mode) | stat.S_IXGRP)


def _git_admin_dir(workspace: Path) -> Path | None:
    """The admin dir a worktree's `.git` file names (`gitdir: PATH`), if it is such a file."""
    dot_git = workspace / ".git"
    try:
        if not stat.S_ISREG(os.lstat(dot_git).st_mode):
            return None
        first = dot_git.read_text(errors="replace").splitlines()[:1]
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not first or not first[0].startswith("gitdir: "):
        return None
    named = Path(first[0].removeprefix("gitdir: "))
    return Path(os.path.realpath(named if named.is_absolute() else workspace / named))


def _is_admin_dir_of(admin_dir: Path, project: str) -> bool:
    worktrees = Path(os.path.realpath(project)) / ".git" / "worktrees"
    return admin_dir.parent == worktrees
