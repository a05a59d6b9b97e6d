"""The Python API: ``AsyncClient`` for asyncio services, ``Client`` for scripts."""

from crossintercom.client.acks import acknowledge, awaiting_mine, sent_awaiting, synced_inbox
from crossintercom.client.aftercare import forget, report_shown, set_wake, shown_frame
from crossintercom.client.aio import MAX_ASK_TIMEOUT_S, AsyncClient
from crossintercom.client.deadletters import dead_letter_json, dead_letters, resend
from crossintercom.client.identity import (
    AttachmentTooLarge,
    Identity,
    Marks,
    file_text,
    load_attachment,
)
from crossintercom.client.inbound import inbound_json, inbound_policy
from crossintercom.client.reservations import (
    project_key,
    repo_paths,
    reservation_json,
    reservation_line,
    reservations,
    reserve,
    unreserve,
)
from crossintercom.client.retries import OPERATION_DEADLINE_S, RECONNECT_WAITS_S, RETRY_WAITS_S
from crossintercom.client.saving import Incoming
from crossintercom.client.sync import Client, wait_until

__all__ = [
    "MAX_ASK_TIMEOUT_S",
    "OPERATION_DEADLINE_S",
    "RECONNECT_WAITS_S",
    "RETRY_WAITS_S",
    "AsyncClient",
    "AttachmentTooLarge",
    "Client",
    "Identity",
    "Incoming",
    "Marks",
    "acknowledge",
    "awaiting_mine",
    "dead_letter_json",
    "dead_letters",
    "file_text",
    "forget",
    "inbound_json",
    "inbound_policy",
    "load_attachment",
    "project_key",
    "repo_paths",
    "report_shown",
    "resend",
    "reservation_json",
    "reservation_line",
    "reservations",
    "reserve",
    "sent_awaiting",
    "set_wake",
    "shown_frame",
    "synced_inbox",
    "unreserve",
    "wait_until",
]
