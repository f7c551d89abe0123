"""Tool calling end to end in Mistral's own format: a random Mistral decoder with mistral-common's v3
(SentencePiece) and tekken test tokenizers (its package data), ``LLM.chat`` with ``tool_choice`` required / named. The prompt the engine ran is
mistral-common's own ``encode_chat_completion`` of the conversation and tools; the output, forced by the
grammar, is ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}]`` however random the model, so every call parses
and its arguments validate (``jsonschema``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")
mistral_common = pytest.importorskip("mistral_common")
transformers = pytest.importorskip("transformers")

from mistral_common.protocol.instruct.messages import UserMessage  # noqa: E402
from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.protocol.instruct.tool_calls import Tool  # noqa: E402
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer  # noqa: E402

from mistral_kernels import LLM  # noqa: E402

pytestmark = pytest.mark.slow

DATA = Path(os.path.dirname(mistral_common.__file__)) / "data"
TOKENIZERS = {"v3": (DATA / "mistral_instruct_tokenizer_240323.model.v3", 32768),
              "tekken": (DATA / "tekken_240911.json", 131072)}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "unit": {"type": "string", "enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 5}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[LLM, Path]:
    """A random decoder with the tokenizer's vocabulary, and the tokenizer file."""
    import torch

    path, vocab = TOKENIZERS[request.param]
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                     max_position_embeddings=1024)
    folder = tmp_path_factory.mktemp(f"random_mistral_{request.param}")
    transformers.MistralForCausalLM(cfg).save_pretrained(folder)
    return LLM(folder, tokenizer=path, num_blocks=32, max_batch=2), path


def test_forced_calls_in_mistral_format(model: tuple[LLM, Path]) -> None:
    llm, path = model
    reference = MistralTokenizer.from_file(str(path))
    expect_prompt = reference.encode_chat_completion(ChatCompletionRequest(
        messages=[UserMessage(content=MESSAGES[0]["content"])],
        tools=[Tool.model_validate(t) for t in TOOLS])).tokens
    for choice, parallel, seed in [("required", False, 0), ("get_time", True, 1)]:
        reply = llm.chat(MESSAGES, tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel, temperature=1.0,
                         seed=seed, max_new_tokens=96)
        assert reply.completion.prompt_token_ids == expect_prompt
        assert reply.completion.token_ids[0] == reference.instruct_tokenizer.tokenizer.get_special_token("[TOOL_CALLS]")
        assert reply.finish_reason == "tool_calls", reply.completion.text
        assert reply.content is None and reply.tool_calls
        if not parallel:
            assert len(reply.tool_calls) == 1
        for call in reply.tool_calls:
            assert call.name in (SCHEMAS if choice == "required" else {"get_time"})
            jsonschema.validate(call.parsed_arguments(), SCHEMAS[call.name])


def test_forced_text_is_tokenized_as_it_is_spelled(model: tuple[LLM, Path]) -> None:
    """The grammar vocabulary's encoder (llguidance tokenizes forced text with it) gives tokens whose bytes are
    the text: no SentencePiece dummy-prefix space."""
    from mistral_kernels.structured.vocab import _Vocabulary

    llm = model[0]
    vocab = _Vocabulary(llm.tokenizer, llm.model.config.vocab_size, min(llm.tokenizer.eos_ids))
    for text in [b"name", b'{"name": "', b" x", b"\n\t{", "é日".encode()]:
        assert b"".join(vocab.tokens[t] for t in vocab(text)) == text
