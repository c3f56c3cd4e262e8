"""The docs stay true without a server: the site builds with `--strict`, the job.json
reference is the schema's, every shown `nomadtf` command is run or mapped to the test that
runs it (tests/docs_commands.py), and the offline ones run here, in process."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from nomadtf import wire
from tests import docs_commands
from tests.docs_commands import (
    DOC_FILES,
    OFFLINE,
    ON_STACK,
    RUN_BY,
    RUN_ELSEWHERE,
    classify,
    defined,
    run_shown,
)
from tests.helpers import EXAMPLES, REPO

SHOWN = docs_commands.shown_commands()


def test_the_site_builds_with_strict_links(tmp_path):
    # --strict: a broken link, a missing anchor or a page left out of the nav fails the build.
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "reference" / "job-json" / "index.html").is_file()


def test_every_shown_command_is_run_or_mapped_to_the_test_that_runs_it():
    assert len(SHOWN) > 40, [s.text for s in SHOWN]  # the extraction found the docs' commands
    unmatched = [f"{s.where}: {s.text}" for s in SHOWN if not classify(s)]
    ambiguous = [f"{s.where}: {s.text} -> {classify(s)}" for s in SHOWN if len(classify(s)) > 1]
    assert not unmatched, "shown commands no test runs (add them to tests/docs_commands.py):\n" + "\n".join(unmatched)
    assert not ambiguous, "\n".join(ambiguous)
    used = {pattern for s in SHOWN for pattern in (*OFFLINE, *ON_STACK, *RUN_BY) if re.fullmatch(pattern, s.text)}
    unused = [p for p in (*OFFLINE, *ON_STACK, *RUN_BY) if p not in used]
    assert not unused, f"patterns no doc shows any more: {unused}"
    missing = sorted({test for test in RUN_BY.values() if not defined(test)})
    assert not missing, f"mapped tests that do not exist: {missing}"


def test_each_test_that_runs_a_shown_command_takes_it_from_the_docs():
    """RUN_BY's tests run the docs' own text (shown_argv), not a copy that could drift from it."""
    assert set(RUN_ELSEWHERE) <= set(RUN_BY)
    retyped = [f"{test} types {pattern!r} again" for pattern, test in RUN_BY.items()
               if pattern not in RUN_ELSEWHERE and not docs_commands.runs_the_docs_text(test, pattern)]
    assert not retyped, "use tests/docs_commands.shown_argv:\n" + "\n".join(retyped)


def test_a_test_that_types_the_command_itself_is_caught(tmp_path, monkeypatch):
    module = tmp_path / "tests" / "stack" / "test_x.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "def _helper(job):\n    return shown_argv(r'nomadtf stop digits', {'digits': job})\n\n"
        "def test_from_the_docs():\n    _helper('j')\n\n"
        "def test_typed():\n    nomadtf('stop', 'j')\n\n"
        "def _run(pattern):\n    return shown_argv(pattern)\n\n"
        "def test_through_a_helper():\n    _run(r'nomadtf stop digits --purge')\n"
    )
    monkeypatch.setattr(docs_commands, "REPO", tmp_path)
    assert docs_commands.runs_the_docs_text("tests/stack/test_x.py::test_from_the_docs", r"nomadtf stop digits")
    assert not docs_commands.runs_the_docs_text("tests/stack/test_x.py::test_typed", r"nomadtf stop digits")
    assert not docs_commands.runs_the_docs_text("tests/stack/test_x.py::test_from_the_docs", r"nomadtf stop digits --purge")
    assert docs_commands.runs_the_docs_text("tests/stack/test_x.py::test_through_a_helper", r"nomadtf stop digits --purge")


def test_shown_argv_gives_the_docs_command_ready_to_run_with_the_tests_own_names():
    argv = docs_commands.shown_argv(r"nomadtf run examples/digits/job-mwms.json --var entrypoint.workdir=\$PWD/examples/digits")
    assert argv == ["run", str(REPO / "examples/digits/job-mwms.json"), "--var", f"entrypoint.workdir={REPO}/examples/digits"]
    assert docs_commands.shown_argv(r"nomadtf stop digits", {"digits": "digits-ab12cd"}) == ["stop", "digits-ab12cd"]
    with pytest.raises(AssertionError, match="not a RUN_BY pattern"):
        docs_commands.shown_argv(r"nomadtf stop everything")


def test_a_mapping_to_a_test_that_does_not_exist_is_caught():
    assert defined("tests/stack/test_docs.py::test_the_readme_example_command_trains_the_example")
    assert not defined("tests/stack/test_docs.py::test_nothing_by_this_name")
    assert not defined("tests/stack/no_such_file.py::test_x")


def test_commands_are_found_inside_eval_and_quoted_command_strings(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\n"
        'eval "$(nomadtf dev env --cluster)"   # a comment\n'
        "cd /nomadtf && vagrant ssh server -c 'cd /x && /opt/venv/bin/nomadtf run a.json \\\n"
        "    --var b=c'\n"
        "$ nomadtf status\n"
        "```\n"
        "```json\n"
        '{"nomadtf": "status"}\n'
        "```\n"
        "Prose: `nomadtf stop JOB` is not a shown command.\n"
    )
    texts = [s.text for s in docs_commands.shown_commands([page], root=tmp_path)]
    assert texts == ["nomadtf dev env --cluster", "/opt/venv/bin/nomadtf run a.json --var b=c", "nomadtf status"]


OFFLINE_SHOWN = [s for s in SHOWN if [kind for kind, _ in classify(s)] == ["offline"]]


@pytest.mark.parametrize("shown", OFFLINE_SHOWN, ids=lambda s: f"{s.where} {s.text}")
def test_the_offline_commands_run(shown, tmp_path, monkeypatch):
    # No server is reachable: validate then checks the schema and the cross-field rules only.
    for var in ("NOMAD_ADDR", "CONSUL_HTTP_ADDR", "VAULT_ADDR"):
        monkeypatch.setenv(var, "http://127.0.0.1:1")
    code, out, err = run_shown(shown, tmp_path, monkeypatch)
    (_, pattern), = classify(shown)
    assert code in OFFLINE[pattern], f"{shown.where}: {shown.text} exited {code}\n{out[-2000:]}\n{err[-2000:]}"
    assert out.strip() or err.strip()
    if shown.argv[-1] == "--help":
        assert "Usage" in out


def test_the_job_json_reference_is_generated_from_the_schema():
    generator = docs_commands.load_reference_generator()
    page = generator.render_page(json.loads(generator.SCHEMA.read_text()))
    assert generator.PAGE.read_text() == page, "docs/reference/job-json.md is out of date: run python scripts/docs_reference.py"


def test_full_jobs_shown_in_the_docs_are_the_examples_as_they_are():
    examples = {json.loads(p.read_text())["name"]: json.loads(p.read_text()) for p in EXAMPLES.glob("*/job*.json")}
    shown = []
    for path in DOC_FILES:
        for block in re.findall(r"```json\n(.*?)```", path.read_text(), flags=re.S):
            data = json.loads(block) if block.lstrip().startswith("{") and '"roles"' in block else None
            if data:
                shown.append((path.name, data))
    assert shown
    for where, data in shown:
        assert data == examples[data["name"]], f"{where}: the job {data['name']!r} differs from its example file"


def test_acl_names_in_the_docs_are_the_ones_acl_apply_makes():
    shown = {m.groups() for path in DOC_FILES for m in re.finditer(r"nomadtf-default-([a-z0-9-]+?)-([0-9a-f]{8})\b", path.read_text())}
    assert shown, "no doc shows a job's ACL name any more"
    for job, digest in shown:
        assert f"nomadtf-default-{job}-{digest}" == wire.acl_name("default", job), (job, digest)


def test_the_readmes_links_lead_somewhere():
    readme = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if "://" not in t]
    assert local and all((REPO / t).exists() for t in local), [t for t in local if not (REPO / t).exists()]


def test_scripts_example_runs_the_commands_mapped_to_it():
    # The README example test runs `bash scripts/example`: the commands mapped to it must be
    # the ones the script runs (it adds `--var name=digits-<time>` and the test's options).
    script = [argv for _, line in docs_commands.shell_lines("```bash\n" + (REPO / "scripts" / "example").read_text() + "```\n")
              for argv in docs_commands.invocations(shlex.split(line, comments=True))]
    ran = [" ".join(argv) for argv in script]
    mapped = [p for p, test in RUN_BY.items() if test.endswith("::test_the_readme_example_command_trains_the_example")]
    assert mapped
    for pattern in mapped:
        assert any(re.match(pattern + r"( |$)", command) for command in ran), (pattern, ran)


def test_every_example_names_its_stack_and_tests_that_exist():
    # tests/stack/test_nomad_accepts.py places each example on the stack named here.
    stacks = docs_commands.example_stacks()
    assert sorted(stacks) == sorted(str(p.relative_to(REPO)) for p in EXAMPLES.glob("*/job*.json"))
    named = re.findall(r"`(tests/[\w/]+\.py::\w+)`", docs_commands.EXAMPLES_PAGE.read_text())
    assert named and [t for t in named if not defined(t)] == []


def test_no_link_is_empty():
    # An empty target renders as a link to the page itself: a moved cross-reference gone wrong.
    empty = [f"{p.relative_to(REPO)}: {m}" for p in DOC_FILES for m in re.findall(r"\[[^\]]+\]\(\)", p.read_text())]
    assert not empty, empty


def test_the_readme_stays_a_front_page():
    # What it is, install, the two commands, a first job, versions, dependencies, tests, links:
    # the rest lives in docs/ (the house rule, issue #35).
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move the detail to docs/ and link it"
