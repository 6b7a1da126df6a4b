"""End to end on kind: build the CPU image, install the chart, serve SmolLM2, ask it something.

    pytest e2e -q          # KEEP_CLUSTER=1 keeps the cluster; KIND_CLUSTER names it

Skips, with one line saying why, where kind, kubectl or a running Docker daemon is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CLUSTER = os.environ.get("KIND_CLUSTER", "tokenmill-e2e")
IMAGE = "tokenmill:e2e"
NAMESPACE = "tokenmill-system"


def _missing() -> str | None:
    for tool in ("kind", "docker", "kubectl"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "the Docker daemon is not running"
    return None


if reason := _missing():
    pytest.skip(f"e2e needs kind, kubectl and Docker: {reason}", allow_module_level=True)


def run(*args: str, input: str | None = None, timeout: float = 600) -> str:
    done = subprocess.run(args, input=input, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def kubectl(*args: str, input: str | None = None, timeout: float = 600) -> str:
    return run("kubectl", "--context", f"kind-{CLUSTER}", *args, input=input, timeout=timeout)


@pytest.fixture(scope="module")
def cluster():
    existing = run("kind", "get", "clusters").split()
    if CLUSTER not in existing:
        run("kind", "create", "cluster", "--name", CLUSTER, "--wait", "120s")
    try:
        yield
    finally:
        if not os.environ.get("KEEP_CLUSTER") and CLUSTER not in existing:
            run("kind", "delete", "cluster", "--name", CLUSTER)


@pytest.fixture(scope="module")
def operator(cluster):
    import helm_python

    run("docker", "build", "-t", IMAGE, "--build-arg", "DEVICE=cpu", ".", timeout=3600)
    run("kind", "load", "docker-image", IMAGE, "--name", CLUSTER)
    chart_dir = REPO / "charts" / "tokenmill"
    chart = helm_python.Chart.load(str(chart_dir))
    for crd in chart.crds:
        kubectl("apply", "--server-side", "-f", "-", input=crd["data"])
    # The API server must serve the new types before anything uses them.
    kubectl("wait", "--for=condition=Established", "--timeout=60s",
            "crd/inferenceservices.tokenmill.io", "crd/kopfpeerings.kopf.dev",
            "crd/clusterkopfpeerings.kopf.dev", timeout=90)
    kubectl("apply", "-f", "-", input=kubectl("create", "namespace", NAMESPACE,
                                              "--dry-run=client", "-o", "yaml"))
    values = {"image": {"repository": IMAGE.split(":")[0], "tag": IMAGE.split(":")[1],
                        "pullPolicy": "Never"}}
    rendered = chart.render(values, name="tm", namespace=NAMESPACE, is_install=True)
    manifests = "\n---\n".join(t for p, t in rendered.items() if p.endswith(".yaml"))
    kubectl("apply", "-n", NAMESPACE, "-f", "-", input=manifests)
    kubectl("-n", NAMESPACE, "rollout", "status", "deployment/tm-tokenmill-operator",
            "--timeout=300s", timeout=330)


def test_smollm2_answers_through_the_service(operator):
    example = yaml.safe_load((REPO / "examples" / "smollm2-cpu.yaml").read_text())
    kubectl("apply", "-f", "-", input=yaml.safe_dump(example))
    kubectl("wait", "inferenceservice/smollm2", "--for=condition=Ready", "--timeout=900s",
            timeout=930)
    status = json.loads(kubectl("get", "tmis", "smollm2", "-o", "json"))["status"]
    url = status["url"]
    assert url == "http://smollm2.default.svc.cluster.local:8000/v1"
    client = (
        "import json, urllib.request; "
        f"req = urllib.request.Request('{url}/chat/completions', data=json.dumps({{"
        "'model': 'smollm2', 'max_tokens': 16, 'temperature': 0, 'messages': "
        "[{'role': 'user', 'content': 'What is the capital of France?'}]}).encode(), "
        "headers={'Content-Type': 'application/json'}); "
        "print(urllib.request.urlopen(req, timeout=120).read().decode())"
    )
    out = kubectl("run", "e2e-client", "--rm", "-i", "--restart=Never", f"--image={IMAGE}",
                  "--image-pull-policy=Never", "--command", "--", "python", "-c", client,
                  timeout=300)
    answer = json.loads(out[out.index("{"):out.rindex("}") + 1])
    assert "Paris" in answer["choices"][0]["message"]["content"]
