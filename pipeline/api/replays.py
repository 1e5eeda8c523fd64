"""The webhook replay cache: a signature is accepted once inside its timestamp window.

In PostgreSQL rather than process memory, so every API process behind a load balancer refuses
a replay that another one accepted, and a restart forgets nothing.
"""

from __future__ import annotations

from sqlalchemy import delete, func
from sqlalchemy.dialects.postgresql import insert

from models import WebhookDelivery
from pipeline.db import transaction


def first_delivery(signature: str, tolerance_seconds: float) -> bool:
    """Record the signature; False if it was received before (a replay).

    A signature's timestamp is accepted from `tolerance` before it to `tolerance` after it,
    so a record older than twice the tolerance can no longer match an acceptable request.
    """
    with transaction() as session:
        session.execute(
            delete(WebhookDelivery).where(
                WebhookDelivery.received_at
                < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, 2 * tolerance_seconds)
            )
        )
        recorded = session.execute(
            insert(WebhookDelivery)
            .values(signature=signature)
            .on_conflict_do_nothing(index_elements=["signature"])
            .returning(WebhookDelivery.signature)
        ).scalar_one_or_none()
    return recorded is not None
