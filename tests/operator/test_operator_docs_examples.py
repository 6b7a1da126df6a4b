"""Every InferenceService the documentation shows is one `kubectl apply` admits and the
operator deploys: a whole object of tokenmill.io, or a fragment of its `spec:` alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from operator_support import admission_errors

from tokenmill.operator import reconcile

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


def documented() -> list[tuple[str, dict]]:
    found = []
    for path in DOCUMENTS:
        for number, block in enumerate(BLOCK.findall(path.read_text()), 1):
            for obj in yaml.safe_load_all(block):
                if not isinstance(obj, dict):
                    continue
                if set(obj) == {"spec"}:  # a fragment: the spec of some InferenceService
                    obj = {"apiVersion": "tokenmill.io/v1alpha1", "kind": "InferenceService",
                           "metadata": {"name": "example"}, **obj}
                if str(obj.get("apiVersion", "")).startswith("tokenmill.io/"):
                    found.append((f"{path.name}:block{number}", obj))
    return found


EXAMPLES = documented()


def test_the_documentation_shows_inference_services():
    assert {where.partition(":")[0] for where, _ in EXAMPLES} >= {"operator.md", "migrating.md"}


@pytest.mark.parametrize(("where", "obj"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_each_documented_inference_service_is_admitted_and_deployable(where, obj):
    assert admission_errors(obj) == []
    reconcile.load(obj["metadata"]["name"], obj.get("spec"))
