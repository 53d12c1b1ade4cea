"""Parse one llama-server log line into at most one event. Pure: no I/O, no state, no clock.

A line is first normalised (`normalize`): JSONL wrapping (`--log-jsonl`), ANSI colour codes, the
router's `[ port] ` prefix, the `min.ss.mmm.uuu` elapsed timestamp and the `I/W/E/D` level letter are
removed. Then the message text is matched, never the 12-character function field, which changes
whenever upstream moves code. Every wording in `shared/reference/llama-server-logs.md` that feeds a
metric is accepted, from b3761 (`n_past`, `i =`) to b11434 (`n_tokens`, `off =`, `n_gen`).

Unknown lines return None: most of a log is not interesting and that is not an error.

    >>> parse_line("0.00.064.202 E srv    send_error: task id = 24, error: Context size has been exceeded.")
    RequestError(task=24, reason='context_exceeded')
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from exporter.logs import events as ev

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LEAD = re.compile(r"^(?:\[\s*\d+\] )?(?:\d+\.\d{2}\.\d{3}\.\d{3} )?(?:[IWEDT] )?")
_SLOT = re.compile(r"^slot\s{0,12}\S{1,12}: id\s+(\d+) \| task (-?\d+) \| ?(.*)$")
_SRV = re.compile(r"^srv\s+\S{1,12}: (.*)$")


def normalize(line: str) -> str:
    """Return the bare message of a log line: no JSONL wrapper, colours, router prefix, timestamp or level."""
    if line.startswith("{") and '"msg"' in line:
        try:
            obj = json.loads(line)
        except ValueError:
            pass
        else:
            if isinstance(obj, dict) and isinstance(obj.get("msg"), str):
                # A multi-line entry keeps only its first line; the rest never carries a metric.
                line = obj["msg"].split("\n", 1)[0]
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    line = line.rstrip("\r\n")
    return _LEAD.sub("", line, count=1)


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


_TIMING = re.compile(r"(?:^|\s)(prompt )?eval time = +([\d.]+) ms / +(\d+) tokens")


def _timing(m: re.Match[str]) -> ev.Event:
    if m[1]:
        return ev.PromptEvalTiming(float(m[2]), int(m[3]))
    return ev.GenerationTiming(float(m[2]), int(m[3]))


_SlotRule = tuple[str, re.Pattern[str], Callable[[int, int, re.Match[str]], ev.Event]]
# A tuple of keywords means "any of these".
_TextRule = tuple[str | tuple[str, ...], re.Pattern[str], Callable[[re.Match[str]], ev.Event]]

# Ordered by frequency in real logs; the keyword is a cheap substring check before the regex.
_SLOT_RULES: list[_SlotRule] = [
    (
        "n_gen",
        re.compile(r"\bn_gen = +(\d+), tg ="),
        lambda s, t, m: ev.GenerationProgress(s, t, int(m[1])),
    ),
    (
        "n_decoded",
        re.compile(r"\bn_decoded = +(\d+), tg ="),
        lambda s, t, m: ev.GenerationProgress(s, t, int(m[1])),
    ),
    (
        "eval time =",
        _TIMING,
        lambda s, t, m: _timing(m),
    ),
    (
        "context checkpoint",
        re.compile(
            r"(?:created|saved) context checkpoint (\d+) of (\d+) \(pos_min = (-?\d+), pos_max = (-?\d+)"
            r"(?:, n_tokens = \d+)?, size = ([\d.]+) MiB"
        ),
        lambda s, t, m: ev.CheckpointCreated(s, int(m[1]), int(m[2]), int(m[3]), int(m[4]), float(m[5])),
    ),
    (
        "context checkpoint",
        re.compile(
            r"(erasing old|erasing context checkpoint too close|erased invalidated) .*?\(pos_min = (-?\d+), "
            r"pos_max = (-?\d+),.*?size = ([\d.]+) MiB"
        ),
        lambda s, t, m: ev.CheckpointRemoved(
            s, "invalidated" if m[1] == "erased invalidated" else "evicted", int(m[2]), int(m[3]), float(m[4])
        ),
    ),
    (
        "restored context checkpoint",
        re.compile(r"^restored context checkpoint"),
        lambda s, t, m: ev.CheckpointRestored(s),
    ),
    (
        "failed to restore context checkpoint",
        re.compile(r"failed to restore context checkpoint"),
        lambda s, t, m: ev.CheckpointRestoreFailed(s),
    ),
    (
        "superseding context checkpoint",
        re.compile(r"superseding context checkpoint at n_tokens = (\d+)"),
        lambda s, t, m: ev.CheckpointSuperseded(s, int(m[1])),
    ),
    (
        "SWA checkpoint",
        re.compile(
            r"SWA checkpoint create, pos_min = (-?\d+), pos_max = (-?\d+), size = ([\d.]+) MiB, total = (\d+)/(\d+)"
        ),
        lambda s, t, m: ev.CheckpointCreated(s, int(m[4]), int(m[5]), int(m[1]), int(m[2]), float(m[3])),
    ),
    (
        "SWA checkpoint",
        re.compile(r"SWA checkpoint erase, pos_min = (-?\d+), pos_max = (-?\d+), size = ([\d.]+) MiB"),
        lambda s, t, m: ev.CheckpointRemoved(s, "evicted", int(m[1]), int(m[2]), float(m[3])),
    ),
    ("SWA checkpoint restore", re.compile(r"SWA checkpoint restore"), lambda s, t, m: ev.CheckpointRestored(s)),
    (
        "forcing full prompt re-processing",
        re.compile(r"forcing full prompt re-processing"),
        lambda s, t, m: ev.FullReprocess(s),
    ),
    ("selected slot by", re.compile(r"^selected slot by"), lambda s, t, m: ev.SlotSelected(s)),
    (
        "stop processing",
        re.compile(r"stop processing: (?:n_past|n_tokens) = (\d+)"),
        lambda s, t, m: ev.SlotReleased(s, t, int(m[1])),
    ),
    (
        "clearing ",
        re.compile(r"clearing (?:prompt|slot) with (\d+) tokens"),
        lambda s, t, m: ev.SlotCleared(s, int(m[1])),
    ),
    ("processing task", re.compile(r"^processing task\b"), lambda s, t, m: ev.TaskStarted(s, t)),
    (
        "n_ctx_slot",
        re.compile(
            r"(?:new prompt|prompt tokenized), n_ctx_slot = (\d+), n_keep = -?\d+, "
            r"(?:task\.n_tokens|n_prompt_tokens) = (\d+)"
        ),
        lambda s, t, m: ev.NewPrompt(s, t, int(m[1]), int(m[2])),
    ),
    (
        "memory_seq_rm",
        re.compile(r"(?:n_past|n_tokens) = (\d+), memory_seq_rm \["),
        lambda s, t, m: ev.CachedTokens(s, t, int(m[1])),
    ),
    (
        "kv cache rm",
        re.compile(r"kv cache rm \[(\d+), end\)"),
        lambda s, t, m: ev.CachedTokens(s, t, int(m[1])),
    ),
    (
        "prompt processing,",
        re.compile(r"^prompt processing, n_tokens = +(\d+), progress"),
        lambda s, t, m: ev.PromptProgress(s, t, int(m[1]), absolute=False),
    ),
    (
        "prompt processing progress",
        re.compile(r"prompt processing progress, (?:n_past|n_tokens) = (\d+),"),
        lambda s, t, m: ev.PromptProgress(s, t, int(m[1]), absolute=True),
    ),
    (
        "done, n_",
        re.compile(r"prompt (?:processing )?done, (?:n_past|n_tokens) = (\d+)"),
        lambda s, t, m: ev.PromptProgress(s, t, int(m[1]), absolute=True),
    ),
    (
        "saving idle slot",
        re.compile(r"saving idle slot to prompt cache"),
        lambda s, t, m: ev.IdleSlotSaved(s),
    ),
    (
        "new slot",
        re.compile(r"new slot,? n_ctx(?:_slot)? = (\d+)"),
        lambda s, t, m: ev.SlotCreated(s, int(m[1])),
    ),
]

_FATAL = re.compile(
    r"(Context size has been exceeded\.|Invalid input batch\.|Compute error\.),? (?:i|off) = \d+, n_batch"
)

# Rules for everything that is not a `slot … | task … |` line: `srv` lines and library lines.
_TEXT_RULES: list[_TextRule] = [
    (
        "retrying with smaller batch",
        re.compile(r"retrying with smaller batch size.*?\b(?:i|off) = (\d+), n_batch = (\d+)"),
        lambda m: ev.KVRetry(int(m[1]), int(m[2])),
    ),
    (
        "for batch of size",
        re.compile(r"failed to find a memory slot for batch of size (\d+)"),
        lambda m: ev.MemorySlotFailure(int(m[1])),
    ),
    (
        "KV cache slot for",
        re.compile(r"failed to find KV cache slot for u?batch of size (\d+)"),
        lambda m: ev.MemorySlotFailure(int(m[1])),
    ),
    ("all slots are idle", re.compile(r"all slots are idle"), lambda m: ev.AllSlotsIdle()),
    (
        "error: ",
        re.compile(r"^task id = (\d+), error: (.*)$"),
        lambda m: ev.RequestError(int(m[1]), _reason(m[2])),
    ),
    ("n_batch = ", _FATAL, lambda m: ev.DecodeFatal(_reason(m[1]))),
    (
        "KV cache is full",
        re.compile(r"failed to decode the batch: KV cache is full"),
        lambda m: ev.DecodeFatal("context_exceeded"),
    ),
    ("decode() failed", re.compile(r"decode\(\) failed: (.*)$"), lambda m: ev.DecodeFailed(m[1].strip())),
    (
        "purging slot",
        re.compile(r"purging slot (\d+) with (\d+) tokens"),
        lambda m: ev.SlotPurged(int(m[1]), int(m[2])),
    ),
    (
        ("llama_context: ", "llama_init_from_model: ", "llama_new_context_with_model: "),
        re.compile(
            r"^(?:llama_context|llama_init_from_model|llama_new_context_with_model): "
            r"(n_ctx|n_ctx_seq|n_ctx_per_seq|n_seq_max|n_batch|n_ubatch)\s+= (\d+)\s*$"
        ),
        lambda m: ev.ContextParam("n_ctx_seq" if m[1] == "n_ctx_per_seq" else m[1], int(m[2])),
    ),
    (
        "kv_unified ",
        re.compile(r"^(?:llama_context|llama_init_from_model): kv_unified\s+= (true|false)\s*$"),
        lambda m: ev.ContextParam("kv_unified", int(m[1] == "true")),
    ),
    (
        "size = ",
        re.compile(
            r"^llama_kv_cache\w*: size = +([\d.]+) MiB \( *(\d+) cells, +\d+ layers"
            r"(?:, +(\d+)(?:/ *(\d+))? seqs)?\), K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB"
        ),
        lambda m: ev.KVCacheSize(
            size_mib=float(m[1]),
            cells=int(m[2]),
            seqs=int(m[3]) if m[3] else None,
            streams=int(m[4]) if m[4] else None,
            type_k=m[5],
            k_mib=float(m[6]),
            type_v=m[7],
            v_mib=float(m[8]),
        ),
    ),
    (
        "KV self size",
        re.compile(r"KV self size += +([\d.]+) MiB, K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB"),
        lambda m: ev.KVCacheSize(float(m[1]), None, None, None, m[2], float(m[3]), m[4], float(m[5])),
    ),
    (
        "KV cache, size",
        re.compile(r"creating +(non-SWA|SWA) KV cache, size = (\d+) cells"),
        lambda m: ev.KVCacheSection(swa=m[1] == "SWA", cells=int(m[2])),
    ),
    (
        "initializing",
        re.compile(r"^initializing(?: slots)?, n_slots = (\d+)(?:, n_ctx_slot = (\d+), kv_unified = '(true|false)')?"),
        lambda m: ev.SlotsInitialized(int(m[1]), int(m[2]) if m[2] else None, (m[3] == "true") if m[3] else None),
    ),
    ("initializing ...", re.compile(r"^initializing \.\.\.$"), lambda m: ev.ServerStarting()),
    (
        "listening on",
        re.compile(r"(?:server is listening on|^listening on) (\S+?)(?: - starting the main loop)?$"),
        lambda m: ev.ServerReady(m[1]),
    ),
    ("loading model '", re.compile(r"^loading model '(.*)'$"), lambda m: ev.ModelLoading(m[1])),
    (
        "capping per-slot",
        re.compile(r"capping per-slot context \((\d+)\) to --kv-unified-per-slot \((\d+)\)"),
        lambda m: ev.PerSlotCap(int(m[1]), int(m[2])),
    ),
    (
        "idle slots will be saved",
        re.compile(r"idle slots will be saved to prompt cache and cleared upon starting a new task"),
        lambda m: ev.IdleSlotPolicy(clear_on_new_task=True),
    ),
    (
        "build",
        re.compile(r"^(?:build|common_params_print_info: build):? (\d+) \((\w+)\)"),
        lambda m: ev.BuildInfo(int(m[1]), m[2]),
    ),
    ("build_info: b", re.compile(r"\bbuild_info: b(\d+)-(\w+)"), lambda m: ev.BuildInfo(int(m[1]), m[2])),
    (
        "verbosity = ",
        re.compile(r"verbosity = (\d+) \(adjust with"),
        lambda m: ev.Verbosity(int(m[1])),
    ),
    ("eval time =", _TIMING, _timing),  # pre-b9230 timings are continuation lines without a slot tag
    (
        "cache state:",
        re.compile(r"cache state: (\d+) prompts, ([\d.]+) MiB \(limits: ([\d.]+) MiB"),
        lambda m: ev.PromptCacheState(int(m[1]), float(m[2]), float(m[3])),
    ),
    (
        "prompt with length",
        re.compile(r"- prompt with length +(\d+), lcp = +-?\d+, f_keep = ([-\d.]+), f_sim = ([-\d.]+)"),
        lambda m: ev.PromptCacheCandidate(int(m[1]), m[2], m[3]),
    ),
    (
        "found better prompt",
        re.compile(r"found better prompt with f_keep = ([-\d.]+), f_sim = ([-\d.]+)"),
        lambda m: ev.PromptLoaded(m[1], m[2]),
    ),
    (
        "saving prompt with length",
        re.compile(r"saving prompt with length (\d+), total state size = ([\d.]+) MiB"),
        lambda m: ev.PromptSaved(int(m[1]), float(m[2])),
    ),
    (
        "removing obsolete cached prompt",
        re.compile(r"removing obsolete cached prompt with length (\d+)"),
        lambda m: ev.PromptCacheRemoved(int(m[1])),
    ),
    ("removing oldest entry", re.compile(r"removing oldest entry"), lambda m: ev.PromptCacheRemoved(None)),
    (
        "prompt cache is",
        re.compile(r"prompt cache is (?:enabled, size limit: (?:(\d+) MiB|(no limit))|(disabled))"),
        lambda m: ev.PromptCacheLimit(float(m[1]) if m[1] else (None if m[2] else 0.0)),
    ),
    (
        "cache size limit reduced",
        re.compile(r"cache size limit reduced to ([\d.]+) MiB"),
        lambda m: ev.PromptCacheLimit(float(m[1])),
    ),
    (
        "context checkpoints",
        re.compile(r"context checkpoints (?:enabled, max = (\d+)|(disabled))"),
        lambda m: ev.CheckpointConfig(int(m[1]) if m[1] else 0),
    ),
]


def parse_message(msg: str) -> ev.Event | None:
    """Parse a normalised message (see `normalize`)."""
    if msg.startswith("slot "):
        sm = _SLOT.match(msg)
        if sm is None:
            return None
        slot, task, rest = int(sm[1]), int(sm[2]), sm[3]
        for keyword, rx, build in _SLOT_RULES:
            if keyword in rest:
                m = rx.search(rest)
                if m is not None:
                    return build(slot, task, m)
        return None
    if msg.startswith("srv "):
        srv = _SRV.match(msg)
        if srv is not None:
            msg = srv[1]
    elif msg.startswith(("cmn ", "que ", "spec ")):
        # b9829+ tags common-library lines `cmn  fn: `; keep the text after the tag's function field.
        _, _, msg = msg.partition(": ")
    for kw, rx, build_text in _TEXT_RULES:
        if (kw in msg) if isinstance(kw, str) else any(k in msg for k in kw):
            m = rx.search(msg)
            if m is not None:
                return build_text(m)
    return None


def parse_line(line: str) -> ev.Event | None:
    """Parse one raw log line (any era, any prefix/colour/JSONL form) into an event, or None."""
    return parse_message(normalize(line))
