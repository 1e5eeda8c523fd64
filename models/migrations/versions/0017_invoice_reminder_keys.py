"""invoice reminders keyed per client and ISO week: sent reminders take the new key

The reminder's key was `invoice_reminders:<invoice>:<iso week>`; it is now
`invoice-reminder:<client>:<iso week>`, one reminder per client and week. So that an upgrade in
the middle of a week reminds no one twice, each client's confirmed reminder of a week (the
first sent) takes the new key, which the new code then finds. A client whose reminders of the
week are all still open (sent or about to be, outcome unknown) has its first open one take the
new key too: a rerun of the week then waits for it to be settled (a key conflict) instead of
sending another. Its audit trail and the runs waiting on it follow the key, and an audit entry
says under which key the email API saw it (what a person checks before deciding). The client
of an invoice comes from the list the same run fetched (its journaled list_overdue_invoices
result). A week whose list was compacted away (older than the retention window) is over and
keeps its old keys.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01 22:40:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = '0017'
down_revision: str | None = '0016'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_PREFIX = 'invoice_reminders:'
NEW_PREFIX = 'invoice-reminder:'

_LISTED = """
    SELECT DISTINCT j.run_id, item->>'invoice' AS invoice, item->>'client' AS client
      FROM journal j,
           jsonb_array_elements((j.payload->>'content')::jsonb->'invoices') AS item
     WHERE j.step_name = 'list_overdue_invoices'
       AND j.key LIKE 'tool:%'
       AND NOT j.compacted
       AND coalesce(j.payload->>'is_error', 'false') = 'false'
       AND j.payload->>'content' LIKE '{%'
"""


def _rekey(states: str, audit_note: str | None) -> str:
    """Give each client and week with no reminder under the new key its first reminder in one
    of `states` (an SQL list): the new key, its audit trail and the waits on it (its own run's,
    another run's key conflict); and, with `audit_note`, an audit entry saying so."""
    noted = "" if audit_note is None else f"""
, noted AS (
    INSERT INTO action_audit (action_key, run_id, event, by, via, note)
    SELECT new_key, run_id, 'rekeyed', 'migration 0017', 'alembic', {audit_note}
      FROM renamed
)"""
    return f"""
WITH listed AS ({_LISTED}), chosen AS (
    SELECT DISTINCT ON (l.client, split_part(a.idempotency_key, ':', 3))
           a.id, a.run_id, a.idempotency_key AS old_key,
           '{NEW_PREFIX}' || l.client || ':' || split_part(a.idempotency_key, ':', 3) AS new_key
      FROM actions a
      JOIN listed l ON l.run_id = a.run_id AND l.invoice = a.args->>'invoice'
     WHERE a.idempotency_key LIKE '{OLD_PREFIX}%'
       AND a.tool = 'send_invoice_reminder'
       AND a.state IN ({states})
     ORDER BY l.client, split_part(a.idempotency_key, ':', 3), a.first_attempt_at, a.id
), renamed AS (
    UPDATE actions SET idempotency_key = chosen.new_key, updated_at = now()
      FROM chosen
     WHERE actions.id = chosen.id
       AND NOT EXISTS (SELECT 1 FROM actions taken WHERE taken.idempotency_key = chosen.new_key)
    RETURNING chosen.old_key, chosen.new_key, chosen.run_id
), audited AS (
    UPDATE action_audit SET action_key = renamed.new_key
      FROM renamed WHERE action_audit.action_key = renamed.old_key
){noted}
UPDATE runs SET waiting_on = split_part(runs.waiting_on, ':', 1) || ':' || renamed.new_key
  FROM renamed
 WHERE runs.status IN ('waiting', 'needs_attention')
   AND substr(runs.waiting_on, strpos(runs.waiting_on, ':') + 1) = renamed.old_key
"""


_CONFIRMED = "'confirmed'"
_OPEN = "'pending_approval', 'intended', 'attempted', 'outcome_unknown'"
_SAW = (
    "'outcome still open at the upgrade: the email API saw this reminder under key ' || "
    "old_key || '; look it up there before deciding'"
)

# Only a reminder this migration re-keyed still has its invoice in its arguments (its audit
# rows and the runs waiting on it keep the client's key).
_DOWNGRADE = f"""
UPDATE actions
   SET idempotency_key = '{OLD_PREFIX}' || (args->>'invoice') || ':'
                         || split_part(idempotency_key, ':', 3),
       updated_at = now()
 WHERE idempotency_key LIKE '{NEW_PREFIX}%' AND tool = 'send_invoice_reminder'
   AND args ? 'invoice'
"""


def upgrade() -> None:
    op.execute(_rekey(_CONFIRMED, None))
    op.execute(_rekey(_OPEN, _SAW))  # only where no confirmed reminder took the key


def downgrade() -> None:
    op.execute(_DOWNGRADE)
