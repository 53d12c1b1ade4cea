"""What a generation request asks of the pool, read from its body. Pure: the tokenizing is the proxy's.

`plan(path, body)` says how to count the prompt with the server's own tokenizer and what the
generation budget is:

    >>> p = plan("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}')
    >>> p.template, p.budget, p.model
    (True, 64, None)
    >>> plan("/completion", b'{"prompt": [1, 2, 3], "n_predict": 8}').token_counts
    [3]
    >>> plan("/completion", b"{not json") is None
    True
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

#: Routes that start generation tasks in slots, by how their prompt is found. Each also without `/v1`.
CHAT_ROUTES = frozenset({"/v1/chat/completions", "/chat/completions"})
COMPLETION_ROUTES = frozenset({"/completion", "/completions", "/v1/completions"})
INFILL_ROUTES = frozenset({"/infill"})
MESSAGES_ROUTES = frozenset({"/v1/messages", "/messages"})
RESPONSES_ROUTES = frozenset({"/v1/responses", "/responses"})
GENERATION_ROUTES = CHAT_ROUTES | COMPLETION_ROUTES | INFILL_ROUTES | MESSAGES_ROUTES | RESPONSES_ROUTES


@dataclass
class Plan:
    """How to size one request.

    - `template`: chat messages: `/apply-template` the body, then `/tokenize` the result;
    - `texts`: prompts to `/tokenize` (one task each); `token_counts`: prompts given as tokens;
    - `count_route`: a route of the server that counts the body's input tokens itself (`/v1/messages/count_tokens`).
    `budget` is the request's own generation limit per task (None: it gives none), `stream` whether it streams.
    """

    route: str
    template: bool = False
    texts: list[str] = field(default_factory=list)
    token_counts: list[int] = field(default_factory=list)
    count_route: str | None = None
    budget: int | None = None
    stream: bool = False
    model: str | None = None

    def bound(self) -> int | None:
        """At least as many prompt tokens as the server will count, without asking it; None for chat and messages.

        A tokenizer gives at most one token per byte (byte fallback), plus the few it adds (BOS, a leading
        space, EOS): a text of B bytes is at most B + 4 tokens. Token prompts are exact.
        """
        if self.template or self.count_route is not None:
            return None
        return sum(len(t.encode()) + 4 for t in self.texts) + sum(self.token_counts)

    @property
    def exact(self) -> bool:
        """The prompt is given as tokens only: its size needs no tokenizer."""
        return not self.texts and not self.template and self.count_route is None

    @property
    def tasks(self) -> int:
        """Tasks (slots) the request starts: one per prompt."""
        return max(1, len(self.texts) + len(self.token_counts))


def generation_route(path: str) -> str | None:
    """The generation route `path` names (`/v1/chat/completions`), or None for any other path."""
    return path if path in GENERATION_ROUTES else None


def _budget(body: dict[str, Any]) -> int | None:
    """`n_predict` wins over `max_tokens` (as in llama-server), then `max_completion_tokens`; -1 or absent: none."""
    for key in ("n_predict", "max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value if value >= 0 else None
    return None


def _prompt_parts(prompt: Any) -> tuple[list[str], list[int]] | None:
    """A completion prompt as texts and token counts, or None when its shape is not one llama-server takes."""
    if isinstance(prompt, str):
        return [prompt], []
    if isinstance(prompt, list):
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [], [len(prompt)]
        texts: list[str] = []
        counts: list[int] = []
        for item in prompt:
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
                counts.append(len(item))
            else:
                return None  # mixed text-and-token prompts, multimodal parts: not sized
        return texts, counts
    return None


def plan(path: str, raw: bytes) -> Plan | None:
    """How to size the request `raw` sent to `path`, or None when it cannot be sized (not JSON, not an object,
    no prompt the guard understands): it is then passed on as it is, and llama-server answers it."""
    route = generation_route(path)
    if route is None:
        return None
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(body, dict):
        return None
    model = body.get("model")
    p = Plan(
        route,
        budget=_budget(body),
        stream=body.get("stream") is True,
        model=model if isinstance(model, str) and model else None,
    )
    if route in CHAT_ROUTES:
        if not isinstance(body.get("messages"), list):
            return None
        p.template = True
    elif route in MESSAGES_ROUTES:
        if not isinstance(body.get("messages"), list):
            return None
        p.count_route = "/v1/messages/count_tokens"
    elif route in COMPLETION_ROUTES:
        parts = _prompt_parts(body.get("prompt"))
        if parts is None:
            return None
        p.texts, p.token_counts = parts
    elif route in INFILL_ROUTES:
        # The server builds the infill prompt from these parts (plus a few special tokens): their sum is
        # within a handful of tokens of it.
        texts = [body.get(k) for k in ("input_prefix", "input_suffix", "prompt")]
        if not all(t is None or isinstance(t, str) for t in texts):
            return None
        p.texts = ["".join(t for t in texts if isinstance(t, str))]
    else:  # /v1/responses: no counting route the guard can rely on across builds
        return None
    return p
