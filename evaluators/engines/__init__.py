"""Serving engines as evaluators: one client per engine behind one interface (`base.EngineClient`),
as vLLM's `spec_decode/` has one proposer per method.

- `base`: what every engine reports (`EngineInfo`, `EngineReply`), HTTP and Prometheus parsing.
- `vllm`, `sglang`: the two clients, each reading its engine's own response fields.
- `server`: a managed engine server (started from its own Python, stopped on every exit path).
- `run`: `draftboard eval --engine`: the offline eval's prompts and protocol, measured by an engine.

What engines name their counters and log lines is `tracker.measurement.engine_metrics`'s; the gap between an
engine eval and an offline one is `tracker.measurement.reconcile`'s (the dashboard draws it too).
"""
