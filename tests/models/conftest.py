"""Fixtures of the model-fetching tests (the S3 server and its environment are shared by
every group: tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def download_dir(tmp_path):
    return str(tmp_path / "cache")
