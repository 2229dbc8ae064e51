"""The ``telegram`` source: Bot API updates delivered by ``setWebhook``.

Telegram authenticates a delivery only by echoing the ``secret_token`` given to
``setWebhook`` in ``X-Telegram-Bot-Api-Secret-Token``; there is no signature and
no timestamp, so redeliveries are recognised by ``update_id`` alone. ``parse`` makes one
job per message, edit, button press or membership change; storing one sets or clears the
chat's blocked mark (a trigger on jobs, ``autom_telegram_chat_seen``). Channel posts and
the rest are stored as events without jobs. A callback's recipient is ``<chat>:cb``: a
line of its own beside the chat's, so a button is answered without waiting for the chat's slow jobs.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from autom.errors import VerificationError
from autom.jobs.models import NewJob
from autom.sources.base import (
    Headers,
    Parsed,
    ParseError,
    id_field,
    load_object,
    object_or_none,
    required_header,
    single_token,
)

SECRET_HEADER = "x-telegram-bot-api-secret-token"  # noqa: S105 - a header name

# Telegram ids fit in a signed 64-bit integer (the Bot API promises at most 52 significant bits)
_INT64 = range(-(2**63), 2**63)

#: what a callback's recipient adds to its chat's id: the chat's button presses have a line of their own
CALLBACK_LINE = ":cb"


class TelegramSource:
    """Verifies the secret token, dedups by ``update_id``, turns messages into ``telegram.message``."""

    name = "telegram"
    secret_headers = frozenset({SECRET_HEADER})

    def __init__(self, secret: str) -> None:
        """``secret`` is TELEGRAM_WEBHOOK_SECRET, the ``secret_token`` given to ``setWebhook``."""
        # Digests, as for the admin token: compare_digest is constant-time only for inputs
        # of equal length, so comparing the raw secret would let timing reveal its length.
        self._digest = hashlib.sha256(secret.encode("utf-8")).digest()

    def _matches(self, token: str) -> bool:
        return hmac.compare_digest(hashlib.sha256(token.encode("ascii")).digest(), self._digest)

    #: Telegram retries in order per chat: a refusal stalls the chat, so it is never shed first
    sender_retries = False

    def verify_headers(self, headers: Headers) -> None:
        """The whole proof is a header: checked at the door, before the body is read (``verify`` again after)."""
        self.verify(headers, b"", 0.0)

    def verify(self, headers: Headers, body: bytes, now: float) -> None:
        """Accept iff the secret-token header equals the secret (constant-time, through SHA-256 digests)."""
        value = required_header(headers, SECRET_HEADER)  # non-ASCII is rejected here, before encode
        ok = self._matches(value)
        # A repeated header arrives as "tok, tok"; Telegram tokens are [A-Za-z0-9_-], so a
        # comma can only come from joining. Equal copies count as one.
        token = single_token(headers, SECRET_HEADER, max_chars=len(value))
        if token is not None and token != value:
            ok |= self._matches(token)
        if not ok:
            raise VerificationError("telegram secret token does not match")

    def dedup_key(self, headers: Headers, body: bytes) -> str | None:
        """``str(update_id)`` when the body is an object with an integer ``update_id``."""
        update = object_or_none(body)
        if update is None or not _is_int(update.get("update_id")):
            return None
        return id_field(update, "update_id")

    def parse(self, headers: Headers, text: str) -> Parsed:
        """One job for a ``message`` (``telegram.message``), ``edited_message`` (``telegram.edited``),
        ``callback_query`` (``telegram.callback``, ``_callback_job``) or ``my_chat_member``
        update (``telegram.member``, ``_member_job``); none for other updates.

        A message's payload is ``{"update_id", "chat_id", "text", "message_id", "from"}``:
        ``text`` is ``None`` for messages without text (photos, stickers), ``from`` is
        ``{"id", "username"?}`` or ``None`` (messages sent on behalf of a chat).
        The job key is ``telegram:<update_id>``, the recipient the chat id, so one
        chat's replies go out one at a time and in order.
        """
        update = load_object(text)
        update_id = update.get("update_id")
        if not _is_int(update_id):
            raise ParseError("telegram update has no integer update_id")
        dedup = id_field(update, "update_id")
        kind = "telegram.message"
        message = update.get("message")
        if message is None and update.get("edited_message") is not None:
            kind, message = "telegram.edited", update["edited_message"]
        if message is None:
            query = update.get("callback_query")
            if query is not None:
                return Parsed(dedup, [_callback_job(update_id, dedup, query)])
            member = update.get("my_chat_member")
            return Parsed(dedup, [] if member is None else [_member_job(update_id, dedup, member)])
        if not isinstance(message, dict):
            raise ParseError("telegram message is not an object")
        chat = message.get("chat")
        if not isinstance(chat, dict) or not _is_int(chat.get("id")):
            raise ParseError("telegram message has no integer chat.id")
        chat_id = chat["id"]
        message_id = message.get("message_id")
        if not _is_int(message_id):
            raise ParseError("telegram message has no integer message_id")
        message_text = message.get("text")
        if message_text is not None and not isinstance(message_text, str):
            raise ParseError("telegram message text is not a string")
        payload: dict[str, Any] = {
            "update_id": update_id,
            "chat_id": chat_id,
            "text": message_text,
            "message_id": message_id,
            "from": _sender(message.get("from")),
        }
        job = NewJob(
            kind=kind,
            payload=payload,
            key=f"telegram:{dedup}",
            recipient=str(chat_id),
        )
        return Parsed(dedup, [job])


def _member_job(update_id: object, dedup: str | None, member: object) -> NewJob:
    """The ``telegram.member`` job of a ``my_chat_member`` update: the bot's new status in the chat.

    Payload ``{"update_id", "chat_id", "status", "old_status", "from"}``; ``status``
    "kicked" marks the chat blocked when it is stored, "member" (and any other but
    "left") clears the mark.
    """
    if not isinstance(member, dict):
        raise ParseError("telegram my_chat_member is not an object")
    chat = member.get("chat")
    if not isinstance(chat, dict) or not _is_int(chat.get("id")):
        raise ParseError("telegram my_chat_member has no integer chat.id")
    statuses = []
    for field in ("new_chat_member", "old_chat_member"):
        part = member.get(field)
        status = part.get("status") if isinstance(part, dict) else None
        if not isinstance(status, str):
            raise ParseError(f"telegram my_chat_member has no {field}.status")
        statuses.append(status)
    payload: dict[str, Any] = {
        "update_id": update_id,
        "chat_id": chat["id"],
        "status": statuses[0],
        "old_status": statuses[1],
        "from": _sender(member.get("from")),
    }
    return NewJob(kind="telegram.member", payload=payload, key=f"telegram:{dedup}", recipient=str(chat["id"]))


def _callback_job(update_id: object, dedup: str | None, query: object) -> NewJob:
    """The ``telegram.callback`` job of a ``callback_query`` update: a button pressed.

    Payload ``{"update_id", "id", "data", "chat_id", "message_id", "message_text", "from"}``:
    ``id`` the query's (for answerCallbackQuery), ``data`` the button's callback data (None
    for a game's), ``chat_id``, ``message_id`` and ``message_text`` those of the message with
    the button (None for an inline-mode message), ``from`` the presser as Telegram sent it. Recipient
    ``<chat>:cb``: the chat's presses one at a time, in order, apart from its messages.
    """
    if not isinstance(query, dict):
        raise ParseError("telegram callback_query is not an object")
    query_id = query.get("id")
    if not isinstance(query_id, str) or not query_id:
        raise ParseError("telegram callback_query has no id")
    data = query.get("data")
    if data is not None and not isinstance(data, str):
        raise ParseError("telegram callback_query data is not a string")
    sender = query.get("from")
    if not isinstance(sender, dict) or not _is_int(sender.get("id")):
        raise ParseError("telegram callback_query has no from.id")
    chat_id: int | None = None
    message_id: int | None = None
    message_text: str | None = None
    message = query.get("message")
    if message is not None:
        chat = message.get("chat") if isinstance(message, dict) else None
        if not isinstance(chat, dict) or not _is_int(chat.get("id")):
            raise ParseError("telegram callback_query message has no integer chat.id")
        if not _is_int(message.get("message_id")):
            raise ParseError("telegram callback_query message has no integer message_id")
        chat_id, message_id = chat["id"], message["message_id"]
        text = message.get("text")
        message_text = text if isinstance(text, str) else None
    payload: dict[str, Any] = {
        "update_id": update_id,
        "id": query_id,
        "data": data,
        "chat_id": chat_id,
        "message_id": message_id,
        "message_text": message_text,
        "from": sender,
    }
    recipient = None if chat_id is None else f"{chat_id}{CALLBACK_LINE}"
    return NewJob(kind="telegram.callback", payload=payload, key=f"telegram:{dedup}", recipient=recipient)


def _is_int(value: object) -> bool:
    # bool is an int subclass; true is not an id. Out-of-range ints are not Telegram's either.
    return isinstance(value, int) and not isinstance(value, bool) and value in _INT64


def _sender(value: object) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not _is_int(value.get("id")):
        raise ParseError("telegram message sender has no integer id")
    sender: dict[str, Any] = {"id": value["id"]}
    username = value.get("username")
    if isinstance(username, str):
        sender["username"] = username
    return sender
