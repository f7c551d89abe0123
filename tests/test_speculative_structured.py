"""Speculative decoding of constrained requests (structured outputs): every verify row carries its grammar's
mask after the proposals before it, proposals the grammar forbids cut the run. Greedy outputs token-identical
with and without speculation — on the loop toy (regex, choice; constrained and free requests batched) and on
the default model (JSON schema, regex, choice; several prompts, batch > 1) — with n-gram proposals the grammar
forbids; sampled outputs keep the masked distribution (chi-square / total variation on a tiny vocabulary,
point-mass n-gram proposals and a drawn q that the grammar forbids on purpose)."""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest
import torch

from mistral_kernels.config import ModelConfig
from mistral_kernels.engine import Engine
from mistral_kernels.sampling import SamplingParams
from mistral_kernels.speculative import Proposal, SpeculativeConfig
from mistral_kernels.structured import Choice, JsonSchema, Regex

from .helpers.engine import CharTokenizer
from .helpers.model_helpers import random_model
from .helpers.speculative import LoopToy, PoolChecker, chi_square_p, run_engine

TOK = CharTokenizer()


class Cuts:
    """Wraps an engine's speculator: counts proposals and the proposals the grammar cut off (a constrained
    request's ``draft_ids`` shorter than its proposer's proposal)."""

    def __init__(self, engine: Engine) -> None:
        spec = engine.speculator
        assert spec is not None
        self.proposed = self.cut = self.constrained_verified = 0
        original, prepare = spec.proposer.propose, spec.prepare
        last: dict[int, int] = {}

        def propose(requests, k):
            out = original(requests, k)
            for r, n, p in zip(requests, k, out):
                last[r.rid] = len(p.token_ids[:n])
            return out

        def prepare_counted(running) -> None:
            last.clear()
            prepare(running)
            for r in running:
                if r.rid in last:
                    self.proposed += last[r.rid]
                    if r.grammar is not None:
                        self.cut += last[r.rid] - len(r.draft_ids)
                        self.constrained_verified += len(r.draft_ids)

        spec.proposer.propose = propose  # type: ignore[method-assign]
        spec.prepare = prepare_counted  # type: ignore[method-assign]


def _toy_engine(spec: SpeculativeConfig | None, cuts: list[Cuts] | None = None, max_batch: int = 4):
    def make() -> Engine:
        engine = Engine(LoopToy(), TOK, num_blocks=300, block_size=4, max_batch=max_batch, max_tokens_per_step=64,
                        speculative=spec)
        if cuts is not None:
            cuts.append(Cuts(engine))
        return engine
    return make


def _compare(make_plain, make_spec, jobs) -> list:
    want, _, _ = run_engine(make_plain, jobs)
    got, streamed, engine = run_engine(make_spec, jobs, check=PoolChecker())
    for w, g in zip(want, got):
        assert (g.token_ids, g.text, g.finish_reason, g.stop_reason) == \
            (w.token_ids, w.text, w.finish_reason, w.stop_reason)
    assert streamed == [c.token_ids for c in got]
    assert engine.blocks.num_used_blocks == 0
    return got


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_identical_on_the_toy_with_grammars_and_free_requests(batch: int) -> None:
    rng = random.Random(batch)
    specs = [Regex("[a-f]+( [a-h]+)*"), Regex("([aeiou][b-l]){3,30}"), Choice(["abcabcabc", "abcdabcd fgh",
                                                                               "bcd bcd bcd bcd"]), None]
    jobs = []
    for i in range(8):
        prompt = [rng.randrange(12) for _ in range(rng.randrange(4, 14))]
        spec = specs[i % len(specs)]
        jobs.append((prompt, SamplingParams(max_new_tokens=rng.randrange(25, 45), structured=spec,
                                            ignore_eos=spec is None)))
    cuts: list[Cuts] = []
    spec = SpeculativeConfig(num_tokens=4, max_batch=8, max_rows=64, row_cost=0.0)
    got = _compare(_toy_engine(None, max_batch=batch), _toy_engine(spec, cuts, max_batch=batch), jobs)
    for (_, p), c in zip(jobs, got):
        if isinstance(p.structured, Regex) and c.finish_reason == "stop":
            assert re.fullmatch(p.structured.pattern, c.text), c.text
        if isinstance(p.structured, Choice):
            assert c.text in p.structured.options
    c = cuts[0]
    assert c.cut > 0 and c.constrained_verified > 0, (c.cut, c.constrained_verified)  # both kinds happened


def test_forbidden_proposals_are_cut_and_allowed_ones_verified() -> None:
    """Proposals that are the constrained output's own continuation followed by a token the grammar forbids:
    the forbidden tail is cut, the rest is verified (all accepted); proposals the grammar forbids from the start
    are never verified. Outputs equal plain constrained decoding either way."""
    jobs = [([1, 2, 3, 1, 2, 3, 1], SamplingParams(max_new_tokens=40, structured=Regex("[a-d]+( [g-l]+)*"))),
            ([4, 5, 6, 4, 5], SamplingParams(max_new_tokens=30, structured=Regex("[h-l][a-c]+")))]
    want, _, _ = run_engine(_toy_engine(None), jobs)
    known = {tuple(ids): c.token_ids for (ids, _), c in zip(jobs, want)}
    bad = TOK.encode("U")[0]  # an upper-case letter: neither pattern allows it

    class RightThenForbidden:
        def __init__(self, right: int) -> None:
            self.right = right  # how many of the true continuation come before the forbidden token

        def propose(self, requests, k):
            out = []
            for r, n in zip(requests, k):
                i = len(r.output_ids)
                good = known[tuple(r.prompt_ids)][i:i + min(self.right, n - 1)]
                out.append(Proposal(good + [bad] * (n - len(good))))
            return out

        def forget(self, rid: int) -> None:
            return None

    for right in (0, 2):
        spec = SpeculativeConfig(num_tokens=4, max_batch=8, max_rows=64, row_cost=0.0)

        def make(right=right) -> Engine:
            return Engine(LoopToy(), TOK, num_blocks=300, block_size=4, max_batch=2, max_tokens_per_step=64,
                          speculative=spec, proposer=RightThenForbidden(right))
        _compare(_toy_engine(None), make, jobs)
        _, _, engine = run_engine(make, jobs)
        s = engine.stats
        if right == 0:
            assert s.spec_proposed_tokens == 0
        else:
            assert s.spec_proposed_tokens > 20 and s.spec_accepted_tokens == s.spec_proposed_tokens


# ------------------------------------------------------------------------------------------ the default model
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 130},
                                           "city": {"type": "string", "maxLength": 24}},
          "required": ["name", "age", "city"], "additionalProperties": False,
          "x-guidance": {"whitespace_flexible": False}}


def test_greedy_identical_on_the_default_model_json_regex_choice() -> None:
    from mistral_kernels import LLM

    from .helpers.default_model_files import default_model_or_skip

    path = default_model_or_skip()
    texts = ["Extract the person as JSON: Maria Lopez is 34 years old and lives in Madrid. Maria Lopez works "
             "as a teacher in Madrid.",
             "Extract the person as JSON: John Smith, aged 58, moved from London to Leeds; John Smith now lives "
             "in Leeds.",
             "Write the date 2024-05-17 again, exactly as given: 2024-05-17.",
             "Which colour is the sky on a clear day: blue sky, green grass or red roses? Answer with one option."]
    params = [SamplingParams(structured=JsonSchema(SCHEMA), max_new_tokens=60),
              SamplingParams(structured=JsonSchema(SCHEMA), max_new_tokens=60),
              SamplingParams(structured=Regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}( [0-9]{4}-[0-9]{2}-[0-9]{2})*"),
                             max_new_tokens=40),
              SamplingParams(structured=Choice(["blue sky", "green grass", "red roses"]), max_new_tokens=10)]
    plain = LLM(path, max_batch=4)
    jobs = [(plain.prompt_ids(t, chat=True), p) for t, p in zip(texts, params)]
    want = plain.engine.generate(jobs)
    spec = LLM(path, max_batch=4, speculative=SpeculativeConfig(num_tokens=3, max_batch=4, row_cost=0.0))
    cuts = Cuts(spec.engine)
    got = spec.engine.generate(jobs)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for c in got[:2]:
        assert c.finish_reason == "stop"
        obj = json.loads(c.text)
        assert set(obj) == {"name", "age", "city"}
    assert got[3].text in ("blue sky", "green grass", "red roses")
    s = spec.engine.stats
    assert s.spec_accepted_tokens > 0 and cuts.constrained_verified > 0 and cuts.cut > 0, \
        (s.spec_accepted_tokens, cuts.constrained_verified, cuts.cut)


# ------------------------------------------------------------------------------------------ sampling with a mask
TINY = "abcdefg!"  # '!' = EOS


CONFIG = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=48, vocab_size=8,
                     max_position=128, sliding_window=12, eos_token_ids=(7,))
PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]  # repetitive: the n-gram proposer has something to propose
PATTERN = "[b-e][b-e][a-e][a-g]+"  # tokens 2-3 (those the test counts) masked to 4 and 5 of the 8 ids
N = 3000  # per arm: cutting SkewedDraft's forbidden proposals off (instead of rejecting them) gives p ~ 1e-10


class SkewedDraft:
    """Proposes tokens drawn from a fixed q: half its mass on token 0 ('a'), which the grammar forbids as the 1st
    and 2nd token (such a proposal stays in the draft and its row rejects it), half on 'b' … 'e', which it allows
    there — so the residual a rejected row redraws from is far from the masked p (cutting the forbidden
    proposal off instead, and sampling that row from p, would bias the distribution)."""

    def __init__(self) -> None:
        self.q = torch.tensor([0.5, 0.125, 0.125, 0.125, 0.125, 0.0, 0.0, 0.0])
        self.gen = torch.Generator().manual_seed(17)

    def propose(self, requests, k):
        return [Proposal(torch.multinomial(self.q, n, replacement=True, generator=self.gen).tolist(),
                         self.q.expand(n, 8).clone()) for n in k]

    def forget(self, rid: int) -> None:
        return None


@pytest.fixture(scope="module")
def tiny_model():
    m = random_model(CONFIG, seed=3, fused_cpu_decode=False)
    m.lm_head.mul_(1.5)  # spread enough under the mask that a biased rule shows (see SkewedDraft)
    return m


def _samples(model, spec, proposer, seed0: int) -> tuple[Counter, Engine]:
    engine = Engine(model, CharTokenizer(TINY), num_blocks=600, block_size=4, max_batch=48, max_tokens_per_step=1024,
                    speculative=spec, proposer=proposer)
    params = dict(temperature=0.9, top_k=7, repetition_penalty=1.2, max_new_tokens=5, ignore_eos=True,
                  structured=Regex(PATTERN))
    done = engine.generate([(PROMPT, SamplingParams(seed=seed0 + i, **params)) for i in range(N)])
    for c in done:
        assert re.fullmatch(PATTERN[:-1] + "*", c.text[:3]), c.text  # the first three obey the grammar
    return Counter(tuple(c.token_ids[1:3]) for c in done), engine


@pytest.mark.parametrize("method", ["ngram", "skewed_draft"])
def test_masked_distribution_equals_plain_sampling(tiny_model, method: str) -> None:
    plain, _ = _samples(tiny_model, None, None, seed0=10**6)
    spec = SpeculativeConfig(num_tokens=3, ngram_min=1, max_batch=64, max_rows=1000, adaptive=False)
    proposer = SkewedDraft() if method == "skewed_draft" else None
    got, engine = _samples(tiny_model, spec, proposer, seed0=0)
    s = engine.stats
    assert s.spec_accepted_tokens > 0.05 * s.spec_proposed_tokens > 0
    assert s.spec_accepted_tokens < 0.95 * s.spec_proposed_tokens
    p, tv = chi_square_p(plain, got)
    assert p > 1e-3 and tv < 0.12, (p, tv)
    second = chi_square_p(Counter(k[:1] for k in plain.elements()), Counter(k[:1] for k in got.elements()))
    assert second[0] > 1e-3, second  # the 2nd token alone, where the grammar forbids SkewedDraft's favourite
    # the same check tells the unmasked distribution apart (it can fail)
    free = Engine(tiny_model, CharTokenizer(TINY), num_blocks=600, block_size=4, max_batch=48,
                  max_tokens_per_step=1024).generate(
        [(PROMPT, SamplingParams(seed=i, temperature=0.9, top_k=7, repetition_penalty=1.2, max_new_tokens=5,
                                 ignore_eos=True)) for i in range(N)])
    p_free, _ = chi_square_p(plain, Counter(tuple(c.token_ids[1:3]) for c in free))
    assert p_free < 1e-3


def test_allowed_prefix_agrees_with_the_masks_along_the_proposals() -> None:
    """allowed_prefix (llguidance's token validation) equals the first proposal whose row mask (computed along
    the proposals) forbids it — two different paths through the matcher; the state is left as it was."""
    from mistral_kernels.structured.grammar import GrammarCompiler

    rng = random.Random(0)
    compiler = GrammarCompiler(TOK, 50, [49])
    for pattern in ("ab+c", "[a-c]+( [d-f]+)*", "(abc|abd)e"):
        state = compiler.state(Regex(pattern))
        for _ in range(60):
            # no EOS among them: the mask rows after an EOS are all-allowed (never read), not a grammar's verdict
            proposed = [rng.choice(TOK.encode("abcdef x")) for _ in range(rng.randrange(1, 7))]
            masks = state.masks_for_proposals(proposed)
            first_bad = next((j for j, t in enumerate(proposed) if not (int(masks[j, t // 32]) >> (t % 32)) & 1),
                             len(proposed))
            assert state.allowed_prefix(proposed) == first_bad, (pattern, proposed)
        row = torch.empty(2, dtype=torch.int32)
        state.fill(row)
        assert bool((row == compiler.state(Regex(pattern)).masks_for_proposals([])[0]).all())
