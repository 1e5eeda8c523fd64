"""The Celery application. Configuration lives in the top-level `celeryconfig` module."""

from __future__ import annotations

from celery import Celery

app = Celery("nightshift")
app.config_from_object("celeryconfig")
app.conf.imports = ("pipeline.tasks",)
