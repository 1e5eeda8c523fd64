"""artifacts in PostgreSQL: each row keeps its content, so every host reads it; the files
under the data dir move in

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-02 07:00:00.000000

The files are read from the artifact directory of the data dir this process's settings name
(NIGHTSHIFT_DATA_DIR): <data dir>/artifacts/<run id>/<file name>. A file that is not there, or
whose content no longer matches its hash, is reported (a warning listing it) and its row says
so in `missing`; the upgrade goes on. The files themselves are left in place for the operator
to remove. The downgrade writes the contents back out as files.
"""

import hashlib
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path, PurePath

import sqlalchemy as sa
from alembic import op

revision: str = '0026'
down_revision: str | None = '0025'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger("nightshift.migrate")
NOT_FOUND = "its file was not in the data dir when artifacts moved into PostgreSQL (0026)"
CHANGED = "its file no longer matched its hash when artifacts moved into PostgreSQL (0026)"


def _artifact_dir() -> Path:
    from pipeline.settings import get_settings  # noqa: PLC0415 (a migration's own settings)

    return get_settings().data_dir / "artifacts"


def upgrade() -> None:
    op.add_column('artifacts', sa.Column('content', sa.LargeBinary(), nullable=True))
    op.add_column('artifacts', sa.Column('missing', sa.String(length=300), nullable=True))
    bind = op.get_bind()
    root = _artifact_dir()
    rows = bind.execute(sa.text(
        "SELECT id, run_id, path, sha256 FROM artifacts WHERE deleted_at IS NULL ORDER BY id"
    )).all()  # fmt: skip
    moved, missing = 0, []
    for artifact_id, run_id, path, sha256 in rows:
        file = root / str(run_id) / PurePath(path).name
        content, why = _read(file, sha256)
        bind.execute(
            sa.text("UPDATE artifacts SET content = :content, missing = :why WHERE id = :id"),
            {"content": content, "why": why, "id": artifact_id},
        )
        if why is None:
            moved += 1
        else:
            missing.append(f"{file} ({why.split(' when ')[0]})")
    op.drop_column('artifacts', 'path')
    if rows:
        log.warning("moved %d artifact file(s) from %s into PostgreSQL; the files can go",
                    moved, root)  # fmt: skip
    if missing:
        log.warning("%d artifact file(s) missing, their rows say so: %s",
                    len(missing), "; ".join(missing))  # fmt: skip


def _read(file: Path, sha256: str) -> tuple[bytes | None, str | None]:
    try:
        content = file.read_bytes()
    except OSError:
        return None, NOT_FOUND
    if hashlib.sha256(content).hexdigest() != sha256:
        return None, CHANGED
    return content, None


def downgrade() -> None:
    op.add_column('artifacts', sa.Column('path', sa.String(length=1000), nullable=True))
    bind = op.get_bind()
    root = _artifact_dir()
    ids = bind.execute(sa.text("SELECT id FROM artifacts ORDER BY id")).scalars().all()
    for artifact_id in ids:
        run_id, name, sha256, content = bind.execute(
            sa.text("SELECT run_id, name, sha256, content FROM artifacts WHERE id = :id"),
            {"id": artifact_id},
        ).one()
        file = _file_for(root, run_id, name, sha256)
        if content is not None:
            _write_private(file, content)
        bind.execute(
            sa.text("UPDATE artifacts SET path = :path WHERE id = :id"),
            {"path": str(file), "id": artifact_id},
        )
    op.alter_column('artifacts', 'path', nullable=False)
    op.drop_column('artifacts', 'missing')
    op.drop_column('artifacts', 'content')


def _file_for(root: Path, run_id: object, name: str, sha256: str) -> Path:
    """Where the release before 0026 wrote it (pipeline/engine/artifacts.py then)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:80]
    return root / str(run_id) / f"{safe}-{sha256[:16]}.txt"


def _write_private(file: Path, content: bytes) -> None:
    file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
