"""Chat prompts with tools, token for token against the references: mistral-common's own
``encode_chat_completion`` for its v3, v7 and tekken test tokenizers (shipped in its package data), and
transformers' ``apply_chat_template(tools=...)`` for an HF tokenizer whose template reads ``tools``. The
fallback for templates without tools (SmolLM2's) is checked for what it must carry."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mistral_kernels.tools import ToolDef, chat_prompt_ids, template_reads_tools, tool_format

mistral_common = pytest.importorskip("mistral_common")
from mistral_common.protocol.instruct.messages import (AssistantMessage, SystemMessage, ToolMessage,  # noqa: E402
                                                       UserMessage)
from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.protocol.instruct.tool_calls import FunctionCall, Tool, ToolCall  # noqa: E402
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer  # noqa: E402

from mistral_kernels.tokenization.mistral import MistralCommonTokenizer, mistral_call_id  # noqa: E402

DATA = Path(os.path.dirname(mistral_common.__file__)) / "data"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
           "required": ["city"]}
TOOLS = [ToolDef("get_weather", "The weather of a city", WEATHER), ToolDef("get_time", "The time now")]
ARGS = '{"city": "Paris", "unit": "c"}'
# OpenAI-shaped history: a call (content null) with a 9-character id, its result, a follow-up question
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "abcDEF123", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]},
            {"role": "tool", "content": "18 C, sunny", "tool_call_id": "abcDEF123"},
            {"role": "assistant", "content": "18 C and sunny."},
            {"role": "user", "content": "And the time?"}]


def _reference_request(call_id: str = "abcDEF123") -> ChatCompletionRequest:
    """The same conversation built with mistral-common's own types."""
    return ChatCompletionRequest(
        messages=[SystemMessage(content="Be brief."), UserMessage(content="Weather in Paris?"),
                  AssistantMessage(content=None, tool_calls=[ToolCall(id=call_id, function=FunctionCall(
                      name="get_weather", arguments=ARGS))]),
                  ToolMessage(content="18 C, sunny", tool_call_id=call_id),
                  AssistantMessage(content="18 C and sunny."), UserMessage(content="And the time?")],
        tools=[Tool(function={"name": t.name, "description": t.description, "parameters": dict(t.parameters)})
               for t in TOOLS])


@pytest.mark.parametrize("name", ["mistral_instruct_tokenizer_240323.model.v3",
                                  "mistral_instruct_tokenizer_241114.model.v7", "tekken_240911.json"])
def test_mistral_prompt_equals_mistral_common(name: str) -> None:
    ours = MistralCommonTokenizer(DATA / name)
    reference = MistralTokenizer.from_file(str(DATA / name))
    expect = reference.encode_chat_completion(_reference_request()).tokens
    assert chat_prompt_ids(ours, MESSAGES, TOOLS) == expect
    text = reference.instruct_tokenizer.tokenizer.decode(expect, special_token_policy="keep")
    assert "[AVAILABLE_TOOLS]" in text and "[TOOL_CALLS]" in text and "[TOOL_RESULTS]" in text
    # OpenAI ids (call_...) become 9 stable characters, the same in the call and in its result
    openai_ids = [{**m, "tool_calls": [{**m["tool_calls"][0], "id": "call_0123456789abcdef"}]}
                  if m.get("tool_calls") else {**m, "tool_call_id": "call_0123456789abcdef"} if m["role"] == "tool"
                  else m for m in MESSAGES]
    mapped = mistral_call_id("call_0123456789abcdef")
    assert len(mapped) == 9 and mapped.isalnum()
    assert chat_prompt_ids(ours, openai_ids, TOOLS) == \
        reference.encode_chat_completion(_reference_request(mapped)).tokens
    fmt = tool_format(ours)
    assert fmt.name == "mistral" and fmt.tool_calls_id == reference.instruct_tokenizer.tokenizer.get_special_token(
        "[TOOL_CALLS]")


# A Hermes-style template that reads `tools` (as Qwen2.5's / NousResearch's do), written for this test.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{{ messages[0]['content'] if messages[0]['role'] == 'system' else '' }}"
    "\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{%- elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for m in messages %}{%- if m['role'] == 'system' %}{%- elif m['role'] == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{%- elif m.tool_calls %}<|im_start|>assistant\n{%- for c in m.tool_calls %}\n<tool_call>\n"
    "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>"
    "{%- endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


def _hf_tokenizer_dir(tmp_path: Path) -> Path:
    """A tiny byte-level BPE tokenizer.json + tokenizer_config.json with TOOL_TEMPLATE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": TOOL_TEMPLATE, "eos_token": "<|im_end|>", "bos_token": None,
         "tokenizer_class": "PreTrainedTokenizerFast"}))
    return tmp_path


def test_hf_template_prompt_equals_transformers(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from mistral_kernels.tokenization import load_tokenizer

    folder = _hf_tokenizer_dir(tmp_path)
    ours = load_tokenizer(folder / "tokenizer.json")
    assert template_reads_tools(ours.chat_template)
    reference = transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))
    ref_messages = [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(ARGS)}}
                                         for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in MESSAGES]
    expect = reference.apply_chat_template(ref_messages, tools=[t.to_openai() for t in TOOLS],
                                           add_generation_prompt=True, tokenize=True, return_dict=False)
    got = chat_prompt_ids(ours, MESSAGES, TOOLS)
    assert got == list(expect)
    text = reference.decode(got)
    assert '"name": "get_weather"' in text and "<tool_response>" in text and "<tools>" in text
    assert tool_format(ours).name == "hermes"


def test_fallback_for_a_template_without_tools() -> None:
    from mistral_kernels.default_model import default_model_path
    from mistral_kernels.tokenization import load_tokenizer

    try:
        tok = load_tokenizer(default_model_path())
    except (FileNotFoundError, ImportError) as e:
        pytest.skip(f"default model not installed: {e}")
    assert not template_reads_tools(tok.chat_template)  # SmolLM2's template has no tools
    text = tok.decode(chat_prompt_ids(tok, MESSAGES, TOOLS), skip_special_tokens=False)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.")
    for t in TOOLS:  # every tool's schema, as JSON, and the call convention are in the system turn
        assert json.dumps(t.to_openai()["function"], ensure_ascii=False) in system
    assert "<tool_call>" in system
    assert ('<|im_start|>assistant\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
            "</tool_call><|im_end|>") in text
    assert '<|im_start|>user\n<tool_response>{"name": "get_weather", "content": "18 C, sunny"}</tool_response>' in text
    assert text.endswith("<|im_start|>user\nAnd the time?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("name", ["mistral_instruct_tokenizer_240323.model.v3",
                                  "mistral_instruct_tokenizer_241114.model.v7", "tekken_240911.json"])
def test_mistral_token_bytes_spell_the_text(name: str) -> None:
    """What a grammar matches tokens by: the bytes of a text's tokens join to the text (SentencePiece's word
    marker is a space, its byte-fallback pieces their byte — the first token's leading space aside)."""
    tok = MistralCommonTokenizer(DATA / name)
    text = 'Hello wörld \r\n [{"x": 1}] 日本'
    ids = tok.encode(text, add_special_tokens=False)
    assert b"".join(tok.token_bytes(i) for i in ids).decode("utf-8").removeprefix(" ") == text
    calls = tool_format(tok).tool_calls_id
    assert calls is not None and tok.token_bytes(calls) == b"[TOOL_CALLS]"


@pytest.mark.parametrize("name", ["mistral_instruct_tokenizer_240323.model.v3", "tekken_240911.json"])
def test_mistral_decode_keeping_special_tokens_is_text(name: str) -> None:
    """With special tokens kept (how tool calls are parsed), the text between them is text (SentencePiece's raw
    pieces ▁ / <0x0A> are not), and the special tokens are spelled out."""
    tok = MistralCommonTokenizer(DATA / name)
    calls = tool_format(tok).tool_calls_id
    ids = tok.encode("Hi there\n[x]", add_special_tokens=True) + [calls] + tok.encode('[{"a": 1}]', False)
    assert tok.decode(ids, skip_special_tokens=False) == '<s>Hi there\n[x][TOOL_CALLS][{"a": 1}]'
    assert tok.decode(ids).replace(" [{", "[{") == 'Hi there\n[x][{"a": 1}]'  # (SentencePiece's dummy space)
