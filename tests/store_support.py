"""The stores tests fetch models from: moto's S3 server on loopback, and Hugging Face hub
caches written in the hub's own layout."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import logging
import os
import shutil
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator

import boto3
from moto.server import ThreadedMotoServer
from process_support import download_command, free_port

BUCKET = "models"
TINY_PREFIX = "llama/tiny"
# The credentials moto accepts while it does not check them, as any S3 client reads them.
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@contextlib.contextmanager
def moto_s3() -> Iterator[str]:
    """A real S3-compatible HTTP server on a free loopback port: its endpoint URL."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def s3_client(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, **{
        "aws_access_key_id": S3_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"],
        "region_name": S3_ENV["AWS_REGION"]})


def upload_directory(client, bucket: str, prefix: str, directory: str) -> None:
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            key = f"{prefix}/{os.path.relpath(path, directory)}"
            client.upload_file(path, bucket, key)


def write_hub_cache(cache: str, repo_id: str, directory: str, commit: str = COMMIT) -> str:
    """`directory`'s files as the hub client caches a download of `repo_id` at `commit`
    (models--ORG--NAME/ with blobs named by content hash, snapshots/COMMIT/ of links to them,
    refs/main): its snapshot directory."""
    repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    snapshot = os.path.join(repo, "snapshots", commit)
    os.makedirs(os.path.join(repo, "blobs"), exist_ok=True)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            blob = hashlib.sha256(f.read()).hexdigest()
        shutil.copyfile(os.path.join(directory, name), os.path.join(repo, "blobs", blob))
        os.makedirs(snapshot, exist_ok=True)
        os.symlink(os.path.join("..", "..", "blobs", blob), os.path.join(snapshot, name))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(commit)
    return snapshot


def same_files(a: str, b: str) -> bool:
    """Whether two directories hold the same files with the same bytes."""
    def files(d: str) -> dict[str, bytes]:
        out = {}
        for root, _, names in os.walk(d):
            for n in names:
                with open(os.path.join(root, n), "rb") as f:
                    out[os.path.relpath(os.path.join(root, n), d)] = f.read()
        return out
    return files(a) == files(b)


@contextlib.contextmanager
def hub_that_finds_nothing(asked: list[str] | None = None) -> Iterator[str]:
    """A loopback server answering every hub request as the hub answers for a repository that
    does not exist (404, X-Error-Code: RepoNotFound), or, under a `gated-*` name, for a gated
    one without access (403, GatedRepo): its URL, for HF_ENDPOINT. `asked` collects the paths
    requested."""
    class Handler(_QuietHandler):
        def do_GET(self) -> None:
            if asked is not None:
                asked.append(self.path)
            gated = "/gated-" in self.path
            self.send_response(403 if gated else 404)
            self.send_header("X-Error-Code", "GatedRepo" if gated else "RepoNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()

    with _loopback(Handler) as url:
        yield url


@contextlib.contextmanager
def hub_serving(repo_id: str, directory: str, asked: list[str] | None = None,
                commit: str = COMMIT,
                authorizations: list[tuple[str, str | None]] | None = None
                ) -> Iterator[str]:
    """A loopback server answering the hub client's calls for `repo_id` at `commit` with the
    files of `directory`, as the hub answers them (the repository's revision and file tree,
    then each file by HEAD for its metadata and GET for its bytes): its URL, for HF_ENDPOINT.
    Files in subdirectories are the repository's under their relative paths. `asked` collects
    the files whose bytes were sent, `authorizations` every request's path and Authorization
    header (None where it had none)."""
    files = {}
    for root, _, names in sorted(os.walk(directory)):
        for name in sorted(names):
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, directory)] = f.read()
    api = f"/api/models/{repo_id}/"

    class Handler(_QuietHandler):
        def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(body)

        def _json(self, value) -> None:
            self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

        def do_GET(self) -> None:
            if authorizations is not None:
                authorizations.append((self.path, self.headers.get("Authorization")))
            path = self.path.split("?")[0]
            if path.startswith(api + "revision/"):
                self._json({"id": repo_id, "sha": commit,
                            "siblings": [{"rfilename": name} for name in files]})
            elif path.startswith(api + "tree/"):
                self._json([{"type": "file", "path": name, "size": len(data),
                             "oid": hashlib.sha1(data).hexdigest()}
                            for name, data in files.items()])
            elif path.startswith(f"/{repo_id}/resolve/"):
                # /REPO/resolve/REVISION/PATH
                name = urllib.parse.unquote(path.removeprefix(f"/{repo_id}/resolve/")
                                            .partition("/")[2])
                if name not in files:
                    self._send(404, b"", {"X-Error-Code": "EntryNotFound"})
                    return
                data = files[name]
                if self.command == "GET" and asked is not None:
                    asked.append(name)
                self._send(200, data, {"X-Repo-Commit": commit,
                                       "ETag": f'"{hashlib.sha256(data).hexdigest()}"'})
            else:
                self._send(404, b"", {"X-Error-Code": "RepoNotFound"})

    with _loopback(Handler) as url:
        yield url


class _QuietHandler(http.server.BaseHTTPRequestHandler):
    """Answers HEAD as GET (the handler's do_GET sends no body to a HEAD) and logs nothing."""

    def do_HEAD(self) -> None:
        self.do_GET()

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def _loopback(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` serving on a free loopback port, on its own thread: its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def download_from_hub(repo_id: str, directory: str, cache: str,
                      *flags: str) -> tuple[str, list[str]]:
    """`tokenmill download hf://REPO` (with `flags`) through the hub's own client against a
    loopback hub serving `directory` as the repository: the local snapshot directory and the
    files whose bytes were sent."""
    asked: list[str] = []
    with hub_serving(repo_id, directory, asked) as hub:
        env = {**os.environ, "HF_ENDPOINT": hub, "HF_HUB_OFFLINE": "0",
               "HF_HUB_DISABLE_XET": "1"}
        result = subprocess.run(download_command(f"hf://{repo_id}", "--download-dir", cache,
                                                 *flags),
                                cwd="/", env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1], asked
