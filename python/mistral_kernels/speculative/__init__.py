"""Speculative decoding: proposers guess the next tokens, the target verifies them in one forward.

=================  ===============================================================================
module             role
=================  ===============================================================================
``config``         :class:`SpeculativeConfig`: method, k, n-gram sizes, draft model, caps, adaptive, row cost
``cost``           when speculation pays: the measured verify-row cost, acceptance, the k per request, probes
``proposer``       the :class:`Proposer` interface and its :class:`Proposal`
``ngram``          n-gram prompt lookup (:class:`NgramProposer`)
``verify``         target tokens of the verify rows (greedy / rejection sampling) and acceptance
``speculator``     the engine's side: each request's k and drafts before a step, kept k/v and counts after it
``draft``          the draft-model proposer (:class:`~.draft.DraftProposer`) and the vocabulary check
=================  ===============================================================================

Exactness: greedy outputs are token-identical to plain decoding; sampled outputs have the same
distribution (:mod:`.verify`).
"""

from .config import METHODS, SpeculativeConfig
from .ngram import NgramProposer, ngram_lookup
from .proposer import Proposal, Proposer

__all__ = ["METHODS", "NgramProposer", "Proposal", "Proposer", "SpeculativeConfig", "ngram_lookup"]
