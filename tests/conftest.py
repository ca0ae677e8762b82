"""Shared fixtures: one real MLflow sqlite store for the whole session.

Creating an MLflow sqlite store runs its migrations (1-2 s), so the tests share one;
each test makes its own runs, so sharing cannot leak results between tests.
"""

import os

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # tests must not reach the network


@pytest.fixture(scope="session")
def store_uri(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'draftboard.db'}"


@pytest.fixture(scope="session")
def tracker(store_uri):
    from tracker import Tracker

    return Tracker(store_uri)


@pytest.fixture(scope="session")
def machine_fp() -> dict:
    """This machine's fingerprint, captured once (the first capture imports the modeling code)."""
    from tracker import fingerprint as fp_module

    return fp_module.capture(device="cpu", dtype="fp32")
