"""The signing secrets read at start (webhooks/signing.py; docs/webhooks.md, "Endpoints and
targets"): a secret every Standard Webhooks verifier reads as the sidecar does, or the start
stops naming the variable (never its value)."""

from __future__ import annotations

import base64
import datetime as dt

import pytest
from standardwebhooks import Webhook

from turnwire_server.webhooks.settings import WebhookSettings
from turnwire_server.webhooks.signing import MissingSecret, Signers, signed_headers

SETTINGS = WebhookSettings.model_validate(
    {"endpoints": {"app": {"url": "https://app.example.com/hooks", "secret_env": "APP_SECRET"}}}
)


# Fixed keys: parameters must be the same in every pytest-xdist worker.
KEY = bytes(range(7, 39))  # 32 bytes
URL_SAFE = "whsec_" + base64.urlsafe_b64encode(b"\xfb" * 33).decode()  # "-_v7-_v7…": the library took it
STANDARD = "whsec_" + base64.b64encode(KEY).decode()


@pytest.mark.parametrize(
    ("secret", "says"),
    [
        (URL_SAFE, "not standard base64"),  # the Python library would drop '-' and '_'
        ("whsec_mysecret", "of 6 bytes"),
        ("whsec_" + base64.b64encode(b"x" * 23).decode(), "of 23 bytes"),
        ("whsec_!!!", "not standard base64"),
    ],
    ids=["url-safe", "six-bytes", "23-bytes", "not-base64"],
)
def test_a_secret_not_every_verifier_reads_alike_stops_the_start(secret: str, says: str) -> None:
    with pytest.raises(MissingSecret) as refused:
        Signers(SETTINGS, {"APP_SECRET": secret})
    message = str(refused.value)
    assert says in message and "APP_SECRET" in message and "webhooks.endpoints.app.secret_env" in message
    assert secret not in message and secret.removeprefix("whsec_") not in message


@pytest.mark.parametrize(
    "secret",
    [
        STANDARD,
        STANDARD + "\n",  # as read from a file
        STANDARD.removeprefix("whsec_"),  # the bare base64, as the libraries take it too
        "whsec_" + base64.b64encode(KEY[:24]).decode(),
    ],
    ids=["standard", "newline", "bare", "24-bytes"],
)
def test_a_standard_secret_signs_what_the_official_verifier_accepts(secret: str) -> None:
    signers = Signers(SETTINGS, {"APP_SECRET": secret})
    endpoint = signers.endpoint("app")
    assert endpoint is not None
    url, signer = endpoint
    body = b'{"type": "turn.completed"}'
    headers = signed_headers(signer, "msg_1", body, dt.datetime.now(dt.UTC))
    assert url == "https://app.example.com/hooks"
    assert Webhook(secret.strip()).verify(body, headers) == {"type": "turn.completed"}
