"""Draft-model proposer: a smaller model with the target's vocabulary proposes k tokens per step.

Shape letters: B sequences proposing in a step, K proposed tokens, V vocabulary.

The draft runs in the engine's process on its own paged KV cache (its own :class:`~mistral_kernels.cache.BlockManager`,
no prefix caching). Per request it remembers the tokens whose k/v its cache holds (the request's tokens at the
last proposal + the proposals but the last). At the next proposal the request's tokens are compared with them:
the common prefix stays (the accepted proposals are already computed), the rest is recomputed — so the draft's
cache follows the accepted tokens, also after a rejection or a preemption of the target. One proposal: a
catch-up forward (the tokens not yet in the draft cache, the last one's logits) and k-1 decode steps, each
ending in one host read of the B proposed ids (the scheduler needs them on the host).

Which token and which q: a greedy request gets the draft's argmax (greedy verification ignores q); a sampling
request gets a draw from the draft's softmax at the request's temperature, and that softmax is its q, so the
rejection rule of :mod:`.verify` keeps the target's distribution exactly. Draws use the proposer's own
generator (seeded), never the request's.

Compatibility is checked when made (:func:`check_same_vocabulary`): the same vocabulary size and, with
tokenizers, the same bytes for every token id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..batch import AttentionBatch
from ..cache import BlockManager, OutOfBlocksError
from ..ops import device_index_checks
from ..request import Request
from ..tokenization import Tokenizer
from .proposer import Proposal

__all__ = ["DraftProposer", "check_same_vocabulary"]


def check_same_vocabulary(target_vocab: int, draft_vocab: int, target_tok: Tokenizer | None = None,
                          draft_tok: Tokenizer | None = None) -> None:
    """Raise a ValueError unless the draft can propose the target's tokens: equal vocabulary sizes and, when both
    tokenizers are given, the same bytes for every token id."""
    if target_vocab != draft_vocab:
        raise ValueError(f"draft model: its vocabulary has {draft_vocab} tokens, the target's {target_vocab}; a draft "
                         "model must share the target's tokenizer (pick a smaller model of the same family)")
    if target_tok is None or draft_tok is None:
        return
    for i in range(target_vocab):
        a, b = target_tok.token_bytes(i), draft_tok.token_bytes(i)
        if a != b:
            raise ValueError(f"draft model: token {i} is {b!r} for the draft but {a!r} for the target; a draft model "
                             "must share the target's tokenizer")


class DraftProposer:
    """Proposals of a draft model (module docstring).

    Parameters
    ----------
    model : the draft model (a :class:`~mistral_kernels.runner.PagedModel`)
    num_blocks, block_size : its KV cache
    seed : of the generator that draws the sampling requests' proposals
    """

    def __init__(self, model: Any, num_blocks: int, block_size: int = 16, seed: int = 0) -> None:
        self.model = model
        self.device = torch.device(model.device)
        self.blocks = BlockManager(num_blocks, block_size, model.config.sliding_window)
        self.cache = model.new_cache(self.blocks.num_physical_blocks, block_size)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self._tokens: dict[int, list[int]] = {}  # rid → the tokens whose k/v the draft cache holds

    def forget(self, rid: int) -> None:
        self.blocks.free(rid)
        self._tokens.pop(rid, None)

    def _forward(self, tables: list[list[int]], cached: list[int], new: list[list[int]]) -> torch.Tensor:
        """The draft's logits [B, V] after each sequence's new tokens (written into its cache)."""
        cfg = self.model.config
        batch = AttentionBatch.build(tables, cached, [len(n) for n in new], self.blocks.block_size, self.device,
                                     logits_sequences=list(range(len(new))), num_blocks=self.blocks.num_physical_blocks,
                                     max_position=cfg.max_position)
        ids = torch.tensor([t for n in new for t in n], dtype=torch.int64, device=self.device)
        with device_index_checks(False):  # validated on the host by AttentionBatch.build
            return self.model.forward(ids, batch, self.cache).float()

    def _pick(self, logits: torch.Tensor, requests: Sequence[Request]) -> tuple[list[int], list[torch.Tensor | None]]:
        """One token per row: argmax for greedy requests, a draw from softmax(logits / T) else (with that q)."""
        picks = logits.argmax(dim=-1)
        qs: list[torch.Tensor | None] = [None] * len(requests)
        for i, r in enumerate(requests):
            if not r.params.greedy:
                q = (logits[i] / r.params.temperature).softmax(dim=-1)
                picks[i] = torch.multinomial(q, 1, generator=self.generator)[0]
                qs[i] = q
        return picks.tolist(), qs

    def propose(self, requests: Sequence[Request], k: Sequence[int]) -> list[Proposal]:
        out = [Proposal() for _ in requests]
        live: list[int] = []  # indices of the requests the draft can serve this step
        tables, cached, new = [], [], []
        for i, (r, n) in enumerate(zip(requests, k)):
            tokens = r.all_ids
            held = self._tokens.get(r.rid, [])
            common = 0
            for a, b in zip(held, tokens):
                if a != b:
                    break
                common += 1
            common = min(common, len(tokens) - 1)  # the last token is always fed (its logits propose)
            if not self.blocks.has(r.rid) or common == 0:
                self.blocks.free(r.rid)
                common = 0
            try:
                self.blocks.allocate(r.rid, common, len(tokens) + n - 1)
            except OutOfBlocksError:
                self.forget(r.rid)
                continue
            live.append(i)
            tables.append(list(self.blocks.block_table(r.rid)))
            cached.append(common)
            new.append(tokens[common:])
        if not live:
            return out
        reqs = [requests[i] for i in live]
        drafts: list[list[int]] = [[] for _ in live]
        probs: list[list[torch.Tensor | None]] = [[] for _ in live]
        going = list(range(len(live)))
        logits = self._forward(tables, cached, new)  # catch up; the logits after each last token
        pos = [c + len(n) for c, n in zip(cached, new)]  # position of each sequence's first proposal
        while True:
            picked, picked_q = self._pick(logits, [reqs[j] for j in going])
            for j, t, q in zip(going, picked, picked_q):
                drafts[j].append(t)
                probs[j].append(q)
            going = [j for j in going if len(drafts[j]) < k[live[j]]]
            if not going:
                break
            logits = self._forward([tables[j] for j in going], [pos[j] for j in going],
                                   [[drafts[j][-1]] for j in going])
            for j in going:
                pos[j] += 1
        for j, i in enumerate(live):
            r = requests[i]
            self._tokens[r.rid] = r.all_ids + drafts[j][:-1]
            q = None
            if not r.params.greedy:
                q = torch.stack([p for p in probs[j] if p is not None])  # [K, V]
            out[i] = Proposal(drafts[j], q)
        return out
