"""Run a command against a scratch database: the one NIGHTSHIFT_DATABASE_URL names is created
new and migrated (pipeline.migrate.fresh_database, the tests' and benchmarks' helper), and
dropped with its sessions when the command ends, however it ends.

Usage: python .ci/scratch_database.py COMMAND [ARG...]; exits with the command's status.
"""

from __future__ import annotations

import os
import subprocess
import sys

from pipeline.migrate import fresh_database, upgrade


def main(command: list[str]) -> int:
    url = os.environ["NIGHTSHIFT_DATABASE_URL"]
    with fresh_database(url):
        upgrade(url)
        return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
