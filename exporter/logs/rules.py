"""What each llama-server log line that matters says: one rule per wording, from b3761 to b11434. Pure.

A rule is (leading words, regex, build): the regex matches the start of a message, the build makes
the event from the match. `exporter.logs.parse` joins every rule into its one scan (the leading
words into a lookahead that rejects most lines after a character or two); group names must be unique
over all rules, since they share that regex. Slot rules match the text after `slot … | task N | `
and their build gets the slot id, the task id and the match; the others match the text after a
line's `srv  function: ` tag and get the match.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from exporter.logs import events as ev


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


# A `print_timing` line's kind (`prompt eval time`, `eval time`, `total time`) by the word before `eval`/`time`.
_TIMING: dict[str | None, type[ev.PromptEvalTiming | ev.GenerationTiming | ev.TotalTiming]] = {
    "prompt ": ev.PromptEvalTiming,
    None: ev.GenerationTiming,
    "total ": ev.TotalTiming,
}


_M = re.Match[str]
# `stopped by …` (llama-server's debug lines) → the bounded finish reason.
_STOPPED = {"EOS": "eos", "limit": "limit", "time limit": "time_limit", "indentation limit": "indentation_limit"}
# The crash cause of a buffer type's name (`CUDA0`, `Vulkan0`, `MTL0`) in ggml-backend's allocation failure.
_OOM_CAUSE: dict[str, str] = {"CUDA": "cuda_out_of_memory", "ROCm": "cuda_out_of_memory", "MUSA": "cuda_out_of_memory"}
_OOM_CAUSE.update(Metal="metal_out_of_memory", MTL="metal_out_of_memory", Vulkan="vulkan_out_of_memory")
# (leading words, regex, build): a rule is tried on messages that start with one of its words.
# Group names must be unique over all rules: they share one regex.
# Slot rules: the regex matches the text after `| task N | `; build gets the slot id, the task id and the match.
# In the order a busy server writes them, most often first: the scan tries them in this order, and a match
# costs more the higher its groups are numbered (a rule's come after those of the rules before it). Rules whose
# leading words start alike (the `prompt …` forms) keep the order their matches need, the longer form first;
# between the others the order changes no match (a test holds the table to that).
SLOT_RULES: list[tuple[str, str, Callable[[int, int, _M], ev.Event]]] = [
    (
        "clearing",
        r"clearing (?:prompt|slot) with (?P<cleared>\d+) tokens",
        lambda s, t, m: ev.SlotCleared(s, int(m["cleared"])),
    ),
    (
        "n_gen n_decoded",
        r"n_(?:gen|decoded) = +(?P<n_gen>\d+), tg = +(?P<tg>" + _FLOAT + r") t/s"
        r"(?:, tg_3s = +(?P<tg_3s>" + _FLOAT + ")|)",
        lambda s, t, m: ev.GenerationProgress(s, t, int(m["n_gen"]), _rate(m["tg_3s"] or m["tg"])),
    ),
    ("saving", r"saving idle slot to prompt cache", lambda s, t, m: ev.IdleSlotSaved(s)),
    ("selected", r"selected slot by", lambda s, t, m: ev.SlotSelected(s)),
    ("processing", r"processing task\b", lambda s, t, m: ev.TaskStarted(s, t)),
    (
        "stopped",
        r"stopped (?:by (?P<stop_by>EOS|limit|time limit|indentation limit)\b|due to running out of context capacity)",
        lambda s, t, m: ev.GenerationStopped(s, t, _STOPPED.get(m["stop_by"], "context_capacity")),
    ),
    (
        "stop",
        r"stop processing: (?:n_past|n_tokens) = (?P<released>\d+)",
        lambda s, t, m: ev.SlotReleased(s, t, int(m["released"])),
    ),
    (
        "cached n_past n_tokens",
        r"(?:cached )?(?:n_past|n_tokens) = (?P<cached>\d+), memory_seq_rm \[",
        lambda s, t, m: ev.CachedTokens(s, t, int(m["cached"])),
    ),
    (
        "prompt eval total",
        r"(?:(?P<slot_prompt>prompt )?eval |(?P<slot_total>total ))time = +(?P<slot_ms>[\d.]+) ms / +"
        r"(?P<slot_tokens>\d+) tokens",
        lambda s, t, m: _TIMING[m["slot_prompt"] or m["slot_total"]](
            float(m["slot_ms"]), int(m["slot_tokens"]), False, s
        ),
    ),
    (
        "new prompt",
        r"(?:new prompt|prompt tokenized), n_ctx_slot = (?P<prompt_ctx>\d+), n_keep = -?\d+, "
        r"(?:task\.n_tokens|n_prompt_tokens) = (?P<prompt_tokens>\d+)",
        lambda s, t, m: ev.NewPrompt(s, t, int(m["prompt_ctx"]), int(m["prompt_tokens"])),
    ),
    ("new", r"new slot,? n_ctx(?:_slot)? = (?P<new_slot>\d+)", lambda s, t, m: ev.SlotCreated(s, int(m["new_slot"]))),
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
    (
        "draft",
        r"draft acceptance(?: rate)? = [\d.]+ \( *(?P<slot_accepted>\d+) accepted / +(?P<slot_drafted>\d+) generated\)",
        lambda s, t, m: ev.DraftAcceptance(int(m["slot_accepted"]), int(m["slot_drafted"]), False, s),
    ),
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
    ("kv", r"kv cache rm \[(?P<kv_rm>\d+), end\)", lambda s, t, m: ev.CachedTokens(s, t, int(m["kv_rm"]))),
]

# One event for every such line (an event is immutable, and equal to another of its value; see `shared`).
_ALL_IDLE = ev.AllSlotsIdle()

#: Events `shared` keeps per rule: the values a busy log repeats (a cascade's batch sizes and offsets).
SHARED_EVENTS = 64


def shared(build: Callable[[_M], ev.Event], *groups: str) -> Callable[[_M], ev.Event]:
    """`build`, one event object for the lines whose `groups` read the same (an event is immutable, and equal
    to another of its values: sharing it changes no value). For the kinds a cascade repeats at every retry:
    a lookup instead of reading the numbers and building the event. The first `SHARED_EVENTS` values are
    kept; a value that cannot be read raises as `build` does, and is not kept."""
    kept: dict[object, ev.Event] = {}

    def build_shared(m: _M) -> ev.Event:
        key = m.group(*groups)
        e = kept.get(key)
        if e is None:
            e = build(m)
            if len(kept) < SHARED_EVENTS:
                kept[key] = e
        return e

    return build_shared


# Rules for everything that is not a `slot … | task … |` line: `srv` lines and library lines.
TEXT_RULES: list[tuple[str, str, Callable[[_M], ev.Event]]] = [
    (
        "failed",
        r"failed to find free space in the KV cache, retrying with smaller batch size.*?\b(?:i|off) = "
        r"(?P<retry_off>\d+), n_batch = (?P<retry_batch>\d+)",
        shared(lambda m: ev.KVRetry(int(m["retry_off"]), int(m["retry_batch"])), "retry_off", "retry_batch"),
    ),
    (
        "failed",
        r"failed to find a memory slot for batch of size (?P<memory_batch>\d+)",
        shared(lambda m: ev.MemorySlotFailure(int(m["memory_batch"])), "memory_batch"),
    ),
    (
        "failed",
        r"failed to find KV cache slot for u?batch of size (?P<kv_slot_batch>\d+)",
        shared(lambda m: ev.MemorySlotFailure(int(m["kv_slot_batch"])), "kv_slot_batch"),
    ),
    ("all", r"all slots are idle", lambda m: _ALL_IDLE),
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
        "llama_memory_recurrent",
        r"llama_memory_recurrent: size = +[\d.]+ MiB \( *(?P<rs_cells>\d+) cells",
        lambda m: ev.RecurrentMemory(int(m["rs_cells"])),
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
        "prompt eval total",
        r"(?:(?P<text_prompt>prompt )?eval |(?P<text_total>total ))time = +(?P<text_ms>[\d.]+) ms / +"
        r"(?P<text_tokens>\d+) tokens",
        # (A continuation line: slot -1.)
        lambda m: _TIMING[m["text_prompt"] or m["text_total"]](float(m["text_ms"]), int(m["text_tokens"]), True, -1),
    ),
    (
        "draft",
        r"draft acceptance rate = [\d.]+ \( *(?P<text_accepted>\d+) accepted / +(?P<text_drafted>\d+) generated\)",
        lambda m: ev.DraftAcceptance(int(m["text_accepted"]), int(m["text_drafted"]), True),
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
    # Out of device memory, in ggml's own words (b11434: ggml-cuda.cu, ggml-metal, ggml-vulkan, ggml-backend.cpp).
    (
        "CUDA ROCm MUSA",  # ggml_cuda_error: GGML_CUDA_NAME " error: %s\n", then GGML_ABORT
        r"(?P<oom_cuda>(?:CUDA|ROCm|MUSA) error: out of memory)",
        lambda m: ev.CrashCause("cuda_out_of_memory", m["oom_cuda"]),
    ),
    (
        "allocating",  # "%s: allocating %.2f MiB on device %d: cudaMalloc failed: %s\n"
        r"(?P<oom_cudamalloc>allocating [\d.]{1,20} MiB on device \d{1,4}: cudaMalloc failed: out of memory)",
        lambda m: ev.CrashCause("cuda_out_of_memory", m["oom_cudamalloc"]),
    ),
    (
        "failed",  # "%s: failed to allocate Metal buffer of %zu bytes (out of memory)\n"
        r"(?P<oom_metal>failed to allocate Metal buffer of \d{1,20} bytes \(out of memory\))",
        lambda m: ev.CrashCause("metal_out_of_memory", m["oom_metal"]),
    ),
    (
        "error",  # ggml_metal_buffer_init: "%s: error: failed to allocate buffer, size = %8.2f MiB\n"
        r"(?P<oom_metal_init>error: failed to allocate buffer, size = +[\d.]{1,20} MiB)",
        lambda m: ev.CrashCause("metal_out_of_memory", m["oom_metal_init"]),
    ),
    (
        "failed",  # ggml-backend.cpp: "%s: failed to allocate %s buffer of size %zu\n" (the buffer type's name)
        r"(?P<oom_backend>failed to allocate (?P<oom_buft>CUDA|ROCm|MUSA|Metal|MTL|Vulkan)\w{0,8} buffer "
        r"of size \d{1,20})",
        lambda m: ev.CrashCause(_OOM_CAUSE[m["oom_buft"]], m["oom_backend"]),
    ),
    (
        "Memory",  # ggml_vulkan: "Memory allocation of size " << size << " failed."
        r"(?P<oom_vulkan>Memory allocation of size \d{1,20} failed\.)",
        lambda m: ev.CrashCause("vulkan_out_of_memory", m["oom_vulkan"]),
    ),
    (
        "terminate",  # the C++ runtime, for an exception nobody caught
        r"(?P<oom_vk_throw>terminate called after throwing an instance of 'vk::OutOfDeviceMemoryError')",
        lambda m: ev.CrashCause("vulkan_out_of_memory", m["oom_vk_throw"]),
    ),
]


# ggml_abort (ggml/src/ggml.c) writes "%s:%d: " __FILE__, __LINE__ and its message to stderr, without the
# log's prefix, then abort(); GGML_ASSERT(x)'s message is "GGML_ASSERT(%s) failed". __FILE__ is the
# absolute path the build compiled (`/home/…/ggml.c`, `D:\a\llama.cpp\…\ggml-cuda.cu`): a line that starts
# with `/` or a drive letter is tried, in two forms that each start with their first character (the regex
# engine passes every other line by that character, without entering the rule). The path is at most 300
# characters, its first one (or the drive's three) outside the group that holds the rest.
_ABORT_TAIL = r"[^\s:]{0,299}\.(?:c|cc|cpp|cu|cuh|h|hpp|m|mm):\d{1,7}: (?P<{assert_}>GGML_ASSERT\()?[^\n]{1,2000}"
ABORT_RULES: list[tuple[str, Callable[[_M], ev.Event]]] = [
    (
        r"/(?P<abort_path>" + _ABORT_TAIL.replace("{assert_}", "abort_assert") + ")$",
        lambda m: _abort(m["abort_assert"], "/" + m["abort_path"]),
    ),
    (
        r"[A-Za-z]:\\(?P<abort_drive_path>" + _ABORT_TAIL.replace("{assert_}", "abort_drive_assert") + ")$",
        lambda m: _abort(
            m["abort_drive_assert"], m.string[m.start("abort_drive_path") - 3 : m.end("abort_drive_path")]
        ),
    ),
]


def _abort(assertion: str | None, line: str) -> ev.Event:
    """The event of an abort line (`line`: from its path to its end)."""
    return ev.CrashCause("ggml_assert" if assertion else "ggml_abort", line[-300:])
