"""`tokenmill run-batch` (vLLM's run-batch): OpenAI's batch file in, one answer per line out in
the input's order, each the server's own answer (a bad body is that line's 400, the others
still run); a file that is not a batch file is refused in one line before the model loads."""

from __future__ import annotations

import json

import pytest

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.cli import main

PROMPTS = ["one two three", "the quick brown fox", "a b c d e f"]


def _write(path, lines: list) -> str:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    return str(path)


def _completion(custom_id: str, prompt: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
            "body": {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0,
                     "ignore_eos": True, **body}}


def test_every_line_is_answered_in_order_as_the_server_would(tiny_llama_dir, tmp_path,
                                                             capsys):
    lines = [_completion(f"c{i}", p) for i, p in enumerate(PROMPTS)]
    lines.insert(1, _completion("bad", "x", max_tokens="six"))
    lines.append({"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": "tiny", "max_tokens": 3, "ignore_eos": True,
                           "messages": [{"role": "user", "content": "hi"}]}})
    lines.append({"custom_id": "embed", "url": "/v1/embeddings",
                  "body": {"model": "tiny", "input": "hi"}})
    source, out = _write(tmp_path / "in.jsonl", lines), tmp_path / "out.jsonl"
    code = main(["run-batch", "-i", source, "-o", str(out), "--model", tiny_llama_dir,
                 "--served-model-name", "tiny", "--max-model-len", "128"])
    assert code == 0
    assert "6 requests, 2 failed" in capsys.readouterr().out
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert [a["custom_id"] for a in answers] == ["c0", "bad", "c1", "c2", "chat", "embed"]
    assert len({a["id"] for a in answers}) == len(answers)
    by_id = {a["custom_id"]: a for a in answers}
    with LLM(tiny_llama_dir, show_progress=False, max_model_len=128) as llm:
        expected = [o.outputs[0].text for o in llm.generate(
            PROMPTS, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))]
    for i, text in enumerate(expected):
        answer = by_id[f"c{i}"]
        assert answer["error"] is None and answer["response"]["status_code"] == 200
        assert answer["response"]["body"]["choices"][0]["text"] == text
        assert answer["response"]["body"]["model"] == "tiny"
    assert by_id["chat"]["response"]["body"]["usage"]["completion_tokens"] == 3
    for bad in ("bad", "embed"):
        assert by_id[bad]["response"]["status_code"] == 400
        assert by_id[bad]["error"] == by_id[bad]["response"]["body"]["error"]["message"]
    assert "max_tokens" in by_id["bad"]["error"]


@pytest.mark.parametrize(("lines", "error"), [
    (["{not json"], "in.jsonl:1: not JSON"),
    ([{"method": "POST", "url": "/v1/completions", "body": {}}], "in.jsonl:1: needs a custom_id"),
    ([_completion("a", "x"), {"custom_id": "b", "url": "/v1/images", "body": {}}],
     "in.jsonl:2: url '/v1/images' is not one of"),
    ([_completion("a", "x", stream=True)], "in.jsonl:1: a batch line cannot stream"),
    ([{"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {}}],
     "in.jsonl:1: method must be POST"),
    ([], "holds no requests"),
    ([_completion("a", "x"), _completion("b", "y"), _completion("a", "z")],
     "in.jsonl:3: custom_id 'a' is line 1's too; each must be unique"),
])
def test_a_file_that_is_not_a_batch_is_refused_before_the_model_loads(tmp_path, capsys, lines,
                                                                     error):
    source = _write(tmp_path / "in.jsonl", lines)
    # The model does not exist: reaching it would be exit 1, not the input's exit 2.
    code = main(["run-batch", "-i", source, "-o", str(tmp_path / "out.jsonl"), "--model",
                 str(tmp_path / "absent")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("tokenmill run-batch: error: --input-file: ") and error in err
    assert not (tmp_path / "out.jsonl").exists()


def test_a_line_not_utf_8_is_refused_naming_it(tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    latin = json.dumps(_completion("b", "caf\u00e9"), ensure_ascii=False).encode("latin-1")
    source.write_bytes(json.dumps(_completion("a", "x")).encode() + b"\n" + latin + b"\n")
    code = main(["run-batch", "-i", str(source), "-o", str(tmp_path / "out.jsonl"),
                 "--model", str(tmp_path / "absent")])
    err = capsys.readouterr().err
    assert code == 2 and "in.jsonl:2: not UTF-8 (invalid continuation byte at byte " in err, err


def test_an_output_file_that_cannot_be_written_is_refused_before_the_model_loads(tmp_path,
                                                                               capsys):
    """Found out after the run, every answer would be lost."""
    source = _write(tmp_path / "in.jsonl", [_completion("a", "x")])
    code = main(["run-batch", "-i", source, "-o", str(tmp_path), "--model",
                 str(tmp_path / "absent")])
    err = capsys.readouterr().err
    assert code == 2 and f"--output-file: {tmp_path} is a directory" in err, err


def test_lines_the_server_refuses_as_json_are_their_own_400s_and_no_line_is_shed(
        tiny_llama_dir, tmp_path, capsys):
    """A NaN, an infinity or a lone surrogate is JSON to Python but not to the server: each is
    its line's 400, as over HTTP, while the others are answered; lines of several prompts
    each queue more engine requests than --max-waiting-requests, which sheds load when
    serving but never a batch's own lines. The file starts with a BOM, as Windows editors
    write it."""
    lines = [_completion(f"p{i}", ["one two", "three four", "five six", "a b"], max_tokens=2)
             for i in range(6)]
    lines[1:1] = ['{"custom_id": "nan", "url": "/v1/completions", "body": {"model": "tiny", '
                  '"prompt": "hi", "temperature": NaN}}',
                  '{"custom_id": "inf", "url": "/v1/completions", "body": {"model": "tiny", '
                  '"prompt": "hi", "top_p": 1e999}}',
                  '{"custom_id": "half", "url": "/v1/completions", "body": {"model": "tiny", '
                  '"prompt": "one \\ud800 two"}}']
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(source, lines)
    source.write_bytes(b"\xef\xbb\xbf" + source.read_bytes())
    code = main(["run-batch", "-i", str(source), "-o", str(out), "--model", tiny_llama_dir,
                 "--served-model-name", "tiny", "--max-model-len", "128", "--max-num-seqs", "2",
                 "--max-waiting-requests", "4"])
    assert code == 0
    assert "9 requests, 3 failed" in capsys.readouterr().out
    by_id = {a["custom_id"]: a for a in map(json.loads, out.read_text().splitlines())}
    for name in ("nan", "inf", "half"):
        assert by_id[name]["response"]["status_code"] == 400, by_id[name]
        assert by_id[name]["error"].startswith("the request body is not valid JSON")
    assert "surrogate" in by_id["half"]["error"]
    for i in range(6):
        answer = by_id[f"p{i}"]
        assert answer["error"] is None, answer["error"]
        assert len(answer["response"]["body"]["choices"]) == 4
