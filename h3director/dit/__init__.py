"""Exact activation techniques for H3's DiT, in plain torch (no framework imports).

The DiT runs 50 identical blocks over one packed sequence; a block's activations, not its weights, are
what a long render runs out of. This package holds the framework-neutral parts of fitting them:

- `tiers`: `DiTMemoryPlan` (which techniques run: lifetime frees, head groups, FFN row chunks, query
  chunks), its exactness class, and the escalation ladder from cheapest-to-run to smallest-peak;
- `ranges`: how rows and heads are split into chunks;
- `blocks`: the grouped attention and row-chunked FFN drivers the framework adapters call
  (`h3director.integrations.comfy_dit`, `h3director.integrations.diffusers_dit`);
- `thread_split`: where PyTorch's CPU elementwise kernels cut a tensor among threads, and which rows of a
  row chunk the SwiGLU must recompute to take the stock call's code path;
- `kernels`: the per-device A/B checks that make "exact where verified" a verified fact (`verify-kernels`),
  per device, library versions, thread count, dtype and row class;
- `capacity`: the check before each forward: will the chosen tier fit what the device can give?
- `block_swap`: weights rather than activations: N blocks kept in host RAM and copied in for their turn
  (exact by construction: only placement changes), driven by `integrations.comfy_blockswap` (the
  H3Director Block Swap node) and `integrations.diffusers_offload` (`apply_block_offload`).

Exactness classes (see shared design.md): *exact by construction* changes only lifetimes; *exact where
verified* regroups the same arithmetic (row chunks of a GEMM, head groups of attention) and is
bit-identical only where the kernel is batch-invariant, which `kernels` checks per device.
"""

__all__: list[str] = []
