"""Who the code runs as: parsed from driver.code_user, refused where the supervisor could not
become it, and the folders it is handed are its own."""

from __future__ import annotations

import os
import subprocess

import pytest

from nomadtf.errors import SpecError
from nomadtf.runtime.codeuser import CodeUser, resolve


def test_a_code_user_is_uid_and_gid_and_none_runs_the_code_as_the_task():
    assert CodeUser.parse("10001:20002") == CodeUser(10001, 20002)
    assert CodeUser.parse("10001") == CodeUser(10001, 10001)
    assert resolve(None, euid=0) is None and resolve("", euid=0) is None
    assert resolve("1000:1000", euid=1000) is None  # already that user: nothing to change
    assert resolve("65534:65534", euid=0) == CodeUser(65534, 65534)


def test_a_supervisor_that_is_not_root_says_it_cannot_become_the_code_user():
    with pytest.raises(SpecError, match=r"driver.code_user 65534:65534: the task runs as uid 1000, not root.*run the task as root"):
        resolve("65534:65534", euid=1000)


def test_the_code_user_owns_the_folders_made_for_it_and_runs_as_itself(tmp_path):
    assert os.geteuid() == 0, "run the tests as root (as CI and scripts/setup do): only root may hand a folder to another uid"
    tmp_path.chmod(0o755)
    user = CodeUser(65534, 65534)
    target = tmp_path / "team-a" / "job" / "run"
    (tmp_path / "team-a").mkdir()
    user.make_dirs(target)
    assert (tmp_path / "team-a").stat().st_uid == 0  # it was there: not the code's
    for folder in (tmp_path / "team-a" / "job", target):
        assert (folder.stat().st_uid, folder.stat().st_gid, folder.stat().st_mode & 0o777) == (65534, 65534, 0o700)
    out = subprocess.run(["/bin/sh", "-c", "id -u; id -g; id -G"], capture_output=True, text=True, cwd="/", **user.popen_kwargs())
    assert out.stdout.split() == ["65534", "65534", "65534"], out  # no supplementary group of ours
