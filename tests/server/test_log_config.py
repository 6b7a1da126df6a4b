"""--log-config-file (vLLM's flag): a logging.config.dictConfig JSON file configures tokenmill's
loggers and uvicorn's in the serving process; a file that can't work stops the start-up."""

from __future__ import annotations

import json
import signal

import pytest
from server_support import ServeProcess, openai_client

from tokenmill.engine.cli import main


def _config(log_file: str) -> dict:
    """Every tokenmill and uvicorn line at INFO into one file: tokenmill's through the logfmt
    formatter, uvicorn's as plain `LEVEL logger message`."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"logfmt": {"()": "tokenmill.engine.log.LogfmtFormatter"},
                       "plain": {"format": "%(levelname)s %(name)s %(message)s"}},
        "handlers": {"tokenmill": {"class": "logging.FileHandler", "filename": log_file,
                                   "formatter": "logfmt"},
                     "uvicorn": {"class": "logging.FileHandler", "filename": log_file,
                                 "formatter": "plain"}},
        "loggers": {"tokenmill": {"handlers": ["tokenmill"], "level": "INFO",
                                  "propagate": False},
                    "uvicorn": {"handlers": ["uvicorn"], "level": "INFO", "propagate": False}},
    }


def test_a_log_config_file_sends_tokenmill_and_uvicorn_lines_where_it_says(tiny_llama_dir,
                                                                           tmp_path):
    log_file = tmp_path / "server.log"
    config = tmp_path / "logging.json"
    config.write_text(json.dumps(_config(str(log_file))))
    proc = ServeProcess(tiny_llama_dir, "--served-model-name", "tiny", "--log-config-file",
                        str(config), "--enable-log-outputs")
    try:
        proc.wait_healthy(timeout=60)
        reply = openai_client(f"{proc.url}/v1").completions.create(
            model="tiny", prompt="hello", max_tokens=3, temperature=0,
            extra_body={"ignore_eos": True})
        assert reply.usage.completion_tokens == 3
    finally:
        proc.send_signal(signal.SIGTERM)
        code, stderr = proc.finish()
    assert code == 0, stderr
    logged = log_file.read_text()
    # uvicorn at INFO, the file's level (the flag's warning default would hide it).
    assert "INFO uvicorn.error Uvicorn running on http://127.0.0.1" in logged
    # tokenmill's INFO lines, which TOKENMILL_LOG_LEVEL's WARNING default would hide.
    assert "level=info logger=tokenmill.engine.server" in logged
    finished = [line for line in logged.splitlines() if 'msg="response finished"' in line]
    assert len(finished) == 1 and "output_tokens=3" in finished[0]
    assert "logger=tokenmill" not in stderr  # nothing left on the default handler


@pytest.mark.parametrize("content, error", [
    (None, "can't read {path}: No such file or directory"),
    ("version: 1", "{path} is not JSON: "),
    ('{"loggers": {}}', "{path} must hold a JSON object in logging.config.dictConfig's schema"),
    ('[1]', "must hold a JSON object"),
])
def test_a_log_config_file_that_cannot_work_exits_2_naming_the_flag(content, error, tmp_path,
                                                                   capsys):
    """Before the model loads: the model named does not exist."""
    path = tmp_path / "logging.json"
    if content is not None:
        path.write_text(content)
    code = main(["serve", "--model", "/nonexistent", "--log-config-file", str(path)])
    assert code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("tokenmill serve: error: --log-config-file: "), last
    assert error.format(path=path) in last, last


def test_a_log_config_python_cannot_apply_exits_2_naming_the_handler(tmp_path):
    """A process of its own: applying a config closes the handlers there were."""
    path = tmp_path / "logging.json"
    path.write_text('{"version": 1, "handlers": {"h": {"class": "no.such.Handler"}}}')
    code, stderr = ServeProcess("/nonexistent", "--log-config-file", str(path)).finish()
    assert code == 2
    assert stderr.strip().splitlines()[-1].startswith(
        f"tokenmill serve: error: --log-config-file: {path}: Unable to configure handler 'h'")
