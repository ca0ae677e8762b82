"""draftboard's tracker package: MLflow-backed runs, checkpoints and fingerprints.

`Tracker` is exported lazily (PEP 562) so that `tracker.fingerprint` and the CLI
do not pay for importing MLflow when they do not use the store.
"""

__all__ = ["Tracker"]


def __getattr__(name: str):
    if name == "Tracker":
        from tracker.store.tracker import Tracker

        return Tracker
    raise AttributeError(f"module 'tracker' has no attribute {name!r}")
