"""The environment a number was measured in: the heart of draftboard's comparability.

- `fingerprint`: what a run's environment was (versions, device, dtype, git state, which linear-
  attention kernels really ran, a numerical probe of the hidden states) and how two differ, with
  severities;
- `linear_attn`: which implementation runs each Gated DeltaNet piece (fla / causal-conv1d kernels or
  the torch reference), how to ask for one, and the per-piece comparison across training, offline
  eval and serving (the engine's own GDN record is `evaluators.engines.gdn`'s, in these pieces' names).
"""
