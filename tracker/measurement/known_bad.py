"""The known-bad table: serving-engine versions and settings that make a served number wrong, as data
(`known_bad.json` beside this module, one row per finding with its source: adding one is one edit), and the one
matcher every reader uses: doctor's serving checks, an engine eval's own record (results `engine.known_bad`, the
tag `draftboard.known_bad`, shown on Runs and Run detail), the served-number importers.

A row matches a serving record (`Serving`: the engine, its version, its settings) when its engine is the record's,
its version range holds and every `when` field holds. A field the record does not know (None) leaves the row
undecided: it is said at the row's `unknown` severity (or not at all where that is null), naming the fields to state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracker.errors import DraftboardError
from tracker.untrusted.digits import MAX_DIGITS, whole_number

DATA = Path(__file__).with_name("known_bad.json")
MATCH, UNDECIDED = "match", "undecided"
SEVERITIES = ("critical", "warning", "info")


@dataclass(frozen=True)
class Row:
    id: str
    check: str  # the doctor check it belongs to
    engine: str
    severity: str
    unknown: str | None
    effect: str
    source: str
    fix: str
    when: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)  # {from, below, exact}: releases; {}: every version

    @property
    def text(self) -> str:
        return f"{self.effect} ({self.source})"


@dataclass(frozen=True)
class Serving:
    """What is known of a serving box: None where a field is not known."""

    engine: str
    version: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)  # model_runner, prefix_cache, hybrid, family, ...


@dataclass(frozen=True)
class Finding:
    row: Row
    state: str  # MATCH | UNDECIDED
    missing: tuple[str, ...] = ()  # UNDECIDED: the fields the record does not know


def release(version: str) -> tuple[int, ...] | None:
    """`0.27.1rc2.dev3+cu128` -> (0, 27, 1); None for a version that is not one."""
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = ""
        for ch in piece[:MAX_DIGITS + 1]:
            if not "0" <= ch <= "9":  # ASCII: `²` passes str.isdigit, and int() refuses it
                break
            digits += ch
        number = whole_number(digits)
        if number is None:  # none, or more digits than any release has: not a version
            break
        parts.append(number)
    return tuple(parts) if len(parts) >= 2 else None


def _rows() -> tuple[Row, ...]:
    try:
        raw = json.loads(DATA.read_text())["rows"]
        rows = tuple(Row(**row) for row in raw)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DraftboardError(f"{DATA}: not a known-bad table ({exc})") from None
    for row in rows:
        if row.severity not in SEVERITIES[:2] or row.unknown not in (*SEVERITIES, None) or not set(row.versions) <= {
                "from", "below", "exact"} or any(release(v) is None for v in row.versions.values()):
            raise DraftboardError(f"{DATA}: row {row.id!r} is malformed")
    return rows


ROWS = _rows()
ROW_BY_ID = {row.id: row for row in ROWS}


def _holds(wanted: Any, value: Any) -> bool:
    if isinstance(wanted, list):
        return value in wanted
    if isinstance(wanted, dict) and "prefix" in wanted:
        return isinstance(value, str) and value.lower().startswith(tuple(wanted["prefix"]))
    if isinstance(wanted, dict) and "min" in wanted:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= wanted["min"]
    return value == wanted


def _version_holds(row: Row, version: tuple[int, ...]) -> bool:
    width = max(3, len(version))

    def pad(v: str) -> tuple[int, ...]:
        r = release(v) or ()
        return r + (0,) * (width - len(r))

    mine = version + (0,) * (width - len(version))
    v = row.versions
    return (("exact" not in v or mine == pad(v["exact"])) and ("from" not in v or mine >= pad(v["from"]))
            and ("below" not in v or mine < pad(v["below"])))


def evaluate(serving: Serving, rows: tuple[Row, ...] = ROWS) -> list[Finding]:
    """The rows that match the record, and those it cannot decide (a field not known), in the table's order."""
    out = []
    for row in rows:
        if row.engine != serving.engine:
            continue
        missing, fails = [], False
        if row.versions:
            parsed = release(serving.version) if serving.version else None
            if parsed is None:
                missing.append("version")
            elif not _version_holds(row, parsed):
                fails = True
        for key, wanted in row.when.items():
            value = serving.settings.get(key)
            if value is None:
                missing.append(key)
            elif not _holds(wanted, value):
                fails = True
        if fails:
            continue
        out.append(Finding(row, UNDECIDED if missing else MATCH, tuple(missing)))
    return out


def matches(serving: Serving) -> list[Row]:
    """The rows that hold for the record."""
    return [f.row for f in evaluate(serving) if f.state == MATCH]


def tag_text(rows: list[Row]) -> str:
    """The `draftboard.known_bad` tag: each matching row's id, effect and source."""
    return "; ".join(f"{row.id}: {row.text}" for row in rows)
