"""The repository's ``Dockerfile`` and ``.dockerignore``, checked statically.

No container daemon runs on the development or CI machines, so the image is never built here;
these tests read the Dockerfile with ``dockerfile-parse`` and hold it to what an image review
asks: a pinned base, a builder and a runtime stage, only runtime dependencies installed in the
final stage, a non-root user, and a HEALTHCHECK through ``turnwire health``.
"""

from __future__ import annotations

import re
import shlex
import tomllib

import pytest
from support.dockerfile import REPO, Stage, exec_form, shell_words, stages

DOCKERIGNORE = REPO / ".dockerignore"

PINNED_BASE = re.compile(r"^python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?$")
"""An exact patch tag of the 3.11 slim bookworm image, optionally with its digest."""

BUILD_TOOLS = re.compile(r"\b(apt-get|apt|apk|gcc|g\+\+|build-essential|make|node|nodejs|npm)\b")


def final_stage() -> Stage:
    return stages()[-1]


def test_a_builder_stage_and_a_runtime_stage_on_one_pinned_base() -> None:
    found = stages()
    assert [stage.name for stage in found] == ["builder", "runtime"]
    for stage in found:
        assert PINNED_BASE.match(stage.base), f"{stage.name}: base {stage.base!r} is not pinned"
    assert all("latest" not in stage.base for stage in found)


CLOUD_EXTRAS = {"bedrock", "vertex", "gemini"}


def test_the_builder_makes_wheels_of_the_three_distributions_with_the_constraints() -> None:
    (command,) = stages()[0].values("RUN")
    argv = shell_words(command, EXTRAS="")
    assert argv[:2] == ["pip", "wheel"]
    assert argv[argv.index("-c") + 1] == "constraints.txt"
    packages = [arg for arg in argv if arg.startswith(".")]
    assert packages == ["./clients/python", "./middleware", "."]
    names = {tomllib.loads((REPO / p / "pyproject.toml").read_text())["project"]["name"] for p in packages}
    assert names == {"turnwire-client", "turnwire-sdk", "turnwire"}
    assert not any("[" in arg for arg in argv), "no extras by default"
    cloud = shell_words(command, EXTRAS="bedrock,gemini")
    assert cloud[-1] == ".[bedrock,gemini]", "EXTRAS names the server's extras"


def test_the_final_stage_installs_only_the_runtime_dependencies_from_the_builders_wheels() -> None:
    stage = final_stage()
    assert stage.values("COPY") == [], "no sources in the runtime image"
    (install, user_setup) = stage.values("RUN")
    options, _, command = install.partition(" pip ")
    assert "--mount=type=bind,from=builder,source=/wheels" in options
    argv = shell_words("pip " + command, EXTRAS="")
    assert argv[:2] == ["pip", "install"]
    assert "--no-index" in argv
    assert argv[argv.index("--find-links") + 1] == "/wheels"
    assert [arg for arg in argv if not arg.startswith("-") and arg not in ("pip", "install", "/wheels")] == [
        "turnwire"
    ], "the server distribution alone, without extras: pip takes its runtime dependencies"
    assert shell_words("pip " + command, EXTRAS="vertex")[-1] == "turnwire[vertex]"
    for command in (install, user_setup):
        assert not BUILD_TOOLS.search(command), f"a build tool in the runtime stage: {command}"


def test_the_cloud_extras_are_a_build_argument_not_in_the_default_image() -> None:
    """The cloud platforms' SDKs (boto3 and botocore alone are ~90 MB) are built in only when
    ``--build-arg EXTRAS=…`` names them; each stage that installs declares the argument."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) == {"dev", *CLOUD_EXTRAS}, "a new extra: decide whether the image can carry it"
    text = (REPO / "Dockerfile").read_text()
    assert 'ARG EXTRAS=""' in text, "empty by default"
    for stage in stages():
        assert "EXTRAS" in stage.values("ARG"), f"stage {stage.name} does not declare EXTRAS"
    assert "--build-arg EXTRAS=" in (REPO / "docs" / "operate" / "deploy.md").read_text()


def test_the_final_stage_runs_as_a_fixed_non_root_uid_with_a_writable_data_directory() -> None:
    stage = final_stage()
    user = stage.last("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0, f"USER {user}: numeric (runAsNonRoot verifies it) and not root"
    assert gid.isdigit() and int(gid) > 0
    workdir = stage.last("WORKDIR")
    setup = stage.values("RUN")[-1]
    assert f"--uid {uid}" in setup
    assert f"install -d -o {uid} -g {gid}" in setup and setup.rstrip().endswith(workdir), (
        "the working directory (where sqlite:///turnwire.db lives) belongs to the user"
    )


def test_the_entry_point_serves_on_the_exposed_port_and_stops_on_sigterm() -> None:
    stage = final_stage()
    assert exec_form(stage.last("ENTRYPOINT")) == ["turnwire"]
    cmd = exec_form(stage.last("CMD"))
    assert cmd == ["serve", "--listen", "0.0.0.0:50051"]
    assert stage.last("EXPOSE") == cmd[-1].rpartition(":")[2]
    assert stage.last("STOPSIGNAL") == "SIGTERM"


def test_the_healthcheck_runs_turnwire_health() -> None:
    healthcheck = final_stage().last("HEALTHCHECK")
    options, _, command = healthcheck.partition(" CMD ")
    argv = exec_form(command)
    assert argv[:2] == ["turnwire", "health"]
    timeouts = dict(re.findall(r"--(\w[\w-]*)=(\d+)s", options))
    # The command gives up (--timeout) before Docker kills it, so it can say why.
    assert float(argv[argv.index("--timeout") + 1]) < int(timeouts["timeout"])
    assert {"interval", "timeout", "start-period"} <= set(timeouts)


def copied_sources() -> list[str]:
    sources: list[str] = []
    for stage in stages():
        for value in stage.values("COPY"):
            *paths, _destination = shlex.split(value)
            sources += [path for path in paths if not path.startswith("--")]
    return sources


@pytest.mark.parametrize("source", copied_sources())
def test_every_copied_path_exists_and_is_in_the_build_context(source: str) -> None:
    assert (REPO / source).exists(), f"COPY {source}: no such path in the repository"
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()]
    rules = [line for line in lines if line and not line.startswith("#")]
    assert rules[0] == "*", ".dockerignore is an allowlist: everything out, then what is copied"
    assert f"!{source}" in rules, f"COPY {source}: excluded from the build context by .dockerignore"
