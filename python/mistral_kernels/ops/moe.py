"""Top-k mixture-of-experts: router, token→expert permute, weighted unpermute, fused Mixtral MoE block.

Kernels: csrc/kernels/{moe_router,moe_permute,grouped_gemm}.cuh, csrc/cpu/moe.cpp.

Shape letters: T tokens, H hidden, I intermediate (per expert), E experts, k top-k (experts per token),
M = T·k permuted rows.

Index layout, worked example (T = 3 tokens, k = 2, E = 4 experts)::

    topk_ids = [[2, 0],      token 0 → experts 2 and 0
                [0, 3],      token 1 → experts 0 and 3
                [2, 0]]      token 2 → experts 2 and 0

    histogram of topk_ids:   expert 0: 3, expert 1: 0, expert 2: 2, expert 3: 1
    expert_offsets = [0, 3, 3, 5, 6]          (exclusive scan, int64 [E+1]; expert 1 is empty)

    permuted_x rows (grouped by expert, tokens increasing inside an expert):
        row 0: x[0]  (expert 0)     row 3: x[0]  (expert 2)
        row 1: x[1]  (expert 0)     row 4: x[2]  (expert 2)
        row 2: x[2]  (expert 0)     row 5: x[1]  (expert 3)

    inv_perm = [[3, 0],      inv_perm[t, j] = row of permuted_x holding x[t] for expert topk_ids[t, j]
                [1, 5],
                [4, 2]]

    moe_unpermute: out[t] = Σ_j topk_weights[t, j] · expert_out[inv_perm[t, j]]
    e.g. out[1] = w[1, 0] · expert_out[1] + w[1, 1] · expert_out[5]

The layout depends only on ``topk_ids`` (no atomics-dependent order), so it is identical on every backend.
"""

from __future__ import annotations

import torch

from ._base import OpFamily, check_index_range, require_tensor

MAX_EXPERTS = 4096  # must match kMaxExperts in csrc/checks/moe.h (the bound of every backend)

class MoEOps(OpFamily):
    """Kernel wrappers of the MoE family, bound to one ``torch.ops`` namespace (see ``ops/__init__.py``)."""

    def topk_softmax(
        self, gating_logits: torch.Tensor, k: int, renormalize: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Router: softmax over the E experts in fp32, top-k, optionally renormalised over the k chosen.

        Ties pick the lower expert id. With ``renormalize`` this equals softmax over the k largest logits
        (Mixtral's routing).

        Parameters
        ----------
        gating_logits : [T, E] contiguous, any supported float dtype
        k : experts per token, 1 ≤ k ≤ min(E, 32)
        renormalize : divide the k chosen probabilities by their sum

        Returns
        -------
        topk_weights : fp32 [T, k], in decreasing order of probability
        topk_ids : int32 [T, k], the chosen experts, same order
        """
        op = "topk_softmax"
        require_tensor(op, "gating_logits", gating_logits)
        if gating_logits.dim() != 2:
            raise ValueError(f"{op}: gating_logits must be 2-D [T, E], got shape {tuple(gating_logits.shape)}")
        num_experts = gating_logits.shape[1]
        if not 1 <= int(k) <= min(num_experts, 32):
            raise ValueError(f"{op}: k must satisfy 1 <= k <= min(E, 32) with E = {num_experts} experts, got k = {k}")
        t = gating_logits.shape[0]
        weights = torch.empty(t, int(k), dtype=torch.float32, device=gating_logits.device)
        ids = torch.empty(t, int(k), dtype=torch.int32, device=gating_logits.device)
        self._lib.topk_softmax(weights, ids, gating_logits, bool(renormalize))
        return weights, ids

    def moe_permute(
        self, x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Group the token rows by expert (stable, deterministic). See the module docstring for an example.

        Parameters
        ----------
        x : [T, H] contiguous
        topk_ids : int32 [T, k], each in [0, E)
        num_experts : E

        Returns
        -------
        permuted_x : [T·k, H]; rows ``expert_offsets[e]:expert_offsets[e+1]`` belong to expert e, tokens in
            increasing order; ``permuted_x[inv_perm[t, j]] == x[t]``
        expert_offsets : int64 [E+1], exclusive scan of the histogram of topk_ids
        inv_perm : int32 [T, k]
        """
        op = "moe_permute"
        require_tensor(op, "x", x)
        require_tensor(op, "topk_ids", topk_ids)
        if x.dim() != 2 or topk_ids.dim() != 2:
            raise ValueError(
                f"{op}: x must be [T, H] and topk_ids [T, k], got {tuple(x.shape)} and {tuple(topk_ids.shape)}"
            )
        if not 1 <= int(num_experts) <= MAX_EXPERTS:  # before allocating expert_offsets [E+1]
            raise ValueError(f"{op}: num_experts must be in [1, {MAX_EXPERTS}], got {num_experts}")
        check_index_range(op, "topk_ids", topk_ids, 0, int(num_experts), f"expert ids, num_experts = {num_experts}")
        t, k = topk_ids.shape
        permuted = x.new_empty(t * k, x.shape[1])
        offsets = torch.empty(int(num_experts) + 1, dtype=torch.int64, device=x.device)
        inv_perm = torch.empty(t, k, dtype=torch.int32, device=x.device)
        self._lib.moe_permute(permuted, offsets, inv_perm, x, topk_ids)
        return permuted, offsets, inv_perm

    def moe_unpermute(
        self,
        expert_out: torch.Tensor,
        topk_weights: torch.Tensor,
        inv_perm: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Weighted sum back to token order: ``out[t] = Σ_j w[t, j] · expert_out[inv_perm[t, j]]``.

        fp32 accumulation in j order, one rounding to the dtype at the end.

        Parameters
        ----------
        expert_out : [M, H] contiguous (M = T·k rows from :meth:`moe_permute` order)
        topk_weights : fp32 [T, k]
        inv_perm : int32 [T, k], each in [0, M)
        out : optional [T, H], dtype of expert_out

        Returns
        -------
        [T, H]
        """
        op = "moe_unpermute"
        require_tensor(op, "expert_out", expert_out)
        require_tensor(op, "topk_weights", topk_weights)
        require_tensor(op, "inv_perm", inv_perm)
        if expert_out.dim() != 2 or topk_weights.dim() != 2:
            raise ValueError(
                f"{op}: expert_out must be [M, H] and topk_weights [T, k], got {tuple(expert_out.shape)} "
                f"and {tuple(topk_weights.shape)}"
            )
        check_index_range(op, "inv_perm", inv_perm, 0, expert_out.shape[0], "rows of expert_out")
        if out is None:
            out = expert_out.new_empty(topk_weights.shape[0], expert_out.shape[1])
        self._lib.moe_unpermute(out, expert_out, topk_weights, inv_perm)
        return out

    def fused_moe(
        self,
        x: torch.Tensor,
        gate_weight: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        w3: torch.Tensor,
        top_k: int = 2,
        renormalize: bool = True,
    ) -> torch.Tensor:
        """The Mixtral sparse MoE block: router → permute → grouped SwiGLU expert GEMMs → weighted unpermute.

        ``expert_e(v) = w2[e] · (silu(w1[e] · v) * (w3[e] · v))``;
        ``out[t] = Σ_j w[t, j] · expert_{ids[t, j]}(x[t])`` with ``w, ids = topk_softmax(x · gate_weightᵀ)``.

        Rounding: router logits, the gate / up projections, the activation and the expert outputs are
        stored in x's dtype (as an unfused PyTorch block does); softmax and the weighted sum are fp32.
        On CUDA the expert offsets never leave the device (no host sync); on CPU empty experts are skipped.

        Parameters
        ----------
        x : [..., H] (flattened to [T, H]; contiguous)
        gate_weight : [E, H] router weight
        w1, w3 : [E, I, H] gate and up projections (HF ``w1`` / ``w3``, i.e. ``gate_up_proj`` split in halves)
        w2 : [E, H, I] down projection
        top_k : experts per token (Mixtral: 2), 1 ≤ top_k ≤ min(E, 32)
        renormalize : renormalise the top-k probabilities (Mixtral: True)

        Returns
        -------
        [..., H], same dtype as x
        """
        op = "fused_moe"
        require_tensor(op, "x", x)
        if x.dim() < 1:
            raise ValueError(f"{op}: x must be [..., H], got a scalar")
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        self._lib.fused_moe(out, x2, gate_weight, w1, w2, w3, int(top_k), bool(renormalize))
        return out.view(x.shape)

    def moe_expert_ffn(
        self,
        permuted_x: torch.Tensor,
        expert_offsets: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        w3: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The SwiGLU experts of :meth:`fused_moe` alone, over rows already grouped by expert.

        ``out[r] = w2[e]·(silu(w1[e]·x[r]) * w3[e]·x[r])`` for the rows r of segment e =
        ``[expert_offsets[e], expert_offsets[e+1])``, e < G = ``w1.shape[0]``; every other row is 0. The
        offsets stay on the device (no host sync on CUDA), so a caller can route over more buckets than
        it has weights — e.g. expert parallelism: the last bucket collects the choices of other ranks'
        experts and comes out as zeros.

        Example: offsets ``[0, 2, 2, 5]`` with G = 2 experts over M = 5 rows: rows 0-1 go through expert 0,
        expert 1 has none, rows 2-4 (the third bucket, beyond G) are 0.

        Parameters
        ----------
        permuted_x : [M, H], e.g. from :meth:`moe_permute`
        expert_offsets : int64 [≥ G+1], non-decreasing, within [0, M]
        w1, w3 : [G, I, H]; w2 : [G, H, I]
        out : optional [M, H]

        Returns
        -------
        [M, H], same dtype as permuted_x
        """
        op = "moe_expert_ffn"
        require_tensor(op, "permuted_x", permuted_x)
        require_tensor(op, "expert_offsets", expert_offsets)
        require_tensor(op, "w1", w1)
        if expert_offsets.dim() == 1 and w1.dim() == 3 and expert_offsets.shape[0] > w1.shape[0]:
            check_index_range(op, "expert_offsets", expert_offsets[: w1.shape[0] + 1], 0,
                              permuted_x.shape[0] + 1, "row bounds within [0, M]")
        if out is None:
            out = torch.empty_like(permuted_x)
        self._lib.moe_expert_ffn(out, permuted_x, expert_offsets, w1, w2, w3)
        return out
