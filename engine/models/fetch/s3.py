"""s3://BUCKET/PREFIX: every object under the prefix, fetched as parallel ranged GETs.

The client is obstore (measured against boto3's transfer manager: docs/benchmarks.md). It
reads the standard AWS variables itself: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_REGION / AWS_DEFAULT_REGION, and AWS_ENDPOINT_URL for S3-compatible
stores (MinIO, Ceph, R2...); a pod's web identity (IRSA) and instance metadata work too."""

from __future__ import annotations

import os
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

from tokenmill.engine.models.fetch.cache import check_free_space, model_lock
from tokenmill.engine.models.fetch.errors import ModelFetchError
from tokenmill.engine.models.fetch.partial import CHUNK_BYTES, PartialFile, RemoteFile
from tokenmill.engine.models.fetch.patterns import unwanted
from tokenmill.engine.models.fetch.progress import Progress
from tokenmill.engine.models.fetch.uri import S3Model
from tokenmill.engine.models.weight_files import skipped_weight_files

WORKERS = 8


def s3_directory(model: S3Model, download_dir: str) -> str:
    return os.path.join(download_dir, "s3", model.bucket, *model.prefix.split("/"))


def fetch_s3(model: S3Model, download_dir: str, chunk_bytes: int = CHUNK_BYTES,
             workers: int = WORKERS, ignore_patterns: tuple[str, ...] = ()) -> str:
    """Download (or find complete) every object under the prefix but those `ignore_patterns`
    match (all of a LoRA adapter's); return the local directory."""
    directory = s3_directory(model, download_dir)
    store = _store(model)
    with model_lock(directory, model.uri):
        files = [PartialFile(os.path.join(directory, *f.name.split("/")), f, chunk_bytes)
                 for f in _list(store, model, ignore_patterns)]
        todo = [f for f in files if not f.complete()]
        resumed = sum(f.written_bytes() for f in todo)
        check_free_space(directory, sum(f.remote.size for f in todo) - resumed, model.uri)
        progress = Progress(model.uri, sum(f.remote.size for f in files),
                            initial=sum(f.remote.size for f in files if f not in todo) + resumed)
        with ThreadPoolExecutor(workers, thread_name_prefix="s3-fetch") as pool:
            futures = [pool.submit(_fetch_range, store, model, f, start, end, progress)
                       for f in todo for start, end in f.pending()]
            finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((fut for fut in finished if fut.exception() is not None), None)
            if failed is not None:
                for fut in futures:
                    fut.cancel()
                raise _error(model, failed.exception()) from failed.exception()
        for f in todo:
            f.finish(model.uri)
        progress.close()
    return directory


def _store(model: S3Model) -> Any:
    from obstore.store import S3Store

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    options = {"allow_http": True} if endpoint and endpoint.startswith("http://") else None
    try:
        return S3Store(model.bucket, endpoint=endpoint, client_options=options,
                       retry_config={"max_retries": 3, "retry_timeout": _timedelta(30)})
    except Exception as exc:  # no region or endpoint set: obstore raises a bare TypeError
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        hint = "" if endpoint or region else \
            " (no AWS_REGION and no AWS_ENDPOINT_URL is set)"
        raise ModelFetchError(model.uri, f"cannot open the bucket {model.bucket!r}{hint}: "
                                         f"{type(exc).__name__} {exc}") from exc


def _timedelta(seconds: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=seconds)


def _list(store: Any, model: S3Model, ignore_patterns: tuple[str, ...]) -> list[RemoteFile]:
    import obstore

    prefix = model.prefix + "/" if model.prefix else ""
    try:
        metas = [m for batch in obstore.list(store, prefix=prefix or None) for m in batch]
    except Exception as exc:
        raise _error(model, exc) from exc
    files = [RemoteFile(m["path"][len(prefix):], m["size"], m["e_tag"]) for m in metas
             if not m["path"].endswith("/")]
    if not files:
        raise ModelFetchError(model.uri, f"no objects under the prefix {prefix or '/'!r} in "
                                         f"bucket {model.bucket!r}")
    names = [f.name for f in files]
    # Mistral's second copy of the weights, the user's patterns
    skipped = set(skipped_weight_files(names) + unwanted(names, ignore_patterns))
    files = [f for f in files if f.name not in skipped]
    if not files:
        raise ModelFetchError(model.uri, f"--ignore-patterns {' '.join(ignore_patterns)} "
                                         f"leaves none of the {len(names)} objects under the "
                                         f"prefix {prefix or '/'!r}")
    return files


def _fetch_range(store: Any, model: S3Model, f: PartialFile, start: int, end: int,
                 progress: Progress) -> None:
    key = f"{model.prefix}/{f.remote.name}" if model.prefix else f.remote.name
    data = _get_range(store, key, start, end)
    if len(data) != end - start:
        raise ModelFetchError(model.uri, f"{f.remote.name}: asked for bytes {start}-{end}, "
                                         f"got {len(data)} (the object changed?)")
    f.write(start, memoryview(data))
    progress.update(end - start)


def _get_range(store: Any, key: str, start: int, end: int) -> Any:
    import obstore

    return obstore.get_range(store, key, start=start, end=end)


def _error(model: S3Model, exc: BaseException) -> ModelFetchError:
    """The store's answer as one line a user can act on."""
    if isinstance(exc, ModelFetchError):
        return exc
    text = " ".join(str(exc).split())
    if "NoSuchBucket" in text:
        return ModelFetchError(model.uri, f"bucket {model.bucket!r} does not exist")
    if any(code in text for code in ("InvalidAccessKeyId", "SignatureDoesNotMatch",
                                     "ExpiredToken", "InvalidToken")):
        return ModelFetchError(model.uri, "the store refused the credentials ("
                                          f"{_code(text)}): check AWS_ACCESS_KEY_ID, "
                                          "AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN")
    if "AccessDenied" in text or "403" in text:
        return ModelFetchError(model.uri, "access denied: the credentials may not read "
                                          f"s3://{model.bucket}/{model.prefix}")
    if "NoSuchKey" in text or type(exc).__name__ == "NotFoundError":
        return ModelFetchError(model.uri, "an object disappeared while downloading")
    if "error sending request" in text or "Connection refused" in text:
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or "the AWS endpoint"
        return ModelFetchError(model.uri, f"cannot reach {endpoint}: {text[:200]}")
    return ModelFetchError(model.uri, f"{type(exc).__name__}: {text[:300]}")


def _code(text: str) -> str:
    for code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"):
        if code in text:
            return code
    return "refused"
