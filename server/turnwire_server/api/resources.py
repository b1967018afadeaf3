"""Store records as API resources: timestamps and ``Conversation`` messages."""

from __future__ import annotations

import datetime as dt

from google.protobuf import timestamp_pb2

from turnwire_client.v1 import chat_service_pb2
from turnwire_server.store.records import ConversationRecord


def timestamp(value: dt.datetime) -> timestamp_pb2.Timestamp:
    """``value`` (tz-aware) as a ``google.protobuf.Timestamp``."""
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(value)
    return stamp


def conversation_proto(record: ConversationRecord) -> chat_service_pb2.Conversation:
    """A conversation's record as the API's ``Conversation`` (without its messages)."""
    return chat_service_pb2.Conversation(
        conversation_id=record.conversation_id,
        create_time=timestamp(record.create_time),
        update_time=timestamp(record.update_time),
        message_count=record.message_count,
        forked_from=(
            chat_service_pb2.ConversationFork(
                conversation_id=record.forked_from_conversation_id,
                message_id=record.forked_from_message_id,
            )
            if record.forked_from_conversation_id
            else None
        ),
    )
