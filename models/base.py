"""Declarative base with a naming convention so Alembic names constraints the same way twice."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, cast

from sqlalchemy import JSON, DateTime, Enum, MetaData, Table, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JsonB = JSON().with_variant(JSONB(), "postgresql")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        dict[str, Any]: JsonB,
        list[Any]: JsonB,
        datetime: DateTime(timezone=True),
    }


def table_of(model: type[Base]) -> Table:
    """A mapped class's Table, typed as one (`__table__` is typed as any FromClause): for Core
    statements built once on the hot path."""
    return cast(Table, model.__table__)


def status_column(enum: type[StrEnum], name: str) -> Enum:
    """A VARCHAR with a CHECK constraint of the enum values (no native PG enum to migrate)."""
    return Enum(
        enum,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=32,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )


def created_at_column() -> Mapped[datetime]:
    return mapped_column(server_default=func.now())


def updated_at_column() -> Mapped[datetime]:
    return mapped_column(server_default=func.now(), onupdate=func.now())
