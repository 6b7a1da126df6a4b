"""s3://BUCKET/PREFIX from a real S3-compatible server (moto on loopback): the files land
whole, a second fetch finds them in the cache, and a download killed half way resumes."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

from store_support import BUCKET, TINY_PREFIX, same_files

from tokenmill.engine.models.fetch import fetch_model
from tokenmill.engine.models.source import resolve_model

URI = f"s3://{BUCKET}/{TINY_PREFIX}"


def _done_line(caplog) -> logging.LogRecord:
    return [r for r in caplog.records if r.getMessage() == "download done"][-1]


def test_fetches_every_object_then_finds_them_in_the_cache(s3_env, download_dir,
                                                           tiny_llama_dir, caplog):
    caplog.set_level(logging.INFO, logger="tokenmill")
    path = fetch_model(URI, download_dir)
    assert path == os.path.join(download_dir, "s3", BUCKET, "llama", "tiny")
    assert same_files(path, tiny_llama_dir)
    first = _done_line(caplog)
    assert first.resumed_bytes == 0 and first.bytes == first.total > 0
    assert fetch_model(URI, download_dir) == path
    again = _done_line(caplog)
    assert again.resumed_bytes == again.total  # nothing moved the second time
    assert resolve_model(URI, download_dir).directory == path


# Fetches in 64 KiB ranges, one at a time, and kills its own process (SIGKILL: nothing runs
# after it) once three ranges are written.
KILLED_HALF_WAY = """
import os, signal, sys
from tokenmill.engine.models.fetch import s3, uri
real, calls = s3._get_range, []
def get_range(store, key, start, end):
    if key.endswith(".safetensors"):
        calls.append(start)
        if len(calls) > 3:
            os.kill(os.getpid(), signal.SIGKILL)
    return real(store, key, start, end)
s3._get_range = get_range
s3.fetch_s3(uri.parse_model_uri(sys.argv[1]), sys.argv[2], chunk_bytes=1 << 16, workers=1)
"""


def test_a_killed_download_resumes_and_its_half_file_is_never_loaded(s3_env, download_dir,
                                                                    tiny_llama_dir, caplog):
    killed = subprocess.run([sys.executable, "-P", "-c", KILLED_HALF_WAY, URI, download_dir],
                            cwd="/", capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    directory = os.path.join(download_dir, "s3", BUCKET, "llama", "tiny")
    weights = os.path.join(directory, "model.safetensors")
    assert os.path.exists(weights + ".partial") and not os.path.exists(weights)
    assert "model.safetensors" not in os.listdir(directory)  # nothing a loader would pick up
    caplog.set_level(logging.INFO, logger="tokenmill")
    fetch_model(URI, download_dir)
    done = _done_line(caplog)
    assert done.resumed_bytes >= 3 * (1 << 16)  # the ranges written before the kill
    assert done.bytes == done.total
    assert not os.path.exists(weights + ".partial")
    assert same_files(directory, tiny_llama_dir)
