"""Every Python package directory ships in the wheel (pyproject's explicit package list), and
the image installs the torch the tests run against."""

from __future__ import annotations

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_package_list_covers_every_subpackage():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(project["tool"]["setuptools"]["packages"])
    mapping = project["tool"]["setuptools"]["package-dir"]
    found = set()
    for package, directory in mapping.items():
        for init in (ROOT / directory).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / directory)
            found.add(".".join([package, *relative.parts]) if relative.parts else package)
    assert found == listed


def test_the_image_pins_the_torch_the_tests_use():
    makefile = (ROOT / "Makefile").read_text()
    dockerfile = (ROOT / "Dockerfile").read_text()
    pinned = re.search(r"torch==([0-9.]+)", makefile).group(1)
    assert f"ARG TORCH={pinned}\n" in dockerfile
    assert dockerfile.count('"torch==${TORCH}"') == 2  # the CPU and the CUDA build
