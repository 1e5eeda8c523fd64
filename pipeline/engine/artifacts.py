"""Large outputs as files, referred to by path and content hash."""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from models import Artifact

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600


def write_file(root: Path, run_id: uuid.UUID, name: str, content: str) -> dict[str, Any]:
    """Write content-addressed, atomically: a rerun after a crash writes the same file.

    Tool outputs may hold customers' data: only this user may read them (0700 folders, 0600
    files), whatever the umask.
    """
    data = content.encode()
    digest = hashlib.sha256(data).hexdigest()
    folder = _private_dir(_private_dir(root) / str(run_id))
    path = folder / f"{_UNSAFE.sub('_', name)[:80]}-{digest[:16]}.txt"
    if not path.exists():
        partial = path.with_suffix(f".{os.getpid()}.partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        partial.replace(path)
    return {"name": name, "path": str(path), "sha256": digest, "size": len(data)}


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o777 != PRIVATE_DIR:
        path.chmod(PRIVATE_DIR)  # made before this rule, or by a mkdir with the umask's mode
    return path


def record_txn(session: Session, run_id: uuid.UUID, ref: dict[str, Any], media_type: str) -> None:
    session.execute(
        insert(Artifact).values(
            run_id=run_id,
            name=ref["name"],
            path=ref["path"],
            sha256=ref["sha256"],
            size=ref["size"],
            media_type=media_type,
        )
    )


def preview(content: str, ref: dict[str, Any], limit: int = 400) -> str:
    """What the model sees instead of a large output."""
    head = content[:limit]
    return (
        f"[stored as artifact {ref['path']} ({ref['size']} bytes, sha256 {ref['sha256'][:16]}); "
        f"first {len(head)} characters follow]\n{head}"
    )
