"""Models for tool-calling tests: chat templates that render tools, and a "scripted" model.

A scripted model is a real checkpoint (config, tokenizer, safetensors) whose weights make
greedy decoding write a fixed reply, token by token: each piece of the reply is a token of
its own (added to the tokenizer), attention and MLP outputs are zero so the last position
sees only its own token's embedding, and the LM head maps each token to the next piece. The
reply starts after the chat template's generation prompt, whatever the conversation. So the
real engine and server produce a known tool call in known pieces, which the parsers must
find, streamed and not.
"""

from __future__ import annotations

import copy
import os
import random

import torch
from model_support import save_tokenizer

from tokenmill.engine.server.tool_parsers import ToolCallStream, ToolParser, tool_call_message

# Qwen 2.5 / Hermes style: tools listed in the system turn, calls in <tool_call> tags,
# results in <tool_response> tags.
HERMES_TEMPLATE = """
{%- if tools %}<|im_start|>system
{{ messages[0].content if messages[0].role == 'system' else 'You are a helpful assistant.' }}

# Tools

You may call one or more functions. Function signatures within <tools></tools>:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>

For each call, return a JSON object within <tool_call></tool_call> tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}<|im_start|>\
{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{%- if message.content %}
{{ message.content }}
{%- endif %}
{%- for call in message.tool_calls or [] %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Llama 3.1 style: JSON calls with "parameters", results from the "ipython" role.
LLAMA3_TEMPLATE = """
{%- if tools %}<|start_header_id|>system<|end_header_id|>

Environment: ipython
Answer a function call as JSON {"name": function name, "parameters": arguments object}.
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|eot_id|>
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}\
<|start_header_id|>assistant<|end_header_id|>

{% for call in message.tool_calls %}{"name": "{{ call.function.name }}", \
"parameters": {{ call.function.arguments | tojson }}}{% endfor %}<|eot_id|>
{%- elif message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

# Mistral style: tools before the last user turn; calls after [TOOL_CALLS].
MISTRAL_TEMPLATE = """
{%- for message in messages %}
{%- if message.role == 'user' %}
{%- if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}\
[INST]{{ message.content }}[/INST]
{%- elif message.role == 'assistant' %}{{ message.content or '' }}</s>
{%- endif %}
{%- endfor %}"""

# Llama 3.2 style for the pythonic format: calls as a Python list.
PYTHONIC_TEMPLATE = """
{%- if tools %}<|start_header_id|>system<|end_header_id|>

Call functions as [func(param=value), ...]. Functions:
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|eot_id|>
{%- endif %}
{%- for message in messages %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

# What the scripted models answer, in the pieces they generate. Pieces split the tags and
# the JSON mid-way, so streaming must hold text back and send arguments in fragments.
# The second call's tags are special tokens, as in Hermes 2 Pro's tokenizer.
HERMES_REPLY = [
    "Let me check.", "\n<tool", "_call>\n{\"na", "me\": \"get_weather\", \"argu",
    "ments\": {\"city\": \"Pa", "ris\", \"days\": 3}}\n</tool_call>\n",
    "<tool_call>", "\n{\"name\": \"get_time\", ", "\"arguments\": {\"zone\": \"CET\"}}\n",
    "</tool_call>",
]
HERMES_SPECIAL = ("<tool_call>", "</tool_call>")
LLAMA3_REPLY = [
    "<|python_tag|>", "{\"na", "me\": \"get_weather\", \"param", "eters\": {\"city\": \"Par",
    "is\", \"days\": 3}}",
]


def make_scripted_model(directory: str, base_tokenizer, chat_template: str,
                        reply: list[str], special: tuple[str, ...] = ()) -> str:
    """Save a model that answers every chat with `reply` (then EOS) under greedy decoding.
    Pieces in `special` become special tokens (dropped from text by skip_special_tokens)."""
    from tokenizers import AddedToken
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = copy.deepcopy(base_tokenizer)
    tokenizer.chat_template = chat_template
    added = tokenizer.add_tokens([AddedToken(p, special=p in special) for p in reply])
    assert added == len(reply), "reply pieces must be new and distinct"
    pieces = tokenizer.convert_tokens_to_ids(reply)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                           add_generation_prompt=True, tokenize=True,
                                           return_dict=False)
    chain = [prompt[-1], *pieces]  # each token, followed by the next piece (then EOS)
    following = [*pieces, tokenizer.eos_token_id]
    hidden = 64
    assert len(chain) <= hidden
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        for k, (token, nxt) in enumerate(zip(chain, following, strict=True)):
            model.model.embed_tokens.weight[token] = 0.0
            model.model.embed_tokens.weight[token, k] = 1.0
            model.lm_head.weight[nxt] = 0.0
            model.lm_head.weight[nxt, k] = 20.0
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    save_tokenizer(tokenizer, directory)
    return directory

# Mistral's v11 form; [TOOL_CALLS] and [ARGS] are special tokens, as in its tokenizers.
MISTRAL_REPLY = ["Sure, checking.", "[TOOL_CALLS]", "get_weather", "[ARGS]",
                 "{\"city\": \"Pa", "ris\", \"days\": 3}"]
MISTRAL_SPECIAL = ("[TOOL_CALLS]", "[ARGS]")
PYTHONIC_REPLY = ["[get_weat", "her(city='Pa", "ris', days=3), get_ti", "me(zone=\"CET\")]"]
QWEN3_CODER_REPLY = ["<tool_call>\n<function=get_wea", "ther>\n<parameter=city>\n750",
                     "01\n</parameter>\n<parameter=days>\n3\n</para",
                     "meter>\n</function>\n</tool_call>"]


# ---- parsers fed as the server feeds them ------------------------------------------------

def streamed(parser: ToolParser, pieces: list[str]) -> tuple[str, list[dict], list[dict]]:
    """Feed the text piece by piece as the server does (the last update is final); return
    the joined content, the calls reassembled from their deltas, and every tool-call delta."""
    stream = ToolCallStream(parser)
    content, calls, deltas = "", [], []
    text = ""
    for i, piece in enumerate(pieces):
        text += piece
        c, d = stream.update(text, final=i == len(pieces) - 1)
        content += c
        deltas += d
        for delta in d:
            if delta["index"] == len(calls):
                assert delta["id"].startswith("call_") and delta["type"] == "function"
                calls.append({"id": delta["id"], "name": delta["function"]["name"],
                              "arguments": delta["function"]["arguments"]})
            else:
                assert "id" not in delta and "name" not in delta["function"]
                calls[delta["index"]]["arguments"] += delta["function"]["arguments"]
    return content, calls, deltas


def splits(text: str, seed: int = 0) -> list[list[str]]:
    """One character at a time, the whole text at once, and some random chunkings."""
    rng = random.Random(seed)
    out = [list(text), [text]]
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


def assert_stream_matches(parser: ToolParser, text: str) -> tuple[str | None, list[dict]]:
    content, calls = tool_call_message(parser, text)
    for pieces in splits(text):
        s_content, s_calls, _ = streamed(parser, pieces)
        assert s_content == (content or "")
        assert [(c["name"], c["arguments"]) for c in s_calls] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in calls]
    return content, calls


def streamed_reasoning(client, model: str, messages: list[dict],
                       extra_body: dict | None = None) -> tuple[str, str]:
    """(reasoning, content) of a streamed greedy chat reply, its deltas joined."""
    thought, answer = "", ""
    for piece in client.chat.completions.create(model=model, messages=messages, max_tokens=20,
                                                temperature=0, stream=True,
                                                extra_body=extra_body):
        delta = piece.choices[0].delta
        thought += (delta.model_extra or {}).get("reasoning") or ""
        answer += delta.content or ""
    return thought, answer
