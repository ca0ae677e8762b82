"""z-lab's own code as the tests run it: `dflash==0.1.0` from the package registry, whose
`dflash/model.py` is z-lab/dflash @ 07ebd93's (the copy in the code index, read_file id 58210760216,
is the same code), installed by scripts/test.sh with --no-deps into its own folder
(DRAFTBOARD_ZLAB_SITE). Its code is not part of this repository."""

import importlib
import os
import sys
import time

import pytest


def zlab_model():
    """z-lab's dflash.model module, or a skip (a failure where scripts/test.sh installed it). Its
    timer synchronises CUDA; on these CPUs it is plain wall-clock time."""
    site = os.environ.get("DRAFTBOARD_ZLAB_SITE")
    if not site:
        if os.environ.get("DRAFTBOARD_REQUIRE_ZLAB"):
            pytest.fail("DRAFTBOARD_ZLAB_SITE is not set: scripts/test.sh installs dflash==0.1.0 there")
        pytest.skip("z-lab's dflash package is not installed (scripts/test.sh installs it)")
    if site not in sys.path:
        sys.path.insert(0, site)
    module = importlib.import_module("dflash.model")
    module._cuda_time = time.perf_counter
    return module
