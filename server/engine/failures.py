"""How a turn's failure becomes the ``google.rpc.Status`` of its TurnEnd event."""

from __future__ import annotations

import grpc
from google.rpc import status_pb2

from middleware import ErrorStage, HookError
from server.errors import TurnwireStatusError, build_status
from server.providers import ProviderError, UnknownModel
from server.store.base import MessageIdConflict, StoreError, TurnAlreadyExists


class ModelTimeout(Exception):
    """A model call ran past a ``TurnConfig.timeout`` limit."""


class TurnFailure(Exception):
    """A turn failed at ``stage``; ``__cause__`` is the original error."""

    def __init__(self, stage: ErrorStage, error: BaseException) -> None:
        super().__init__(str(error))
        self.stage = stage
        self.error = error
        self.__cause__ = error


def _provider_status(error: ProviderError) -> status_pb2.Status:
    # The caller did nothing wrong when the provider is down or rate-limited:
    # those map to retryable codes; a rejected request maps to INVALID_ARGUMENT.
    # An error without an HTTP status (in-stream, dropped connection, or raised by the adapter
    # itself) is UNAVAILABLE only when retrying can help; a request the adapter refused to send
    # is the caller's.
    if error.status == 429:
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
    elif error.retryable or error.status >= 500:
        code = grpc.StatusCode.UNAVAILABLE
    elif error.status in (400, 413, 422) or (error.status == 0 and error.type == "invalid_request_error"):
        code = grpc.StatusCode.INVALID_ARGUMENT
    elif error.status == 404:
        code = grpc.StatusCode.NOT_FOUND
    else:
        code = grpc.StatusCode.INTERNAL
    metadata = {"provider": error.provider, "http_status": str(error.status)}
    if error.type:
        metadata["provider_error_type"] = error.type
    if error.code:
        metadata["provider_error_code"] = error.code
    retry_after = error.retry_after
    if retry_after is None and (error.retryable or error.status == 429):
        retry_after = 1.0
    return build_status(
        code,
        f"model provider error: {error.message}",
        reason="PROVIDER_ERROR",
        retry_after=retry_after,
        metadata=metadata,
    )


def status_of(error: BaseException, stage: ErrorStage) -> status_pb2.Status:
    """The status a client sees for ``error`` raised at ``stage``."""
    if isinstance(error, TurnwireStatusError):
        return error.to_status()
    if isinstance(error, ModelTimeout):
        return build_status(
            grpc.StatusCode.DEADLINE_EXCEEDED, str(error), reason="MODEL_TIMEOUT", retry_after=1.0
        )
    if isinstance(error, ProviderError):
        return _provider_status(error)
    if isinstance(error, UnknownModel):
        return build_status(
            grpc.StatusCode.INVALID_ARGUMENT,
            str(error),
            reason="UNKNOWN_MODEL",
            field_violations=[("model", str(error))],
        )
    if isinstance(error, HookError):
        return build_status(
            grpc.StatusCode.INTERNAL,
            str(error),
            reason="HOOK_FAILED",
            metadata={"middleware": error.middleware, "hook": error.hook, "stage": stage},
        )
    if isinstance(error, MessageIdConflict):
        return build_status(
            grpc.StatusCode.ALREADY_EXISTS,
            str(error),
            reason="INVALID_FIELD",
            field_violations=[
                ("message.id", "choose an id not used in this conversation, or leave it empty")
            ],
        )
    if isinstance(error, TurnAlreadyExists):
        return build_status(
            grpc.StatusCode.ALREADY_EXISTS,
            str(error),
            reason="INVALID_FIELD",
            field_violations=[("request_id", "already used by an earlier turn; use a new request_id")],
        )
    if isinstance(error, StoreError):
        return build_status(
            grpc.StatusCode.UNAVAILABLE,
            f"store unavailable: {error}",
            reason="STORE_UNAVAILABLE",
            retry_after=1.0,
        )
    return build_status(
        grpc.StatusCode.INTERNAL,
        f"internal error at stage {stage}: {type(error).__name__}: {error}",
        reason="INTERNAL",
        metadata={"stage": stage},
    )
