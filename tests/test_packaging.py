"""Every package folder is listed in pyproject.toml, so a non-editable install ships all of it."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"infc." + ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "compiler").rglob("__init__.py")}
    assert found - listed == set(), f"add to pyproject.toml packages: {sorted(found - listed)}"
