"""High-level Python API: ``LLM(path).generate([...])`` and ``LLM(path).stream(prompt)``.

>>> import mistral_kernels                                       # doctest: +SKIP
>>> llm = mistral_kernels.LLM()          # default model: SmolLM2-135M-Instruct (see default_model.py)
>>> [c.text for c in llm.generate(["What is the capital of France?"], chat=True)]   # doctest: +SKIP
['The capital of France is Paris.']
>>> for piece in llm.stream("Once upon a time", max_new_tokens=20):                # doctest: +SKIP
...     print(piece, end="", flush=True)
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from .cache import default_num_blocks
from .checkpoint import Checkpoint
from .engine import Completion, Engine
from .engine_sizing import MIN_STEP_TOKENS, engine_sizes
from .loading import load_model
from .memory import MemoryWarning, check_kv_pool, memory_warning
from .parallel import ParallelContext
from .sampling_params import SamplingParams, sampling_params
from .speculative.config import SpeculativeConfig
from .speculative.draft import DraftProposer, check_same_vocabulary
from .tokenization import Message, Tokenizer, load_tokenizer
from .tools.chat import ChatReply, ChatTools
from .tools.spec import ToolDef

__all__ = ["LLM"]


class LLM:
    """A loaded model + tokenizer + generation engine.

    Parameters
    ----------
    path : str, Path, Checkpoint or None
        HF directory, Mistral consolidated directory or ``.gguf`` file, or an open
        :class:`~mistral_kernels.checkpoint.Checkpoint` (left open); None = the default model. A path is
        opened once (:meth:`Checkpoint.open`): config, dtype, footprint, weights and a GGUF's tokenizer all
        come from that one read.
    device, dtype : where and in which dtype the weights and the KV cache live; ``dtype=None`` (default) is
        the checkpoint's own (:meth:`Checkpoint.default_dtype`; fp16 → bf16 on the CPU). An explicit
        ``torch.float16`` runs on the CPU too (fp16 storage, fp32 math: code written for a GPU runs unchanged).
    max_batch : most sequences decoded together; None (default) sizes it from the memory left after the
        weights (:mod:`.engine_sizing`, at most 64).
    block_size : KV cache block size (tokens, a power of two).
    num_blocks : KV cache blocks; None sizes the pool for ``max_batch`` sequences (cache.default_num_blocks).
    max_tokens_per_step : token budget of one engine step (the scheduler's chunked prefill); None (default)
        = what this model computes in half a second on this device, measured after loading
        (:mod:`.engine_sizing`).
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
    check_tensors : scan every weight for inf / NaN at load (llama.cpp's ``--check-tensors``; one pass over
        the weights, cost in the README's "Loading" section). Without it non-finite values are still refused
        wherever loading touches every value (conversion, dequantization, quantization, GGUF block scales).
    activations : how fp32 activations enter the quantized (packed) matrices' products: ``"auto"`` (default)
        rounds them to bf16 and quantizes them to int8 per block in every packed matmul, as llama.cpp does
        (the residual stream, norms and attention stay fp32; accuracy in the README's "Quantized models"),
        ``"exact"`` multiplies them in fp32 with the exactly decoded weights (slower); ``"int8"`` = auto,
        refused for fp16 activations.
    speculative : speculative decoding (:mod:`mistral_kernels.speculative`): a :class:`SpeculativeConfig`, or
        "ngram" for its defaults; None (default) = off. Method "draft" loads ``draft_model`` on the same device,
        in the same dtype, and checks it shares the target's vocabulary (ValueError otherwise).
    """

    def __init__(self, path: str | Path | Checkpoint | None = None, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype | None = None, max_batch: int | None = None, block_size: int = 16,
                 num_blocks: int | None = None, max_tokens_per_step: int | None = None,
                 tokenizer: str | Path | None = None, progress: bool = False,
                 parallel: ParallelContext | None = None, prefix_caching: bool = True,
                 enforce_eager: bool = False, quantized: bool = True, quantize: str | None = None,
                 check_tensors: bool = False, speculative: SpeculativeConfig | str | None = None,
                 activations: str = "auto") -> None:
        if path is None:
            from .default_model import default_model_path

            path = default_model_path()
        t0 = time.perf_counter()
        ckpt = path if isinstance(path, Checkpoint) else Checkpoint.open(path)
        try:
            self.path = ckpt.path
            if dtype is None:
                dtype = ckpt.default_dtype(device)
            if parallel is None:  # warn before loading rather than be killed while loading
                config = ckpt.config
                if num_blocks is not None:  # an impossible pool fails before the weights load
                    check_kv_pool(config, dtype, device, num_blocks, block_size)
                # the least pool the defaults could choose (they fit what is available by construction)
                blocks = num_blocks or default_num_blocks(config, block_size, max_batch or 1,
                                                          max_tokens_per_step or MIN_STEP_TOKENS)
                weights = ckpt.footprint(dtype, quantized=quantized, quantize=quantize).bytes
                warning = memory_warning(config, dtype, device, blocks * block_size, weight_bytes=weights)
                if warning is not None:
                    warnings.warn(warning, MemoryWarning, stacklevel=2)
            self.model = load_model(ckpt, device=device, dtype=dtype, progress=progress, parallel=parallel,
                                    quantized=quantized, quantize=quantize, check_tensors=check_tensors,
                                    activations=activations)
            self.tokenizer: Tokenizer = load_tokenizer(tokenizer if tokenizer is not None else ckpt)
        finally:
            if ckpt is not path:
                ckpt.close()
        self.load_seconds = time.perf_counter() - t0
        self.sizes = engine_sizes(self.model, self.model.dtype, block_size, max_batch, max_tokens_per_step)
        max_batch, max_tokens_per_step = self.sizes.max_batch, self.sizes.max_tokens_per_step
        if num_blocks is None:
            num_blocks = default_num_blocks(self.model.config, block_size, max_batch, max_tokens_per_step)
        elif parallel is not None:  # a rank holds its share of the heads: check with its own config
            check_kv_pool(self.model.config, dtype, device, num_blocks, block_size)
        eos = set(self.tokenizer.eos_ids) | set(self.model.config.eos_token_ids)
        if isinstance(speculative, str):
            speculative = SpeculativeConfig(method=speculative)
        proposer = None
        if speculative is not None and speculative.method == "draft":
            proposer = self._draft_proposer(speculative, device, dtype, num_blocks, block_size, quantized)
        self.engine = Engine(self.model, self.tokenizer, num_blocks=num_blocks, block_size=block_size,
                             max_batch=max_batch, max_tokens_per_step=max_tokens_per_step, eos_ids=sorted(eos),
                             prefix_caching=prefix_caching, enforce_eager=True if enforce_eager else None,
                             speculative=speculative, proposer=proposer)

    def _draft_proposer(self, spec: SpeculativeConfig, device: str | torch.device, dtype: torch.dtype,
                        num_blocks: int, block_size: int, quantized: bool) -> DraftProposer:
        """The draft model of ``spec``, loaded and checked against the target (same vocabulary)."""
        assert spec.draft_model is not None  # SpeculativeConfig checks it
        with Checkpoint.open(spec.draft_model) as ckpt:
            draft = load_model(ckpt, device=device, dtype=dtype, progress=False, quantized=quantized)
            try:
                draft_tokenizer: Tokenizer | None = load_tokenizer(ckpt)
            except (OSError, ValueError):  # no tokenizer next to the draft: the vocabulary size must do
                draft_tokenizer = None
        check_same_vocabulary(self.model.config.vocab_size, draft.config.vocab_size, self.tokenizer, draft_tokenizer)
        return DraftProposer(draft, num_blocks, block_size)

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

    def generate(self, prompts: Sequence[str], params: SamplingParams | None = None, *, chat: bool = False,
                 system: str | None = None, **overrides: Any) -> list[Completion]:
        """Generate for every prompt (continuous batching); completions in prompt order.

        ``params`` (default ``SamplingParams()``) with ``overrides`` replacing its fields — any field of
        :class:`~mistral_kernels.sampling_params.SamplingParams`: ``max_new_tokens``, ``temperature``, ``top_k``,
        ``top_p``, ``min_p``, the repetition / presence / frequency penalties, ``seed``, ``stop``,
        ``stop_token_ids``, ``ignore_eos``, ``logprobs``. With a ``seed``, prompt i samples with seed + i
        (reproducible whatever the batching). ``logprobs=k`` fills each completion's ``logprobs``
        (:mod:`mistral_kernels.logprobs`).

        Every prompt is checked before any is admitted (a ValueError names ``prompts[i]``; an unknown override
        is a TypeError); if the call fails or is interrupted (KeyboardInterrupt) its requests are aborted, their
        KV blocks freed.
        """
        if isinstance(prompts, str):
            raise TypeError("generate: prompts must be a list of strings (got a single str); use [prompt]")
        base = sampling_params(params, overrides, "generate")
        jobs = []
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise TypeError(f"generate: prompts[{i}] must be a str, got {type(p).__name__}")
            jobs.append((self.prompt_ids(p, chat=chat, system=system), base.for_choice(i)))
        return self.engine.generate(jobs, name="generate: prompts")

    def chat(self, messages: Sequence[Message], params: SamplingParams | None = None, *,
             tools: Sequence[ToolDef | dict[str, Any]] | None = None, tool_choice: str | None = None,
             parallel_tool_calls: bool = True, **overrides: Any) -> ChatReply:
        """One assistant turn of a conversation (OpenAI-shaped messages: system / user / assistant with
        ``tool_calls`` / tool results), with ``tools`` (OpenAI tool dicts or :class:`~.tools.ToolDef`) offered.

        ``tool_choice``: "auto" (default with tools), "none", "required" or a function's name — the last two
        constrain the output to a call with valid arguments (:mod:`mistral_kernels.tools.chat`). Returns the
        reply's content and parsed ``tool_calls``; ``reply.message()`` is the turn to append to ``messages``.
        ``params`` / ``overrides`` as for :meth:`generate`.

        >>> reply = llm.chat([{"role": "user", "content": "Weather in Paris?"}], tools=[weather],
        ...                  tool_choice="required")                                   # doctest: +SKIP
        >>> reply.tool_calls[0].name, reply.tool_calls[0].parsed_arguments()          # doctest: +SKIP
        ('get_weather', {'city': 'Paris'})
        """
        setup = ChatTools.make(self.tokenizer, tools, tool_choice, parallel_tool_calls)
        params = setup.params(sampling_params(params, overrides, "chat"))
        ids = setup.prompt_ids(self.tokenizer, messages)
        c = self.engine.generate([(ids, params)], name="chat: messages")[0]
        return setup.reply(c.text, c.finish_reason, c)

    def stream(self, prompt: str, params: SamplingParams | None = None, *, chat: bool = False,
               system: str | None = None, **overrides: Any) -> Iterator[str]:
        """Yield the generated text piece by piece as it is produced; the pieces join to the completion's
        text. ``params`` and ``overrides`` as for :meth:`generate`. The finished :class:`Completion` is kept
        in ``self.last_completion``. Closing the generator early (``close()``, garbage collection) or an
        exception aborts the request and frees its KV blocks."""
        params = sampling_params(params, overrides, "stream")
        rid = self.engine.add_request(self.prompt_ids(prompt, chat=chat, system=system), params)
        with contextlib.closing(self.engine.iterate([rid])) as outputs:  # closing aborts an unfinished request
            for out in outputs:
                if out.text:
                    yield out.text
                if out.completion is not None:
                    self.last_completion = out.completion
