"""`tokenmill download MODEL`, what an init container runs: it needs no torch, prints the
local path, and two of them downloading into one cache share it without corrupting it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from process_support import download_command
from store_support import BUCKET, TINY_PREFIX, same_files, upload_directory

URI = f"s3://{BUCKET}/{TINY_PREFIX}"

# `tokenmill download` with torch made unimportable.
WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None
from tokenmill.engine.cli import main
code = main(["download", *sys.argv[1:]])
assert "torch" not in {m.split(".")[0] for m, v in sys.modules.items() if v is not None}
sys.exit(code)
"""


def test_downloads_without_torch_and_prints_the_path(s3_env, download_dir, tiny_llama_dir):
    result = subprocess.run([sys.executable, "-P", "-c", WITHOUT_TORCH, URI, "--download-dir",
                             download_dir], cwd="/", capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    path = result.stdout.strip()
    assert path == os.path.join(download_dir, "s3", BUCKET, *TINY_PREFIX.split("/"))
    assert same_files(path, tiny_llama_dir)
    # Off a terminal, progress is logfmt lines (here the last one: the whole download).
    assert re.search(rf"msg=\"download done\" model={URI} bytes=(\d+) total=\1 ", result.stderr)


def test_two_downloads_into_one_cache_move_the_bytes_once(s3_env, download_dir,
                                                          tiny_llama_dir):
    procs = [subprocess.Popen(download_command(URI, "--download-dir", download_dir), cwd="/",
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert outputs[0][0] == outputs[1][0]
    path = outputs[0][0].strip()
    assert same_files(path, tiny_llama_dir)  # no .partial, no journal left, every byte right
    done = [re.search(r"download done.* bytes=(\d+) total=(\d+) resumed_bytes=(\d+)", err)
            for _, err in outputs]
    total = int(done[0].group(2))
    moved = sorted(int(m.group(1)) - int(m.group(3)) for m in done)
    # One fetched everything; the other waited on the lock, then found it complete.
    assert moved == [0, total]


def _adapter(directory) -> str:
    """A PEFT adapter's files as a store holds them (the bytes need not be weights here)."""
    directory.mkdir()
    (directory / "adapter_config.json").write_text('{"r": 8, "peft_type": "LORA"}')
    (directory / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    return str(directory)


def test_downloads_a_model_and_its_adapters_in_order(s3_env, bucket, download_dir,
                                                     tiny_llama_dir, tmp_path):
    """What one init container runs for a model and its LoRA adapters: every source in turn,
    an adapter's directory (adapter_config.json, no config.json) taken as it is."""
    adapter = _adapter(tmp_path / "adapter")
    upload_directory(bucket, BUCKET, "lora/sql", adapter)
    result = subprocess.run(download_command(URI, f"s3://{BUCKET}/lora/sql", "--download-dir",
                                             download_dir), cwd="/", capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    model, lora = result.stdout.split()
    assert same_files(model, tiny_llama_dir)
    assert lora == os.path.join(download_dir, "s3", BUCKET, "lora", "sql")
    assert same_files(lora, adapter)


def test_stops_at_the_first_source_it_cannot_fetch(s3_env, download_dir):
    result = subprocess.run(download_command(f"s3://{BUCKET}/lora/missing", URI,
                                             "--download-dir", download_dir), cwd="/",
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("tokenmill download: error:") and "lora/missing" in last


def test_a_bare_hub_id_is_the_hubs_as_in_vllm(tmp_path, tiny_llama_dir):
    """ORG/NAME with no local path of that name is hf://ORG/NAME (here from an offline cache);
    a local directory of that relative name is still the local one."""
    from store_support import write_hub_cache

    cache = str(tmp_path / "hub")
    snapshot = write_hub_cache(cache, "tokenmill-test/tiny-llama", tiny_llama_dir)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    found = [subprocess.run(download_command(name, "--download-dir", cache), cwd=str(tmp_path),
                            capture_output=True, text=True, env=env)
             for name in ("tokenmill-test/tiny-llama", "hf://tokenmill-test/tiny-llama")]
    assert [r.returncode for r in found] == [0, 0], [r.stderr for r in found]
    assert {r.stdout.strip() for r in found} == {snapshot}
    local = tmp_path / "tokenmill-test" / "tiny-llama"
    shutil.copytree(tiny_llama_dir, local)
    result = subprocess.run(download_command("tokenmill-test/tiny-llama"), cwd=str(tmp_path),
                            capture_output=True, text=True, env=env)
    assert (result.returncode, result.stdout.strip()) == (0, str(local)), result.stderr
