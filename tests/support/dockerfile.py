"""The repository's ``Dockerfile`` read with ``dockerfile-parse``, stage by stage, for the
static checks of the image (``tests/test_dockerfile.py``) and of the Kubernetes example that
runs it (``tests/test_kubernetes_example.py``)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


@dataclass
class Stage:
    """One ``FROM`` (``base`` with build arguments substituted, ``name`` after ``AS``) and its
    instructions up to the next, as ``(INSTRUCTION, value)`` pairs without comments."""

    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        """The values of every ``instruction`` of this stage, in order."""
        return [value for name, value in self.instructions if name == instruction]

    def last(self, instruction: str) -> str:
        """The value of the last ``instruction`` (the one in force); fails when there is none."""
        values = self.values(instruction)
        assert values, f"stage {self.name} has no {instruction}"
        return values[-1]


def stages(path: Path = DOCKERFILE) -> list[Stage]:
    """The Dockerfile's stages in order."""
    parser = DockerfileParser(path=str(path))
    bases = iter(parser.parent_images)
    result: list[Stage] = []
    for item in parser.structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "FROM":
            _, _, name = value.partition(" AS ")
            result.append(Stage(next(bases), name.strip()))
        elif instruction != "COMMENT" and result:
            result[-1].instructions.append((instruction, value))
    return result


def exec_form(value: str) -> list[str]:
    """The JSON argument list of an exec-form instruction (fails on the shell form)."""
    parsed = json.loads(value)
    assert isinstance(parsed, list) and all(isinstance(arg, str) for arg in parsed), value
    return parsed


def shell_words(command: str, **build_args: str) -> list[str]:
    """The words of a shell-form ``RUN`` after ``/bin/sh`` expands them with ``build_args`` set
    (``${EXTRAS:+[$EXTRAS]}`` → ``[bedrock]`` or nothing): what the build would run, by a real
    shell rather than a reimplementation of its expansion."""
    env = {"PATH": "/usr/bin:/bin", **build_args}
    script = f'set -- {command}\nprintf "%s\\0" "$@"'
    words = subprocess.run(["sh", "-c", script], env=env, capture_output=True, check=True).stdout
    return words.decode().split("\0")[:-1]
