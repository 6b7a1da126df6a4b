"""Every way a fetch can fail ends in one line naming the model and the cause: an unknown
scheme, a missing bucket or prefix, refused credentials, a repository the hub does not have
(or gates), a revision missing from an offline cache, and a cache volume too small."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from moto.core.authorization import enable_iam_authentication
from process_support import download_command
from store_support import BUCKET, TINY_PREFIX, hub_that_finds_nothing

from tokenmill.engine.models.fetch import ModelFetchError, fetch_model
from tokenmill.engine.models.fetch import cache as fetch_cache


def _failure(model: str, download_dir: str) -> str:
    with pytest.raises(ModelFetchError) as caught:
        fetch_model(model, download_dir)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"cannot fetch {model}: ")
    return message


def test_an_unknown_scheme_names_the_forms_that_work(download_dir):
    message = _failure("gs://models/llama", download_dir)
    assert "unknown scheme gs://" in message and "s3://BUCKET/PREFIX" in message


def test_a_missing_bucket(s3_env, download_dir):
    assert "bucket 'no-such-bucket' does not exist" in _failure("s3://no-such-bucket/llama",
                                                                download_dir)


def test_no_region_and_no_endpoint_say_so(download_dir, monkeypatch):
    """The store client refused to open with a bare TypeError (a 500 from the server's
    adapter loading, a traceback from `tokenmill download`)."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    assert "no AWS_REGION and no AWS_ENDPOINT_URL is set" in _failure("s3://models/llama",
                                                                      download_dir)


def test_a_prefix_with_no_objects(s3_env, download_dir):
    assert f"no objects under the prefix 'llama/nothing/' in bucket '{BUCKET}'" in _failure(
        f"s3://{BUCKET}/llama/nothing", download_dir)


def test_refused_credentials(s3_env, download_dir, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG1")
    with enable_iam_authentication():  # moto now checks keys, as S3 does
        message = _failure(f"s3://{BUCKET}/{TINY_PREFIX}", download_dir)
    assert "refused the credentials (InvalidAccessKeyId)" in message
    assert "AWS_ACCESS_KEY_ID" in message


def _download_fails(model: str, download_dir: str, env: dict[str, str]) -> str:
    """`tokenmill download MODEL` exits 1 with one line on stderr: that line."""
    result = subprocess.run(download_command(model, "--download-dir", download_dir), cwd="/",
                            env={**os.environ, **env}, capture_output=True, text=True)
    assert result.returncode == 1 and result.stdout == "", result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"tokenmill download: error: cannot fetch {model}: "), result.stderr
    return lines[0]


def test_a_repository_the_hub_does_not_have(download_dir):
    # The hub client reads HF_ENDPOINT once, at import: each case is a new process.
    with hub_that_finds_nothing() as hub:
        env = {"HF_ENDPOINT": hub, "HF_HUB_OFFLINE": "0"}
        assert "repository tokenmill-test/missing not found on the hub" in _download_fails(
            "hf://tokenmill-test/missing", download_dir, env)
        assert "is gated: accept its terms on the hub, then set HF_TOKEN" in _download_fails(
            "hf://tokenmill-test/gated-llama", download_dir, env)


def test_a_revision_missing_from_an_offline_cache(download_dir):
    message = _download_fails("hf://tokenmill-test/tiny-llama@v2", download_dir,
                              {"HF_HUB_OFFLINE": "1"})
    assert f"revision 'v2' is not in the cache {download_dir} and HF_HUB_OFFLINE is set" in message


def test_a_cache_volume_too_small_names_the_size_needed(s3_env, download_dir, monkeypatch,
                                                        tiny_llama_dir):
    # A volume with 1 MiB free: the size a small emptyDir or PVC would report.
    real = shutil.disk_usage
    monkeypatch.setattr(fetch_cache.shutil, "disk_usage",
                        lambda path: real(path)._replace(free=1 << 20))
    message = _failure(f"s3://{BUCKET}/{TINY_PREFIX}", download_dir)
    assert "GiB" in message and "free in" in message and "which has 0.00 GiB (1048576 bytes)" \
        in message
