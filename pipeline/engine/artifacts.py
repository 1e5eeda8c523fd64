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


def write_file(root: Path, run_id: uuid.UUID, name: str, content: str) -> dict[str, Any]:
    """Write content-addressed, atomically: a rerun after a crash writes the same file."""
    data = content.encode()
    digest = hashlib.sha256(data).hexdigest()
    folder = root / str(run_id)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{_UNSAFE.sub('_', name)[:80]}-{digest[:16]}.txt"
    if not path.exists():
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_bytes(data)
        partial.replace(path)
    return {"name": name, "path": str(path), "sha256": digest, "size": len(data)}


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
