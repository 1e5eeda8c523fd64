"""Processes nightshift starts on this machine: real Celery worker and beat processes
(celery_process), and the demo that runs them (demo)."""
