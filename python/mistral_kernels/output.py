"""The output processor: sampled token ids → text, stop conditions, finish reasons and completions.

Host-only. For each sampled token of a request, in this order:

1. append it and detokenise incrementally (special tokens skipped unless ``skip_special_tokens=False``);
2. a stop string found in the text (once ``min_tokens`` tokens are out) → finish "stop", the text is cut
   before the string, or after it with ``include_stop_str_in_output`` (searched only in the tail a new match
   can touch: the last ``len(longest stop) - 1`` old characters + the new text);
3. else a ``stop_token_ids`` token, or an EOS token (unless ``ignore_eos``) → "stop"; that token's own text
   is left out unless ``include_stop_str_in_output`` (as vLLM does);
4. else the request's grammar (structured output, :mod:`.structured`) consumed the token and is complete
   → "stop";
5. else ``max_new_tokens`` reached → "length".

Each processed token gives the request's :class:`RequestOutput` of the step: the new token ids, the text
that became final since the previous output, the new tokens' log-probabilities, and on the last one the
:class:`Completion` (the request is then forgotten here). The text delta holds back the last
``len(longest stop) - 1`` characters while the request runs, as they might still begin a stop string.
Example: stop "</s>", text so far "Hello </" → "Hello" is released, " </" is held until later text shows
whether "</s>" completes.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from .logprobs import TokenLogprob
from .request import Request, RequestTimings
from .tokenization import IncrementalDecoder, Tokenizer

__all__ = ["Completion", "OutputProcessor", "RequestOutput"]


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


@dataclass(slots=True)
class RequestOutput:
    """What one engine step produced for one request (:meth:`mistral_kernels.engine.Engine.step`).

    Attributes
    ----------
    request_id : engine id
    token_ids : the tokens generated in this step (one; several when speculative decoding accepted proposals)
    text : the text that became final since the previous output (may be empty: an incomplete UTF-8
        character, or text that might still begin a stop string, is held back)
    logprobs : the log-probabilities of ``token_ids`` when the request asked for ``logprobs``; else empty
    completion : the request's :class:`Completion` when it finished in this step; else None
    """

    request_id: int
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob]
    completion: Completion | None = None

    @property
    def finished(self) -> bool:
        return self.completion is not None


@dataclass
class _TextState:
    request: Request
    decoder: IncrementalDecoder | None
    text: str = ""
    emitted: int = 0  # text[:emitted] was handed out in an output
    logprobs: list[TokenLogprob] = field(default_factory=list)


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
        dec = self.tokenizer.incremental_decoder(request.params.skip_special_tokens) \
            if self.tokenizer is not None else None
        self._states[request.rid] = _TextState(request, dec)

    def process(self, requests: Sequence[Request], token_ids: Sequence[int], now: float,
                logprobs: Sequence[TokenLogprob | None] | None = None) -> list[RequestOutput]:
        """Append each request's sampled token (``token_ids[i]`` to ``requests[i]``, with its log-probability
        ``logprobs[i]`` when not None); the requests' outputs, in order. A request that finished with its
        token has its ``timings.finished`` set to ``now`` and its completion in its output (and is dropped)."""
        lps = None if logprobs is None else [[lp] if lp is not None else [] for lp in logprobs]
        return self.process_many(requests, [[t] for t in token_ids], now, lps)

    def process_many(self, requests: Sequence[Request], token_ids: Sequence[Sequence[int]], now: float,
                     logprobs: Sequence[Sequence[TokenLogprob]] | None = None) -> list[RequestOutput]:
        """:meth:`process` for several new tokens per request (speculative decoding's accepted run), in order:
        the tokens after one that finishes the request (stop string, stop / EOS token, max_new_tokens) are
        dropped. ``logprobs[i]``: the log-probabilities of ``token_ids[i]`` (empty when not asked)."""
        outputs = []
        for i, (r, toks) in enumerate(zip(requests, token_ids)):
            st = self._states[r.rid]
            lps = logprobs[i] if logprobs is not None else []
            kept: list[int] = []
            for j, tok in enumerate(toks):
                kept.append(int(tok))
                if j < len(lps):
                    st.logprobs.append(lps[j])
                self._append(st, int(tok), now)
                if r.finish_reason is not None:
                    break
            out = RequestOutput(r.rid, kept, self._text_delta(st), list(lps[:len(kept)]))
            if r.finish_reason is not None:
                r.timings.finished = now
                out.completion = self.completion(r)
            outputs.append(out)
        return outputs

    def _text_delta(self, st: _TextState) -> str:
        """New final text of a request since its previous output (see the module docstring)."""
        stop = st.request.params.stop
        end = len(st.text)
        if st.request.finish_reason is None and stop:
            end = max(st.emitted, end - (max(len(s) for s in stop) - 1))
        piece = st.text[st.emitted:end]
        st.emitted = end
        return piece

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
        before = len(st.text)
        if st.decoder is not None:
            st.text += st.decoder.push([tok])
            if p.stop and len(r.output_ids) >= p.min_tokens:
                # Search only where a new match can be: the tail that includes the new text.
                start = max(0, before - max(len(s) for s in p.stop) + 1)
                hits = [(st.text.find(s, start), s) for s in p.stop]
                hits = [(i, s) for i, s in hits if i >= 0]
                if hits:
                    pos, s = min(hits)
                    if p.include_stop_str_in_output:
                        pos += len(s)
                    st.text = st.text[:pos]
                    st.emitted = min(st.emitted, pos)
                    r.finish_reason, r.stop_reason = "stop", s
                    return
        complete = r.grammar is not None and r.grammar.accept(tok)
        if tok in p.stop_token_ids:
            r.finish_reason, r.stop_reason = "stop", tok
        elif tok in self.eos_ids and not p.ignore_eos:
            r.finish_reason, r.stop_reason = "stop", tok
        elif complete:
            r.finish_reason = "stop"
        elif len(r.output_ids) >= p.max_new_tokens:
            r.finish_reason = "length"
        if r.finish_reason is not None and st.decoder is not None:
            st.text += st.decoder.flush()
            if r.stop_reason == tok and not p.include_stop_str_in_output:
                st.text = st.text[:before]  # the stop / EOS token's own text is not output
