"""`tracker.fingerprint`, a fixed name of the Python API (docs/DESIGN.md): the environment room's
`tracker.environment.fingerprint` itself, under its published name (the same module object, so a
caller patching one patches the other)."""

import sys

from tracker.environment import fingerprint

sys.modules[__name__] = fingerprint
