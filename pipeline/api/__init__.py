"""The HTTP edge: JSON API, signed webhooks, the status page."""
