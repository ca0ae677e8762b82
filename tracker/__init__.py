"""draftboard's tracker package: MLflow-backed runs, checkpoints and fingerprints.

`Tracker` and `attach_fingerprint` (a fingerprint for `mlflow.active_run()`, for runs another
tool started) are exported lazily (PEP 562) so that `tracker.environment.fingerprint` and the CLI do not pay
for importing MLflow when they do not use the store.
"""

__all__ = ["Tracker", "attach_fingerprint"]


def __getattr__(name: str):
    if name in __all__:
        from tracker.store import tracker

        return getattr(tracker, name)
    raise AttributeError(f"module 'tracker' has no attribute {name!r}")
