"""nightshift: durable AI-agent runs on Celery.

`celery -A pipeline worker` finds the Celery app here.
"""

from pipeline.app import app

__all__ = ["app"]
