"""The configuration the HTTP doors' end-to-end tests share (``test_http_connect_e2e.py``,
``test_openai_door_e2e.py``): scripted models, static bearer tokens,
the HTTP listener on a free port."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.sidecar import SidecarProcess, free_port
from support.tokens import auth_config, write_tokens_file


def http_sidecar_config(
    workdir: Path, tokens: dict[str, tuple[str, str]], scripts: dict[str, Any], **http: Any
) -> dict[str, Any]:
    """A sidecar configuration: the ``scripted`` provider with ``scripts`` (default model
    ``scripted:echo``), auth by a static tokens file written in ``workdir`` (``tokens``: token →
    (principal, tenant)), ``http.listen`` on a free loopback port plus the ``http`` keys given
    (``cors=...``). Callers add what else their module needs (metrics, middleware)."""
    return {
        "default_model": "scripted:echo",
        "providers": {"scripted": {"scripts": scripts}},
        "auth": auth_config(write_tokens_file(workdir / "tokens.json", tokens)),
        "http": {"listen": f"127.0.0.1:{free_port()}", **http},
    }


def http_base(sidecar: SidecarProcess) -> str:
    """``http://<http.listen>`` of a sidecar started with a config that has an ``http`` section."""
    assert sidecar.config is not None, "the sidecar has no config, so no http.listen"
    return f"http://{sidecar.config['http']['listen']}"
