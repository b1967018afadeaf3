"""Messages the tests build: a message of one text part."""

from __future__ import annotations

from turnwire_client.v1 import message_pb2


def text_message(
    message_id: str, text: str, role: message_pb2.Role.ValueType = message_pb2.ROLE_USER
) -> message_pb2.Message:
    """Message ``message_id`` of ``role`` holding one text part, ``text``."""
    message = message_pb2.Message(id=message_id, role=role)
    message.parts.add().text.text = text
    return message
