"""scripts/docs_reference.py: the job.json reference page, generated from the schema."""

from __future__ import annotations

import re

import pytest

from nomadtf.job.validate import schema
from nomadtf.roles import ROLES
from tests.docs_commands import load_reference_generator

generator = load_reference_generator()

TINY = {
    "type": "object",
    "required": ["name", "roles"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]+$", "description": "The job's name."},
        "mode": {"enum": ["fast", "slow"], "default": "fast", "description": "a | b, or consul/creds/<role>; `x|<y>`"},
        "wait": {"$ref": "#/$defs/duration", "default": "5m"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "roles": {"type": "object", "properties": {"chief": {"$ref": "#/$defs/role"}, "worker": {"$ref": "#/$defs/role"}}},
        "secrets": {
            "type": "array",
            "items": {"type": "object", "required": ["path"], "properties": {"path": {"type": "string"}}},
        },
    },
    "$defs": {
        "duration": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
        "role": {
            "type": "object",
            "properties": {
                "count": {"type": "integer", "minimum": 0, "maximum": 9, "default": 1},
                "gpus": {
                    "oneOf": [
                        {"type": "integer", "minimum": 0},
                        {"type": "object", "required": ["count"], "properties": {"count": {"type": "integer"}}},
                    ],
                    "default": 0,
                },
            },
        },
    },
}


def rows(page: str) -> dict[str, list[str]]:
    """field path → the other cells of its row."""
    out = {}
    for line in page.splitlines():
        match = re.match(r"^\| `([^`]+)` \| (.*) \|$", line)
        if match:
            out[match[1]] = re.split(r"(?<!\\) \| ", match[2])
    return out


def test_every_field_gets_its_type_default_allowed_values_and_description():
    table = rows(generator.render_page(TINY))
    assert table["name"] == ["string", "required", "matches `^[a-z]+$`", "The job's name."]
    assert table["mode"][:3] == ["string", '`"fast"`', '`"fast"`, `"slow"`']
    assert table["wait"] == ["duration", '`"5m"`', "", ""]  # a $ref followed, its own default kept
    assert table["tags"] == ["array of string", "", "at least 1 item", ""]
    assert table["roles.<role>.count"] == ["integer", "`1`", "0 to 9", ""]
    assert table["roles.<role>.gpus"][:2] == ["integer or object", "`0`"]
    assert table["roles.<role>.gpus.count"][:2] == ["integer", "required"]  # the object form's keys
    assert table["secrets[].path"][:2] == ["string", "required"]
    assert "roles.<role>.chief" not in table and "roles.chief" not in table  # every role has the same fields


def test_pipes_and_angle_brackets_cannot_break_the_table():
    (description,) = rows(generator.render_page(TINY))["mode"][3:]
    assert description == "a \\| b, or consul/creds/&lt;role&gt;; `x|<y>`"  # code spans are left alone


def test_the_real_schema_has_every_field_on_the_page():
    page = generator.render_page(schema())
    paths = set(rows(page))

    resolve = generator.Schema(schema()).resolve

    def walk(node: dict, path: str):
        """Every field path below `node`: properties, array items (`[]`), oneOf's objects."""
        node = resolve(node)
        yield path
        items = resolve(node["items"]) if isinstance(node.get("items"), dict) else {}
        for base, holder in ((path, node), (f"{path}[]", items), *((path, resolve(o)) for o in node.get("oneOf", []))):
            for key, child in (holder.get("properties") or {}).items():
                yield from walk(child, f"{base}.{key}" if base else key)

    expected = set()
    for path in list(walk(schema(), ""))[1:]:
        if re.match(rf"^roles\.({'|'.join(ROLES)})(\.|$)", path):
            path = re.sub(r"^roles\.\w+", "roles.<role>", path)
            if path == "roles.<role>":
                continue
        expected.add(path)
    assert expected - paths == set()
    assert len(expected) > 90, sorted(expected)


def test_check_fails_when_the_page_differs(tmp_path, monkeypatch, capsys):
    page = tmp_path / "job-json.md"
    monkeypatch.setattr(generator, "PAGE", page)
    monkeypatch.setattr(generator, "REPO", tmp_path)
    assert generator.main(["--check"]) == 1  # no page yet
    assert generator.main([]) == 0
    assert generator.main(["--check"]) == 0
    page.write_text(page.read_text().replace("Nomad job ID", "Nomad job id"))
    assert generator.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err


def test_a_remote_ref_is_refused():
    with pytest.raises(ValueError, match="only local"):
        generator.Schema({}).resolve({"$ref": "https://example.org/other.json"})

