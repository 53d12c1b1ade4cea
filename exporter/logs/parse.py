"""Parse llama-server log lines into events. Pure: no I/O, no state, no clock.

A line is first normalised (`normalize`): JSONL wrapping (`--log-jsonl`), ANSI colour codes, the
router's `[ port] ` prefix, the `min.ss.mmm.uuu` elapsed timestamp and the `I/W/E/D` level letter are
removed. Then the message text is matched, never the 12-character function field, which changes
whenever upstream moves code. Every wording in `shared/reference/llama-server-logs.md` that feeds a
metric is accepted, from b3761 (`n_past`, `i =`) to b11434 (`n_tokens`, `off =`, `n_gen`).

Each rule is a regex for the start of a message: the text after `slot … | task N | ` for slot rules;
for the others the text after the `srv  function: ` tag (or the first `: ` of a b9829+ `cmn`/`que`/
`spec` line), where a ` - ` bullet and a library line's `function: ` may come first. All rules are
alternatives of one regex, and `parse_lines` runs it once over a whole batch of lines: the regex
engine skips the lines that carry no metric without any Python code running for them, and a match
names its rule (`Match.lastgroup`), so building the event is one call. That is what lets the exporter
read a large log several times faster than mtail. `parse_line` is the same scan on one line.
Unknown lines give no event: most of a log is not interesting and that is not an error.

    >>> parse_line("0.00.064.202 E srv    send_error: task id = 24, error: Context size has been exceeded.")
    RequestError(task=24, reason='context_exceeded')
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable, Sequence

from exporter.logs import events as ev

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Router prefix, elapsed timestamp, level letter. Whitespace classes exclude "\n": the scan runs over many lines.
# (`(?:x|)` rather than `(?:x)?`, and ASCII classes: the same matches, found faster by Python's regex engine.)
# The mark is not llama-server's: `unwrap_marked` puts it where it removed JSONL wrapping or colours.
_LEAD = r"(?:[\udc1d\udc1e]|)(?:\[[^\S\n]*\d+\] |)(?:\d+\.\d{2}\.\d{3}\.\d{3} |)(?:[IWEDT] |)"
_LEAD_RX = re.compile(_LEAD, re.ASCII)
_LEAD_PARTS = re.compile(
    r"(?P<mark>[\udc1d\udc1e]|)(?:\[ *\d+\] |)(?P<ts>\d+\.\d{2}\.\d{3}\.\d{3} |)(?P<lvl>[IWEDT] |)"
)


# llama-server's own `--log-jsonl` shape, message last: the message is decoded without the rest of
# the object, 0.9 µs a line against 2.2 for json.loads, with the same result (a test holds it to that).
_JSONL_HEAD = re.compile(r'\{"type":"log","time":-?(?:0|[1-9]\d*),"level":"\w*","msg":"')
# json's own string decoder (C): (text, index after the opening quote) -> (value, index after the closing one).
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


def _jsonl_message(line: str) -> str | None:
    """The "msg" of a JSONL log entry, or None if the line is not a JSON object with a string "msg"."""
    m = _JSONL_HEAD.match(line)
    if m is not None:
        try:
            msg, end = _scanstring(line, m.end())
        except ValueError:
            pass
        else:
            if line[end:].strip(" \t\r\n") == "}":
                return msg
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    value: object = obj.get("msg") if isinstance(obj, dict) else None
    return value if isinstance(value, str) else None


# Lone surrogates: UTF-8 decoding (the tailer's, the journal's, standard input's) never yields one, so
# no line read from a log can start with a mark.
_JSONL_MARK, _COLOURS_MARK = "\udc1e", "\udc1d"


def unwrap_marked(line: str) -> str:
    """`unwrap`, with a mark in front of the line for what it removed (JSONL wrapping, colours in front).

    The scan reads the mark into the line's format (`LineFormat`), so that a raw line in a JSONL log, or
    a line without colours in a coloured one, can be told apart from the server's.
    """
    if line.startswith("{") and '"msg"' in line:
        msg = _jsonl_message(line)
        if msg is not None:
            msg = msg.split("\n", 1)[0]
            return _JSONL_MARK + (ANSI.sub("", msg) if "\x1b" in msg else msg).rstrip("\r")
    if "\x1b" in line:
        mark = _COLOURS_MARK if line.startswith("\x1b[") else ""
        return mark + ANSI.sub("", line).rstrip("\r\n")
    return line.rstrip("\r\n")


def unwrap(line: str) -> str:
    """The line without JSONL wrapping, colours and line ending (still with prefix, timestamp and level)."""
    line = unwrap_marked(line)
    return line[1:] if line[:1] in (_JSONL_MARK, _COLOURS_MARK) else line


def normalize(line: str) -> str:
    """Return the bare message of a log line: no JSONL wrapper, colours, router prefix, timestamp or level."""
    return _LEAD_RX.sub("", unwrap(line), count=1)


def _reason(message: str) -> str:
    """Bounded label value for an error message (never free text in a label)."""
    m = message.lower()
    if "context size has been exceeded" in m or "kv cache is full" in m or "too big compared to kv size" in m:
        return "context_exceeded"
    if "invalid input batch" in m:
        return "invalid_batch"
    if "compute error" in m:
        return "compute_error"
    if "exceeds the available context size" in m or "larger than the max context size" in m:
        return "prompt_too_long"
    if "context shift is disabled" in m:
        return "context_shift_disabled"
    if "cancel" in m:
        return "cancelled"
    return "other"


# A decimal number as llama-server prints one (%f, %.2f): digits bounded, so float() cannot fail or stall.
_FLOAT = r"\d{1,12}(?:\.\d{1,9}|)"


def _opt_float(text: str | None) -> float | None:
    return float(text) if text else None


def _rate(text: str | None) -> float | None:
    """A speed in tokens/s; 0 and absent are both 'unknown' (llama-server prints 0 before it can measure)."""
    value = float(text) if text else 0.0
    return value if value > 0 else None


def _timing(prompt: str | None, ms: str, tokens: str, continuation: bool = False) -> ev.Event:
    if prompt:
        return ev.PromptEvalTiming(float(ms), int(tokens), continuation)
    return ev.GenerationTiming(float(ms), int(tokens), continuation)


_M = re.Match[str]
# (leading words, regex, build): a rule is tried on messages that start with one of its words.
# Group names must be unique over all rules: they share one regex.
# Slot rules: the regex matches the text after `| task N | `; build gets the slot id, the task id and the match.
_SLOT_RULES: list[tuple[str, str, Callable[[int, int, _M], ev.Event]]] = [
    (
        "n_gen n_decoded",
        r"n_(?:gen|decoded) = +(?P<n_gen>\d+), tg = +(?P<tg>" + _FLOAT + r") t/s"
        r"(?:, tg_3s = +(?P<tg_3s>" + _FLOAT + ")|)",
        lambda s, t, m: ev.GenerationProgress(s, t, int(m["n_gen"]), _rate(m["tg_3s"] or m["tg"])),
    ),
    (
        "prompt eval",
        r"(?P<slot_prompt>prompt )?eval time = +(?P<slot_ms>[\d.]+) ms / +(?P<slot_tokens>\d+) tokens",
        lambda s, t, m: _timing(m["slot_prompt"], m["slot_ms"], m["slot_tokens"]),
    ),
    (
        "created saved",
        r"(?:created|saved) context checkpoint (?P<ck_index>\d+) of (?P<ck_max>\d+) \(pos_min = (?P<ck_min>-?\d+), "
        r"pos_max = (?P<ck_pos_max>-?\d+)(?:, n_tokens = \d+)?, size = (?P<ck_mib>[\d.]+) MiB",
        lambda s, t, m: ev.CheckpointCreated(
            s, int(m["ck_index"]), int(m["ck_max"]), int(m["ck_min"]), int(m["ck_pos_max"]), float(m["ck_mib"])
        ),
    ),
    (
        "erasing erased",
        r"(?P<erased>erasing old|erasing context checkpoint too close|erased invalidated) .*?\(pos_min = "
        r"(?P<erased_min>-?\d+), pos_max = (?P<erased_max>-?\d+),.*?size = (?P<erased_mib>[\d.]+) MiB",
        lambda s, t, m: ev.CheckpointRemoved(
            s,
            "invalidated" if m["erased"] == "erased invalidated" else "evicted",
            int(m["erased_min"]),
            int(m["erased_max"]),
            float(m["erased_mib"]),
        ),
    ),
    ("restored", r"restored context checkpoint", lambda s, t, m: ev.CheckpointRestored(s)),
    ("failed", r"failed to restore context checkpoint", lambda s, t, m: ev.CheckpointRestoreFailed(s)),
    (
        "superseding",
        r"superseding context checkpoint at n_tokens = (?P<superseded>\d+)",
        lambda s, t, m: ev.CheckpointSuperseded(s, int(m["superseded"])),
    ),
    (
        "SWA",
        r"SWA checkpoint create, pos_min = (?P<swa_min>-?\d+), pos_max = (?P<swa_max>-?\d+), "
        r"size = (?P<swa_mib>[\d.]+) MiB, total = (?P<swa_index>\d+)/(?P<swa_total>\d+)",
        lambda s, t, m: ev.CheckpointCreated(
            s, int(m["swa_index"]), int(m["swa_total"]), int(m["swa_min"]), int(m["swa_max"]), float(m["swa_mib"])
        ),
    ),
    (
        "SWA",
        r"SWA checkpoint erase, pos_min = (?P<swe_min>-?\d+), pos_max = (?P<swe_max>-?\d+), "
        r"size = (?P<swe_mib>[\d.]+) MiB",
        lambda s, t, m: ev.CheckpointRemoved(s, "evicted", int(m["swe_min"]), int(m["swe_max"]), float(m["swe_mib"])),
    ),
    ("SWA", r"SWA checkpoint restore", lambda s, t, m: ev.CheckpointRestored(s)),
    ("forcing", r"forcing full prompt re-processing", lambda s, t, m: ev.FullReprocess(s)),
    ("selected", r"selected slot by", lambda s, t, m: ev.SlotSelected(s)),
    (
        "stop",
        r"stop processing: (?:n_past|n_tokens) = (?P<released>\d+)",
        lambda s, t, m: ev.SlotReleased(s, t, int(m["released"])),
    ),
    (
        "clearing",
        r"clearing (?:prompt|slot) with (?P<cleared>\d+) tokens",
        lambda s, t, m: ev.SlotCleared(s, int(m["cleared"])),
    ),
    ("processing", r"processing task\b", lambda s, t, m: ev.TaskStarted(s, t)),
    (
        "new prompt",
        r"(?:new prompt|prompt tokenized), n_ctx_slot = (?P<prompt_ctx>\d+), n_keep = -?\d+, "
        r"(?:task\.n_tokens|n_prompt_tokens) = (?P<prompt_tokens>\d+)",
        lambda s, t, m: ev.NewPrompt(s, t, int(m["prompt_ctx"]), int(m["prompt_tokens"])),
    ),
    (
        "cached n_past n_tokens",
        r"(?:cached )?(?:n_past|n_tokens) = (?P<cached>\d+), memory_seq_rm \[",
        lambda s, t, m: ev.CachedTokens(s, t, int(m["cached"])),
    ),
    ("kv", r"kv cache rm \[(?P<kv_rm>\d+), end\)", lambda s, t, m: ev.CachedTokens(s, t, int(m["kv_rm"]))),
    (
        "prompt",
        r"prompt processing, n_tokens = +(?P<processed>\d+), progress = (?P<pp_frac>" + _FLOAT + r")"
        r"(?:, t = +(?P<pp_t>" + _FLOAT + r") s / (?P<pp_rate>" + _FLOAT + r") tokens per second|)",
        lambda s, t, m: ev.PromptProgress(
            s, t, int(m["processed"]), False, float(m["pp_frac"]), _opt_float(m["pp_t"]), _rate(m["pp_rate"])
        ),
    ),
    (
        "prompt",
        r"prompt processing progress, (?:n_past|n_tokens) = (?P<progress>\d+), (?:n_tokens|batch\.n_tokens) = \d+, "
        r"progress = (?P<old_frac>" + _FLOAT + ")",
        lambda s, t, m: ev.PromptProgress(s, t, int(m["progress"]), True, float(m["old_frac"])),
    ),
    (
        "prompt",
        r"prompt processing progress, (?:n_past|n_tokens) = (?P<progress_bare>\d+),",
        lambda s, t, m: ev.PromptProgress(s, t, int(m["progress_bare"]), absolute=True),
    ),
    (
        "prompt",
        r"prompt (?:processing )?done, (?:n_past|n_tokens) = (?P<done>\d+)",
        lambda s, t, m: ev.PromptProgress(s, t, int(m["done"]), absolute=True),
    ),
    ("saving", r"saving idle slot to prompt cache", lambda s, t, m: ev.IdleSlotSaved(s)),
    ("new", r"new slot,? n_ctx(?:_slot)? = (?P<new_slot>\d+)", lambda s, t, m: ev.SlotCreated(s, int(m["new_slot"]))),
]

# Rules for everything that is not a `slot … | task … |` line: `srv` lines and library lines.
_TEXT_RULES: list[tuple[str, str, Callable[[_M], ev.Event]]] = [
    (
        "failed",
        r"failed to find free space in the KV cache, retrying with smaller batch size.*?\b(?:i|off) = "
        r"(?P<retry_off>\d+), n_batch = (?P<retry_batch>\d+)",
        lambda m: ev.KVRetry(int(m["retry_off"]), int(m["retry_batch"])),
    ),
    (
        "failed",
        r"failed to find a memory slot for batch of size (?P<memory_batch>\d+)",
        lambda m: ev.MemorySlotFailure(int(m["memory_batch"])),
    ),
    (
        "failed",
        r"failed to find KV cache slot for u?batch of size (?P<kv_slot_batch>\d+)",
        lambda m: ev.MemorySlotFailure(int(m["kv_slot_batch"])),
    ),
    ("all", r"all slots are idle", lambda m: ev.AllSlotsIdle()),
    (
        "task",
        r"task id = (?P<error_task>\d+), error: (?P<error>.*)$",
        lambda m: ev.RequestError(int(m["error_task"]), _reason(m["error"])),
    ),
    (
        "Context Invalid Compute",
        r"(?P<fatal>Context size has been exceeded\.|Invalid input batch\.|Compute error\.),? (?:i|off) = \d+, n_batch",
        lambda m: ev.DecodeFatal(_reason(m["fatal"])),
    ),
    ("failed", r"failed to decode the batch: KV cache is full", lambda m: ev.DecodeFatal("context_exceeded")),
    ("decode()", r"decode\(\) failed: (?P<decode_error>.*)$", lambda m: ev.DecodeFailed(m["decode_error"].strip())),
    (
        "purging",
        r"purging slot (?P<purged>\d+) with (?P<purged_tokens>\d+) tokens",
        lambda m: ev.SlotPurged(int(m["purged"]), int(m["purged_tokens"])),
    ),
    (
        "llama_context llama_init_from_model llama_new_context_with_model",
        r"(?:llama_context|llama_init_from_model|llama_new_context_with_model): "
        r"(?P<param>n_ctx|n_ctx_seq|n_ctx_per_seq|n_seq_max|n_batch|n_ubatch)[^\S\n]+= (?P<param_value>\d+)[^\S\n]*$",
        lambda m: ev.ContextParam("n_ctx_seq" if m["param"] == "n_ctx_per_seq" else m["param"], int(m["param_value"])),
    ),
    (
        "llama_context llama_init_from_model",
        r"(?:llama_context|llama_init_from_model): kv_unified[^\S\n]+= (?P<kv_unified>true|false)[^\S\n]*$",
        lambda m: ev.ContextParam("kv_unified", int(m["kv_unified"] == "true")),
    ),
    (
        "llama_kv_cache",
        r"llama_kv_cache\w*: size = +(?P<kv_mib>[\d.]+) MiB \( *(?P<kv_cells>\d+) cells, +\d+ layers"
        r"(?:, +(?P<kv_seqs>\d+)(?:/ *(?P<kv_streams>\d+))? seqs)?\), "
        r"K \((?P<kv_type_k>\w+)\): +(?P<kv_k_mib>[\d.]+) MiB, V \((?P<kv_type_v>\w+)\): +(?P<kv_v_mib>[\d.]+) MiB",
        lambda m: ev.KVCacheSize(
            size_mib=float(m["kv_mib"]),
            cells=int(m["kv_cells"]),
            seqs=int(m["kv_seqs"]) if m["kv_seqs"] else None,
            streams=int(m["kv_streams"]) if m["kv_streams"] else None,
            type_k=m["kv_type_k"],
            k_mib=float(m["kv_k_mib"]),
            type_v=m["kv_type_v"],
            v_mib=float(m["kv_v_mib"]),
        ),
    ),
    (
        "KV",
        r"KV self size += +(?P<self_mib>[\d.]+) MiB, K \((?P<self_type_k>\w+)\): +(?P<self_k_mib>[\d.]+) MiB, "
        r"V \((?P<self_type_v>\w+)\): +(?P<self_v_mib>[\d.]+) MiB",
        lambda m: ev.KVCacheSize(
            float(m["self_mib"]),
            None,
            None,
            None,
            m["self_type_k"],
            float(m["self_k_mib"]),
            m["self_type_v"],
            float(m["self_v_mib"]),
        ),
    ),
    (
        "creating",
        r"creating +(?P<section>non-SWA|SWA) KV cache, size = (?P<section_cells>\d+) cells",
        lambda m: ev.KVCacheSection(swa=m["section"] == "SWA", cells=int(m["section_cells"])),
    ),
    (
        "initializing",
        r"initializing(?: slots)?, n_slots = (?P<n_slots>\d+)"
        r"(?:, n_ctx_slot = (?P<init_ctx>\d+), kv_unified = '(?P<init_unified>true|false)')?",
        lambda m: ev.SlotsInitialized(
            int(m["n_slots"]),
            int(m["init_ctx"]) if m["init_ctx"] else None,
            (m["init_unified"] == "true") if m["init_unified"] else None,
        ),
    ),
    ("initializing", r"initializing \.\.\.$", lambda m: ev.ServerStarting()),
    (
        "router server listening",
        r"(?:router )?(?:server is )?listening on (?P<address>\S+?)(?: - starting the main loop)?$",
        lambda m: ev.ServerReady(m["address"]),
    ),
    ("loading", r"loading model '(?P<model>.*)'$", lambda m: ev.ModelLoading(m["model"])),
    # Router mode's own lines about its children (b7218+). A name is a model id: no space, bounded length.
    ("starting", r"starting server in router mode\b", lambda m: ev.RouterMode()),
    (
        "spawning",
        r"spawning server instance with name=(?P<spawn_name>[^\s]{1,200}) on port (?P<spawn_port>\d{1,5})$",
        lambda m: ev.ChildSpawned(m["spawn_name"], int(m["spawn_port"])),
    ),
    (
        "stopping",
        r"stopping model instance name=(?P<stop_name>[^\s]{1,200})$",
        lambda m: ev.ChildStopping(m["stop_name"]),
    ),
    (
        "instance",
        r"instance name=(?P<exit_name>[^\s]{1,200}) exited with status (?P<exit_status>-?\d{1,6})$",
        lambda m: ev.ChildExited(m["exit_name"], int(m["exit_status"])),
    ),
    ("failed", r"failed to load model, '(?P<failed_model>.*)'$", lambda m: ev.ModelLoadFailed(m["failed_model"])),
    # b11434: `srv    operator(): operator(): cleaning up before exit...` (the signal handler's lambda).
    ("cleaning operator()", r"(?:operator\(\): )?cleaning up before exit\.\.\.$", lambda m: ev.ServerExiting()),
    (
        "projected",
        r"projected to use (?P<proj_used>\d+) MiB of (?P<proj_kind>host|device) memory vs\. "
        r"(?P<proj_avail>\d+) MiB of (?:total host|free device) memory$",
        lambda m: ev.MemoryProjection(m["proj_kind"], int(m["proj_used"]), int(m["proj_avail"])),
    ),
    (
        "capping",
        r"capping per-slot context \((?P<cap_requested>\d+)\) to --kv-unified-per-slot \((?P<cap>\d+)\)",
        lambda m: ev.PerSlotCap(int(m["cap_requested"]), int(m["cap"])),
    ),
    (
        "idle",
        r"idle slots will be saved to prompt cache and cleared upon starting a new task",
        lambda m: ev.IdleSlotPolicy(clear_on_new_task=True),
    ),
    # The commit is a hash, or whatever a packager passed as LLAMA_BUILD_COMMIT (`unknown`, `b11434`, a version).
    (
        "build",
        r"build:? (?P<build>\d+) \((?P<commit>[\w.+-]{1,64})\)",
        lambda m: ev.BuildInfo(int(m["build"]), m["commit"]),
    ),
    (
        "build_info",
        r"build_info: b(?P<build_info>\d+)-(?P<build_commit>\w+)",
        lambda m: ev.BuildInfo(int(m["build_info"]), m["build_commit"], tag=True),
    ),
    ("verbosity", r"verbosity = (?P<verbosity>\d+) \(adjust with", lambda m: ev.Verbosity(int(m["verbosity"]))),
    # Pre-b9230 timings are continuation lines without a slot tag.
    (
        "prompt eval",
        r"(?P<text_prompt>prompt )?eval time = +(?P<text_ms>[\d.]+) ms / +(?P<text_tokens>\d+) tokens",
        lambda m: _timing(m["text_prompt"], m["text_ms"], m["text_tokens"], continuation=True),
    ),
    (
        "cache",
        r"cache state: (?P<cache_prompts>\d+) prompts, (?P<cache_mib>[\d.]+) MiB \(limits: (?P<cache_limit>[\d.]+) MiB",
        lambda m: ev.PromptCacheState(int(m["cache_prompts"]), float(m["cache_mib"]), float(m["cache_limit"])),
    ),
    (
        "prompt",
        r"prompt with length +(?P<candidate>\d+), lcp = +-?\d+, f_keep = (?P<candidate_keep>[-\d.]+), "
        r"f_sim = (?P<candidate_sim>[-\d.]+)",
        lambda m: ev.PromptCacheCandidate(int(m["candidate"]), m["candidate_keep"], m["candidate_sim"]),
    ),
    (
        "found",
        r"found better prompt with f_keep = (?P<loaded_keep>[-\d.]+), f_sim = (?P<loaded_sim>[-\d.]+)",
        lambda m: ev.PromptLoaded(m["loaded_keep"], m["loaded_sim"]),
    ),
    (
        "saving",
        r"saving prompt with length (?P<saved>\d+), total state size = (?P<saved_mib>[\d.]+) MiB",
        lambda m: ev.PromptSaved(int(m["saved"]), float(m["saved_mib"])),
    ),
    (
        "removing",
        r"removing obsolete cached prompt with length (?P<removed>\d+)",
        lambda m: ev.PromptCacheRemoved(int(m["removed"])),
    ),
    ("making", r"making room for prompt cache entry, removing oldest entry", lambda m: ev.PromptCacheRemoved(None)),
    (
        "prompt",
        r"prompt cache is (?:enabled, size limit: (?:(?P<cache_ram>\d+) MiB|(?P<no_limit>no limit))"
        r"|(?P<cache_off>disabled))",
        lambda m: ev.PromptCacheLimit(float(m["cache_ram"]) if m["cache_ram"] else (None if m["no_limit"] else 0.0)),
    ),
    (
        "cache",
        r"cache size limit reduced to (?P<reduced>[\d.]+) MiB",
        lambda m: ev.PromptCacheLimit(float(m["reduced"])),
    ),
    (
        "context",
        r"context checkpoints (?:enabled, max = (?P<checkpoints>\d+)|disabled)",
        lambda m: ev.CheckpointConfig(int(m["checkpoints"]) if m["checkpoints"] else 0),
    ),
]


def _alternatives(rules: Sequence[tuple[str, str, object]], tag: str) -> str:
    """`(?=word|…)(?:rule0(?P<tag0>)|rule1(?P<tag1>)|…)`.

    The lookahead on the rules' leading words rejects most lines after a character or two, before
    the rules are tried one by one. The empty group at the end of each rule closes last, so
    `Match.lastgroup` names the rule that matched.
    """
    words = sorted({word for words, _, _ in rules for word in words.split()}, key=len, reverse=True)
    rules_rx = "|".join(f"{rx}(?P<{tag}{i}>)" for i, (_, rx, _) in enumerate(rules))
    return f"(?={'|'.join(map(re.escape, words))})(?:{rules_rx})"


def _atomic(pattern: str, name: str) -> str:
    """`pattern`, matched once and never backtracked into: only for speed, the matches are the same."""
    if sys.version_info >= (3, 11):
        return f"(?>{pattern})"
    return f"(?=(?P<{name}>{pattern}))(?P={name})"  # the same, spelled with a lookahead and a back-reference


# One message: a slot line, or the text of any other line after its optional tag (`srv  function: `, or
# up to the first `: ` of a `cmn`/`que`/`spec` line) and a ` - ` bullet, then either a library line's
# `function: ` or not (`llama_context: n_ctx = …` and `build: 4747 (…)` are matched with their name).
_MESSAGE = (
    r"(?:slot [^\S\n]{0,11}(?:(?=print_timing: )(?P<timing_fn>)|)\S{1,12}: "
    r"id[^\S\n]+(?P<slot>\d+) \| task (?P<task>-?\d+) \| ? *"
    # A slot line with no message from `print_timings`: the head of a pre-b9230 timings entry. The message
    # is empty, so the function field is all that tells it from other such lines (`slot reset:` at -v).
    + "(?:(?(timing_fn)(?P<timings_head>)$|(?!))|"
    + _alternatives(_SLOT_RULES, "s")
    + ")|"
    + _atomic(r"(?:srv [^\S\n]*\S{1,12}: |(?:cmn|que|spec) (?:[^:\n]|:(?! ))*: |) *-? *", "tag")
    + "(?:"
    + _atomic(r"\w+: +-? *", "function")
    + ")?"
    + _alternatives(_TEXT_RULES, "t")
    + ")"
)
# Lines start after "\n": a literal first character lets the regex engine jump from line to line in C.
_SCAN_LINES = re.compile(r"\n(?P<lead>" + _atomic(_LEAD, "lead_") + ")" + _MESSAGE, re.MULTILINE | re.ASCII)
_SLOT_BUILDS: dict[str, Callable[[int, int, _M], ev.Event]] = {
    f"s{i}": build for i, (_, _, build) in enumerate(_SLOT_RULES)
}
_SLOT_BUILDS["timings_head"] = lambda s, t, m: ev.TimingsHead(s, t)
_TEXT_BUILDS = {f"t{i}": build for i, (_, _, build) in enumerate(_TEXT_RULES)}


# What building an event from a matched line can raise: int() of more digits than Python reads (4,300 by
# default), float() of "1.2.3". The line is then rejected, never the batch it came in.
_UNREADABLE = (ValueError, OverflowError)


def _line_format(lead: str) -> int:
    """The `LineFormat` code of a line's lead (what the scan read before the message; colours count
    only with a prefix)."""
    m = _LEAD_PARTS.match(lead)
    if m is None:  # cannot happen: the scan matched the same pattern
        return 0
    mark, ts, level = m.group("mark", "ts", "lvl")
    code = (ev.LineFormat.TIMESTAMP if ts else 0) | (ev.LineFormat.LEVEL if level else 0)
    if mark == _JSONL_MARK:
        return code | ev.LineFormat.JSONL
    if mark and code:
        return code | ev.LineFormat.COLOURS
    return code


def _event(m: re.Match[str]) -> ev.Event:
    """The event of a scan match: built by the rule it names (`Rejected` when a number cannot be read)."""
    rule = m.lastgroup or ""
    try:
        build = _TEXT_BUILDS.get(rule)
        if build is not None:
            return build(m)
        return _SLOT_BUILDS[rule](int(m["slot"]), int(m["task"]), m)
    except _UNREADABLE:
        return ev.Rejected("malformed")


def _events(text: str, scan: re.Pattern[str], formats: bool = True) -> list[ev.Event]:
    """The events of the lines in `text`, each line preceded by "\\n"; with `formats`, a `LineFormat`
    before the first event and before each event whose line is written differently from the last one's.

    `_event` written out inline: the hot path of every line the exporter reads, and a call per
    event costs 5-10 % of it (measured on the bench corpus). A `try` costs nothing until it catches.
    """
    events: list[ev.Event] = []
    last, lead_len, lead_first = -1, -1, ""
    for m in scan.finditer(text):
        if formats:
            # A lead of the same length and first character as the last one is written the same way
            # (its time stamp differs): the format is worked out only when that changes.
            start, end = m.span(1)  # the lead
            if end - start != lead_len or text[start] != lead_first:
                lead_len, lead_first = end - start, text[start]
                code = _line_format(text[start:end])
                if code != last:
                    events.append(ev.LineFormat(code))
                    last = code
        rule = m.lastgroup or ""
        try:
            build = _TEXT_BUILDS.get(rule)
            if build is not None:
                events.append(build(m))
            else:
                events.append(_SLOT_BUILDS[rule](int(m["slot"]), int(m["task"]), m))
        except _UNREADABLE:
            events.append(ev.Rejected("malformed"))
    return events


def line_starts_with(text: str, char: str) -> bool:
    """Whether a line of `text` (lines separated by "\\n", the first one after it) starts with `char`.

    For a character that is rare in a log (`[`, `{`): each one is found by a memchr and its line start
    checked, several times cheaper than searching for "\\n" + char, which stops at every line. Past
    one for every 256 characters (a log has about one in a KiB), the rest of the text is searched that
    way: no text costs more than about a third more than that search.
    """
    i = text.find(char, 1)
    for _ in range(64 + (len(text) >> 8)):
        if i < 0:
            return False
        if text[i - 1] == "\n":
            return True
        i = text.find(char, i + 1)
    return i >= 0 and text.find("\n" + char, i - 1) >= 0


def is_plain(text: str) -> bool:
    """No line in `text` needs `unwrap_marked`: no JSONL, colours or CR."""
    return not ("\x1b" in text or "\r" in text or line_starts_with(text, "{"))


def parse_lines(lines: Sequence[str]) -> list[ev.Event]:
    """The events of many raw log lines, in order (one line gives at most one event, after its `LineFormat`).

    The same events as `parse_line` on each line, at a fraction of the cost: plain text is scanned as
    one string; only a batch with JSONL, colours or CRLF line ends is unwrapped line by line first.
    """
    return parse_joined("\n" + "\n".join(lines), lines)


def parse_joined(text: str, lines: Sequence[str]) -> list[ev.Event]:
    """`parse_lines` for a caller that has joined the lines already: `text` is "\n" + "\n".join(lines)."""
    if not is_plain(text):
        text = "\n" + "\n".join([unwrap_marked(line) for line in lines])
    return _events(text, _SCAN_LINES)


def parse_text_indexed(text: str) -> list[tuple[int, int, ev.Event]]:
    """The events of `text`, lines separated by "\\n", each with the index of its line and the
    offset in `text` where that line starts.

    For callers that need to know which line an event came from (`diagnose`). The lines must be
    plain (see `is_plain`) or already passed through `unwrap_marked`.
    """
    scan = "\n" + text
    out: list[tuple[int, int, ev.Event]] = []
    index, counted_to, last = 0, 0, -1
    lead_len, lead_first = -1, ""
    # `_line_format` and `_event` written out inline, as in `_events` (the hot path of `diagnose`).
    for m in _SCAN_LINES.finditer(scan):
        start = m.start()  # this line's "\n" in `scan`, i.e. where the line starts in `text`
        index += scan.count("\n", counted_to, start)  # newlines before this line's own "\n"
        counted_to = start
        lead_start, lead_end = m.span(1)
        if lead_end - lead_start != lead_len or scan[lead_start] != lead_first:
            lead_len, lead_first = lead_end - lead_start, scan[lead_start]
            code = _line_format(scan[lead_start:lead_end])
            if code != last:
                out.append((index, start, ev.LineFormat(code)))
                last = code
        rule = m.lastgroup or ""
        try:
            build = _TEXT_BUILDS.get(rule)
            e = build(m) if build is not None else _SLOT_BUILDS[rule](int(m["slot"]), int(m["task"]), m)
        except _UNREADABLE:
            e = ev.Rejected("malformed")
        out.append((index, start, e))
    return out


@functools.cache
def _scan_messages() -> re.Pattern[str]:
    """The scan for messages without their lead: compiled on first use (only tests parse bare messages)."""
    return re.compile(r"\n" + _MESSAGE, re.MULTILINE | re.ASCII)


def parse_message(msg: str) -> ev.Event | None:
    """Parse a normalised message (see `normalize`)."""
    events = _events("\n" + msg, _scan_messages(), formats=False)
    return events[0] if events else None


def parse_line_events(line: str) -> list[ev.Event]:
    """The events of one raw line: none, or its `LineFormat` and its event."""
    return _events("\n" + unwrap_marked(line), _SCAN_LINES)


def parse_line(line: str) -> ev.Event | None:
    """Parse one raw log line (any era, any prefix/colour/JSONL form) into an event, or None."""
    events = _events("\n" + unwrap_marked(line), _SCAN_LINES, formats=False)
    return events[0] if events else None
