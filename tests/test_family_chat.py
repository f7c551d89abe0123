"""Chat prompts of the Mistral tokenizer versions (v1, v2, v3 SentencePiece, v3 tekken, v7) vs mistral-common.

The tokenizer files are the ones mistral-common ships; ours are loaded by :func:`load_tokenizer` from the file,
the reference is mistral-common's own encoder built by its named constructors (``MistralTokenizer.v3(...)``).
The conversation is multi-turn with a system prompt, ending on a user turn.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mistral_kernels.tokenization import load_tokenizer

mistral_common = pytest.importorskip("mistral_common")
from mistral_common.protocol.instruct.messages import AssistantMessage, SystemMessage, UserMessage  # noqa: E402
from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer  # noqa: E402

DATA = Path(mistral_common.__file__).parent / "data"
SYSTEM, TURNS = "You are terse.", ["Hi there", "Hello!", "What is 2+2?"]
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TURNS[0]},
            {"role": "assistant", "content": TURNS[1]}, {"role": "user", "content": TURNS[2]}]

# file shipped by mistral-common → reference encoder
VERSIONS = {
    "tokenizer.model.v1": lambda: MistralTokenizer.v1(),
    "mistral_instruct_tokenizer_240216.model.v2": lambda: MistralTokenizer.v2(),
    "mistral_instruct_tokenizer_240323.model.v3": lambda: MistralTokenizer.v3(),
    "tekken_240718.json": lambda: MistralTokenizer.v3(is_tekken=True),
    "mistral_instruct_tokenizer_241114.model.v7": lambda: MistralTokenizer.v7(),
}


def _reference_ids(tok: MistralTokenizer) -> list[int]:
    request = ChatCompletionRequest(messages=[SystemMessage(content=SYSTEM), UserMessage(content=TURNS[0]),
                                              AssistantMessage(content=TURNS[1]), UserMessage(content=TURNS[2])])
    return list(tok.encode_chat_completion(request).tokens)


@pytest.mark.parametrize("filename", list(VERSIONS))
def test_chat_ids_match_mistral_common(filename: str) -> None:
    ours = load_tokenizer(DATA / filename)
    ids = ours.apply_chat_template(MESSAGES)
    assert ids == _reference_ids(VERSIONS[filename]()), filename
    # the layout itself: BOS first, one [INST] per user turn, the prompt ends on [/INST], EOS after the answer
    text = ours.decode(ids, skip_special_tokens=False)
    assert ids[0] == ours.bos_id and text.count("[INST]") == 2 and text.rstrip().endswith("[/INST]")
    assert text.count("terse") == 1 and sum(i in ours.eos_ids for i in ids) == 1


# ------------------------------------------------------------------ HF tokenizer.json chat templates
# Mistral's instruct templates as HF tokenizer_config.json ships them, in the two layouts: v3 (system prompt
# joined to the last user turn) and v7 (Mistral Small 3.x: [SYSTEM_PROMPT] block first).
TEMPLATE_V3 = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- bos_token }}{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('After the optional system message, conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{%- endif %}"
    "{%- if message['role'] == 'user' %}{%- if loop.last and system_message is defined %}"
    "{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}"
    "{%- else %}{{- raise_exception('Only user and assistant roles are supported!') }}{%- endif %}{%- endfor %}"
)
TEMPLATE_V7 = (
    "{{- bos_token }}{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- if system_message is defined %}{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{%- endif %}"
    "{%- for message in loop_messages %}{%- if message['role'] == 'user' %}"
    "{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}"
    "{%- else %}{{- raise_exception('Only user, system and assistant roles are supported!') }}{%- endif %}"
    "{%- endfor %}"
)


@pytest.fixture(scope="module")
def hf_base_tokenizer():
    """transformers' tokenizer of the default model (any BPE tokenizer.json will do), with Mistral's controls."""
    transformers = pytest.importorskip("transformers")
    from .helpers.default_model_files import default_model_or_skip

    path = default_model_or_skip()
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok.add_special_tokens({"additional_special_tokens": ["[INST]", "[/INST]", "[SYSTEM_PROMPT]",
                                                          "[/SYSTEM_PROMPT]"]})
    return tok


@pytest.mark.parametrize("template", [TEMPLATE_V3, TEMPLATE_V7], ids=["v3", "v7"])
def test_hf_mistral_chat_template_matches_transformers(template: str, hf_base_tokenizer, tmp_path: Path) -> None:
    hf_base_tokenizer.chat_template = template
    hf_base_tokenizer.save_pretrained(tmp_path)
    ours = load_tokenizer(tmp_path)
    want_text = hf_base_tokenizer.apply_chat_template(MESSAGES, tokenize=False)
    assert ours.render_chat(MESSAGES) == want_text
    want = hf_base_tokenizer.apply_chat_template(MESSAGES, tokenize=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert ours.apply_chat_template(MESSAGES) == list(want)
    inst = hf_base_tokenizer.convert_tokens_to_ids("[INST]")
    assert ours.apply_chat_template(MESSAGES).count(inst) == 2  # the controls are single tokens
    if template is TEMPLATE_V3:  # the template's own error reaches the caller as a ValueError
        with pytest.raises(ValueError, match="alternate"):
            ours.apply_chat_template([MESSAGES[1], MESSAGES[1]])
