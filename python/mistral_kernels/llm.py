"""High-level Python API: ``LLM(path).generate([...])`` and ``LLM(path).stream(prompt)``.

>>> import mistral_kernels                                       # doctest: +SKIP
>>> llm = mistral_kernels.LLM()          # default model: SmolLM2-135M-Instruct (see default_model.py)
>>> [c.text for c in llm.generate(["What is the capital of France?"], chat=True)]   # doctest: +SKIP
['The capital of France is Paris.']
>>> for piece in llm.stream("Once upon a time", max_new_tokens=20):                # doctest: +SKIP
...     print(piece, end="", flush=True)
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from .cache import default_num_blocks
from .config import load_config
from .engine import Completion, Engine
from .loading import load_model
from .memory import MemoryWarning, check_kv_pool, memory_warning
from .parallel import ParallelContext
from .sampling import SamplingParams
from .tokenization import Message, Tokenizer, load_tokenizer
from .weight_footprint import weight_footprint
from .weights import default_dtype, detect_format

__all__ = ["LLM"]


class LLM:
    """A loaded model + tokenizer + generation engine.

    Parameters
    ----------
    path : str, Path or None
        HF directory, Mistral consolidated directory or ``.gguf`` file; None = the default model.
    device, dtype : where and in which dtype the weights and the KV cache live; ``dtype=None`` (default) is
        the checkpoint's own (:func:`mistral_kernels.weights.default_dtype`; fp16 → bf16 on the CPU). An explicit
        ``torch.float16`` runs on the CPU too (fp16 storage, fp32 math: code written for a GPU runs unchanged).
    max_batch : most sequences decoded together.
    block_size : KV cache block size (tokens, a power of two).
    num_blocks : KV cache blocks; None sizes the pool for ``max_batch`` sequences (cache.default_num_blocks).
    max_tokens_per_step : token budget of one engine step (prefill chunk size).
    tokenizer : path of a tokenizer to use instead of the one found with the model.
    progress : show a progress bar over the bytes read while loading.
    parallel : tensor / expert parallelism: this process is one rank (see :mod:`mistral_kernels.parallel`;
        every rank constructs the LLM and makes the same calls). None = one process.
    prefix_caching : share the KV blocks of common prompt prefixes between requests (:mod:`.cache`).
    enforce_eager : no CUDA graphs for decode steps (default False: on CUDA, decode steps replay one
        captured graph per batch-size bucket; see :mod:`mistral_kernels.decode_graphs`).
    quantized : a GGUF's quantized matrices run natively on their packed blocks (default True); False
        dequantizes them at load into ``dtype`` (the behaviour before native quantized kernels).
    quantize : ``"int8"``: quantize every matrix at load to int8 weight-only (per output row scales; HF,
        consolidated or GGUF checkpoints). None (default): keep the checkpoint's weights.
    """

    def __init__(self, path: str | Path | None = None, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype | None = None, max_batch: int = 8, block_size: int = 16,
                 num_blocks: int | None = None, max_tokens_per_step: int = 512,
                 tokenizer: str | Path | None = None, progress: bool = False,
                 parallel: ParallelContext | None = None, prefix_caching: bool = True,
                 enforce_eager: bool = False, quantized: bool = True, quantize: str | None = None) -> None:
        if path is None:
            from .default_model import default_model_path

            path = default_model_path()
        t0 = time.perf_counter()
        self.path = Path(path)
        if dtype is None:
            dtype = default_dtype(self.path, device)
        if parallel is None:  # warn before loading rather than be killed while loading
            config = load_config(self.path)
            if num_blocks is not None:  # an impossible pool fails before the weights load
                check_kv_pool(config, dtype, device, num_blocks, block_size)
            blocks = num_blocks or default_num_blocks(config, block_size, max_batch, max_tokens_per_step)
            packed = quantize is not None or (quantized and detect_format(self.path) == "gguf")
            weights = weight_footprint(self.path, dtype, quantized=quantized, quantize=quantize).bytes \
                if packed else None  # dense: parameters × dtype size, no second header read
            warning = memory_warning(config, dtype, device, blocks * block_size, weight_bytes=weights)
            if warning is not None:
                warnings.warn(warning, MemoryWarning, stacklevel=2)
        self.model = load_model(self.path, device=device, dtype=dtype, progress=progress, parallel=parallel,
                                quantized=quantized, quantize=quantize)
        self.tokenizer: Tokenizer = load_tokenizer(tokenizer if tokenizer is not None else self.path)
        self.load_seconds = time.perf_counter() - t0
        if num_blocks is None:
            num_blocks = default_num_blocks(self.model.config, block_size, max_batch, max_tokens_per_step)
        elif parallel is not None:  # a rank holds its share of the heads: check with its own config
            check_kv_pool(self.model.config, dtype, device, num_blocks, block_size)
        eos = set(self.tokenizer.eos_ids) | set(self.model.config.eos_token_ids)
        self.engine = Engine(self.model, self.tokenizer, num_blocks=num_blocks, block_size=block_size,
                             max_batch=max_batch, max_tokens_per_step=max_tokens_per_step, eos_ids=sorted(eos),
                             prefix_caching=prefix_caching, enforce_eager=True if enforce_eager else None)

    def prompt_ids(self, prompt: str, *, chat: bool = False, system: str | None = None) -> list[int]:
        """Token ids of a prompt: plain (BOS added per the tokenizer) or as a one-turn chat."""
        if not chat:
            if system is not None:
                raise ValueError("system prompt given without chat=True")
            return self.tokenizer.encode(prompt)
        messages: list[Message] = []
        if system is not None:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        return self.tokenizer.apply_chat_template(messages)

    @staticmethod
    def _params(max_new_tokens: int, temperature: float, top_k: int, top_p: float, min_p: float,
                repetition_penalty: float, seed: int | None, stop: str | Sequence[str] | None,
                ignore_eos: bool, index: int, logprobs: int | None) -> SamplingParams:
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        # Distinct but reproducible seeds per prompt of a batch.
        return SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                              min_p=min_p, repetition_penalty=repetition_penalty,
                              seed=None if seed is None else seed + index, stop=stops, ignore_eos=ignore_eos,
                              logprobs=logprobs)

    def generate(self, prompts: Sequence[str], *, max_new_tokens: int = 128, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                 seed: int | None = None, stop: str | Sequence[str] | None = None, ignore_eos: bool = False,
                 chat: bool = False, system: str | None = None, logprobs: int | None = None) -> list[Completion]:
        """Generate for every prompt (continuous batching); completions in prompt order.

        With ``seed``, prompt i samples with seed ``seed + i`` (reproducible whatever the batching).
        ``logprobs=k`` fills each completion's ``logprobs`` (raw-model log-probability of every generated token
        and its k most likely alternatives; :mod:`mistral_kernels.logprobs`).

        Every prompt is validated before any is admitted (a ValueError names ``prompts[i]``); if the call
        fails or is interrupted (KeyboardInterrupt) its requests are aborted, their KV blocks freed.
        """
        if isinstance(prompts, str):
            raise TypeError("generate: prompts must be a list of strings (got a single str); use [prompt]")
        jobs = []
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise TypeError(f"generate: prompts[{i}] must be a str, got {type(p).__name__}")
            jobs.append((self.prompt_ids(p, chat=chat, system=system),
                         self._params(max_new_tokens, temperature, top_k, top_p, min_p, repetition_penalty, seed,
                                      stop, ignore_eos, i, logprobs)))
        for i, (ids, params) in enumerate(jobs):  # validate all before admitting any
            try:
                self.engine.check_request(ids, params)
            except ValueError as e:
                raise ValueError(f"generate: prompts[{i}]: {e}") from e
        return self.engine.generate(jobs)

    def stream(self, prompt: str, *, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0, seed: int | None = None,
               stop: str | Sequence[str] | None = None, ignore_eos: bool = False, chat: bool = False,
               system: str | None = None, logprobs: int | None = None) -> Iterator[str]:
        """Yield the generated text piece by piece as it is produced; the pieces join to the completion's
        text. The finished :class:`Completion` is kept in ``self.last_completion``. Closing the generator
        early (``close()``, garbage collection) or an exception aborts the request and frees its KV blocks."""
        rid = self.engine.add_request(
            self.prompt_ids(prompt, chat=chat, system=system),
            self._params(max_new_tokens, temperature, top_k, top_p, min_p, repetition_penalty, seed, stop,
                         ignore_eos, 0, logprobs))
        try:
            while not self.engine.is_finished(rid):
                self.engine.step()
                piece = self.engine.drain_text(rid)
                if piece:
                    yield piece
            piece = self.engine.drain_text(rid)
            if piece:
                yield piece
            self.last_completion = self.engine.pop_completion(rid)
        finally:
            # Closed early (GeneratorExit from close() or garbage collection), or a step raised: the request
            # must not keep its KV blocks. After pop_completion this is a no-op.
            self.engine.abort(rid)

