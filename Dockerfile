# The nightshift image used by docker-compose.yml: one install, every role picks its command.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md celeryconfig.py beat_schedule.py ./
COPY pipeline ./pipeline
COPY models ./models
# git: the Patch agent clones, tests, commits and pushes in its worktrees.
RUN apt-get update && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir . && useradd --create-home nightshift
USER nightshift
ENV NIGHTSHIFT_DATA_DIR=/home/nightshift/data
