"""What `draftboard doctor` says: one `Check` per thing it looked at, and the report they make.

Severities are the environment diff's (`critical`, `warning`, `info`) plus `ok`: a check that
looked and found nothing wrong says so, with what it saw, so a report is a record of what was
checked and not only of what failed. Any critical check makes the report critical (exit 1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

OK, INFO, WARNING, CRITICAL = "ok", "info", "warning", "critical"
SEVERITIES = (CRITICAL, WARNING, INFO, OK)  # most severe first


@dataclass(frozen=True)
class Check:
    name: str  # stable identifier (DESIGN.md: the layer-mapping check is `layer_offset`)
    severity: str  # SEVERITIES
    verdict: str  # one line: what is the case
    evidence: str  # what was measured or read that says so
    fix: str = ""  # what to do about it (empty when there is nothing to do)

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}; expected one of {', '.join(SEVERITIES)}")


@dataclass(frozen=True)
class Report:
    checks: list[Check]

    @property
    def critical(self) -> bool:
        return any(c.severity == CRITICAL for c in self.checks)

    def ordered(self) -> list[Check]:
        return sorted(self.checks, key=lambda c: SEVERITIES.index(c.severity))

    def to_dict(self) -> dict:
        """`draftboard doctor --json` (DESIGN.md, fixed keys)."""
        return {"checks": [asdict(c) for c in self.ordered()], "critical": self.critical}
