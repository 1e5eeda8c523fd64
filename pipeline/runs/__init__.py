"""The record's operations: start, fan-out, waits, cancellation, decisions, events, the tick,
schedules, retention (redaction, then deletion), expiry."""
