"""One error model (turnwire.errors): every error a client may see derives from DomainError and
carries its reason and status; the API maps by those attributes; public names are unique; the
tool-call texts and the protobuf number rule are defined once."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections import defaultdict
from pathlib import Path
from types import ModuleType

import grpc
import pytest
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2

from turnwire import values as sdk_values
from turnwire.errors import CanonicalCode, DomainError, ErrorDetails, ErrorReason
from turnwire_client import values as client_values
from turnwire_client.v1 import error_reason_pb2
from turnwire_server.api.status import status_error_of, status_of
from turnwire_server.store import errors as store_errors

ROOTS = ("turnwire", "turnwire_server", "turnwire_client")

NOT_DOMAIN_ERRORS = {
    # The client's own errors: the client installs alone and may not import turnwire.
    "turnwire_client.errors.TurnwireError",
    "turnwire_client.errors.ProtocolError",
    "turnwire_client.errors.TlsMismatchError",
    # A carrier: the engine unwraps it (its error and stage) before anything maps it.
    "turnwire_server.engine.errors.TurnFailure",
    # Carriers inside the remote hook middleware: a failed call becomes the hook's failure mode
    # (fail-open, or HOOK_FAILED when closed) before anything leaves the middleware.
    "turnwire_server.remote_hooks.session.CallFailed",
    "turnwire_server.remote_hooks.session.SessionBroken",
    "turnwire_server.remote_hooks.calls.HookCallFailed",
    "turnwire_server.remote_hooks.calls.ResendUnary",
    # The HTTP listener's carrier of a status the servicer already chose (mapped from a domain error).
    "turnwire_server.http.calls.CallEnded",
    # The HTTP doors' refusal of a body (OpenAI, AG-UI, AI SDK): a 400 in the door's error shape, no status.
    "turnwire_server.http.openai_request.RequestProblem",
    # Inside the sidecar only: a schedule's timing refused is answered INVALID_ARGUMENT with
    # BadRequest by the API layer (api/schedule_rpcs.py); a webhook target refused on its resolved
    # address is stored with the delivery attempt, never raised to a client.
    "turnwire_server.engine.schedule_times.TimingError",
    "turnwire_server.webhooks.targets.TargetRefused",
    # For the authors of hooks and tools, in process: a sub-agent called where none is served.
    "turnwire.subagents.SubagentsUnavailable",
    # Startup and configuration: the process refuses to start; no client ever sees them.
    "turnwire_server.subagent_loading.SubagentConfigError",
    "turnwire_server.webhooks.signing.MissingSecret",
    "turnwire_server.api.authentication.AuthConfigError",
    "turnwire_server.api.tls.TlsFileError",
    "turnwire_server.assembly.StartupError",
    "turnwire_server.assembly.StartupStopped",
    "turnwire_server.config.ConfigError",
    "turnwire_server.cli.demo.SidecarExited",
    "turnwire_server.event_loop.EventLoopUnavailable",
    "turnwire_server.http.server.HttpListenError",
    "turnwire_server.listen_check.ListenAddressError",
    "turnwire_server.providers.settings.ProviderConfigError",
    "turnwire_server.supervisor.SupervisorError",
    "turnwire_server.tools.grpc_host.ToolHostError",
    "turnwire_server.tools.loading.ToolLoadError",
}
"""Public exception classes that are not domain errors, each for the reason given."""

WITHOUT_OWN_REASON = {
    # A tool call's failure, which the model sees; no client gets it as a status.
    "turnwire.tools.ToolError",
    "turnwire.values.NotJsonError",
    "turnwire_server.engine.assistant_message.OutputTooLarge",
    # Bases whose subclasses say why.
    "turnwire.errors.DomainError",
    "turnwire_server.engine.errors.AdmissionRefused",
}
"""Domain errors with no ErrorReason of their own: were one to reach a client, it would be INTERNAL."""

SHARED_NAMES = {"Usage", "ToolCall"}
"""Public class names still defined twice (turnwire.types, the model's chunks, and
turnwire_client.values, the client's plain views): renaming either breaks a published API."""


def _modules() -> list[ModuleType]:
    modules = []
    for root in ROOTS:
        package = importlib.import_module(root)
        for info in pkgutil.walk_packages(package.__path__, f"{root}."):
            if "_pb2" in info.name or info.name.endswith("__main__"):
                continue
            modules.append(importlib.import_module(info.name))
    return modules


def _public_classes() -> dict[str, type]:
    found = {}
    for module in _modules():
        for name, value in vars(module).items():
            if inspect.isclass(value) and value.__module__ == module.__name__ and not name.startswith("_"):
                found[f"{module.__name__}.{value.__qualname__}"] = value
    return found


@pytest.fixture(scope="module")
def public_classes() -> dict[str, type]:
    return _public_classes()


def test_every_public_error_a_client_may_see_is_a_domain_error(public_classes: dict[str, type]) -> None:
    errors = {path: kind for path, kind in public_classes.items() if issubclass(kind, BaseException)}
    without_base = {path for path, kind in errors.items() if not issubclass(kind, DomainError)}
    assert without_base == NOT_DOMAIN_ERRORS
    for path, kind in errors.items():
        if not issubclass(kind, DomainError):
            continue
        assert isinstance(kind.status_code, CanonicalCode), path
        assert kind.error_reason in ErrorReason.values(), path
        has_reason = kind.error_reason != error_reason_pb2.ERROR_REASON_UNSPECIFIED
        assert has_reason == (path not in WITHOUT_OWN_REASON), path
        if kind.retry_delay_seconds is not None:
            assert kind.retryable, f"{path} suggests a retry delay but is not retryable"


def test_no_two_public_classes_share_a_name(public_classes: dict[str, type]) -> None:
    homes: dict[str, set[str]] = defaultdict(set)
    for path, kind in public_classes.items():
        homes[kind.__name__].add(path)
    shared = {name for name, paths in homes.items() if len(paths) > 1}
    assert shared == SHARED_NAMES


class _Quota(DomainError):
    """A domain error the API layer has never heard of."""

    error_reason = error_reason_pb2.ERROR_REASON_RATE_LIMITED
    status_code = CanonicalCode.RESOURCE_EXHAUSTED
    retryable = True
    retry_delay_seconds = 2.5

    @property
    def client_message(self) -> str:
        return f"over quota: {self}"

    def details(self) -> ErrorDetails:
        return ErrorDetails(
            metadata={"tenant": "t1"},
            field_violations=(("model", "pick a cheaper one"),),
            retry_after_seconds=self.retry_delay_seconds,
        )


def test_the_api_maps_a_new_domain_error_by_its_attributes() -> None:
    error = status_error_of(_Quota("100 turns a day"), "step")
    assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.message == "over quota: 100 turns a day"
    assert error.reason == "RATE_LIMITED"
    status = status_of(_Quota("100 turns a day"), "step")
    info, bad_request, retry = (
        error_details_pb2.ErrorInfo(),
        error_details_pb2.BadRequest(),
        error_details_pb2.RetryInfo(),
    )
    assert [
        status.details[0].Unpack(info),
        status.details[1].Unpack(bad_request),
        status.details[2].Unpack(retry),
    ] == [True] * 3
    assert (info.reason, info.domain, dict(info.metadata)) == (
        "RATE_LIMITED",
        "turnwire.dev",
        {"tenant": "t1"},
    )
    assert [(v.field, v.description) for v in bad_request.field_violations] == [
        ("model", "pick a cheaper one")
    ]
    assert retry.retry_delay.ToMilliseconds() == 2500


def test_an_instance_may_refine_its_class_status_and_reason() -> None:
    from turnwire_server.engine.errors import StoppedByInput
    from turnwire_server.store.errors import SubmissionNotPending

    assert status_error_of(StoppedByInput("r2", rollback=True)).reason == "ROLLED_BACK"
    assert status_error_of(StoppedByInput("r2", rollback=False)).reason == "INTERRUPTED"
    assert status_error_of(SubmissionNotPending("s1", "aborted")).code is grpc.StatusCode.ABORTED
    assert (
        status_error_of(SubmissionNotPending("s1", "cancelled")).code is grpc.StatusCode.FAILED_PRECONDITION
    )


def test_an_error_without_a_reason_of_its_own_is_internal_and_names_the_stage() -> None:
    class Unclassified(DomainError):
        status_code = CanonicalCode.NOT_FOUND

    for error in (RuntimeError("boom"), Unclassified("boom")):
        mapped = status_error_of(error, "step")
        assert mapped.code is grpc.StatusCode.INTERNAL
        assert mapped.reason == "INTERNAL"
        assert mapped.message == f"internal error at stage step: {type(error).__name__}: boom"
        assert mapped.metadata == {"stage": "step"}


def test_canonical_codes_are_grpcs() -> None:
    assert {code.name: code.value for code in CanonicalCode} == {
        code.name: code.value[0] for code in grpc.StatusCode
    }


def test_the_tool_call_texts_are_defined_once() -> None:
    """The errors a tool call gets when the sidecar ended it are written in turnwire.errors only."""
    texts = ("The tool call was aborted before it finished.", "The tool call was interrupted before")
    homes = set()
    for root in ROOTS:
        root_dir = Path(importlib.import_module(root).__path__[0])
        for path in root_dir.rglob("*.py"):
            if "_pb2" not in path.name and any(text in path.read_text(encoding="utf-8") for text in texts):
                homes.add(f"{root}/{path.relative_to(root_dir).as_posix()}")
    assert homes == {"turnwire/errors.py"}


@pytest.mark.parametrize(
    ("number", "read"),
    [
        (3.0, 3),
        (-7.0, -7),
        (2.5, 2.5),
        (float(2**53 - 1), 2**53 - 1),
        (float(2**53), float(2**53)),
        (1e20, 1e20),
    ],
)
def test_one_rule_reads_protobuf_numbers_on_both_sides(number: float, read: float) -> None:
    """A whole double below 2**53 is the integer its sender wrote; beyond, it may stand for several
    integers and stays a float (docs/semantics.md §11, exact values): the SDK and the client agree."""
    value = struct_pb2.Value(number_value=number)
    struct = struct_pb2.Struct()
    struct.update({"n": number})
    for got in (
        sdk_values.from_value(value),
        client_values.struct_value(value),
        client_values.struct_value(struct)["n"],
    ):
        assert got == read
        assert type(got) is type(read)


@pytest.mark.parametrize(
    ("error", "code", "reason"),
    [
        (store_errors.UnknownMessage("c", "tw_m1"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD"),
        (store_errors.InvalidPageToken("not ours"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN"),
        (store_errors.TurnNotFound("r1"), grpc.StatusCode.NOT_FOUND, "TURN_NOT_FOUND"),
        (
            store_errors.StoreInUse("/data/turnwire.db"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "STORE_UNAVAILABLE",
        ),
    ],
)
def test_a_store_refusal_is_never_a_retryable_unavailable(
    error: DomainError, code: grpc.StatusCode, reason: str
) -> None:
    """What a request asked for cannot be fixed by retrying it: only a failing store is UNAVAILABLE."""
    assert not error.retryable
    mapped = status_error_of(error, "persist")
    assert (mapped.code, mapped.reason) == (code, reason)


@pytest.mark.parametrize(("status", "shown"), [(529, {"http_status": "529"}), (0, {})])
def test_a_provider_error_names_an_http_status_only_when_one_came(status: int, shown: dict[str, str]) -> None:
    """SRE trial (stop 67): a timeout's ErrorInfo said ``http_status: "0"``, a status no HTTP
    answer has; it is left out when no answer came (docs/providers.md, "Errors")."""
    from turnwire.providers import ProviderError

    error = ProviderError("no answer", status=status, retryable=True, provider="anthropic")
    info = error_details_pb2.ErrorInfo()
    assert status_of(error, "step").details[0].Unpack(info)
    assert info.reason == "PROVIDER_ERROR"
    assert {k: v for k, v in info.metadata.items() if k == "http_status"} == shown
    assert info.metadata["provider"] == "anthropic"
