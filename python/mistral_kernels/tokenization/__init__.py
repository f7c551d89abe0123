"""Tokenizers: HF tokenizer.json, GGUF-embedded, and mistral-common (tekken.json / tokenizer.model.vN).

:func:`load_tokenizer` picks the kind from the file's contents and returns a :class:`Tokenizer` with one API:

>>> tok = load_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf")              # doctest: +SKIP
>>> ids = tok.encode("Hello")                                           # doctest: +SKIP
>>> tok.decode(ids)                                                     # doctest: +SKIP
'Hello'
>>> prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])  # list[int], ends with the
>>> # assistant header so generation starts the answer                  # doctest: +SKIP
>>> dec = tok.incremental_decoder()                                     # doctest: +SKIP
>>> "".join(dec.push([i]) for i in ids) + dec.flush() == tok.decode(ids)  # doctest: +SKIP
True

Modules: ``base`` (the interface), ``streaming`` (incremental decoding), ``hf`` (tokenizers-backed kinds and
chat templates), ``gguf`` (a tokenizer built from GGUF metadata), ``mistral`` (mistral-common), ``load``.
"""

from .base import Message, Tokenizer
from .hf import HFTokenizer
from .load import load_tokenizer
from .mistral import MistralCommonTokenizer
from .streaming import IncrementalDecoder, StreamDecoder

__all__ = ["HFTokenizer", "IncrementalDecoder", "Message", "MistralCommonTokenizer", "StreamDecoder",
           "Tokenizer", "load_tokenizer"]
