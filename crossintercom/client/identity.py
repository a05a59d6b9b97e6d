"""Who a client registers as, and the attachments it sends."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypedDict, Unpack

from crossintercom import protocol as p
from crossintercom.config import Settings
from crossintercom.errors import Code, UsageError
from crossintercom.models import (
    CWD_CHARS,
    PRIORITIES,
    Attachment,
    Priority,
    durable_session_id,
    new_id,
    valid_name,
)


class Marks(TypedDict, total=False):
    """How a sender marks a message (docs/delivery.md#priority, #acknowledgement)."""

    priority: Priority
    ack_required: bool
    # Overdue this many seconds after sending; only with ``ack_required``.
    ack_within_s: float | None


def _ack_by(marks: Marks) -> str | None:
    within = marks.get("ack_within_s")
    if not marks.get("ack_required") or within is None:
        return None
    if within <= 0:
        raise UsageError("the acknowledgement deadline must be positive")
    try:
        when = datetime.now(UTC) + timedelta(seconds=within)
    except (OverflowError, ValueError):  # beyond the year 9999, infinite or NaN
        raise UsageError("the acknowledgement deadline is too far off") from None
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Identity(p.SessionBody, frozen=True, omit_defaults=True):
    """The session a client registers. ``named`` gives the durable mailbox `--as NAME` means."""

    @classmethod
    def named(
        cls, settings: Settings, name: str, session_id: str | None = None, **kw: Any
    ) -> Identity:
        if not valid_name(name):
            raise UsageError(
                f"invalid name {name!r}: use letters, digits, '.', '_' or '-', starting with a "
                "letter or digit, at most 64 characters"
            )
        sid = session_id or durable_session_id(settings.host_id, name)
        cwd = kw.pop("cwd", os.getcwd())
        # A directory deeper than the bound a `list` answer carries is not described at all.
        cwd = cwd if cwd is None or len(cwd) <= CWD_CHARS else None
        return cls(id=sid, name=name, durable=True, cwd=cwd, **kw)

    @classmethod
    def ephemeral(cls, **kw: Any) -> Identity:
        return cls(id=new_id(), **kw)


class AttachmentTooLarge(UsageError):
    """An attachment is over the message size limit; nothing was sent."""

    code = Code.TOO_LARGE


def file_text(data: bytes) -> str:
    """Bytes read from a file or standard input as text, as a text stream reads them: UTF-8
    (``UnicodeDecodeError`` otherwise), universal newlines."""
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


def load_attachment(path: str, max_bytes: int) -> Attachment:
    """A file attachment, refused clearly when it is too big, unreadable or not a regular file
    (a FIFO, a device or a socket could block the caller or never end); at most
    ``max_bytes + 1`` bytes are ever read."""
    fpath = Path(path)
    try:
        # Non-blocking open: a FIFO without a writer is refused below rather than waited on.
        fd = os.open(fpath, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise UsageError(f"attachment {path} is not a regular file; nothing was sent")
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise AttachmentTooLarge(
                f"attachment {path} is {max(info.st_size, len(data))} bytes; the message limit "
                f"is {max_bytes} bytes; nothing was sent"
            )
        content = file_text(data)
    except UnicodeDecodeError:
        raise UsageError(f"attachment {path} is not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"cannot read attachment {path}: {exc.strerror}") from None
    except ValueError:  # a NUL byte in the path
        raise UsageError("an attachment's path holds a NUL byte; nothing was sent") from None
    return Attachment("file", fpath.name, content)


def outgoing_body(
    to: str | None,
    text: str,
    attachments: Sequence[Attachment],
    reply_to: str | None,
    expects_reply: bool,
    message_id: str | None,
    *,
    subject: str | None = None,
    thread_id: str | None = None,
    **marks: Unpack[Marks],
) -> p.OutgoingBody:
    """What a sender puts on the wire; the broker adds sender, time and (for replies) the
    thread. The acknowledgement deadline is fixed here, so a retry repeats it."""
    priority = marks.get("priority", "normal")
    if priority not in PRIORITIES:
        raise UsageError(f"priority must be one of {', '.join(PRIORITIES)}, got {priority!r}")
    return p.OutgoingBody(
        id=message_id or new_id(),
        message=text,
        to=to,
        attachments=[p.AttachmentBody(a.kind, a.name, a.content, a.language) for a in attachments],
        reply_to=reply_to,
        expects_reply=expects_reply,
        subject=subject or None,
        thread_id=thread_id or None,
        priority=priority,
        ack_required=bool(marks.get("ack_required")),
        ack_by=_ack_by(marks),
    )
