"""A `vllm serve` command line runs as `tokenmill serve`: one real server started with vLLM's
server flags (several served names, HTTPS, CORS, request logs, uvicorn's log level, no API
docs) and the engine flags that only exist for vLLM's command lines, driven with the official
openai client; flags that can't work together exit 2 naming one of them."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import signal
import ssl
import time

import httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from server_support import ServeProcess, openai_client

from tokenmill.engine.cli import main, parse_args
from tokenmill.engine.contract.config import engine_config_from_args

KEY = "sk-flags"
ORIGIN = "https://ui.example"


def _self_signed(directory) -> tuple[str, str]:
    """A key and a certificate for 127.0.0.1, which the client trusts as its own CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    key_path, cert_path = directory / "key.pem", directory / "cert.pem"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(key_path), str(cert_path)


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> tuple[str, str]:
    return _self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def vllm_server(tiny_llama_dir, tls, tmp_path_factory):
    """Some flags from a --config file (vLLM's YAML), one of them given again on the command
    line, which wins."""
    key, cert = tls
    config = tmp_path_factory.mktemp("config") / "serve.yaml"
    config.write_text("served-model-name: [tiny, tiny-alias]\nmax_log_len: 12\n"
                      "enable-log-requests: true\nuvicorn-log-level: error\n")
    proc = ServeProcess(
        tiny_llama_dir, "--config", str(config), "--trust-remote-code",
        "--enable-chunked-prefill", "--disable-log-requests", "--disable-log-stats",
        "--enable-log-outputs", "--enable-tokenizer-info-endpoint", "--log-error-stack",
        "--ssl-ciphers", "ECDHE+AESGCM",
        "--kv-offloading-backend", "native", "--disable-cascade-attn",
        "--uvicorn-log-level", "info",
        "--disable-uvicorn-access-log", "--disable-fastapi-docs",
        "--disable-frontend-multiprocessing", "--distributed-executor-backend", "mp",
        "--enable-expert-parallel",
        "--pipeline-parallel-size", "1", "--data-parallel-size", "1", "--api-server-count", "1",
        "--guided-decoding-backend", "xgrammar", "--return-tokens-as-token-ids",
        "--structured-outputs-config", '{"backend": "xgrammar", "disable_fallback": true}',
        "--enable-request-id-headers", "--exclude-tools-when-tool-choice-none",
        "--use-tqdm-on-load", "--max-parallel-loading-workers", "2",
        "--logprobs-mode", "raw_logprobs",
        "--limit-mm-per-prompt", '{"image": 0, "video": {"count": 0}}',
        "--tokenizer-mode", "mistral", "--config-format", "mistral", "--load-format", "mistral",
        "--swap-space", "16", "--disable-custom-all-reduce", "--max-seq-len-to-capture", "8192",
        "--root-path", "/llm", "--max-logprobs", "30", "--enable-force-include-usage",
        "--enable-prompt-tokens-details", "--scheduling-policy", "priority",
        "--stream-interval", "3", "--cuda-graph-sizes", "1", "2", "4",
        "--prefix-caching-hash-algo", "sha256_cbor", "--code-revision", "main", "-O3",
        "--num-scheduler-steps", "8", "--use-v2-block-manager", "--disable-async-output-proc",
        "--multi-step-stream-outputs", "--disable-mm-preprocessor-cache",
        "--mm-processor-cache-gb", "4", "--mm-encoder-tp-mode", "data", "--model-impl", "vllm",
        "--show-hidden-metrics-for-version", "0.10", "--fully-sharded-loras",
        "--max-num-partial-prefills", "4", "--max-long-partial-prefills", "2",
        "--calculate-kv-scales", "--preemption-mode", "swap", "--num-lookahead-slots", "0",
        "--cpu-offload-gb", "0",
        "--compilation-config", '{"cudagraph_capture_sizes": [1, 2]}',
        "--allowed-origins", f'["{ORIGIN}"]', "--ssl-keyfile", key, "--ssl-certfile", cert,
        env={"TOKENMILL_API_KEY": KEY})
    proc.url = proc.url.replace("http://", "https://")
    proc.verify = ssl.create_default_context(cafile=cert)
    try:
        proc.wait_healthy(timeout=60)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def https_client(vllm_server) -> openai.OpenAI:
    return openai_client(f"{vllm_server.url}/v1", api_key=KEY,
                         http_client=httpx.Client(verify=vllm_server.verify))


def test_serving_options_reach_the_server_under_its_root_path(vllm_server):
    """--root-path, --max-logprobs, --enable-force-include-usage and --scheduling-policy
    priority, through the official client on the prefixed path."""
    client = openai_client(f"{vllm_server.url}/llm/v1", api_key=KEY,
                           http_client=httpx.Client(verify=vllm_server.verify))
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True,
        logprobs=True, top_logprobs=30, extra_body={"priority": -3, "ignore_eos": True}))
    assert chunks[-1].usage.completion_tokens == 2
    assert all(len(t.top_logprobs) == 30 for c in chunks if c.choices and c.choices[0].logprobs
               for t in c.choices[0].logprobs.content)
    with pytest.raises(openai.BadRequestError, match="--max-logprobs"):
        client.completions.create(model="tiny", prompt="x", max_tokens=1, logprobs=31)


def test_stream_interval_sends_tokens_three_at_a_time_between_the_first_and_the_end(
        https_client):
    """The first chunk holds what was ready when the stream began, the last the remainder;
    without the interval a reader that keeps up gets one token a chunk."""
    chunks = list(https_client.completions.create(
        model="tiny", prompt="hello there", max_tokens=20, temperature=0, stream=True,
        extra_body={"ignore_eos": True, "return_token_ids": True}))
    sizes = [len(c.choices[0].token_ids) for c in chunks if c.choices]
    whole = https_client.completions.create(model="tiny", prompt="hello there", max_tokens=20,
                                            temperature=0, extra_body={"ignore_eos": True})
    assert sum(sizes) == 20
    assert all(size >= 3 for size in sizes[1:-1]), sizes
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text


def test_a_request_may_use_any_served_name_and_replies_use_the_first(https_client):
    reply = https_client.chat.completions.create(
        model="tiny-alias", messages=[{"role": "user", "content": "hello"}], max_tokens=3,
        temperature=0, logprobs=True)
    assert reply.model == "tiny"
    assert reply.usage.completion_tokens == 3
    assert all(t.token.startswith("token_id:") for t in reply.choices[0].logprobs.content)
    assert [m.id for m in https_client.models.list().data] == ["tiny", "tiny-alias"]
    assert https_client.models.retrieve("tiny-alias").id == "tiny-alias"
    with pytest.raises(openai.NotFoundError, match="'tiny', 'tiny-alias'"):
        https_client.completions.create(model="other", prompt="hello", max_tokens=1)


def test_a_renewed_certificate_is_served_without_a_restart(tiny_llama_dir, tmp_path):
    """--enable-ssl-refresh: the files replaced under the running server (as cert-manager
    renews a Secret's), new connections get the new certificate."""
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    key, cert = _self_signed(tmp_path / "old")
    proc = ServeProcess(tiny_llama_dir, "--ssl-keyfile", key, "--ssl-certfile", cert,
                        "--enable-ssl-refresh")
    proc.url = proc.url.replace("http://", "https://")
    proc.verify = ssl.create_default_context(cafile=cert)
    try:
        proc.wait_healthy(timeout=60)
        served = ssl.get_server_certificate(("127.0.0.1", proc.port))
        assert ssl.PEM_cert_to_DER_cert(served) == _der(cert)
        new_key, new_cert = _self_signed(tmp_path / "new")
        renewed = _der(new_cert)
        os.replace(new_key, key)
        os.replace(new_cert, cert)
        deadline = time.monotonic() + 15
        while ssl.PEM_cert_to_DER_cert(
                ssl.get_server_certificate(("127.0.0.1", proc.port))) != renewed:
            assert time.monotonic() < deadline, "the renewed certificate was not served"
            time.sleep(0.2)
        trusting_new = ssl.create_default_context(cafile=cert)
        assert httpx.get(proc.url + "/health", verify=trusting_new, timeout=5).status_code == 200
    finally:
        proc.kill()
        proc.wait()


def _der(pem_path: str) -> bytes:
    with open(pem_path, encoding="ascii") as f:
        return ssl.PEM_cert_to_DER_cert(f.read())


def test_plain_http_gets_no_answer(vllm_server):
    with pytest.raises(httpx.TransportError):
        httpx.get(vllm_server.url.replace("https://", "http://") + "/health", timeout=5)


def test_a_browser_preflight_passes_for_the_allowed_origin_only(vllm_server):
    url = vllm_server.url + "/v1/chat/completions"
    asks = {"Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"}
    with httpx.Client(verify=vllm_server.verify, timeout=10) as http:
        allowed = http.options(url, headers={"Origin": ORIGIN, **asks})  # carries no key
        other = http.options(url, headers={"Origin": "https://elsewhere.example", **asks})
        unauthorized = http.post(url, headers={"Origin": ORIGIN}, json={})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == ORIGIN
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    # The page can read why it was refused.
    assert unauthorized.status_code == 401
    assert unauthorized.headers["access-control-allow-origin"] == ORIGIN


def test_tokenizer_info_shows_how_the_server_tokenizes(vllm_server, tiny_llama_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    with httpx.Client(verify=vllm_server.verify, timeout=10) as http:
        info = http.get(vllm_server.url + "/tokenizer_info",
                        headers={"Authorization": f"Bearer {KEY}"})
        assert http.get(vllm_server.url + "/tokenizer_info").status_code == 401
    assert info.status_code == 200, info.text
    body = info.json()
    assert body["tokenizer_class"] == type(tokenizer).__name__
    assert body["chat_template"] == tokenizer.chat_template
    assert body["eos_token"] == tokenizer.eos_token  # a special token as its text
    assert body["model_max_length"] == tokenizer.model_max_length


def test_the_api_docs_are_off(vllm_server):
    with httpx.Client(verify=vllm_server.verify, timeout=10) as http:
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert http.get(vllm_server.url + path).status_code == 404, path


def test_each_request_and_its_output_are_logged_cut_to_max_log_len_and_no_access_log(
        vllm_server, https_client):
    """Last in this module: it stops the server to read its log."""
    reply = https_client.completions.create(
        model="tiny", prompt="the quick brown fox jumps", max_tokens=2, temperature=0, seed=7,
        extra_body={"return_token_ids": True})
    vllm_server.send_signal(signal.SIGTERM)
    code, stderr = vllm_server.finish()
    assert code == 0, stderr
    logged = [line for line in stderr.splitlines() if "logger=tokenmill.requests" in line]
    received = [line for line in logged if 'msg="request received"' in line]
    finished = [line for line in logged if 'msg="response finished"' in line]
    # The chats of the first test and of the root-path test, the stream-interval test's two
    # completions, and this completion; each finished once, streamed or not.
    assert len(received) == 5 == len(finished), stderr
    line = received[-1]
    assert "model=tiny" in line
    assert "prompt_tokens=" in line and 'prompt="the quick br"' in line
    assert "'max_tokens': 2" in line and "'seed': 7" in line and "'temperature': 0.0" in line
    request_id = re.search(r" id=(\S+)", line)[1]
    assert [re.search(r" id=(\S+)", f)[1] for f in finished].count(request_id) == 1
    output = next(f for f in finished if f" id={request_id} " in f)
    assert "finish_reason=length output_tokens=2" in output
    assert f'output_token_ids="{reply.choices[0].token_ids}"' in output
    # The stream-interval test's 20 tokens, streamed and not: joined, then cut to 12 ids.
    long = [f for f in finished if "output_tokens=20" in f]
    assert len(long) == 2
    assert all(len(json.loads(re.search(r'output_token_ids="(\[.*?\])"', f)[1])) == 12
               for f in long)
    # --enable-log-deltas (on by default): what each step of a stream added, which adds up.
    deltas = [line for line in logged if 'msg="response delta"' in line]
    streamed = {re.search(r" id=(\S+)", d)[1] for d in deltas}
    for stream_id in streamed:
        mine = [d for d in deltas if f" id={stream_id} " in d]
        whole = next(f for f in finished if f" id={stream_id} " in f)
        total = int(re.search(r"output_tokens=(\d+)", whole)[1])
        assert sum(int(re.search(r"output_tokens=(\d+)", d)[1]) for d in mine) == total
    assert any("output_tokens=20" in f for f in finished if re.search(r" id=(\S+)", f)[1]
               in streamed)
    # --log-error-stack: the root-path test's 400 (31 logprobs), with its traceback.
    assert 'msg="error response"' in stderr and "status=400" in stderr
    assert "Traceback (most recent call last)" in stderr
    assert "Uvicorn running on https://127.0.0.1" in stderr  # uvicorn's INFO lines are on
    assert "HTTP/1.1" not in stderr  # but not its access log


@pytest.mark.parametrize("flags, error", [
    (["--ssl-keyfile", "KEY"], "--ssl-keyfile: needs --ssl-certfile"),
    (["--ssl-certfile", "CERT"], "--ssl-certfile: needs --ssl-keyfile"),
    (["--ssl-keyfile", "/no/key.pem", "--ssl-certfile", "/no/cert.pem"],
     "--ssl-certfile: can't load /no/cert.pem with the key /no/key.pem"),
    (["--ssl-keyfile", "KEY", "--ssl-certfile", "KEY"], "--ssl-certfile: can't load"),
    (["--ssl-keyfile", "KEY", "--ssl-certfile", "CERT", "--ssl-ca-certs", "/no/ca.pem"],
     "--ssl-ca-certs: can't load /no/ca.pem"),
    (["--ssl-cert-reqs", "2"], "--ssl-cert-reqs: client certificates need HTTPS"),
    (["--ssl-ciphers", "ECDHE+AESGCM"], "--ssl-ciphers: ciphers need HTTPS"),
    (["--enable-ssl-refresh"], "--enable-ssl-refresh: needs HTTPS"),
    (["--ssl-keyfile", "KEY", "--ssl-certfile", "CERT", "--ssl-ciphers", "NOPE"],
     "--ssl-ciphers: 'NOPE' selects no cipher OpenSSL knows"),
    (["--allowed-origins", "*"], "argument --allowed-origins: must be a JSON list of strings"),
    (["--allowed-methods", '["GET", 1]'], "argument --allowed-methods: must be a JSON list"),
    (["--uvicorn-log-level", "loud"], "argument --uvicorn-log-level: invalid choice: 'loud'"),
    (["--max-log-len", "0"], "argument --max-log-len: must be a positive integer"),
    (["--port", "99999"], "argument --port: must be a port number, 0 to 65535, got '99999'"),
    (["--port", "-1"], "argument --port: must be a port number"),
    (["--max-waiting-requests", "0"],
     "argument --max-waiting-requests: must be a positive integer, got '0'"),
    (["--shutdown-timeout", "-3"],
     "argument --shutdown-timeout: must be a number of seconds, 0 or more, got '-3'"),
    (["--shutdown-timeout", "nan"], "argument --shutdown-timeout: must be a number of seconds"),
    (["--override-generation-config", '{"seed": 1}'],
     "argument --override-generation-config: 'seed' is not one of temperature, top_p"),
    (["--override-generation-config", "[1]"],
     "argument --override-generation-config: must be a JSON object"),
    (["--override-generation-config", '{"top_p": "high"}'], "top_p must be a number"),
    (["--override-generation-config", '{"max_new_tokens": 0}'],
     "max_new_tokens must be at least 1"),
    (["--pipeline-parallel-size", "2"], "--pipeline-parallel-size: 2 is not supported; a "
     "replica shards its model with --tensor-parallel-size"),
    (["--data-parallel-size", "4"], "--data-parallel-size: 4 is not supported; run more "
     "replicas"),
    (["--api-server-count", "4"], "--api-server-count: 4 is not supported; one HTTP server "
     "shares the engine's process"),
    (["--cpu-offload-gb", "10"], "--cpu-offload-gb: 10 is not supported; the weights stay "
     "whole on the device"),
    (["--cpu-offload-gb", "-1"], "argument --cpu-offload-gb: must be a number, 0 or more"),
    (["--preemption-mode", "evict"], "argument --preemption-mode: invalid choice: 'evict'"),
    (["--num-lookahead-slots", "two"], "argument --num-lookahead-slots: must be a whole number"),
    (["--structured-outputs-config", '{"backend": "outlines"}'], "argument "
     "--structured-outputs-config: backend 'outlines' is not available: structured outputs "
     "run on xgrammar"),
    (["--structured-outputs-config", '{"disable_any_whitespace": true}'], "argument "
     "--structured-outputs-config: 'disable_any_whitespace' is not supported here"),
    (["--logprobs-mode", "processed"], "'processed' is not one of ('raw_logprobs'"),
    (["--generation-config", "/nonexistent/dir"], "--generation-config: '/nonexistent/dir' "
     "is neither auto, vllm nor a directory holding generation_config.json"),
    (["--structured-outputs-config", "xgrammar"], "argument --structured-outputs-config: must "
     "be a JSON object"),
    (["--limit-mm-per-prompt", '{"image": 1, "audio": 1}'], "limit_mm_per_prompt: audio: 1 "
     "is not supported; tokenmill reads text and images (set every other modality to 0)"),
    (["--allowed-local-media-path", "/nonexistent/media"], "--allowed-local-media-path: "
     "/nonexistent/media is not a directory"),
    (["--limit-mm-per-prompt", "image=0,video=2"], "limit_mm_per_prompt: video: 2 is not"),
    (["--limit-mm-per-prompt", "images"], "limit_mm_per_prompt: must be a JSON "
     'object such as {"image": 0}, or image=0,video=0'),
    (["--limit-mm-per-prompt", '{"image": -1}'],
     "limit_mm_per_prompt: image: -1 is not a count of items"),
    (["--default-chat-template-kwargs", "[1]"], "argument --default-chat-template-kwargs: "
     'must be a JSON object such as {"enable_thinking": false}'),
    (["--default-chat-template-kwargs", '{"tools": []}'], "argument "
     "--default-chat-template-kwargs: 'tools' is not a template variable a server may set"),
    (["--load-format", "dummy"], "argument --load-format: invalid choice: 'dummy'"),
    (["--tokenizer-mode", "custom"], "argument --tokenizer-mode: invalid choice: 'custom'"),
    (["--distributed-executor-backend", "ray"],
     "argument --distributed-executor-backend: invalid choice: 'ray'"),
    (["--max-model-len", "1.5K"], "argument --max-model-len: '1.5K' is not a size such as "
     "8192, 32k (32,000) or 32K (32,768); a decimal takes a lowercase suffix (25.6k)"),
    (["--kv-cache-memory-bytes", "4Gi"], "--kv-cache-memory-bytes: '4Gi' is not a size"),
    (["--max-num-batched-tokens", "lots"], "--max-num-batched-tokens: 'lots' is not a size"),
    (["-O5"], "argument -O/--optimization-level: must be 0, 1, 2 or 3 (vLLM's levels)"),
    (["--compilation-config", "[1]"], "argument --compilation-config: must be a JSON object"),
    (["--cuda-graph-sizes", "0"], "argument --cuda-graph-sizes/--max-cudagraph-capture-size: "
     "must be a positive integer, got '0'"),
    (["--compilation-config", '{"cudagraph_capture_sizes": [0]}'], "argument "
     "--compilation-config: cudagraph_capture_sizes must be a list of positive integers"),
    (["--kv-offloading-backend", "lmcache"], "--kv-offloading-backend: lmcache is not "
     "available; the host tier of --kv-offloading-size is tokenmill's own (native)"),
    (["--model-impl", "transformers"], "--model-impl: transformers is not available: "
     "tokenmill runs its own implementation of each architecture it supports"),
    (["--enable-reasoning"], "--enable-reasoning: needs --reasoning-parser (deepseek_r1 or"),
    (["--mm-processor-cache-gb", "-1"], "argument --mm-processor-cache-gb: must be a number, "
     "0 or more, got '-1'"),
    (["--num-scheduler-steps", "0"], "argument --num-scheduler-steps: must be a positive"),
    (["--max-num-partial-prefills", "0"],
     "argument --max-num-partial-prefills: must be a positive"),
])
def test_server_flags_that_cannot_work_exit_2_naming_one(flags, error, tls, capsys):
    """Before the model loads: the model named does not exist."""
    key, cert = tls
    flags = [{"KEY": key, "CERT": cert}.get(f, f) for f in flags]
    try:
        code = main(["serve", "--model", "/nonexistent", *flags])
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    assert code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after argparse's usage, if any
    assert last.startswith("tokenmill serve: error: ") and error in last, last


def test_a_config_file_gives_flags_the_command_line_overrides(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("model: Org/from-file\nmax-num-seqs: 8\nenable_prefix_caching: false\n"
                      "served-model-name: [a, b]\nallowed-origins: ['https://x.example']\n"
                      'speculative-config: {method: ngram, num_speculative_tokens: 2}\n'
                      "lora-modules: [{name: sql, path: /adapters/sql}]\nenable-lora: true\n"
                      "disable-fastapi-docs: false\nlimit-mm-per-prompt: {image: 0}\n")
    args = parse_args(["serve", "--config", str(config), "--max-num-seqs", "4"])
    assert (args.model, args.max_num_seqs, args.enable_prefix_caching) == ("Org/from-file", 4,
                                                                           False)
    assert args.served_model_name == ["a", "b"]
    assert args.allowed_origins == ["https://x.example"]
    assert json.loads(args.speculative_config) == {"method": "ngram",
                                                   "num_speculative_tokens": 2}
    assert [json.loads(m) for m in args.lora_modules] == [{"name": "sql",
                                                           "path": "/adapters/sql"}]
    assert args.disable_fastapi_docs is False
    assert json.loads(args.limit_mm_per_prompt) == {"image": 0}
    # A model on the command line wins over the file's, as in vLLM.
    assert parse_args(["serve", "Org/given", "--config", str(config)]).model_tag == "Org/given"
    assert parse_args(["serve", "Org/given", "--config", str(config)]).model != "Org/from-file"
    assert parse_args(["serve", "--config", str(config), "--model", "m"]).model == "m"


def test_sizes_take_vllms_suffixes_and_the_context_length_takes_auto(tmp_path):
    """vLLM's human-readable integers: a lowercase suffix counts in thousands (decimals
    allowed), an uppercase one in 1,024s; --kv-cache-memory-bytes is vLLM's name of
    --kv-cache-memory, in a config file too."""
    args = parse_args(["serve", "--max-model-len", "32k", "--max-num-batched-tokens", "8K",
                       "--kv-cache-memory-bytes", "2G"])
    assert (args.max_model_len, args.max_num_batched_tokens, args.kv_cache_memory) == (
        32000, 8192, 2 << 30)
    assert parse_args(["serve", "--kv-cache-memory", "1500000"]).kv_cache_memory == 1500000
    older = parse_args(["serve", "--override-pooler-config", '{"pooling_type": "MEAN"}'])
    assert older.pooler_config == '{"pooling_type": "MEAN"}'  # vLLM's older name
    for auto in ("auto", "-1", "AUTO"):  # the model's length, as far as the pool holds it
        assert parse_args(["serve", "--max-model-len", auto]).max_model_len is None
    config = tmp_path / "serve.yaml"
    config.write_text("kv-cache-memory-bytes: 1G\nmax-model-len: 25.6k\n")
    args = parse_args(["serve", "--config", str(config)])
    assert (args.kv_cache_memory, args.max_model_len) == (1 << 30, 25600)


@pytest.mark.parametrize("flags,eager,sizes", [
    (["-O0"], True, None),
    (["-O", "3"], False, None),
    (["--optimization-level", "0"], True, None),
    (["--compilation-config", '{"cudagraph_mode": "NONE"}'], True, None),
    (["--compilation-config", '{"cudagraph_capture_sizes": [4, 1, 2], "level": 3}'], False,
     (1, 2, 4)),
    (["--compilation-config", '{"max_cudagraph_capture_size": 16}'], False, (16,)),
    (["--compilation-config", "3"], False, None),
    (["--cuda-graph-sizes", "8"], False, (8,)),
    (["--cuda-graph-sizes", "1", "2", "64"], False, (1, 2, 64)),
    (["--max-cudagraph-capture-size", "32"], False, (32,)),
    ([], False, None),
])
def test_vllms_compilation_flags_set_eager_steps_and_graph_sizes(flags, eager, sizes):
    """vLLM's -O0 and cudagraph_mode NONE run without CUDA graphs: --enforce-eager here; its
    capture sizes are --cuda-graph-sizes; its other compilation settings have nothing to
    change and are taken."""
    config = engine_config_from_args(parse_args(["serve", *flags]))
    assert (config.enforce_eager, config.cuda_graph_sizes) == (eager, sizes)


@pytest.mark.parametrize("text, error", [
    (None, "--config: can't read"),
    ("- max-num-seqs: 8\n", "must map flag names to values"),
    ("max-num-seqs: [8\n", "--config: can't read"),
    ("turbo: true\n", "--config: 'turbo' in"),
    ("max-num-seqs: many\n", "argument --max-num-seqs: invalid int value: 'many'"),
])
def test_a_config_file_that_cannot_be_used_exits_2(tmp_path, text, error, capsys):
    config = tmp_path / "serve.yaml"
    if text is not None:
        config.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        parse_args(["serve", "--config", str(config)])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("tokenmill serve: error: ") and error in last, last


def test_a_unix_socket_serves_in_place_of_a_port(tiny_llama_dir, tmp_path):
    socket_path = str(tmp_path / "engine.sock")
    proc = ServeProcess(tiny_llama_dir, "--uds", socket_path, "--served-model-name", "tiny")
    try:
        transport = httpx.HTTPTransport(uds=socket_path)
        with httpx.Client(transport=transport, base_url="http://engine", timeout=10) as http:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, proc.stderr.read()
                try:
                    if http.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "server did not become healthy"
                time.sleep(0.2)
            reply = http.post("/v1/completions", json={"model": "tiny", "prompt": "hi",
                                                       "max_tokens": 2})
            assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2
        with pytest.raises(httpx.TransportError):  # nothing listens on the port
            httpx.get(proc.url + "/health", timeout=2)
        proc.send_signal(signal.SIGTERM)
        code, stderr = proc.finish()
        assert code == 0, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
