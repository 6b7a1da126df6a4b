"""S3 clients for s3:// models, measured on a real S3-compatible server: moto's, started on
loopback in its own process (so it does not share the client's GIL). An object set of
--files objects totalling --total-mb is uploaded once; each client then downloads all of it
--repeats times into a fresh directory. Reported per client: wall time, MB/s (decimal) and
the client process's CPU seconds (what the client costs when the store is not the limit).

Clients: `tokenmill` (the engine's own fetch: obstore ranged GETs in parallel, written to
.partial files and checked), `obstore` (the same ranged GETs, no checks), `boto3-transfer`
(boto3's transfer manager, download_file per object, parallel ranged GETs within each) and
`boto3-ranges` (boto3 get_object ranged GETs in the same thread pool as obstore's).
Needs moto[server] and boto3 (the dev extra).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

MB = 1_000_000
MIB = 1 << 20
CHUNK = 16 * MIB
WORKERS = 8
BUCKET = "bench-models"
PREFIX = "model"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--total-mb", type=int, default=1024,
                        help="Size of the object set in MiB (default 1024).")
    parser.add_argument("--files", type=int, default=4,
                        help="Objects the set is split into (default 4, like a sharded "
                             "checkpoint).")
    parser.add_argument("--repeats", type=int, default=2, help="Downloads per client.")
    parser.add_argument("--clients", default="tokenmill,obstore,boto3-transfer,boto3-ranges",
                        help="Comma-separated clients to measure.")
    parser.add_argument("--json", default=None, help="Write the raw results here.")


def run(args: argparse.Namespace) -> int:
    from tokenmill.engine.bench.report import command_line, git_revision, write_json

    results = benchmark(args)
    payload = {"command": command_line(), "git": git_revision(), "machine": _machine(),
               "total_bytes": args.total_mb * MIB, "files": args.files,
               "chunk_bytes": CHUNK, "workers": WORKERS, "results": results,
               "summary": {name: _summary(runs) for name, runs in results.items()}}
    for name, s in payload["summary"].items():
        print(f"{name:<16} {s['mb_per_s_median']:8.1f} MB/s  cpu {s['cpu_s_median']:.2f} s  "
              f"wall {s['seconds_median']:.2f} s")
    if args.json:
        write_json(args.json, payload)
        print(f"raw results: {args.json}")
    return 0


def benchmark(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    with moto_environment() as endpoint:
        return _measure(args, endpoint)


@contextlib.contextmanager
def moto_environment() -> Iterator[str]:
    """moto's server running, and this process's S3 settings pointing at it (the bench
    credentials); the settings are restored afterwards. Yields the endpoint URL."""
    saved = {k: os.environ.get(k) for k in [*CREDENTIALS, "AWS_ENDPOINT_URL"]}
    os.environ.update(CREDENTIALS)
    try:
        with _moto_server() as endpoint:
            os.environ["AWS_ENDPOINT_URL"] = endpoint
            yield endpoint
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _measure(args: argparse.Namespace, endpoint: str) -> dict[str, list[dict[str, float]]]:
    with tempfile.TemporaryDirectory() as tmp:
        sizes = _upload(endpoint, args.total_mb * MIB, args.files)
        clients = _clients(endpoint, sizes)
        results: dict[str, list[dict[str, float]]] = {}
        for name in args.clients.split(","):
            results[name] = []
            for i in range(args.repeats):
                dest = os.path.join(tmp, f"{name}-{i}")
                start, cpu = time.perf_counter(), time.process_time()
                clients[name](dest)
                seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu
                got = sum(os.path.getsize(os.path.join(r, n))
                          for r, _, ns in os.walk(dest) for n in ns)
                if got != sum(sizes.values()):
                    raise RuntimeError(f"{name} wrote {got} bytes, not {sum(sizes.values())}")
                results[name].append({"seconds": seconds, "cpu_s": cpu_s,
                                      "mb_per_s": got / MB / seconds})
                shutil.rmtree(dest)
        return results


class _moto_server:
    """moto's S3 server as a child process on a free loopback port."""

    def __enter__(self) -> str:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                      "-p", str(port)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return url
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def _boto(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint,
                        config=Config(max_pool_connections=WORKERS * 2))


def _upload(endpoint: str, total: int, files: int) -> dict[str, int]:
    client = _boto(endpoint)
    client.create_bucket(Bucket=BUCKET)
    sizes = {}
    for i in range(files):
        key = f"{PREFIX}/model-{i:05d}-of-{files:05d}.safetensors"
        size = total // files
        client.put_object(Bucket=BUCKET, Key=key, Body=os.urandom(size))
        sizes[key] = size
    return sizes


def _clients(endpoint: str, sizes: dict[str, int]) -> dict[str, Callable[[str], None]]:
    from boto3.s3.transfer import TransferConfig

    from tokenmill.engine.models.fetch.s3 import _store, fetch_s3
    from tokenmill.engine.models.fetch.uri import S3Model

    model = S3Model(f"s3://{BUCKET}/{PREFIX}", BUCKET, PREFIX)
    boto = _boto(endpoint)
    transfer = TransferConfig(max_concurrency=WORKERS, multipart_chunksize=CHUNK,
                              multipart_threshold=CHUNK)

    def tokenmill(dest: str) -> None:
        fetch_s3(model, dest)

    def obstore_ranges(dest: str) -> None:
        import obstore

        store = _store(model)
        _ranged(dest, sizes, lambda key, a, b: obstore.get_range(store, key, start=a, end=b))

    def boto3_transfer(dest: str) -> None:
        os.makedirs(os.path.join(dest, PREFIX), exist_ok=True)
        with cf.ThreadPoolExecutor(len(sizes)) as pool:
            list(pool.map(lambda key: boto.download_file(BUCKET, key, os.path.join(dest, key),
                                                         Config=transfer), sizes))

    def boto3_ranges(dest: str) -> None:
        _ranged(dest, sizes, lambda key, a, b: boto.get_object(
            Bucket=BUCKET, Key=key, Range=f"bytes={a}-{b - 1}")["Body"].read())

    return {"tokenmill": tokenmill, "obstore": obstore_ranges,
            "boto3-transfer": boto3_transfer, "boto3-ranges": boto3_ranges}


def _ranged(dest: str, sizes: dict[str, int], get: Callable[[str, int, int], Any]) -> None:
    """Every object in CHUNK ranges over one pool of WORKERS threads, written at offsets."""
    os.makedirs(os.path.join(dest, PREFIX), exist_ok=True)
    fds = {key: os.open(os.path.join(dest, key), os.O_WRONLY | os.O_CREAT, 0o644)
           for key in sizes}

    def one(key: str, start: int) -> None:
        data = memoryview(get(key, start, min(start + CHUNK, sizes[key])))
        os.pwrite(fds[key], data, start)

    with cf.ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(lambda job: one(*job),
                      [(k, s) for k, size in sizes.items() for s in range(0, size, CHUNK)]))
    for fd in fds.values():
        os.close(fd)


def _summary(runs: list[dict[str, float]]) -> dict[str, float]:
    return {f"{k}_median": statistics.median(r[k] for r in runs)
            for k in ("seconds", "cpu_s", "mb_per_s")}


def _machine() -> dict[str, Any]:
    import boto3
    import moto
    import obstore

    return {"cpu_cores": os.cpu_count(), "python_version": platform.python_version(),
            "platform": platform.platform(), "load_average_after": list(os.getloadavg()),
            "obstore": obstore.__version__, "boto3": boto3.__version__,
            "moto": moto.__version__, "server": "moto (moto.server) on 127.0.0.1, own process"}
