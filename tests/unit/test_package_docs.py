"""The maps of the code stay true: each subpackage's `__init__` docstring lists every module
in it, and docs/design/layout.md's table names every module under nomadtf/ (the top-level
package's map is that table; its `__init__` holds only the version). A module added, renamed
or removed without its line fails here, so the lists cannot drift again."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers import REPO

PACKAGE = REPO / "nomadtf"
SUBPACKAGES = sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))
LAYOUT = REPO / "docs" / "design" / "layout.md"

# A list line of a docstring: indented names (`task.py`, or `gobuild, plugin_builder`), then
# two or more spaces before what they own.
LIST_LINE = re.compile(r"^\s+([a-z_]+(?:\.py)?(?:,\s*[a-z_]+(?:\.py)?)*)\s{2,}\S")
# A name in prose: `display` or `display.py` in backticks, or a bare `name.py`.
QUOTED = re.compile(r"`([a-z_]+)(?:\.py)?`")
FILE = re.compile(r"(?<![\w/.])([a-z_]+)\.py\b")


def modules(package: Path) -> set[str]:
    return {p.stem for p in package.glob("*.py") if p.stem != "__init__"}


def listed(doc: str) -> set[str]:
    """The module names a docstring lists, as list lines or file names."""
    names = set(FILE.findall(doc))
    for line in doc.splitlines():
        match = LIST_LINE.match(line)
        if match:
            names |= {name.strip().removesuffix(".py") for name in match.group(1).split(",")}
    return names


def named(doc: str) -> set[str]:
    """Every module name a docstring gives, in lists or in backticks in prose."""
    return listed(doc) | set(QUOTED.findall(doc))


def docstring(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""


def layout_rows() -> dict[str, str]:
    """layout.md's table: its first cell -> its second."""
    rows = {}
    for line in LAYOUT.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 2 and cells[0] not in ("module", "---"):
            rows[cells[0]] = cells[1]
    return rows


def test_there_are_subpackages_to_check():
    assert {p.name for p in SUBPACKAGES} >= {"cli", "devstack", "runtime"}


@pytest.mark.parametrize("package", SUBPACKAGES, ids=lambda p: p.name)
def test_each_subpackage_docstring_names_every_module_in_it(package):
    missing = modules(package) - named(docstring(package))
    assert not missing, f"{package.name}/__init__.py's docstring does not name: {sorted(missing)}"


@pytest.mark.parametrize("package", SUBPACKAGES, ids=lambda p: p.name)
def test_each_subpackage_docstring_lists_only_modules_that_exist(package):
    stale = listed(docstring(package)) - modules(package)
    assert not stale, f"{package.name}/__init__.py's docstring lists modules that do not exist: {sorted(stale)}"


def test_the_layout_table_names_every_top_level_module():
    first_cells = " ".join(layout_rows())
    in_table = set(FILE.findall(first_cells))
    assert not modules(PACKAGE) - in_table, f"layout.md has no row for: {sorted(modules(PACKAGE) - in_table)}"
    assert not in_table - modules(PACKAGE), f"layout.md has rows for modules that do not exist: {sorted(in_table - modules(PACKAGE))}"


def test_the_layout_table_has_a_row_for_every_subpackage_naming_each_of_its_modules():
    rows = layout_rows()
    packages = {match.group(1) for match in map(re.compile(r"`([a-z_]+)/`").fullmatch, rows) if match}
    assert packages == {p.name for p in SUBPACKAGES}
    for package in SUBPACKAGES:
        missing = modules(package) - named(rows[f"`{package.name}/`"])
        assert not missing, f"layout.md's {package.name}/ row does not name: {sorted(missing)}"


def test_a_module_left_out_is_found():
    # The checks can fail: a list line and a file name count, a word in prose does not.
    doc = "The runtime.\n\n    task.py     the entry\n    loop        the queue\n\nIt runs a task and an oom check."
    assert listed(doc) == {"task", "loop"}
    assert {"task", "loop", "oom"} - named(doc) == {"oom"}


# Sizes a newcomer can read whole (issue #35): a module over this many lines, or a class,
# is split where its jobs part.
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 250


def oversized(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(root.parent)
        if text.count("\n") > MAX_MODULE_LINES:
            found.append(f"{where}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                found.append(f"{where}: class {node.name} {node.end_lineno - node.lineno + 1} lines")
    return found


def test_no_module_over_500_lines_and_no_class_over_250():
    assert oversized(PACKAGE) == []


def test_an_oversized_module_or_class_is_found(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (package / "wide.py").write_text("class Wide:\n" + "    x = 1\n" * MAX_CLASS_LINES)
    assert oversized(package) == [f"pkg/big.py: {MAX_MODULE_LINES + 1} lines", f"pkg/wide.py: class Wide {MAX_CLASS_LINES + 1} lines"]
