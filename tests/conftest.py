"""Fixtures every group of tests shares: the real SmolLM2 model, its HF reference, its weights as
safetensors, a tiny random-weight Llama, and an S3 server holding it.

The tests are grouped by part: engine/ (the engine in this process), device_kernels/ (Triton
kernels, decode graphs and their torch references), server/ (the HTTP server, in process or
as `tokenmill serve`), operator/ (the Kubernetes operator, its CRD, chart and autoscaler),
bench/ (the benchmark commands), models/ (fetching models from hf:// and s3://: caches,
resumed and concurrent downloads, failures) and project/ (packaging, and the configuration
the CLI and the operator share). What a group's files share is in its conftest.py (fixtures) and its
*_support.py (functions and constants); operator/ also holds its API server model, Pod
Security checker and autoscaling harness.

Pytest puts this directory on sys.path (no __init__.py files: the repository root, whose
operator/ would shadow Python's operator module, stays off it), so the modules here are
imported by name from every group: model_support (SmolLM2's name, random-weight checkpoints,
SmolLM2 as safetensors, HF's greedy reference), process_support (free_port, the serve command
line, /proc), store_support (moto's S3 server, hub caches in the hub's layout),
structured_support (the JSON schema of the structured-output tests) and lora_support (random
PEFT adapters, HF + peft references). The names of these modules are unique across all
directories, and so are test file names.

What a group needs beyond torch, transformers and pytest is imported by the fixtures that use
it (the S3 server's moto and boto3, the built-in model's GGUF reader), so the groups that need
none of it (device_kernels/, on a GPU machine that has only those) collect and run without it.
"""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from model_support import (
    REFERENCE,
    SMOLLM2,
    make_random_model,
    smollm2_checkpoint,
    smollm2_installed,
)
from process_support import run_directory

from tokenmill.engine import LLM
from tokenmill.engine.bench.random_model import BUILTIN_VOCAB_SIZE

# Tests compare greedy outputs with HF in float32, so engines they start (in process or as
# `tokenmill serve`) take float32 for dtype auto on every CPU, bf16-native ones included;
# the bf16 default itself is tested with explicit CPU flags and its accuracy by its bounds.
os.environ.setdefault("TOKENMILL_CPU_DTYPE", "float32")
from tokenmill.engine.bench.word_tokenizer import word_level_tokenizer
from tokenmill.engine.models.source import resolve_model

# How much a worker's memory may grow past what it held after its last collection before a
# module's end collects again (a CPU engine's KV pool alone is 1 GiB by default).
GARBAGE_ALLOWANCE = 1 << 30
_collected_at: list[int] = [0]
# Python's own full collections come a hundred times less often than by default: each walks
# every object the worker imported (hundreds of thousands), and the modules' ends collect by
# memory (below) anyway.
_young, _middle, _old = gc.get_threshold()
gc.set_threshold(_young, _middle, _old * 100)


def _resident_bytes() -> int | None:
    """This process's resident memory (Linux's /proc), None where that cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@pytest.fixture(scope="module", autouse=True)
def _collect_garbage_after_each_module():
    """An engine and its loop and metrics refer to one another, so Python frees a finished one
    only when its cycle collector runs, which may be many modules later. A module's end
    collects once the worker holds GARBAGE_ALLOWANCE more than after the last collection,
    which keeps the run's memory near one module's engines; not every time, since a full
    collection walks every object the worker imported (several tenths of a second each)."""
    yield
    resident = _resident_bytes()
    if resident is None or resident > _collected_at[0] + GARBAGE_ALLOWANCE:
        gc.collect()
        _collected_at[0] = _resident_bytes() or 0


@pytest.fixture(scope="session")
def smol_source():
    return resolve_model(SMOLLM2)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2's weights as a float32 safetensors checkpoint with its tokenizer (transformers'
    reading of the built-in GGUF, written out), which loads in about a second where the GGUF
    takes many. Written once per run: pytest-xdist's workers share it, the first to need it
    writing it under a lock while the others wait."""
    shared = run_directory(tmp_path_factory)
    directory = shared / "smollm2-safetensors"
    with FileLock(f"{directory}.lock"):
        if not directory.is_dir():
            partial = shared / "smollm2-safetensors.partial"
            shutil.rmtree(partial, ignore_errors=True)
            smollm2_checkpoint(partial)
            partial.rename(directory)
    return directory


@pytest.fixture(scope="session")
def smol_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session")
def smol_llm(smollm2_dir):
    """The engine over SmolLM2 (the GGUF's weights, from their safetensors copy)."""
    return LLM(str(smollm2_dir), show_progress=False, **REFERENCE)


@pytest.fixture(scope="session")
def smol_hf(smollm2_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def vocab_tokenizer(request):
    """SmolLM2's tokenizer, for models that need only its vocabulary; where the built-in model
    or its GGUF reader is not installed (a GPU machine), a word-level one of the same size."""
    if smollm2_installed():
        return request.getfixturevalue("smol_tokenizer")
    return word_level_tokenizer(BUILTIN_VOCAB_SIZE)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, vocab_tokenizer):
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=len(vocab_tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        rope_theta=500000.0, bos_token_id=1, eos_token_id=2,
    )
    return make_random_model(str(tmp_path_factory.mktemp("tiny-llama")), config, vocab_tokenizer)


@pytest.fixture(scope="session")
def tiny_llama(tiny_llama_dir):
    return LLM(tiny_llama_dir, show_progress=False)


@pytest.fixture(scope="session")
def s3_endpoint(tiny_llama_dir):
    """A real S3-compatible server (moto) on loopback holding the tiny Llama under
    s3://BUCKET/TINY_PREFIX: its endpoint URL."""
    from store_support import BUCKET, TINY_PREFIX, moto_s3, s3_client, upload_directory

    with moto_s3() as endpoint:
        client = s3_client(endpoint)
        client.create_bucket(Bucket=BUCKET)
        upload_directory(client, BUCKET, TINY_PREFIX, tiny_llama_dir)
        yield endpoint


@pytest.fixture
def s3_env(s3_endpoint, monkeypatch):
    """The store's endpoint and test credentials in the environment, as a pod has them."""
    from store_support import S3_ENV

    env = {**S3_ENV, "AWS_ENDPOINT_URL": s3_endpoint}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    return env


@pytest.fixture
def bucket(s3_endpoint):
    """A boto3 client of the store: how tests put objects there (tokenmill reads with its own)."""
    from store_support import s3_client

    return s3_client(s3_endpoint)
