"""A model that is missing or cannot load ends every `tokenmill` command with one line naming
the command and the reason, exit 1, and no traceback; a bad option stays exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tokenmill.engine.cli import main


@pytest.mark.parametrize("argv", [["generate"], ["bench", "offline"], ["bench", "host-overhead"],
                                  ["bench", "llama-cpp"]])
def test_a_missing_model_is_one_line_and_exit_1(argv, tmp_path, capsys):
    missing = str(tmp_path / "no-such-model")
    assert main([*argv, "--model", missing]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"tokenmill {' '.join(argv)}: error: model '{missing}' not found")
    assert "Traceback" not in err


def test_a_file_that_is_not_a_model_is_one_line_and_exit_1(tmp_path, capsys):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf file")
    assert main(["generate", "--model", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("tokenmill generate: error: ")
    assert "not a GGUF file" in err


def test_a_bad_option_stays_exit_2_naming_the_subcommand(capsys):
    assert main(["bench", "offline", "--max-num-seqs", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "tokenmill bench offline: error: max_num_seqs: must be at least 1, got 0\n"


def test_a_bad_sampling_option_is_refused_before_the_model_loads(tmp_path, capsys):
    # The model does not exist: reaching it would be exit 1, not the option's exit 2.
    argv = ["generate", "--model", str(tmp_path / "absent"), "--temperature", "-1"]
    assert main(argv) == 2
    assert capsys.readouterr().err == ("tokenmill generate: error: temperature: must be "
                                       "non-negative, got -1.0\n")


def test_a_prompt_longer_than_the_context_is_one_line_and_exit_1(capsys):
    assert main(["generate", "--max-model-len", "16", "--max-tokens", "4"]) == 1
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("tokenmill generate: error: this model's maximum context length is 16")


def test_help_and_option_errors_import_no_torch(tmp_path):
    """`tokenmill --help` and a refused option answer at once: the parser and the option
    checks import neither torch nor the server's libraries (each costs seconds)."""
    script = (
        "import sys\n"
        "from tokenmill.engine.cli import build_parser, main\n"
        "build_parser()\n"
        "assert main(['serve', '--block-size', '7']) == 2\n"
        "assert main(['generate', '--temperature', '-1']) == 2\n"
        "heavy = {'torch', 'fastapi', 'aiohttp', 'transformers'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    # Away from the repository root, whose `operator` package would shadow the standard one.
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "block_size: 7 is not one of" in done.stderr


def test_serve_takes_the_model_once_positional_or_flag(capsys):
    """`tokenmill serve MODEL` as vLLM's; the same model also given as --model is fine, a
    different one is refused before anything loads."""
    assert main(["serve", "a/model", "--model", "another/model"]) == 2
    assert capsys.readouterr().err.strip() == (
        "tokenmill serve: error: model: given twice, as 'a/model' and as --model "
        "'another/model'; give one")
