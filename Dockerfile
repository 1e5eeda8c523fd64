# The nightshift image, and the recipe a team extends with its own agents. Every role
# (migrate, worker, beat, the API, Flower) is this image with another command:
# docker-compose.yml.
#
# Your agents go in with nightshift, one of two ways; either way the package registers them
# by entry point (docs/agents.md) and every process of the image has them:
#   - a build argument: what `pip install` takes, from your package index or a git URL:
#       docker build --build-arg AGENTS="acme-agents==1.4.0" -t acme/nightshift .
#   - an image of your own on top of this one (a package from your own source tree):
#       FROM nightshift:latest
#       USER root
#       COPY acme_agents /src/acme_agents
#       RUN pip install --no-cache-dir /src/acme_agents
#       USER nightshift
# tests/integration/test_dockerfile.py runs the RUN lines below in a fresh virtual environment
# and a fresh user (there is no Docker engine in CI), with AGENTS naming examples/oncall_digest.
FROM python:3.11-slim
ARG AGENTS=""
WORKDIR /app
# git: the Patch agent clones, tests, commits and pushes in its worktrees.
RUN apt-get update && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md celeryconfig.py beat_schedule.py ./
COPY pipeline ./pipeline
COPY models ./models
# One pip run for nightshift and the team's agents, so their requirements are resolved together.
RUN pip install --no-cache-dir . $AGENTS
# The data directory (beat's schedule file, the workers' metrics, the session key) exists and
# belongs to the service user: a named volume mounted on it starts as a copy of it, owner
# included, instead of a root-owned directory the service cannot write.
RUN useradd --create-home nightshift \
    && install -d -o nightshift -g nightshift -m 0700 /home/nightshift/data
USER nightshift
ENV NIGHTSHIFT_DATA_DIR=/home/nightshift/data
