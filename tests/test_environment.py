"""pyproject.toml and environment.yml name the same dependencies, with the same version bounds.

environment.yml is read by a small parser for its simple shape (top-level keys, a `dependencies` list and
one nested `pip` list), so that this test needs no YAML library.
"""
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the "test" extra installs tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SELF = "osdn"


def split_requirement(req: str) -> tuple[str, str]:
    """'Triton>=3.6,<3.10; marker' → ('triton', '>=3.6,<3.10;marker'): PEP 503 name, spaceless rest."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?(.*)", req)
    assert m, f"not a requirement: {req!r}"
    name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
    return name, re.sub(r"\s+", "", m.group(3)).replace('"', "'")


def pyproject_requirements() -> dict[str, str]:
    """Runtime dependencies plus every extra, with `osdn[...]` self-references expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    found: dict[str, str] = {}

    def add(reqs):
        for req in reqs:
            name, rest = split_requirement(req)
            if name == SELF:
                for extra in re.findall(r"[\w-]+", re.match(r"[^\[]*\[([^\]]*)\]", req).group(1)):
                    add(extras[extra])
                continue
            assert found.setdefault(name, rest) == rest, f"{name} has two different bounds in pyproject.toml"
            found[name] = rest

    add(project["dependencies"])
    for reqs in extras.values():
        add(reqs)
    return found


def parse_environment_yml(text: str) -> dict:
    """{'name': str, 'channels': [...], 'dependencies': [...], 'pip': [...]} from the simple YAML shape."""
    parsed: dict = {"dependencies": [], "pip": [], "channels": []}
    key, in_pip = None, False
    for raw in text.splitlines():
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        item = line.strip()
        if indent == 0:
            key, _, value = item.partition(":")
            in_pip = False
            if value.strip():
                parsed[key] = value.strip()
            continue
        assert item.startswith("- "), f"unexpected line in environment.yml: {raw!r}"
        entry = item[2:].strip()
        if key == "dependencies" and entry == "pip:":
            in_pip = True
        elif in_pip and indent > 2:
            parsed["pip"].append(entry)
        else:
            in_pip = False
            parsed[key].append(entry)
    return parsed


@pytest.fixture(scope="module")
def env():
    return parse_environment_yml((ROOT / "environment.yml").read_text())


def test_same_dependencies(env):
    conda = dict(split_requirement(d) for d in env["dependencies"])
    pip = dict(split_requirement(d) for d in env["pip"] if not d.startswith("-e"))
    assert not set(conda) & set(pip), "a dependency listed twice in environment.yml"
    named = {**conda, **pip}
    python = named.pop("python")
    named.pop("pip")
    assert named == pyproject_requirements()
    assert python == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]


def test_installs_the_checkout_with_all_extras(env):
    assert env["name"] == SELF
    assert "-e .[dev]" in env["pip"]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"test", "book", "dev"} <= set(extras)
    dev_extras = set(re.findall(r"[\w-]+", extras["dev"][0].split("[", 1)[1]))
    assert dev_extras == set(extras) - {"dev"}, "dev is the union of every other extra"


def test_parser_reads_the_simple_shape():
    text = "name: x\nchannels:\n  - c\ndependencies:\n  - a>=1  # note\n  - pip\n  - pip:\n      - b<2\n      - -e .[dev]\n"
    assert parse_environment_yml(text) == {
        "name": "x", "channels": ["c"], "dependencies": ["a>=1", "pip"], "pip": ["b<2", "-e .[dev]"],
    }
