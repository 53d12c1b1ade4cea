"""What llama-server's command line and `LLAMA_ARG_*` environment say about its KV pool. Pure: no I/O.

At the default verbosity (`-lv 3`, b9151+) the log hides the KV pool size (`llama_context: n_ctx`,
`llama_kv_cache: size`). The settings that determine it are on the command line, or in the
environment llama-server read them from, so `/proc/<pid>/cmdline` and `/proc/<pid>/environ` let the
exporter compute the pool the way llama-server b11434 does:

- `-np N` (`LLAMA_ARG_N_PARALLEL`); left out or `-1` = auto: 4 slots **and** unified KV (b7433+).
- `-kvu`/`-no-kvu` (`LLAMA_ARG_KV_UNIFIED`, `LLAMA_ARG_NO_KV_UNIFIED`): one shared stream.
- `-c N` (`LLAMA_ARG_CTX_SIZE`); `0` or left out = the model's training context (unknown here), except
  `--kv-unified-per-slot M` without `-c` sizes the pool to `slots × M` (an explicit `-c 0` does not).
- `llama_context` pads `n_ctx` to a multiple of 256; without unified KV each of the `slots` streams
  gets `pad256(n_ctx / slots)` cells, and the pool is their sum.

Environment variables apply first and the command line overrides them, as in `common/arg.cpp`.

    >>> cfg = parse_command_line(["llama-server", "-m", "m.gguf", "-c", "512", "-np", "4", "-kvu"], {})
    >>> cfg.pool_capacity(), cfg.slot_count(), cfg.unified()
    (512, 4, True)
    >>> parse_command_line(["llama-server", "-np", "4", "-kvu", "--kv-unified-per-slot", "512"], {}).pool_capacity()
    2048
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: `llama_context` rounds n_ctx (and, without unified KV, each stream) up to this (b6975+, #17046).
N_CTX_PAD = 256
#: `-np -1` / no `-np` on b7433+: this many slots, and unified KV.
AUTO_SLOTS = 4
#: `-v`: llama-server sets its verbosity threshold to INT_MAX (log everything).
VERBOSE_ALL = 2**31 - 1

_TRUE = frozenset({"on", "enabled", "true", "1"})
_FALSE = frozenset({"off", "disabled", "false", "0"})

# option spelling → (field, kind). kind: "int", "str", "true", "false" (flags without a value).
_OPTIONS: dict[str, tuple[str, str]] = {
    "-c": ("ctx_size", "int"),
    "--ctx-size": ("ctx_size", "int"),
    "-np": ("n_parallel", "int"),
    "--parallel": ("n_parallel", "int"),
    "-kvu": ("kv_unified", "true"),
    "--kv-unified": ("kv_unified", "true"),
    "-no-kvu": ("kv_unified", "false"),
    "--no-kv-unified": ("kv_unified", "false"),
    "--kv-unified-per-slot": ("kv_unified_per_slot", "int"),
    "-ctk": ("type_k", "str"),
    "--cache-type-k": ("type_k", "str"),
    "-ctv": ("type_v", "str"),
    "--cache-type-v": ("type_v", "str"),
    "-cram": ("cache_ram_mib", "int"),
    "--cache-ram": ("cache_ram_mib", "int"),
    "-ctxcp": ("ctx_checkpoints", "int"),
    "--ctx-checkpoints": ("ctx_checkpoints", "int"),
    "--swa-checkpoints": ("ctx_checkpoints", "int"),
    "-lv": ("verbosity", "int"),
    "--verbosity": ("verbosity", "int"),
    "--log-verbosity": ("verbosity", "int"),
    "-v": ("verbosity", "all"),
    "--verbose": ("verbosity", "all"),
    "--log-verbose": ("verbosity", "all"),
    "--log-file": ("log_file", "str"),
    "--slots": ("slots_endpoint", "true"),
    "--no-slots": ("slots_endpoint", "false"),
    "--api-key": ("api_key_set", "present"),
    "--api-key-file": ("api_key_set", "present"),
}

# environment variable → (field, kind), applied before the command line.
_ENV: dict[str, tuple[str, str]] = {
    "LLAMA_ARG_CTX_SIZE": ("ctx_size", "int"),
    "LLAMA_ARG_N_PARALLEL": ("n_parallel", "int"),
    "LLAMA_ARG_KV_UNIFIED": ("kv_unified", "bool"),
    "LLAMA_ARG_KV_UNIFIED_PER_SLOT": ("kv_unified_per_slot", "int"),
    "LLAMA_ARG_CACHE_TYPE_K": ("type_k", "str"),
    "LLAMA_ARG_CACHE_TYPE_V": ("type_v", "str"),
    "LLAMA_ARG_CACHE_RAM": ("cache_ram_mib", "int"),
    "LLAMA_ARG_CTX_CHECKPOINTS": ("ctx_checkpoints", "int"),
    "LLAMA_ARG_LOG_VERBOSITY": ("verbosity", "int"),
    "LLAMA_ARG_LOG_FILE": ("log_file", "str"),
    "LLAMA_LOG_FILE": ("log_file", "str"),  # before b3761-era renames
    "LLAMA_ARG_ENDPOINT_SLOTS": ("slots_endpoint", "bool"),
    "LLAMA_API_KEY": ("api_key_set", "present"),
    "LLAMA_ARG_API_KEY_FILE": ("api_key_set", "present"),
}
# Negated booleans (`LLAMA_ARG_NO_KV_UNIFIED`) mean false whatever their value, as in get_value_from_env.
_ENV_NEGATED = {"LLAMA_ARG_NO_KV_UNIFIED": "kv_unified", "LLAMA_ARG_NO_ENDPOINT_SLOTS": "slots_endpoint"}


def pad(n: int, to: int = N_CTX_PAD) -> int:
    """Round up to a multiple of `to` (GGML_PAD)."""
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class ServerCommandLine:
    """llama-server settings read from its argv and environment. None = not given (llama-server's default).

    The API key itself is never kept: `api_key_set` only says that the server requires one.
    """

    ctx_size: int | None = None
    n_parallel: int | None = None
    kv_unified: bool | None = None
    kv_unified_per_slot: int | None = None
    type_k: str | None = None
    type_v: str | None = None
    cache_ram_mib: int | None = None
    ctx_checkpoints: int | None = None
    verbosity: int | None = None
    log_file: str | None = None
    slots_endpoint: bool | None = None
    api_key_set: bool = False

    def slot_count(self) -> int:
        """Number of slots: `-np`, or 4 when it is left on auto."""
        return self.n_parallel if self.n_parallel is not None and self.n_parallel > 0 else AUTO_SLOTS

    def unified(self) -> bool:
        """Whether the slots share one KV stream: `-kvu`, or always when `-np` is left on auto."""
        if self.n_parallel is None or self.n_parallel < 0:
            return True
        return bool(self.kv_unified)

    def context_size(self) -> int | None:
        """n_ctx before padding; None when it comes from the model (`-c 0` or no `-c`)."""
        if self.ctx_size:
            return self.ctx_size
        if self.ctx_size is None and self.kv_unified_per_slot and self.kv_unified_per_slot > 0:
            # server.cpp: the pool is sized from --kv-unified-per-slot only when -c is not pinned.
            return self.slot_count() * self.kv_unified_per_slot
        return None

    def pool_capacity(self) -> int | None:
        """KV cells in the pool (all streams), as llama_context computes it; None when it depends on the model."""
        n_ctx = self.context_size()
        if n_ctx is None or n_ctx < 0:
            return None
        n_ctx = pad(n_ctx)
        if self.unified():
            return n_ctx
        slots = self.slot_count()
        return pad(n_ctx // slots) * slots

    def slot_context(self) -> int | None:
        """Per-slot context (`n_ctx_slot`), not counting the model's training-context cap."""
        pool = self.pool_capacity()
        if pool is None:
            return None
        per_stream = pool if self.unified() else pool // self.slot_count()
        if self.kv_unified_per_slot and self.kv_unified_per_slot > 0:
            return min(per_stream, self.kv_unified_per_slot)
        return per_stream


def _int(value: str) -> int | None:
    try:
        return int(value.strip())
    except ValueError:
        return None  # llama-server would have refused to start; ignore rather than guess


class _Values:
    """Settings collected so far, typed by kind."""

    def __init__(self) -> None:
        self.ints: dict[str, int] = {}
        self.strs: dict[str, str] = {}
        self.bools: dict[str, bool] = {}

    def set(self, field: str, kind: str, value: str | None) -> None:
        if kind == "int":
            n = None if value is None else _int(value)
            if n is not None:
                self.ints[field] = n
        elif kind == "str":
            if value is not None:
                self.strs[field] = value
        elif kind == "bool":
            v = (value or "").strip().lower()
            if v in _TRUE or v in _FALSE:
                self.bools[field] = v in _TRUE
        elif kind == "all":
            self.ints[field] = VERBOSE_ALL
        else:  # "true", "false", "present"
            self.bools[field] = kind != "false"


# Kinds whose option consumes a value.
_TAKES_VALUE = frozenset({"int", "str", "present"})


def parse_command_line(argv: Sequence[str], environ: Mapping[str, str]) -> ServerCommandLine:
    """Read the settings that matter to the exporter from llama-server's argv and environment.

    Unknown options are skipped; an option that takes a value consumes the next argument. Long
    options accept `_` for `-` (as llama-server does) and the `--opt=value` form.
    """
    v = _Values()
    for name, (field, kind) in _ENV.items():
        if name in environ:
            v.set(field, kind, environ[name])
    for name, field in _ENV_NEGATED.items():
        if name in environ:
            v.bools[field] = False

    args = list(argv[1:])
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        inline: str | None = None
        if arg.startswith("--"):
            arg, eq, rest = arg.partition("=")
            inline = rest if eq else None
            arg = arg.replace("_", "-")
        spec = _OPTIONS.get(arg)
        if spec is None:
            continue
        field, kind = spec
        if kind in _TAKES_VALUE and inline is None:
            if i >= len(args):
                break
            inline = args[i]
            i += 1
        v.set(field, kind, inline)
    return ServerCommandLine(
        ctx_size=v.ints.get("ctx_size"),
        n_parallel=v.ints.get("n_parallel"),
        kv_unified=v.bools.get("kv_unified"),
        kv_unified_per_slot=v.ints.get("kv_unified_per_slot"),
        type_k=v.strs.get("type_k"),
        type_v=v.strs.get("type_v"),
        cache_ram_mib=v.ints.get("cache_ram_mib"),
        ctx_checkpoints=v.ints.get("ctx_checkpoints"),
        verbosity=v.ints.get("verbosity"),
        log_file=v.strs.get("log_file"),
        slots_endpoint=v.bools.get("slots_endpoint"),
        api_key_set=v.bools.get("api_key_set", False),
    )
