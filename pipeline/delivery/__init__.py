"""Delivery: sending what nightshift owes a receiver over HTTP, the completion webhooks and the
alerts' webhooks (owed by pipeline/runs/notifications.py, in the transaction of what they
announce), through the action protocol's states: `sender` one attempt at one notification,
`receivers` a worker's senders and each receiver's backoff, `signatures` the HMAC scheme of
webhooks both ways."""
