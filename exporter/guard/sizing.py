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
    >>> plan("/v1/completions", b'{"prompt": "hi", "n": 3, "max_tokens": 600}').tasks  # three completions, one prompt
    3
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

#: The server's own counting routes (b11434): the body converted, templated and tokenized as the generation
#: route does it, images and audio included where the model reads them.
CHAT_COUNT_ROUTE = "/v1/chat/completions/input_tokens"
RESPONSES_COUNT_ROUTE = "/v1/responses/input_tokens"
MESSAGES_COUNT_ROUTE = "/v1/messages/count_tokens"


@dataclass
class Plan:
    """How to size one request.

    - `template`: chat messages: `/apply-template` the body, then `/tokenize` the result;
    - `texts`: prompts to `/tokenize` (one task each); `token_counts`: prompts given as tokens;
    - `count_route`: a route of the server that counts the body's input tokens itself (`/v1/messages/count_tokens`).
    `budget` is the request's own generation limit per task (None: it gives none), `stream` whether it streams.
    `copies` is the completions asked per prompt (`n_cmpl`, or its alias `n`): llama-server starts one task in
    its own slot for each, and they share their prompt's cells (the children copy the parent's sequence).
    `media`: the body holds images or audio, which only the server's counting route can count; where it has none,
    the prompt is counted at the slot's window (the most one task can hold).
    """

    route: str
    template: bool = False
    texts: list[str] = field(default_factory=list)
    token_counts: list[int] = field(default_factory=list)
    count_route: str | None = None
    budget: int | None = None
    stream: bool = False
    model: str | None = None
    copies: int = 1
    media: bool = False
    windows: int = 0  # prompts counted at the slot's window (multimodal completion prompts)

    def bound(self) -> int | None:
        """At least as many prompt tokens as the server will count, without asking it; None for chat and messages.

        A tokenizer gives at most one token per byte (byte fallback), plus the few it adds (BOS, a leading
        space, EOS): a text of B bytes is at most B + 4 tokens. Token prompts are exact.
        """
        if self.template or self.count_route is not None or self.media:
            return None
        return sum(len(t.encode()) + 4 for t in self.texts) + sum(self.token_counts)

    @property
    def exact(self) -> bool:
        """The prompt is given as tokens only: its size needs no tokenizer."""
        return not self.texts and not self.template and self.count_route is None and not self.media

    @property
    def prompts(self) -> int:
        """Prompts the request carries (several only on the completion routes)."""
        return max(1, len(self.texts) + len(self.token_counts) + self.windows)

    @property
    def tasks(self) -> int:
        """Tasks (slots) the request starts: one per prompt and completion asked (`n`)."""
        return self.prompts * self.copies


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


def _copies(body: dict[str, Any]) -> int:
    """Completions asked per prompt: `n_cmpl`, else its alias `n` (as llama-server reads them); 1 without either.

    llama-server refuses a value past its slots (`-np`); the guard counts what was asked and lets it say so."""
    for key in ("n_cmpl", "n"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return max(1, value)
    return 1


#: Content parts that are no text: images and audio take cells that a text tokenizer does not count.
_MEDIA_PARTS = frozenset(
    {"image_url", "input_image", "input_audio", "image", "audio", "document", "file", "input_file"}
)


def _has_media(value: Any) -> bool:
    """Whether a message list (or a Responses `input`) holds a part that is no text."""
    if isinstance(value, list):
        return any(_has_media(v) for v in value)
    if isinstance(value, dict):
        if value.get("type") in _MEDIA_PARTS:
            return True
        return any(_has_media(value.get(k)) for k in ("content", "output"))
    return False


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
        copies=_copies(body),
    )
    if route in CHAT_ROUTES:
        if not isinstance(body.get("messages"), list):
            return None
        if _has_media(body["messages"]):
            p.media = True
            p.count_route = CHAT_COUNT_ROUTE
        else:
            p.template = True
    elif route in MESSAGES_ROUTES:
        if not isinstance(body.get("messages"), list):
            return None
        p.count_route = MESSAGES_COUNT_ROUTE
        p.media = _has_media(body["messages"])
    elif route in RESPONSES_ROUTES:
        # llama-server turns `instructions` and `input` (a text or a list of items) into chat messages, then
        # templates and tokenizes them as chat; its counting route does exactly that.
        if not isinstance(body.get("input"), (str, list)):
            return None
        p.count_route = RESPONSES_COUNT_ROUTE
        p.media = _has_media(body["input"])
    elif route in COMPLETION_ROUTES:
        prompt = body.get("prompt")
        parts = _prompt_parts(prompt)
        if parts is None:
            if not _multimodal_prompt(prompt):
                return None
            p.media = True  # each counted at the slot's window: no route counts it
            p.windows = len(prompt) if isinstance(prompt, list) else 1
            return p
        p.texts, p.token_counts = parts
    elif route in INFILL_ROUTES:
        # The server builds the infill prompt from these parts (plus a few special tokens): their sum is
        # within a handful of tokens of it.
        texts = [body.get(k) for k in ("input_prefix", "input_suffix", "prompt")]
        if not all(t is None or isinstance(t, str) for t in texts):
            return None
        p.texts = ["".join(t for t in texts if isinstance(t, str))]
    return p


def _multimodal_prompt(prompt: Any) -> bool:
    """A completion prompt with `multimodal_data` (one object, or a list of them)."""
    items = prompt if isinstance(prompt, list) else [prompt]
    return bool(items) and all(isinstance(i, dict) and "multimodal_data" in i for i in items)


def server_path(raw_path: str) -> str:
    """The path llama-server routes `raw_path` (as sent, query included) by: its HTTP library cuts the fragment
    and the query and decodes `%XX` (and `%uXXXX`) escapes, and does not resolve `.` or `..` segments.

    >>> server_path("/v1/chat%2Fcompletions?x=%2F")
    '/v1/chat/completions'
    >>> server_path("/v1/../health")
    '/v1/../health'
    """
    path = raw_path.split("#", 1)[0].split("?", 1)[0]
    if "%" not in path:
        return path
    out = bytearray()
    i = 0
    while i < len(path):
        c = path[i]
        if c == "%" and path[i + 1 : i + 2] == "u" and _is_hex(path[i + 2 : i + 6], 4):
            out += chr(int(path[i + 2 : i + 6], 16)).encode("utf-8", "surrogatepass")
            i += 6
        elif c == "%" and _is_hex(path[i + 1 : i + 3], 2):
            out.append(int(path[i + 1 : i + 3], 16))
            i += 3
        else:
            out += c.encode("utf-8", "surrogateescape")
            i += 1
    return out.decode("utf-8", "replace")


def _is_hex(s: str, n: int) -> bool:
    return len(s) == n and all(c in "0123456789abcdefABCDEF" for c in s)
