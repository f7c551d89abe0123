"""Compatibility name: the tokenizers live in :mod:`mistral_kernels.tokenization`."""

from .tokenization import (HFTokenizer, IncrementalDecoder, Message, MistralCommonTokenizer, StreamDecoder,
                           Tokenizer, load_tokenizer)

__all__ = ["HFTokenizer", "IncrementalDecoder", "Message", "MistralCommonTokenizer", "StreamDecoder",
           "Tokenizer", "load_tokenizer"]
