"""``turnwire demo --inspect`` (issue 39, "Done means"): the demo prints the inspector page's
address, the page is served there, the demo's turns are listed with their stored timelines
(each with the tool call it made), and Ctrl-C stops the sidecar cleanly.

Before issue 39 the demo had no ``--inspect`` and the sidecar no page or ListTurns.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _post(base: str, method: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base}/turnwire.v1.ChatService/{method}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        found: dict[str, Any] = json.load(response)
    return found


def test_the_demo_prints_the_page_that_shows_its_turns(tmp_path: Path) -> None:
    subprocess.run(["make", "--silent", "build-inspector"], cwd=ROOT, check=True)
    demo = subprocess.Popen(
        [sys.executable, "-m", "turnwire_server", "demo", "--inspect", "--workdir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert demo.stdout is not None
    lines: list[str] = []
    try:
        for line in demo.stdout:  # the demo's own pace; it ends the loop once it waits for Ctrl-C
            lines.append(line)
            if "press Ctrl-C" in line:
                break
        output = "".join(lines)
        addresses = re.findall(
            r"inspector: (http://127\.0\.0\.1:\d+/inspector/)#conversation=(demo-\d+)", output
        )
        assert len(addresses) == 2, output  # before the conversation and after it
        page, conversation = addresses[-1]
        with urllib.request.urlopen(page, timeout=30) as response:
            assert response.status == 200
            assert "<title>Turnwire inspector</title>" in response.read().decode()
        base = page.removesuffix("/inspector/")
        listed = _post(base, "ListConversations", {})
        assert [c["conversationId"] for c in listed["conversations"]] == [conversation]
        turns = _post(base, "ListTurns", {"conversationId": conversation})["turns"]
        assert len(turns) == 2 and all(turn["status"] == "TURN_STATUS_COMPLETED" for turn in turns)
        for turn in turns:  # each demo turn called a tool, then answered
            kinds = [span["kind"].removeprefix("TIMELINE_SPAN_KIND_") for span in turn["timeline"]["spans"]]
            assert kinds[:4] == ["QUEUE", "ATTEMPT", "STEP", "MODEL"] and "TOOL" in kinds, kinds
    finally:
        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=60)
    assert demo.returncode == 0, "".join(lines) + rest
    assert "sidecar stopped cleanly" in rest
