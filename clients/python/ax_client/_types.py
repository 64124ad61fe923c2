"""The values ax sends, as Python sees them (docs/protocol.md lists every field)."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

#: States after which nothing more happens to an instance (until a manual re-run).
FINAL_STATES = frozenset({"success", "failed", "cancelled"})


class AxError(Exception):
    """Something ax or NATS did not do; the message says what and why."""


class CommandRefused(AxError):
    """A command ax answered with ``ok: false``: nothing was changed.

    ``errors`` holds one reason per problem, each naming its place; ``denied`` is true when the
    caller's token (or its absence) was the reason.
    """

    def __init__(self, command: str, errors: List[str], denied: bool = False) -> None:
        super().__init__(f"{command} refused: {'; '.join(errors) or 'no reason given'}")
        self.command = command
        self.errors = errors
        self.denied = denied


class ReportRefused(CommandRefused):
    """A report ax would not take: an unknown trace id, or one whose attempt ended before it
    (a timeout, a cancellation, a worker lost) — nothing was changed."""


def parse_time(text: Optional[str]) -> Optional[_dt.datetime]:
    """An RFC 3339 instant as ax writes it (``2026-12-01T14:03:05.000Z``), timezone-aware."""
    if not text:
        return None
    return _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def format_time(at: _dt.datetime) -> str:
    """``at`` as ax reads it: RFC 3339 in UTC with milliseconds (naive means UTC)."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=_dt.timezone.utc)
    at = at.astimezone(_dt.timezone.utc)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


@dataclass(frozen=True)
class Reply:
    """The answer to a command."""

    ok: bool
    errors: List[str]
    message: str
    instance_id: Optional[str]
    changes: List[Dict[str, str]]
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> "Reply":
        return cls(
            ok=bool(raw.get("ok")),
            errors=list(raw.get("errors") or []),
            message=raw.get("message") or "",
            instance_id=raw.get("instance_id") or None,
            changes=list(raw.get("changes") or []),
            raw=raw,
        )


@dataclass(frozen=True)
class Instance:
    """One instance record, as the ``ax_instances`` bucket holds it under its id."""

    instance_id: str
    job: str
    biz_date: str
    state: str
    tag: str
    attempt: int
    trace_id: str
    expected_time: Optional[_dt.datetime]
    created_at: Optional[_dt.datetime]
    started_at: Optional[_dt.datetime]
    finished_at: Optional[_dt.datetime]
    message: str
    output: Any
    revision: int
    raw: Mapping[str, Any] = field(repr=False)

    @property
    def is_final(self) -> bool:
        """Nothing more happens to it (success, failed or cancelled)."""
        return self.state in FINAL_STATES

    @classmethod
    def of(cls, raw: Mapping[str, Any], revision: int = 0) -> "Instance":
        return cls(
            instance_id=raw.get("instance_id", ""),
            job=raw.get("job", ""),
            biz_date=raw.get("biz_date", ""),
            state=raw.get("state", ""),
            tag=raw.get("tag", ""),
            attempt=int(raw.get("attempt") or 0),
            trace_id=raw.get("trace_id", ""),
            expected_time=parse_time(raw.get("expected_time")),
            created_at=parse_time(raw.get("created_at")),
            started_at=parse_time(raw.get("started_at")),
            finished_at=parse_time(raw.get("finished_at")),
            message=raw.get("message") or "",
            output=raw.get("output"),
            revision=revision,
            raw=raw,
        )


@dataclass(frozen=True)
class Result:
    """One finished attempt, from ``ax.result.<job>``."""

    instance_id: str
    trace_id: str
    job: str
    biz_date: str
    attempt: int
    state: str
    tag: str
    message: str
    output: Any
    worker: Optional[str]
    expected_time: Optional[_dt.datetime]
    started_at: Optional[_dt.datetime]
    finished_at: Optional[_dt.datetime]
    duration_ms: Optional[int]
    exit_code: Optional[int]
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> "Result":
        return cls(
            instance_id=raw.get("instance_id", ""),
            trace_id=raw.get("trace_id", ""),
            job=raw.get("job", ""),
            biz_date=raw.get("biz_date", ""),
            attempt=int(raw.get("attempt") or 0),
            state=raw.get("state", ""),
            tag=raw.get("tag", ""),
            message=raw.get("message") or "",
            output=raw.get("output"),
            worker=raw.get("worker") or None,
            expected_time=parse_time(raw.get("expected_time")),
            started_at=parse_time(raw.get("started_at")),
            finished_at=parse_time(raw.get("finished_at")),
            duration_ms=raw.get("duration_ms"),
            exit_code=raw.get("exit_code"),
            raw=raw,
        )


@dataclass(frozen=True)
class Log:
    """An attempt's stdout and stderr as its worker shipped them (``ax.log.<instance>.<attempt>``,
    docs/protocol.md): the pieces in the order they were written."""

    instance_id: str
    attempt: int
    #: ``(stream, data)``: ``stdout``, ``stderr`` or ``note`` (ax's own: what a cap left out).
    pieces: List[Tuple[str, bytes]]
    #: Whether the last chunk arrived (the attempt ended and everything it wrote is here).
    complete: bool
    #: Bytes left out of a log past its cap.
    left_out: int

    def text(self, stream: str) -> str:
        """One stream's bytes, decoded (undecodable bytes replaced)."""
        return b"".join(data for s, data in self.pieces if s == stream).decode("utf-8", "replace")

    @property
    def stdout(self) -> str:
        return self.text("stdout")

    @property
    def stderr(self) -> str:
        return self.text("stderr")
