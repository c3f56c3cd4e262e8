"""Typer's rule for these docs: every `nomadtf` command shown in a code block of README.md or
docs/ is run by a test.

`shown_commands()` finds them: each `nomadtf …` invocation on a line of a shell code block
(continuations joined, comments dropped; inside `eval "$(…)"` and `ssh -c '…'` too). Each
must match exactly one pattern below:

- OFFLINE: needs no server; tests/unit/test_docs.py runs it in process.
- ON_STACK: needs the shared local stack and changes nothing on it; tests/stack/test_docs.py
  runs it in process.
- RUN_BY: starts or stops jobs, stacks or VMs, or needs the several-client stack; the named
  test (`path::function`) runs it, so it is not run twice. The test runs the docs' own text:
  it gets the command from `shown_argv(pattern)` (or `shown_argvs`), never types it again, so
  a changed doc changes what is tested (RUN_ELSEWHERE: the few that cannot, and why).

A command that matches none, a pattern that matches no command, and a named test that does
not exist all fail tests/unit/test_docs.py.

Usage:
    for shown in shown_commands():
        kind, target = classify(shown)     # ("offline", None) / ("on_stack", None) / ("run_by", "tests/…::test_…")
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from tests.helpers import EXAMPLES, REPO

DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SHELL_FENCES = {"bash", "sh", "shell", "console"}

# The exit codes a shown command may end with (default: 0 only).
OFFLINE: dict[str, set[int]] = {
    r"nomadtf( [a-z-]+)* --help": {0},
    r"nomadtf render examples/\S+( --var \S+| --tf-config| --nomad-version \S+)*": {0},
    r"nomadtf validate examples/\S+": {0},  # with Nomad out of reach: the schema and the cross-field rules
    r"nomadtf convert-dcos examples/dcos/options.json( --out \S+)?": {0},
    r"nomadtf acl policies examples/\S+( --nomad-version \S+)?( --allow-policy \S+)?": {0},
    r"nomadtf dev config (server|client)( --\S+( [^-]\S*)?)*": {0},
}
ON_STACK: dict[str, set[int]] = {
    r"nomadtf status": {0},
    r"nomadtf plan examples/\S+": {0, 1},  # 1: the job would change (it is new); placement is asserted apart
    r"nomadtf dev status": {0},
    r"nomadtf dev env": {0},
    r"nomadtf admission status": {0},
    r"nomadtf admission policy show": {0},
    r"nomadtf usage( --since \S+| --namespace \S+| --csv| --json)*": {0},
}
# Each shown command that starts or stops something, and the existing test that runs it.
RUN_BY: dict[str, str] = {
    # `bash scripts/example` runs these three as written (and `--var name=digits-<time>`).
    r"nomadtf dev up": "tests/stack/test_docs.py::test_the_readme_example_command_trains_the_example",
    r"nomadtf run examples/digits/job.json --var entrypoint.workdir=\$PWD/examples/digits":
        "tests/stack/test_docs.py::test_the_readme_example_command_trains_the_example",
    r"nomadtf run examples/digits/job-mwms.json --var entrypoint.workdir=\$PWD/examples/digits":
        "tests/stack/test_run.py::test_multi_worker_mirrored_example_trains_and_completes",
    r"nomadtf run examples/data-service/job.json --var entrypoint.workdir=\$PWD/examples/data-service":
        "tests/stack/test_data_service.py::test_the_data_service_example_trains_through_the_service_to_the_end",
    r"nomadtf run examples/legacy/job.json --var entrypoint.workdir=\$PWD/examples/digits":
        "tests/stack/test_run.py::test_legacy_server_main_gets_the_server_and_context",
    r"nomadtf run examples/jax/job.json --var entrypoint.workdir=\$PWD/examples/jax":
        "tests/stack/test_jax.py::test_keras_on_jax_trains_on_two_processes",
    # Run as commands on the session's stack, which has this shape: already up, nothing restarted.
    r"nomadtf dev up --gpus 6( --mig 2)?( --docker)?":
        "tests/stack/test_devstack.py::test_dev_up_as_the_docs_show_it_finds_the_running_stack_and_leaves_it_alone",
    r"nomadtf dev up --docker":
        "tests/stack/test_devstack.py::test_dev_up_as_the_docs_show_it_finds_the_running_stack_and_leaves_it_alone",
    # Docker: the image the docs show built, found again, and a second TensorFlow version.
    r"nomadtf dev image build":
        "tests/stack/test_docker.py::test_dev_image_build_prints_the_image_on_its_last_line_and_reuses_the_cached_build",
    r"nomadtf dev image build --tf 2\.20\.0":
        "tests/stack/test_docker.py::test_two_tensorflow_versions_as_two_images_train_side_by_side",
    r"nomadtf run examples/docker/job\.json":
        "tests/stack/test_docker.py::test_the_docker_example_trains_with_every_task_in_a_container_of_its_memory",
    r"nomadtf dev down": "tests/stack/test_devstack.py::test_down_leaves_no_process_and_up_comes_back",
    r"nomadtf admission policy (set examples/sharing/policy\.json|clear)":
        "tests/stack/test_fair_sharing.py::test_the_documented_policy_is_stored_shown_applied_and_cleared",
    r"nomadtf dev binaries": "tests/unit/devstack/test_vagrant.py::test_dev_binaries_finds_what_dev_up_uses",
    r"nomadtf status digits": "tests/stack/test_run.py::test_parameter_server_example_trains_to_the_end",
    r"nomadtf logs digits --role chief": "tests/stack/test_run.py::test_parameter_server_example_trains_to_the_end",
    r"nomadtf logs digits --role chief --follow": "tests/stack/test_run.py::test_logs_follow_streams_until_the_task_ends",
    r"nomadtf logs digits --role worker --index 1 --stderr": "tests/stack/test_run.py::test_all_workers_success_waits_for_the_last_worker",
    r"nomadtf scale digits worker=3": "tests/stack/test_run.py::test_scale_resizes_the_workers_and_restarts_the_chief_once_per_change",
    r"nomadtf stop digits": "tests/stack/test_run.py::test_detach_returns_at_once_and_stop_stops_only_that_job",
    r"nomadtf stop digits --purge": "tests/stack/test_run.py::test_moving_a_parameter_server_rebuilds_the_chiefs_tf_config",
    r"nomadtf dev up --clients 3 --gpus 2 --gpu-clients 3 --secure":
        "tests/stack/test_multiclient.py::test_dev_cli_up_with_gpu_clients_finds_the_cluster_and_status_shows_its_gpus",
    r"nomadtf dev status --cluster":
        "tests/stack/test_multiclient.py::test_dev_cli_up_with_gpu_clients_finds_the_cluster_and_status_shows_its_gpus",
    r"nomadtf dev up --clients 3 --secure": "tests/stack/test_multiclient.py::test_dev_cli_sees_the_cluster",
    r"nomadtf dev env --cluster": "tests/stack/test_multiclient.py::test_dev_cli_sees_the_cluster",
    # The secure stack's steps: the cluster profile once, acl apply, then the secrets example
    # as it is, with the profile in the secure stack's real Consul KV.
    r"nomadtf acl profile cluster-profile.json":
        "tests/stack/test_profile.py::test_the_secrets_example_runs_unchanged_on_the_secure_stack",
    r"nomadtf acl apply examples/secrets/job.json":
        "tests/stack/test_profile.py::test_the_secrets_example_runs_unchanged_on_the_secure_stack",
    r"nomadtf run examples/secrets/job.json --var entrypoint.workdir=\$PWD/examples/digits":
        "tests/stack/test_profile.py::test_the_secrets_example_runs_unchanged_on_the_secure_stack",
    # Two teams' runs of one job.json at once: both succeed, one after the other.
    r"nomadtf run job.json --var namespace=team-[ab]":
        "tests/stack/test_queueing.py::test_two_teams_at_once_both_succeed_one_after_the_other_and_the_second_says_why_it_waited",
    r"nomadtf admission deploy": "tests/stack/test_queueing.py::test_a_run_not_placed_whole_is_given_back_and_requeued_then_succeeds_without_its_submitter",
    # Inside a Vagrant VM. No VM can run here (no hypervisor): the test validates the
    # Vagrantfile, and its neighbours the configs the VMs are provisioned with.
    r"/opt/nomadtf/venv/bin/nomadtf run examples/digits/job.json( --var \S+)+":
        "tests/unit/devstack/test_vagrant.py::test_vagrant_validates_the_vagrantfile",
}

# RUN_BY commands whose test cannot take them from shown_argv, and how the docs' text is
# still the one run.
RUN_ELSEWHERE: dict[str, str] = {
    r"nomadtf dev up": "bash scripts/example runs it; tests/unit/test_docs.py checks the script's commands are the docs'",
    r"nomadtf run examples/digits/job.json --var entrypoint.workdir=\$PWD/examples/digits":
        "bash scripts/example runs it; tests/unit/test_docs.py checks the script's commands are the docs'",
    r"/opt/nomadtf/venv/bin/nomadtf run examples/digits/job.json( --var \S+)+": "inside a Vagrant VM: no hypervisor here",
}

SHELL_OPERATORS = {"&&", "||", ";", "|"}


@dataclass(frozen=True)
class Shown:
    """One `nomadtf` invocation as a doc shows it."""

    argv: tuple[str, ...]  # from `nomadtf` on, shell quoting removed, `$VARS` kept as written
    where: str  # "docs/guide/runs.md:12"

    @property
    def text(self) -> str:
        return " ".join(self.argv)


def shell_lines(text: str) -> list[tuple[int, str]]:
    """(line number, logical line) of every shell code block: continuations joined,
    blank lines and whole-line comments left out."""
    out: list[tuple[int, str]] = []
    fence = None
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        marker = re.match(r"^\s*(```+|~~~+)\s*([\w-]*)", line)
        if marker and fence is None:
            fence = (marker.group(1), marker.group(2).lower())
            continue
        if marker and fence is not None and line.strip().startswith(fence[0]):
            fence = None
            continue
        if fence is None or fence[1] not in SHELL_FENCES:
            continue
        if not pending:
            start = number
        body = re.sub(r"^\s*\$ ", "", line) if not pending else line
        if body.rstrip().endswith("\\"):
            pending += body.rstrip()[:-1] + " "
            continue
        logical = (pending + body).strip()
        pending = ""
        if logical and not logical.startswith("#"):
            out.append((start, logical))
    return out


def invocations(tokens: list[str]) -> list[tuple[str, ...]]:
    """The `nomadtf` invocations in one shell line's tokens, also those inside `$(…)` and
    inside a quoted command string (`ssh -c '…'`, `bash -c "…"`)."""
    found: list[tuple[str, ...]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        at_command = i == 0 or tokens[i - 1] in SHELL_OPERATORS
        if at_command and Path(token).name == "nomadtf":
            end = i + 1
            while end < len(tokens) and tokens[end] not in SHELL_OPERATORS:
                end += 1
            found.append(tuple(tokens[i:end]))
            i = end
            continue
        inner = re.fullmatch(r"\$\((.*)\)", token, flags=re.S)
        if inner:
            found += invocations(shlex.split(inner.group(1)))
        elif " " in token and "nomadtf " in token:
            found += invocations(shlex.split(token))
        i += 1
    return found


def shown_commands(files: list[Path] = DOC_FILES, root: Path = REPO) -> list[Shown]:
    shown = []
    for path in files:
        for number, line in shell_lines(path.read_text()):
            for argv in invocations(shlex.split(line, comments=True)):
                shown.append(Shown(argv, f"{path.relative_to(root)}:{number}"))
    return shown


def shown_argvs(pattern: str) -> list[list[str]]:
    """Every distinct command the docs show that `pattern` (a RUN_BY key) matches, as the
    arguments after `nomadtf`, ready to run from anywhere: `$PWD` (the docs run from the
    repository's root) expanded to it, and a relative path that exists there made absolute."""
    assert pattern in RUN_BY, f"{pattern!r} is not a RUN_BY pattern (tests/docs_commands.py)"
    found: list[list[str]] = []
    for shown in shown_commands():
        if not re.fullmatch(pattern, shown.text):
            continue
        argv = [_from_root(arg) for arg in shown.argv[1:]]
        if argv not in found:
            found.append(argv)
    assert found, f"no command in the docs matches {pattern!r}"
    return found


def shown_argv(pattern: str, names: dict[str, str] | None = None) -> list[str]:
    """The one command the docs show that `pattern` (a RUN_BY key) matches (shown_argvs), with
    `names` swapping whole arguments the docs name for the test's own: a job `digits` becomes
    the test's `digits-ab12cd`."""
    variants = shown_argvs(pattern)
    assert len(variants) == 1, f"the docs show {len(variants)} commands for {pattern!r}: use shown_argvs"
    return [(names or {}).get(arg, arg) for arg in variants[0]]


def _from_root(arg: str) -> str:
    arg = arg.replace("$PWD", str(REPO)).replace("${PWD}", str(REPO))
    if not arg.startswith("-") and "/" in arg and "=" not in arg and (REPO / arg).exists():
        return str(REPO / arg)
    return arg


def runs_the_docs_text(test_id: str, pattern: str) -> bool:
    """Whether the test `test_id` gets `pattern`'s command from shown_argv/shown_argvs: a call
    with that pattern in the test function (its decorators too) or in a function of the same
    module that it calls, or the pattern handed to such a function that asks the docs."""
    path, _, name = test_id.partition("::")
    tree = ast.parse((REPO / path).read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    test = functions.get(name.split("[")[0])
    if test is None:
        return False

    def calls(function: ast.FunctionDef) -> list[ast.Call]:
        return [node for node in ast.walk(function) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]

    def gives_pattern(call: ast.Call) -> bool:
        return any(isinstance(arg, ast.Constant) and arg.value == pattern for arg in call.args)

    def asks_the_docs(function: ast.FunctionDef) -> bool:
        return any(call.func.id in ("shown_argv", "shown_argvs") for call in calls(function))

    helpers = [functions[call.func.id] for call in calls(test) if call.func.id in functions]
    for function in [test, *helpers]:
        for call in calls(function):
            if call.func.id in ("shown_argv", "shown_argvs") and gives_pattern(call):
                return True
            # A helper of the module handed the pattern, which asks the docs with it.
            if call.func.id in functions and gives_pattern(call) and asks_the_docs(functions[call.func.id]):
                return True
    return False


def classify(shown: Shown) -> list[tuple[str, str | None]]:
    """Every table entry that matches: ("offline" | "on_stack", pattern) or ("run_by", test id)."""
    matches: list[tuple[str, str | None]] = []
    for kind, table in (("offline", OFFLINE), ("on_stack", ON_STACK)):
        matches += [(kind, pattern) for pattern in table if re.fullmatch(pattern, shown.text)]
    matches += [("run_by", test) for pattern, test in RUN_BY.items() if re.fullmatch(pattern, shown.text)]
    return matches


def defined(test_id: str) -> bool:
    """Whether `path::function` names a function at the top level of that file (the test
    that runs the command)."""
    path, _, name = test_id.partition("::")
    file = REPO / path
    if not file.is_file() or not name:
        return False
    tree = ast.parse(file.read_text())
    return any(isinstance(node, ast.FunctionDef) and node.name == name.split("[")[0] for node in tree.body)


def run_shown(shown: Shown, workdir: Path, monkeypatch) -> tuple[int, str, str]:
    """Run a shown command in process, as the console script runs it (`nomadtf.cli.main`),
    from `workdir`, which gets `examples/` linked in so that the docs' relative paths and
    `$PWD/examples/…` work there. Returns (exit code, stdout, stderr)."""
    from nomadtf import cli

    link = workdir / "examples"
    if not link.exists():
        link.symlink_to(EXAMPLES)
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("PWD", str(workdir))
    monkeypatch.setattr(sys, "argv", ["nomadtf", *(os.path.expandvars(arg) for arg in shown.argv[1:])])
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return code, out.getvalue(), err.getvalue()


EXAMPLES_PAGE = REPO / "docs" / "guide" / "examples.md"


def example_stacks(page: Path = EXAMPLES_PAGE) -> dict[str, str]:
    """Each example's path → the stack its row in the examples page names
    (`| `examples/…json` | what | `nomadtf dev up …` | … |`)."""
    rows = re.findall(r"^\| `(examples/[^`]+\.json)` \|[^|]*\| `(nomadtf dev up[^`]*)` \|", page.read_text(), flags=re.M)
    return dict(rows)


def load_reference_generator() -> ModuleType:
    """scripts/docs_reference.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "scripts" / "docs_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
