"""schemathesis hooks for .ci/contract: how to generate the two string formats of the API's
requests.

- `date-time`: a run's deadline given as a date-time must lie ahead, at most 366 days (JSON
  Schema has no "after now"; pipeline/api/spec.py says so in words), so the ones generated here
  do. A deadline is the only date-time a request of this API takes.
- `event-id`: see below.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import schemathesis
from hypothesis import strategies as st


def _from_now(seconds: int) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


# From ten minutes ahead (a request is sent well within that) to 300 days.
schemathesis.openapi.format("date-time", st.integers(600, 300 * 86400).map(_from_now))

# Event ids (`<xid>-<id>`, format "event-id"): schemathesis' coverage phase generates a header
# from its pattern only with letters and digits, never the dash, unless a format says how.
schemathesis.openapi.format("event-id", st.from_regex(r"[0-9]{1,20}-[0-9]{1,19}", fullmatch=True))
