"""The output processor: sampled token ids → text, stop conditions, finish reasons and completions.

Host-only. For each sampled token of a request, in this order:

1. append it and detokenise incrementally (text with special tokens skipped);
2. a stop string found in the text → finish "stop", the text is cut before the string (searched only
   in the tail a new match can touch: the last ``len(longest stop) - 1`` old characters + the new text);
3. else a ``stop_token_ids`` token, or an EOS token (unless ``ignore_eos``) → "stop";
4. else ``max_new_tokens`` reached → "length".

Streaming (:meth:`OutputProcessor.drain_text`) holds back the last ``len(longest stop) - 1`` characters
while the request runs, as they might still begin a stop string. Example: stop "</s>", text so far
"Hello </" → "Hello" is released, " </" is held until later text shows whether "</s>" completes.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from .logprobs import TokenLogprob
from .request import Request, RequestTimings
from .tokenization import IncrementalDecoder, Tokenizer

__all__ = ["Completion", "OutputProcessor"]


@dataclass
class Completion:
    """Result of one request.

    Attributes
    ----------
    request_id : engine id
    text : generated text (special tokens skipped; cut before a matched stop string)
    token_ids : generated token ids (including the EOS / stop token that ended it)
    prompt_token_ids : the prompt as fed to the model
    finish_reason : "stop" (EOS, stop token or stop string) or "length" (max_new_tokens)
    stop_reason : the matched stop string or stop token id; None otherwise
    num_preemptions : how often the request was preempted and recomputed
    timings : arrival / first token / finish times
    logprobs : one :class:`~mistral_kernels.logprobs.TokenLogprob` per generated token when the request's
        params asked for ``logprobs``; None otherwise
    """

    request_id: int
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str
    stop_reason: str | int | None
    num_preemptions: int
    timings: RequestTimings
    logprobs: list[TokenLogprob] | None = None


@dataclass
class _TextState:
    request: Request
    decoder: IncrementalDecoder | None
    text: str = ""
    emitted: int = 0  # text[:emitted] was handed out by drain_text
    logprobs: list[TokenLogprob] = field(default_factory=list)
    logprobs_emitted: int = 0  # logprobs[:logprobs_emitted] were handed out by drain_logprobs


class OutputProcessor:
    """Per-request text and stop handling.

    Parameters
    ----------
    tokenizer : for text output and stop strings; None → token ids only
    eos_ids : token ids that end generation (unless a request sets ``ignore_eos``)
    """

    def __init__(self, tokenizer: Tokenizer | None, eos_ids: Collection[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(int(e) for e in eos_ids)
        self._states: dict[int, _TextState] = {}

    def add(self, request: Request) -> None:
        """Start tracking a new request's text."""
        dec = self.tokenizer.incremental_decoder() if self.tokenizer is not None else None
        self._states[request.rid] = _TextState(request, dec)

    def process(self, requests: Sequence[Request], token_ids: Sequence[int], now: float,
                logprobs: Sequence[TokenLogprob | None] | None = None) -> list[Request]:
        """Append each request's sampled token (``token_ids[i]`` to ``requests[i]``, with its log-probability
        ``logprobs[i]`` when not None); return those that finished with it, in order."""
        finished = []
        for i, (r, tok) in enumerate(zip(requests, token_ids)):
            st = self._states[r.rid]
            if logprobs is not None and logprobs[i] is not None:
                st.logprobs.append(logprobs[i])  # type: ignore[arg-type]
            self._append(st, int(tok), now)
            if r.finish_reason is not None:
                finished.append(r)
        return finished

    def drain_text(self, rid: int) -> str:
        """New final text of a request since the last call (see the module docstring)."""
        st = self._states.get(rid)
        if st is None:
            raise KeyError(f"drain_text: no request {rid}")
        stop = st.request.params.stop
        end = len(st.text)
        if st.request.finish_reason is None and stop:
            end = max(st.emitted, end - (max(len(s) for s in stop) - 1))
        piece = st.text[st.emitted:end]
        st.emitted = end
        return piece

    def drain_logprobs(self, rid: int) -> list[TokenLogprob]:
        """Log-probabilities of the tokens generated since the last call (for streaming)."""
        st = self._states.get(rid)
        if st is None:
            raise KeyError(f"drain_logprobs: no request {rid}")
        new = st.logprobs[st.logprobs_emitted:]
        st.logprobs_emitted = len(st.logprobs)
        return new

    def has(self, rid: int) -> bool:
        """The request is tracked (added, neither dropped nor turned into a completion)."""
        return rid in self._states

    def drop(self, rid: int) -> None:
        """Forget a request's text (it was aborted)."""
        self._states.pop(rid, None)

    def completion(self, request: Request) -> Completion:
        """The finished request's :class:`Completion`; its text state is dropped."""
        st = self._states.pop(request.rid)
        return Completion(request.rid, st.text, list(request.output_ids), list(request.prompt_ids),
                          request.finish_reason or "length", request.stop_reason, request.num_preemptions,
                          request.timings, st.logprobs if request.params.logprobs is not None else None)

    def _append(self, st: _TextState, tok: int, now: float) -> None:
        r, p = st.request, st.request.params
        if r.timings.first_token is None:
            r.timings.first_token = now
        r.output_ids.append(tok)
        if st.decoder is not None:
            before = len(st.text)
            st.text += st.decoder.push([tok])
            if p.stop:
                # Search only where a new match can be: the tail that includes the new text.
                start = max(0, before - max(len(s) for s in p.stop) + 1)
                hits = [(st.text.find(s, start), s) for s in p.stop]
                hits = [(i, s) for i, s in hits if i >= 0]
                if hits:
                    pos, s = min(hits)
                    st.text = st.text[:pos]
                    st.emitted = min(st.emitted, pos)
                    r.finish_reason, r.stop_reason = "stop", s
                    return
        if tok in p.stop_token_ids:
            r.finish_reason, r.stop_reason = "stop", tok
        elif tok in self.eos_ids and not p.ignore_eos:
            r.finish_reason, r.stop_reason = "stop", tok
        elif len(r.output_ids) >= p.max_new_tokens:
            r.finish_reason = "length"
        if r.finish_reason is not None and st.decoder is not None:
            st.text += st.decoder.flush()
