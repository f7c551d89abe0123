""":class:`SamplingParams`: the one definition of a request's sampling and stopping parameters.

Every surface offers every field, read from here: ``LLM.generate(prompts, params, **overrides)`` and
``LLM.stream`` (overrides checked against the fields, :func:`sampling_params`), the ``generate`` flags
(generated from the fields' metadata by :mod:`.dataclass_cli`), and the server's request bodies
(:meth:`~mistral_kernels.serve.protocol.SamplingFields.to_sampling_params`). A field's meaning is written
once, in its ``help`` metadata (the CLI's ``--help`` shows it; the class docstring lists it). The values
are checked once, when the object is made (``__post_init__``); the engine resolves ``max_new_tokens=None``
when it admits the request.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .dataclass_cli import add_fields, field_flags, values_from
from .structured.cli import add_structured_args, structured_from_args
from .structured.spec import Choice, Grammar, JsonObject, JsonSchema, Regex, StructuredOutput

__all__ = ["FIELD_NAMES", "GREEDY_TEMPERATURE", "LOGIT_BIAS_RANGE", "MAX_LOGPROBS", "MAX_TEMPERATURE", "SEED_RANGE",
           "SamplingParams", "sampling_params"]

MAX_LOGPROBS = 20  # most alternatives per token a request may ask for (as the OpenAI API allows)
# A temperature at or below this is greedy (vLLM's rule: dividing by a tiny temperature overflows the logits
# to inf, and their softmax is NaN); the upper bound is the OpenAI API's.
GREEDY_TEMPERATURE = 1e-5
MAX_TEMPERATURE = 2.0
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # the OpenAI API's bounds of one logit_bias value


def _parse_bias(text: str) -> tuple[int, float]:
    """``"50256=-100"`` → (50256, -100.0): one ``--logit-bias`` flag value."""
    tok, sep, bias = text.partition("=")
    if not sep:
        raise ValueError(f"logit_bias entries are TOKEN_ID=BIAS, got {text!r}")
    return int(tok), float(bias)


def _f(default: Any, help: str, **meta: Any) -> Any:
    if isinstance(default, tuple):
        return field(default_factory=tuple, metadata={"help": help, **meta})
    return field(default=default, metadata={"help": help, **meta})


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling and stopping parameters (frozen; checked when made, a ValueError names the field).

    Attributes
    ----------
    """

    max_new_tokens: int | None = _f(128, "generate at most this many tokens (128); None: as many as the model's "
                                         "context and the KV cache allow (decided by the engine at admission)")
    temperature: float = _f(0.0, f"in [0, {MAX_TEMPERATURE:g}]; 0 = greedy (default; so is any temperature ≤ "
                                 f"{GREEDY_TEMPERATURE:g}, stored as 0); otherwise logits / temperature")
    top_k: int = _f(0, "keep the k most likely tokens (0 = off)")
    top_p: float = _f(1.0, "keep the smallest set of most likely tokens whose probability reaches top_p (1 = off)")
    min_p: float = _f(0.0, "drop tokens with probability < min_p x the largest probability (0 = off)")
    repetition_penalty: float = _f(1.0, "> 1 discourages tokens already in the prompt or output (HF/CTRL rule: "
                                        "positive logits divided, negative multiplied; 1 = off)")
    presence_penalty: float = _f(0.0, "subtracted once from the logit of every token already generated (OpenAI "
                                      "rule, in [-2, 2]; the prompt does not count; 0 = off)")
    frequency_penalty: float = _f(0.0, "subtracted from a token's logit once per time it was generated (OpenAI "
                                       "rule, in [-2, 2]; 0 = off)")
    seed: int | None = _f(None, "seeds the request's own generator (reproducible sampling); none: the engine's "
                                "shared generator")
    stop: tuple[str, ...] = _f((), "stop string (repeatable): generation ends when the output text contains "
                                   "one; the text is cut before it")
    stop_token_ids: tuple[int, ...] = _f((), "token id that ends generation besides EOS (repeatable)",
                                         flag="--stop-token-id")
    ignore_eos: bool = _f(False, "keep generating through EOS (benchmarks); max_new_tokens still applies")
    logprobs: int | None = _f(None, f"k in [0, {MAX_LOGPROBS}]: return each generated token's log-probability "
                                    "and the k most likely tokens' under the raw model distribution "
                                    "(log_softmax of the logits, before penalties, temperature and filters; "
                                    "see mistral_kernels.logprobs); none: off")
    logit_bias: tuple[tuple[int, float], ...] = _f(
        (), f"token id → bias added to its logit before sampling, bias in [{LOGIT_BIAS_RANGE[0]:g}, "
            f"{LOGIT_BIAS_RANGE[1]:g}] (OpenAI rule; -100 bans a token, +100 all but forces it); a dict or "
            "(id, bias) pairs; on the command line TOKEN_ID=BIAS, repeatable", parse=_parse_bias)
    min_tokens: int = _f(0, "generate at least this many tokens: EOS and stop_token_ids are masked and stop "
                            "strings not matched before (0 = off)")
    include_stop_str_in_output: bool = _f(False, "keep the matched stop string (or the text of the stop / EOS "
                                                 "token that ended generation) at the end of the text")
    skip_special_tokens: bool = _f(True, "leave special tokens (<|im_end|>, [TOOL_CALLS], ...) out of the text")
    structured: StructuredOutput | None = _f(
        None, "constrain the output to a JSON object / JSON schema / regex / choice / grammar "
              "(mistral_kernels.structured; flags --json-object, --json-schema FILE, --regex PATTERN, --choice "
              "TEXT, --grammar FILE); the grammar completing finishes the request (\"stop\"); logprobs stay "
              "raw (before the mask); none: free text", flag="--json-schema")

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:  # NaN and ±inf fail too
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}")
        if self.temperature <= GREEDY_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)
        if self.top_k < 0:
            raise ValueError(f"top_k must be ≥ 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise ValueError(f"seed must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}], got {self.seed}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be None or in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if self.min_tokens < 0 or (self.max_new_tokens is not None and self.min_tokens > self.max_new_tokens):
            raise ValueError(f"min_tokens must be in [0, max_new_tokens], got {self.min_tokens}")
        if self.structured is not None and not isinstance(self.structured, _SPECS):
            raise ValueError(f"structured must be a JsonObject, JsonSchema, Regex, Choice or Grammar "
                             f"(mistral_kernels.structured), got {type(self.structured).__name__}")

    def check_vocabulary(self, vocab_size: int) -> None:
        """Token ids of ``logit_bias`` and ``stop_token_ids`` are in [0, vocab_size) (the engine calls this
        when it admits a request; the message begins with the field)."""
        for name, ids in (("logit_bias", [t for t, _ in self.logit_bias]), ("stop_token_ids", self.stop_token_ids)):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"{name} has token id(s) {bad[:5]} outside the vocabulary [0, {vocab_size})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_history(self) -> bool:
        """A penalty reads the tokens seen so far (``sample``'s ``seen`` / ``generated``)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def for_choice(self, i: int) -> SamplingParams:
        """The params of the i-th prompt / choice of one call: with a seed, seed + i (distinct but reproducible
        whatever the batching); else self."""
        return self if self.seed is None or i == 0 else dataclasses.replace(self, seed=self.seed + i)

    # ------------------------------------------------------------------ command line
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        """One flag per field (``--max-new-tokens``, ..., ``--stop`` repeatable; ``structured`` has its own,
        :mod:`mistral_kernels.structured.cli`); a bad value is a parse error naming the flag, with this class's
        message."""
        add_fields(parser, SamplingParams, check=_check_field, only=_PLAIN_FIELDS)
        add_structured_args(parser)

    @staticmethod
    def from_cli_args(args: argparse.Namespace) -> SamplingParams:
        """The params of parsed flags (those of :meth:`add_cli_args`)."""
        return SamplingParams(**values_from(SamplingParams, args, only=_PLAIN_FIELDS),
                              structured=structured_from_args(args))

    @staticmethod
    def cli_flags() -> dict[str, str]:
        """Field name → its command-line flag."""
        return field_flags(SamplingParams)


FIELD_NAMES: frozenset[str] = frozenset(f.name for f in dataclasses.fields(SamplingParams))
_PLAIN_FIELDS = FIELD_NAMES - {"structured"}  # the fields whose flags dataclass_cli generates
_SPECS = (JsonObject, JsonSchema, Regex, Choice, Grammar)
SamplingParams.__doc__ = (SamplingParams.__doc__ or "") + "".join(
    f"    {f.name} : {f.metadata['help']}\n" for f in dataclasses.fields(SamplingParams))


def _bias_pairs(bias: Any) -> tuple[tuple[int, float], ...]:
    """A logit_bias mapping or (id, bias) pairs → sorted (int id, float bias) pairs, each checked."""
    items = bias.items() if isinstance(bias, Mapping) else bias
    out: dict[int, float] = {}
    for pair in items:
        if len(pair) != 2:
            raise ValueError(f"logit_bias must map token ids to biases, got the entry {pair!r}")
        tok, value = pair
        if isinstance(tok, bool) or not isinstance(tok, int) and not (isinstance(tok, str) and tok.strip().isdigit()):
            raise ValueError(f"logit_bias keys must be token ids (integers), got {tok!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not LOGIT_BIAS_RANGE[0] <= value <= LOGIT_BIAS_RANGE[1]:
            raise ValueError(f"logit_bias values must be numbers in [{LOGIT_BIAS_RANGE[0]:g}, "
                             f"{LOGIT_BIAS_RANGE[1]:g}], got {value!r} for token {tok}")
        out[int(tok)] = float(value)
    return tuple(sorted(out.items()))


def _check_field(name: str, value: Any) -> None:
    """One field's value checked by the class's own rules (the other fields at their defaults)."""
    SamplingParams(**{name: value})


def sampling_params(params: SamplingParams | None, overrides: Mapping[str, Any], caller: str) -> SamplingParams:
    """``params`` (default: ``SamplingParams()``) with ``overrides`` replacing its fields.

    Raises
    ------
    TypeError
        ``params`` is not a SamplingParams, or an override is not one of its fields (the message lists them).
    ValueError
        An override's value is invalid (the message names the field).
    """
    if params is None:
        params = SamplingParams()
    elif not isinstance(params, SamplingParams):
        raise TypeError(f"{caller}: params must be a SamplingParams or None, got {type(params).__name__}")
    unknown = sorted(set(overrides) - FIELD_NAMES)
    if unknown:
        raise TypeError(f"{caller}: unknown sampling parameter(s) {unknown}; SamplingParams has "
                        f"{sorted(FIELD_NAMES)}")
    return dataclasses.replace(params, **overrides) if overrides else params
