"""The Kubernetes example (``deploy/kubernetes/``), checked offline.

Every manifest validates against the Kubernetes 1.33 schemas that ``kubernetes-validate`` ships
(strict: an unknown field is an error); the ConfigMap's embedded config loads with Turnwire's
own ``load_settings`` and starts a sidecar; the probes, ports, keys, volumes and grace period
agree with that config and with the image (``Dockerfile``).
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support.dockerfile import REPO, stages

from turnwire_server.api.standard_services import LIVENESS
from turnwire_server.app import _TURN_END_MARGIN_SECONDS, start
from turnwire_server.config import Settings, load_settings
from turnwire_server.health_check import check_health

EXAMPLE = REPO / "deploy" / "kubernetes"

KUBERNETES_VERSION = "1.33.0"
"""The version validated against: native sidecars (restartable init containers) are GA since."""

PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def manifests() -> list[dict[str, Any]]:
    """Every document of every ``*.yaml`` file in the example, in file order."""
    documents: list[dict[str, Any]] = []
    for path in sorted(EXAMPLE.glob("*.yaml")):
        documents += [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return documents


def the(kind: str) -> dict[str, Any]:
    """The example's one manifest of ``kind``."""
    (found,) = [doc for doc in manifests() if doc["kind"] == kind]
    return found


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = the("Deployment")["spec"]["template"]["spec"]
    return spec


def sidecar() -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod_spec()["initContainers"]
    (container,) = [c for c in containers if c["name"] == "turnwire"]
    return container


def containers() -> list[dict[str, Any]]:
    spec = pod_spec()
    return [*spec.get("initContainers", []), *spec["containers"]]


def config_mount() -> tuple[Path, str]:
    """The config file's path in the sidecar and its ConfigMap key."""
    (path,) = [arg for arg in sidecar()["args"] if arg.endswith(".yaml")]
    config_file = Path(path)
    (mount,) = [m for m in sidecar()["volumeMounts"] if Path(m["mountPath"]) == config_file.parent]
    (volume,) = [v for v in pod_spec()["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == the("ConfigMap")["metadata"]["name"]
    return config_file, config_file.name


def example_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """The ConfigMap's config, as ``turnwire serve --config`` reads it in the pod (``overrides``
    as flags)."""
    _, key = config_mount()
    config_file = tmp_path / key
    config_file.write_text(the("ConfigMap")["data"][key])
    return load_settings(config_file, **overrides)


@pytest.mark.parametrize("manifest", manifests(), ids=lambda m: f"{m['kind']}/{m['metadata']['name']}")
def test_the_manifest_validates_against_the_kubernetes_schemas(manifest: dict[str, Any]) -> None:
    assert kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True) == "1.33"


def test_the_validator_rejects_a_probe_on_a_named_port() -> None:
    """The check bites: a gRPC probe's port must be a number, not the port's name."""
    broken = copy.deepcopy(the("Deployment"))
    broken["spec"]["template"]["spec"]["initContainers"][0]["readinessProbe"]["grpc"]["port"] = "grpc"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_the_configmap_config_loads_and_the_probes_ask_the_port_it_listens_on(tmp_path: Path) -> None:
    settings = example_settings(tmp_path)
    host, _, port = settings.listen.rpartition(":")
    assert host == "0.0.0.0", "the kubelet's probes connect to the pod IP"
    container = sidecar()
    assert "--listen" not in container["args"], "a --listen flag would override the config's listen"
    for probe in PROBES:
        assert container[probe]["grpc"]["port"] == int(port), probe
    assert [p["containerPort"] for p in container["ports"]] == [int(port)]
    assert stages()[-1].last("EXPOSE") == port


def test_the_provider_keys_come_from_the_secret(tmp_path: Path) -> None:
    settings = example_settings(tmp_path)
    secret = the("Secret")
    # The scripted provider has no api_key_env; an SDK entry's None means "no key needed".
    key_names = {getattr(provider, "api_key_env", None) for provider in settings.providers.values()}
    key_names.discard(None)
    assert key_names == {"ANTHROPIC_API_KEY"}
    env = {item["name"]: item for item in sidecar()["env"]}
    for name in key_names:
        reference = env[name]["valueFrom"]["secretKeyRef"]
        assert reference["name"] == secret["metadata"]["name"]
        assert reference["key"] in secret["stringData"]
    assert not any(isinstance(v, str) and v.startswith("sk-") for v in the("ConfigMap")["data"].values())


def sidecar_stop_seconds(tmp_path: Path) -> float:
    """The longest a graceful stop of the example's sidecar takes (app.py): the drain window
    (readiness off, calls still taken), the turns' grace, then the margin in which cut-off turns
    send their last events."""
    limits = example_settings(tmp_path).limits
    assert (limits.drain_seconds, limits.shutdown_grace_seconds) == (5.0, 10.0), "the comments quote them"
    return limits.drain_seconds + limits.shutdown_grace_seconds + _TURN_END_MARGIN_SECONDS


def test_termination_outlasts_the_sidecars_drain(tmp_path: Path) -> None:
    # The application's own stop comes first (deployment.yaml budgets it 15 s).
    assert pod_spec()["terminationGracePeriodSeconds"] >= 15 + sidecar_stop_seconds(tmp_path) + 5


def test_liveness_never_cuts_a_graceful_stop_short(tmp_path: Path) -> None:
    """Readiness fails from the first check after SIGTERM (NOT_SERVING, then refused); liveness
    must not restart the sidecar before its stop is over, even when the first failed check
    comes at once."""
    liveness = sidecar()["livenessProbe"]
    assert liveness["periodSeconds"] * (liveness["failureThreshold"] - 1) > sidecar_stop_seconds(tmp_path)
    assert sidecar()["readinessProbe"]["failureThreshold"] == 1, "out of the Services at the first check"


def test_liveness_asks_the_status_that_stays_serving_through_an_outage() -> None:
    """Readiness and start-up ask ``""`` (NOT_SERVING while draining or while the database is
    unreachable); liveness asks the status that stays SERVING then, or a database outage would
    restart every replica (docs/operate/outages.md)."""
    assert sidecar()["livenessProbe"]["grpc"]["service"] == LIVENESS
    for probe in ("startupProbe", "readinessProbe"):
        assert sidecar()[probe]["grpc"].get("service", "") == "", probe


def test_the_pod_runs_as_the_images_non_root_user_on_a_read_only_root() -> None:
    runtime = stages()[-1]
    uid, _, gid = runtime.last("USER").partition(":")
    security = pod_spec()["securityContext"]
    assert security["runAsNonRoot"] is True
    assert (security["runAsUser"], security["runAsGroup"]) == (int(uid), int(gid))
    for container in containers():
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
        resources = container["resources"]
        assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}


def test_the_data_directory_is_a_writable_volume_at_the_images_working_directory() -> None:
    mounts = {Path(m["mountPath"]): m["name"] for m in sidecar()["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    for path in (Path(stages()[-1].last("WORKDIR")), Path("/tmp")):
        assert "emptyDir" in volumes[mounts[path]], f"{path} is not writable on a read-only root"


def test_the_sidecar_starts_before_the_app_and_stops_after_it() -> None:
    assert sidecar()["restartPolicy"] == "Always", "a native sidecar"
    assert "startupProbe" in sidecar(), "the app starts once the sidecar serves"
    (app,) = pod_spec()["containers"]
    env = {item["name"]: item.get("value") for item in app["env"]}
    assert env["TURNWIRE_TARGET"] == "127.0.0.1:" + str(sidecar()["ports"][0]["containerPort"])


def test_no_image_floats() -> None:
    for container in containers():
        _, _, tag = container["image"].rpartition(":")
        assert tag and tag != "latest" and "/" not in tag, container["image"]


async def test_the_example_config_starts_a_serving_sidecar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in the pod (the key from the Secret), on a free local port and a store in tmp_path."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", the("Secret")["stringData"]["ANTHROPIC_API_KEY"])
    settings = example_settings(
        tmp_path, listen="127.0.0.1:0", store={"url": f"sqlite:///{tmp_path / 'turnwire.db'}"}
    )
    running = await start(settings)
    try:
        answers = {
            probe: await asyncio.to_thread(
                check_health, f"127.0.0.1:{running.port}", sidecar()[probe]["grpc"].get("service", "")
            )
            for probe in PROBES
        }
    finally:
        await running.stop()
    assert {probe: answer.status for probe, answer in answers.items()} == dict.fromkeys(PROBES, "SERVING")
