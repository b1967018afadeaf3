"""Fake cloud credentials found the platforms' own way, with their metadata servers switched off.

The AWS and Google credential chains end at a metadata server (EC2's instance metadata, GCE's),
which hangs without a network; and a developer's own files (``~/.aws``, gcloud's) must not change
what a test sees. :func:`cloud_environment` gives the variables that make both chains find only the
test's credentials: AWS keys in the environment, and a Google Application Default Credentials file
whose token endpoint is a local server.
"""

from __future__ import annotations

import json
from pathlib import Path

AWS_ACCESS_KEY_ID = "AKIDEXAMPLE"
GOOGLE_ACCESS_TOKEN = "ya29.test-token"
TOKEN_REPLY = {"access_token": GOOGLE_ACCESS_TOKEN, "expires_in": 3600, "token_type": "Bearer"}
"""What the token endpoint answers (RFC 6749 §5.1)."""

CLEARED = (
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_BEARER_TOKEN_BEDROCK",
    "AWS_SESSION_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_PROJECT",
)
"""Variables of the host that would change what the chains find."""


def no_metadata_environment(folder: Path) -> dict[str, str]:
    """No metadata server, no host credential files (they point into ``folder``, where none are)."""
    return {
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(folder / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-aws-credentials"),
        "NO_GCE_CHECK": "true",  # google-auth compares with "true"
        "GCE_METADATA_HOST": "127.0.0.1:9",
        "GCE_METADATA_IP": "127.0.0.1:9",
        "CLOUDSDK_CONFIG": str(folder / "no-gcloud"),
    }


def adc_file(folder: Path, token_host: str) -> Path:
    """An Application Default Credentials file of workforce identity federation
    (``external_account_authorized_user``) whose token endpoint is ``token_host``: the first request
    trades its refresh token for an access token there. (An ``authorized_user`` file always goes to
    Google's own endpoint; a service account needs a private key.)"""
    path = folder / "adc.json"
    info = {
        "type": "external_account_authorized_user",
        "audience": "//iam.googleapis.com/locations/global/workforcePools/test-pool/providers/test",
        "client_id": "test-client",
        "client_secret": "test-secret",
        "refresh_token": "test-refresh",
        "token_url": f"{token_host}/token",
    }
    path.write_text(json.dumps(info))
    return path


def cloud_environment(folder: Path, token_host: str) -> dict[str, str]:
    """:func:`no_metadata_environment` plus AWS keys and the ADC file (:func:`adc_file`)."""
    return {
        **no_metadata_environment(folder),
        "AWS_ACCESS_KEY_ID": AWS_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        "GOOGLE_APPLICATION_CREDENTIALS": str(adc_file(folder, token_host)),
    }
