"""Who the training code runs as. The supervisor keeps the task's user (root in a container
or under a root Nomad client) for its tokens and secrets; the code it starts runs as the
job's code user (`driver.code_user`, "uid:gid", from the cluster profile's `code_users`),
so it can read neither the supervisor's memory and environment nor PID 1's (root's, 0400),
and, on a client it shares, no other team's files or processes.

What the code needs of the supervisor's is handed over to that user: the job's model_dir
(each folder made on the way, 0700), the secret files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nomadtf.errors import SpecError


@dataclass(frozen=True)
class CodeUser:
    uid: int
    gid: int

    @classmethod
    def parse(cls, text: str | None) -> CodeUser | None:
        """"uid:gid" -> CodeUser; None for an empty setting (the code runs as the task's user)."""
        if not text:
            return None
        uid, _, gid = text.partition(":")
        return cls(int(uid), int(gid or uid))

    def popen_kwargs(self) -> dict[str, Any]:
        """subprocess.Popen's arguments that start the process as this user, with no
        supplementary group of the supervisor's (set between fork and exec by CPython's C
        code: no Python runs there, as child.py requires)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def own(self, path: Path) -> None:
        os.chown(path, self.uid, self.gid)

    def make_dirs(self, path: Path) -> None:
        """`path` and its missing parents, each made here owned by the code user, 0700: the
        folders of a job's checkpoints are that job's code's, and no other team's."""
        missing = []
        for folder in (path, *path.parents):
            if folder.exists():
                break
            missing.append(folder)
        for folder in reversed(missing):
            folder.mkdir(mode=0o700, exist_ok=True)
            self.own(folder)


def resolve(setting: str | None, euid: int | None = None) -> CodeUser | None:
    """The code user of `setting`; SpecError when the supervisor could not become it (it
    is not root and runs as another uid)."""
    user = CodeUser.parse(setting)
    euid = os.geteuid() if euid is None else euid
    if user is None or user.uid == euid:
        return None
    if euid != 0:
        raise SpecError(
            f"driver.code_user {setting}: the task runs as uid {euid}, not root, so it cannot start the code as "
            "another user; run the task as root (the image's default user) or remove code_user from the cluster profile"
        )
    return user
