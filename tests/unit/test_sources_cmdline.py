"""llama-server's argv and LLAMA_ARG_* environment → pool capacity, slots, settings (b11434 semantics).

The real server checks these figures in test_live_server.py (its own log states the pool at -lv 4).
"""

from __future__ import annotations

import pytest
from paths import B11434

from exporter.model.server_cmdline import VERBOSE_ALL, ServerCommandLine, pad, parse_command_line

FIXTURES = B11434


def _cfg(args: str, env: dict[str, str] | None = None) -> ServerCommandLine:
    return parse_command_line(["llama-server", *args.split()], env or {})


@pytest.mark.parametrize(
    ("args", "pool", "slots", "unified", "slot_ctx"),
    [
        ("-c 512 -np 4 -kvu", 512, 4, True, 512),  # the seed incident: four slots share one 512-cell window
        ("-np 4 -kvu --kv-unified-per-slot 512", 2048, 4, True, 512),  # the fix: pool = slots x cap
        ("-c 4096 -np 4 -kvu --kv-unified-per-slot 512", 4096, 4, True, 512),  # -c pins the pool, cap per slot
        ("-c 0 -np 4 -kvu --kv-unified-per-slot 512", None, 4, True, None),  # -c 0 = model's n_ctx_train
        ("-c 500 -np 4 -kvu", 512, 4, True, 512),  # padded to 256
        ("-c 1000 -np 3", 1536, 3, False, 512),  # non-unified: 3 streams of pad256(1000 // 3)
        ("-c 4096 -np 4", 4096, 4, False, 1024),
        ("-c 32768", 32768, 4, True, 32768),  # -np left on auto: 4 slots and unified KV
        ("-c 32768 -np -1 -no-kvu", 32768, 4, True, 32768),  # auto forces unified even with -no-kvu
        ("-np 2", None, 2, False, None),  # no -c: from the model
        ("", None, 4, True, None),
    ],
)
def test_pool_capacity_like_llama_server(
    args: str, pool: int | None, slots: int, unified: bool, slot_ctx: int | None
) -> None:
    cfg = _cfg(args)
    assert (cfg.pool_capacity(), cfg.slot_count(), cfg.unified(), cfg.slot_context()) == (
        pool,
        slots,
        unified,
        slot_ctx,
    )


def test_long_forms_underscores_and_equals_are_the_same_flags() -> None:
    a = _cfg("-c 512 -np 4 -kvu -ctk q8_0 -ctv q4_0 -cram 2048 -ctxcp 8 -lv 4")
    b = _cfg(
        "--ctx-size 512 --parallel 4 --kv-unified --cache-type-k q8_0 --cache-type-v=q4_0 "
        "--cache_ram 2048 --swa-checkpoints 8 --log-verbosity 4"
    )
    assert a == b
    assert (a.type_k, a.type_v, a.cache_ram_mib, a.ctx_checkpoints, a.verbosity) == ("q8_0", "q4_0", 2048, 8, 4)


def test_environment_applies_first_and_the_command_line_wins() -> None:
    env = {
        "LLAMA_ARG_CTX_SIZE": "8192",
        "LLAMA_ARG_N_PARALLEL": "2",
        "LLAMA_ARG_KV_UNIFIED": "true",
        "LLAMA_ARG_CACHE_TYPE_K": "q8_0",
        "LLAMA_ARG_LOG_VERBOSITY": "4",
        "LLAMA_ARG_KV_UNIFIED_PER_SLOT": "1024",
    }
    cfg = _cfg("", env)
    assert (cfg.ctx_size, cfg.n_parallel, cfg.kv_unified, cfg.type_k, cfg.verbosity) == (8192, 2, True, "q8_0", 4)
    assert cfg.pool_capacity() == 8192 and cfg.slot_context() == 1024
    cfg = _cfg("-c 512 -np 4 -lv 3", env)
    assert (cfg.ctx_size, cfg.n_parallel, cfg.verbosity, cfg.kv_unified) == (512, 4, 3, True)
    # LLAMA_ARG_NO_KV_UNIFIED means false whatever its value (common_arg::get_value_from_env).
    assert _cfg("-np 4 -c 1024", {"LLAMA_ARG_NO_KV_UNIFIED": "1"}).unified() is False
    assert _cfg("-np 4", {"LLAMA_ARG_KV_UNIFIED": "off"}).kv_unified is False
    assert _cfg("-np 4", {"LLAMA_ARG_KV_UNIFIED": "maybe"}).kv_unified is None  # the server would refuse it


def test_verbose_flag_and_unknown_options() -> None:
    assert _cfg("-v").verbosity == VERBOSE_ALL
    # Unknown options and their values are skipped; a trailing option without its value is ignored.
    cfg = _cfg("-m model.gguf --alias big -t 2 --port 8080 --host 0.0.0.0 -c 512 -np")
    assert (cfg.ctx_size, cfg.n_parallel) == (512, None)
    assert _cfg("-c lots").ctx_size is None


def test_api_key_is_noticed_but_never_kept() -> None:
    cfg = _cfg("--api-key s3cret -c 512")
    assert cfg.api_key_set is True and cfg.ctx_size == 512
    assert "s3cret" not in repr(cfg)
    assert _cfg("", {"LLAMA_API_KEY": "s3cret"}).api_key_set is True
    assert _cfg("-c 512").api_key_set is False


def test_log_file_and_slots_endpoint() -> None:
    cfg = _cfg("--log-file /var/log/llama.log --no-slots")
    assert (cfg.log_file, cfg.slots_endpoint) == ("/var/log/llama.log", False)
    assert _cfg("", {"LLAMA_ARG_LOG_FILE": "x.log"}).log_file == "x.log"


def test_pad() -> None:
    assert [pad(n) for n in (1, 256, 257, 512, 32768)] == [256, 256, 512, 512, 32768]


@pytest.mark.parametrize(
    "name",
    [
        "exhaust-lv4",
        "exhaust-default-verbosity",
        "exhaust-jsonl",
        "exhaust-long-lv4",
        "recover-purge-lv4",
        "longprompt-lv4",
        "checkpoints-swa-lv4",
    ],
)
def test_captured_command_lines_agree_with_their_logs(name: str) -> None:
    """Each capture's cmdline.txt gives the pool its own llama_kv_cache/initializing line states."""
    argv = (FIXTURES / name / "cmdline.txt").read_text().split()
    cfg = parse_command_line(argv, {})
    log = (FIXTURES / name / "llama-server.log").read_text().replace("\\n", "\n")
    init = next(line for line in log.splitlines() if "initializing, n_slots" in line)
    n_slots = int(init.split("n_slots = ")[1].split(",")[0])
    n_ctx_slot = int(init.split("n_ctx_slot = ")[1].split(",")[0])
    assert cfg.slot_count() == n_slots
    assert cfg.slot_context() == n_ctx_slot
    sizes = [line for line in log.splitlines() if "llama_kv_cache: size =" in line]
    if sizes:  # -lv 4: the pool is stated as cells x streams
        cells = int(sizes[0].split("(")[1].split("cells")[0])
        streams = int(sizes[0].split("seqs)")[0].rsplit("/", 1)[1])
        assert cfg.pool_capacity() == cells * streams
