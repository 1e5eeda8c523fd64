"""The durable record: SQLAlchemy 2 typed ORM for every table nightshift keeps."""

from models.action import Action, ActionAudit
from models.alert import Alert
from models.api_token import ApiToken
from models.artifact import Artifact, artifact_url
from models.base import Base, table_of
from models.batch import Batch
from models.beat_schedules import BeatSchedules
from models.bulk_operation import BulkItem, BulkKind, BulkOperation
from models.external_event import ExternalEvent
from models.journal import JournalEntry
from models.model_outage import ModelOutage
from models.resumption import ResumeCause, Resumption
from models.run import Run, tokens_used
from models.run_event import RunEvent
from models.schedule_fire import ScheduleFire
from models.status import ActionKind, ActionState, BatchStatus, FireDecision, RunStatus
from models.status_page_session import StatusPageSession
from models.webhook_delivery import WebhookDelivery
from models.worker_heartbeat import WorkerHeartbeat

__all__ = [
    "Action",
    "ActionAudit",
    "ActionKind",
    "ActionState",
    "Alert",
    "ApiToken",
    "Artifact",
    "Base",
    "Batch",
    "BatchStatus",
    "BeatSchedules",
    "BulkItem",
    "BulkKind",
    "BulkOperation",
    "ExternalEvent",
    "FireDecision",
    "JournalEntry",
    "ModelOutage",
    "ResumeCause",
    "Resumption",
    "Run",
    "RunEvent",
    "RunStatus",
    "ScheduleFire",
    "StatusPageSession",
    "WebhookDelivery",
    "WorkerHeartbeat",
    "artifact_url",
    "table_of",
    "tokens_used",
]
