"""The init container's command and the engine's model flags meet in the cache: the download
the operator asks for (real `tokenmill download`, a real S3-compatible server) leaves what the
engine's flags find, and the engine's side needs no network, no credentials and no write, so
a read-only mount and credentials on the init container alone are enough."""

from __future__ import annotations

import os
import subprocess

from process_support import download_command, free_port
from store_support import (
    BUCKET,
    COMMIT,
    TINY_PREFIX,
    hub_that_finds_nothing,
    same_files,
    upload_directory,
    write_hub_cache,
)

from tokenmill.operator import manifests
from tokenmill.operator.args import CACHE_MOUNT
from tokenmill.operator.reconcile import load

CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN")


def pod(uri: str) -> dict:
    spec = load("svc", {"model": {"uri": uri}, "resources": {"gpus": 0}})
    return manifests.deployment("svc", "team", "uid-1", spec, "tokenmill:1")["spec"][
        "template"]["spec"]


def in_cache(args: list[str], cache: str) -> list[str]:
    """The arguments with the cache's mount path replaced by a local directory."""
    return [cache + a[len(CACHE_MOUNT):] if a.startswith(CACHE_MOUNT) else a for a in args]


def model_flags(container: dict, cache: str) -> list[str]:
    """The engine's --model (and --download-dir) as its command has them."""
    args = in_cache(container["command"], cache)
    flags = ["--model", args[args.index("--model") + 1]]
    if "--download-dir" in args:
        flags += ["--download-dir", args[args.index("--download-dir") + 1]]
    return flags


def engine_env(container: dict, unreachable: str) -> dict[str, str]:
    """The engine container's variables, no credentials, and every store out of reach."""
    env = {k: v for k, v in os.environ.items() if k not in CREDENTIALS}
    env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
    env.update({"HOME": os.environ.get("HOME", "/tmp"), "AWS_ENDPOINT_URL": unreachable,
                "HF_ENDPOINT": unreachable})
    env.pop("HF_HOME", None)
    env.pop("XDG_CACHE_HOME", None)
    return env


def tree(directory: str) -> dict[str, tuple[int, float]]:
    """Every path under a directory with its size and modification time."""
    found = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            stat = os.lstat(path)
            found[os.path.relpath(path, directory)] = (stat.st_size, stat.st_mtime_ns)
    return found


def resolve(flags: list[str], env: dict[str, str]) -> str:
    """The local model the engine would load with these flags (serve resolves them the same
    way, through resolve_model)."""
    model = flags[1]
    result = subprocess.run(download_command(model, *flags[2:]), env=env, cwd="/",
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_engine_finds_the_s3_download_without_the_store(s3_env, tmp_path, tiny_llama_dir):
    uri = f"s3://{BUCKET}/{TINY_PREFIX}"
    cache = str(tmp_path / "cache")
    p = pod(uri)
    init = p["initContainers"][0]
    done = subprocess.run(download_command(*in_cache(init["command"], cache)[2:]), cwd="/",
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    before = tree(cache)

    unreachable = f"http://127.0.0.1:{free_port()}"
    local = resolve(model_flags(p["containers"][0], cache),
                    engine_env(p["containers"][0], unreachable))
    assert same_files(local, tiny_llama_dir)
    assert tree(cache) == before  # no lock, no listing journal: nothing written


def test_the_engine_finds_the_hf_download_offline(tmp_path, tiny_llama_dir):
    """What the download leaves for hf:// (the hub's cache layout) is found from refs/ with the
    hub out of reach, without HF_TOKEN, and without a write."""
    cache = str(tmp_path / "cache")
    snapshot = write_hub_cache(cache, "acme/tiny-llama", tiny_llama_dir)
    p = pod("hf://acme/tiny-llama@main")
    before = tree(cache)

    unreachable = f"http://127.0.0.1:{free_port()}"
    local = resolve(model_flags(p["containers"][0], cache),
                    engine_env(p["containers"][0], unreachable))
    assert local == snapshot and local.endswith(COMMIT)
    assert same_files(local, tiny_llama_dir)
    assert tree(cache) == before


def test_without_offline_the_engine_would_ask_the_hub_on_every_start(tmp_path, tiny_llama_dir):
    """Why the engine container gets HF_HUB_OFFLINE=1: without it the same flags resolve only
    after asking the hub (a network call on each start, HF_TOKEN for a private repository);
    with it the hub is never asked."""
    cache = str(tmp_path / "cache")
    write_hub_cache(cache, "acme/tiny-llama", tiny_llama_dir)
    container = pod("hf://acme/tiny-llama@main")["containers"][0]
    env = engine_env(container, "unused")
    for offline, expect_asked in ((None, True), ("1", False)):
        if offline is None:
            env.pop("HF_HUB_OFFLINE", None)
        else:
            env["HF_HUB_OFFLINE"] = offline
        asked: list[str] = []
        with hub_that_finds_nothing(asked) as endpoint:
            env["HF_ENDPOINT"] = endpoint
            resolve(model_flags(container, cache), env)
        assert bool(asked) is expect_asked, asked


def test_the_engine_finds_each_adapter_the_init_container_downloaded(s3_env, bucket, tmp_path,
                                                                     tiny_llama_dir):
    """One init container fetches the model and an s3:// adapter; the engine's --lora-modules
    path is the adapter's directory in the cache, found with every store out of reach."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8, "peft_type": "LORA"}')
    (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    upload_directory(bucket, BUCKET, "lora/sql", str(adapter))
    spec = load("svc", {"model": {"uri": f"s3://{BUCKET}/{TINY_PREFIX}"},
                        "adapters": [{"name": "sql", "uri": f"s3://{BUCKET}/lora/sql"}],
                        "resources": {"gpus": 0}})
    p = manifests.deployment("svc", "team", "uid-1", spec, "tokenmill:1")["spec"]["template"][
        "spec"]
    cache = str(tmp_path / "cache")
    done = subprocess.run(download_command(*in_cache(p["initContainers"][0]["command"],
                                                     cache)[2:]),
                          cwd="/", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    args = in_cache(p["containers"][0]["command"], cache)
    (module,) = args[args.index("--lora-modules") + 1:args.index("--max-loras")]
    name, _, path = module.partition("=")
    (path,) = in_cache([path], cache)
    assert name == "sql" and same_files(path, str(adapter))
    before = tree(cache)
    unreachable = f"http://127.0.0.1:{free_port()}"
    assert same_files(resolve(model_flags(p["containers"][0], cache),
                              engine_env(p["containers"][0], unreachable)), tiny_llama_dir)
    assert tree(cache) == before
