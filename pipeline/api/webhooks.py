"""The inbound side of signed webhooks (the scheme: pipeline/delivery/signatures.py): a
signature binds the request to its action or event source, so the same headers sent to another
path do not match, and each signature is accepted once with each credential
(pipeline.api.replays); a sender that retries signs the retry anew.
"""

from __future__ import annotations

import hashlib

from pipeline.api.tokens import Authenticated


def replay_key(digest: str, credential: str | None) -> str:
    """What the replay cache remembers: the signature, with the bearer credential it came with.

    Two approvers whose identical decisions are signed in the same second are not a replay of
    each other; a captured request sent again, credential and all, is. (Pairing a captured
    signature with one's own token gains nothing: that token decides on the status page too.)
    """
    if credential is None:
        return digest
    return hashlib.sha256(f"{digest}\n{credential}".encode("utf-8", "replace")).hexdigest()


def credential_of(who: Authenticated) -> str:
    """The credential as authenticated, not as spelled: `bearer X`, `BEARER X` and a doubled
    space are one token, so the same signed request sent with each is a replay."""
    if who.token_id is not None:
        return f"token {who.token_id}"
    return f"{who.actor.via}: {who.actor.identity}"
