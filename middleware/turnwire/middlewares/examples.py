"""The five ``beforeTurn`` examples of Think's lifecycle-hooks page, as runnable middlewares.

Each returns a :class:`~middleware.TurnConfig` with only the fields it changes
(docs/semantics.md §3: "only what is returned changes"), or ``None``.

* ``CheaperModelOnContinuation(model)``: on a continuation turn (ContinueLastTurn,
  automatic continuation) → ``model``.
* ``LimitActiveTools(tools)``: every turn → ``active_tools``.
* ``SelectedFileInSystemPrompt()``: the body has ``selected_file`` (or ``selectedFile``)
  → ``system`` + ``"\\n\\nUser is editing: <file>"``.
* ``HideReasoningOnContinuation()``: on a continuation turn → ``send_reasoning=False``.
* ``StructuredAnswer(schema, mode_field="mode", mode_value="structured-answer")``:
  ``body[mode_field] == mode_value`` → ``output=schema`` and ``active_tools=[]``.

``output`` is turn-level only (no ``before_step`` override), as in Think.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from turnwire.hooks import Middleware, TurnConfig, TurnContext

SELECTED_FILE_KEYS = ("selected_file", "selectedFile")
"""Body keys read by :class:`SelectedFileInSystemPrompt`, in order (snake_case first)."""


class CheaperModelOnContinuation(Middleware):
    """Use ``model`` (``provider:model``) on continuation turns; other turns keep theirs.

    Think: ``if (ctx.continuation) return { model: this.cheapModel };``. Raises
    :class:`ValueError` when ``model`` is not ``provider:model``.
    """

    def __init__(self, *, model: str) -> None:
        """``model``: the cheaper model, ``provider:model`` (e.g. ``scripted:cheap``)."""
        super().__init__(model=model)
        if ":" not in model:
            raise ValueError(f"model: must be provider:model, got {model!r}")
        self.model = model

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """``TurnConfig(model=…)`` when ``ctx.continuation``, else ``None``."""
        return TurnConfig(model=self.model) if ctx.continuation else None


class LimitActiveTools(Middleware):
    """Limit the tools the model may call to ``tools`` (names not in the turn's set are ignored).

    Think: ``return { activeTools: ["read", "write", "getWeather"] };``. A call of
    another tool becomes that call's input error (``tool_input_error``); the turn goes on.
    """

    def __init__(self, *, tools: Sequence[str]) -> None:
        """``tools``: the tool names the model may call (may be empty: no tools)."""
        super().__init__(tools=tools)
        if isinstance(tools, str):
            raise ValueError(f"tools: must be a list of tool names, got {tools!r}")
        self.tools = tuple(tools)

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """``TurnConfig(active_tools=tools)`` on every turn."""
        return TurnConfig(active_tools=self.tools)


class SelectedFileInSystemPrompt(Middleware):
    """Append ``\\n\\nUser is editing: <file>`` to the system prompt when the body names a file.

    Think: ``if (ctx.body?.selectedFile) return { system: ctx.system + ... };``. Reads
    ``body["selected_file"]``, else ``body["selectedFile"]``; a missing, empty or
    ``null`` value changes nothing. ``ctx.system`` already has earlier middlewares' changes.
    """

    def __init__(self) -> None:
        """No options."""
        super().__init__()

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """``TurnConfig(system=ctx.system + …)`` when the body names a file, else ``None``."""
        selected = next((ctx.body[k] for k in SELECTED_FILE_KEYS if ctx.body.get(k)), None)
        if selected is None:
            return None
        return TurnConfig(system=f"{ctx.system}\n\nUser is editing: {selected}")


class HideReasoningOnContinuation(Middleware):
    """On continuation turns, neither stream nor store reasoning (``send_reasoning=False``).

    Think: ``if (ctx.continuation) return { sendReasoning: false };``.
    """

    def __init__(self) -> None:
        """No options."""
        super().__init__()

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """``TurnConfig(send_reasoning=False)`` when ``ctx.continuation``, else ``None``."""
        return TurnConfig(send_reasoning=False) if ctx.continuation else None


class StructuredAnswer(Middleware):
    """Force structured output for a turn whose body asks for it, with no tools.

    Think: ``if (ctx.body?.mode === "structured-answer") return { output: …, activeTools: [] };``.
    ``schema`` is a JSON Schema object (e.g. ``{"type": "object", "properties":
    {"severity": {"enum": ["low", "high"]}}}``). Raises :class:`ValueError` when
    ``schema`` is not a mapping.
    """

    def __init__(
        self,
        *,
        schema: Mapping[str, Any],
        mode_field: str = "mode",
        mode_value: Any = "structured-answer",
    ) -> None:
        """``schema``: the output's JSON Schema; the turn is structured when
        ``body[mode_field] == mode_value``."""
        super().__init__(schema=schema, mode_field=mode_field, mode_value=mode_value)
        if not isinstance(schema, Mapping):
            raise ValueError(f"schema: must be a JSON Schema object, got {type(schema).__name__}")
        self.schema = dict(schema)
        self.mode_field = mode_field
        self.mode_value = mode_value

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """``TurnConfig(output=schema, active_tools=[])`` when the body's mode matches, else ``None``."""
        if self.mode_field in ctx.body and ctx.body[self.mode_field] == self.mode_value:
            return TurnConfig(output=self.schema, active_tools=())
        return None
