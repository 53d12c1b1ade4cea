"""Tiny random-weight GGUF models that a real llama-server loads on CPU in milliseconds.

No downloads: the PyPI ``gguf`` writer plus numpy. The models are useless as language models but
exercise every code path the exporter cares about (slots, the shared KV pool, the retry cascade,
context checkpoints, the full re-processing of sliding-window, recurrent and hybrid models).

Tokenizer: SentencePiece-style (``llama``) vocabulary: ``<unk>``, ``<s>``, ``</s>``, 256 byte-fallback
tokens, ``▁``, printable ASCII and ``▁``-prefixed lower-case letters (380 tokens). English text is about
one token per character, so a prompt of N characters is about N tokens; that makes it trivial to size
prompts against ``n_ctx``.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_LAYER = 2
#: Metadata only. llama-server caps ``n_ctx_slot`` at ``n_ctx_train``, so a large value lets tests use
#: any ``-c`` without the ``n_ctx_seq > n_ctx_train`` warning.
CTX_TRAIN = 131072
#: Gemma2 sliding window: small enough that SWA bites at ``-c 512`` and the server creates, restores
#: and erases context checkpoints.
GEMMA2_SLIDING_WINDOW = 32
#: llama-server arguments that make :func:`write_slow_loading_model` models load slowly: read the
#: weights into memory instead of mmapping them (b11434 has no ``--no-mmap``; it has ``-lm``).
SLOW_LOAD_SERVER_ARGS = ("-lm", "none")
#: Unicode's private-use area (U+E000-U+F8FF): the extra tokens of a large vocabulary.
_PRIVATE, _N_PRIVATE = 0xE000, 0x1900
#: Extra tokens that make :func:`write_slow_vocab_llama` models spend about a second loading.
SLOW_VOCAB_EXTRA_TOKENS = 300_000


def _vocab(extra: int = 0) -> tuple[list[str], list[float], list[int]]:
    """SentencePiece vocabulary with byte fallback, so any input text tokenizes.

    ``extra`` more tokens of two private-use characters each (U+E000-U+F8FF): no prompt of the tests
    has such characters, so they never change how a prompt tokenizes; they only make the vocabulary
    large (see :func:`write_slow_vocab_llama`).
    """
    toks: list[str] = []
    scores: list[float] = []
    types: list[int] = []

    def add(text: str, score: float, kind: gguf.TokenType) -> None:
        toks.append(text)
        scores.append(score)
        types.append(int(kind))

    tt = gguf.TokenType
    add("<unk>", 0.0, tt.UNKNOWN)
    add("<s>", 0.0, tt.CONTROL)
    add("</s>", 0.0, tt.CONTROL)
    for b in range(256):
        add(f"<0x{b:02X}>", 0.0, tt.BYTE)
    add("\u2581", -1.0, tt.NORMAL)  # '▁', SentencePiece's space
    for c in range(33, 127):  # printable ASCII except space
        add(chr(c), -2.0, tt.NORMAL)
    for letter in "abcdefghijklmnopqrstuvwxyz":
        add("\u2581" + letter, -1.5, tt.NORMAL)
    for i in range(extra):
        add(chr(_PRIVATE + i // _N_PRIVATE) + chr(_PRIVATE + i % _N_PRIVATE), -100.0, tt.NORMAL)
    return toks, scores, types


def _add_vocab(w: gguf.GGUFWriter, toks: list[str], scores: list[float], types: list[int]) -> None:
    """The vocabulary (`_vocab`) as a llama (SentencePiece) tokenizer: unknown 0, BOS 1 (added), EOS 2."""
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def _write(
    path: Path,
    arch: str,
    *,
    ctx_train: int,
    n_ff: int = N_FF,
    sliding_window: int | None = None,
    zero_ffn: bool = False,
    n_embd: int = N_EMBD,
    n_layer: int = N_LAYER,
    extra_tokens: int = 0,
) -> Path:
    rng = np.random.default_rng(0)  # fixed seed: identical bytes on every run
    toks, scores, types = _vocab(extra_tokens)
    N_EMBD, N_LAYER = n_embd, n_layer
    head_dim = N_EMBD // N_HEAD
    n_embd_kv = head_dim * N_HEAD_KV

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}-random")
    w.add_context_length(ctx_train)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if sliding_window is not None:
        w.add_sliding_window(sliding_window)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)

    _add_vocab(w, toks, scores, types)

    def tensor(name: str, *shape: int, ones: bool = False, zeros: bool = False, f16: bool = False) -> None:
        # numpy shape is (rows=out, cols=in); GGUF/ggml reverse it, which the writer handles.
        arr: npt.NDArray[np.float32]
        if ones:
            arr = np.ones(shape, np.float32)
        elif zeros:
            # Big padding tensors: calloc'd zeros cost no RAM or RNG time until written.
            arr = np.zeros(shape, np.float32)
        else:
            arr = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        w.add_tensor(name, arr.astype(np.float16) if f16 else arr)

    # A large vocabulary: half-size embeddings, tied to the output (llama.cpp uses token_embd when a
    # llama has no output.weight), so the file stays small and the matrix is read once per output.
    tensor("token_embd.weight", len(toks), N_EMBD, f16=bool(extra_tokens))
    tensor("output_norm.weight", N_EMBD, ones=True)
    if arch == "llama" and not extra_tokens:  # gemma2 ties the output projection to token_embd
        tensor("output.weight", len(toks), N_EMBD)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        tensor(p + "attn_norm.weight", N_EMBD, ones=True)
        tensor(p + "attn_q.weight", N_HEAD * head_dim, N_EMBD)
        tensor(p + "attn_k.weight", n_embd_kv, N_EMBD)
        tensor(p + "attn_v.weight", n_embd_kv, N_EMBD)
        tensor(p + "attn_output.weight", N_EMBD, N_HEAD * head_dim)
        tensor(p + "ffn_norm.weight", N_EMBD, ones=True)
        tensor(p + "ffn_gate.weight", n_ff, N_EMBD, zeros=zero_ffn)
        tensor(p + "ffn_up.weight", n_ff, N_EMBD, zeros=zero_ffn)
        tensor(p + "ffn_down.weight", N_EMBD, n_ff, zeros=zero_ffn)
        if arch == "gemma2":
            tensor(p + "post_attention_norm.weight", N_EMBD, ones=True)
            tensor(p + "post_ffw_norm.weight", N_EMBD, ones=True)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_tiny_llama(path: Path, *, ctx_train: int = CTX_TRAIN) -> Path:
    """Write a 2-layer, 64-wide llama (full attention, plain unified KV cache), about 0.5 MB.

    It loads in ~25 ms and generates ~18k tokens/s on 2 CPU cores. Returns ``path``.
    """
    return _write(path, "llama", ctx_train=ctx_train)


def write_slow_llama(path: Path, *, n_embd: int = 512, n_layer: int = 12, n_ff: int = 1024) -> Path:
    """Write a random llama big enough to be slow on 2 CPU cores (512 wide, 12 layers: ~19M weights, 76 MB).

    For tests that must watch a KV pool fill over minutes, not milliseconds: on 2 cores it reads a
    prompt at a few hundred tokens per second, slower as the context grows. Returns ``path``.
    """
    return _write(path, "llama", ctx_train=CTX_TRAIN, n_embd=n_embd, n_layer=n_layer, n_ff=n_ff)


def write_tiny_gemma2(path: Path, *, ctx_train: int = CTX_TRAIN, sliding_window: int = GEMMA2_SLIDING_WINDOW) -> Path:
    """Write a tiny gemma2 (sliding-window attention, so an iSWA KV cache), about 0.5 MB.

    With ``-c 4096 -np 2 -kvu -ctxcp 3 -cms 64 -b 128 -ub 128 -lv 4`` the server logs context
    checkpoints being created, restored and erased. Returns ``path``.
    """
    return _write(path, "gemma2", ctx_train=ctx_train, sliding_window=sliding_window)


def write_tiny_mamba(path: Path, *, ctx_train: int = CTX_TRAIN) -> Path:
    """Write a tiny Mamba (a recurrent model: no KV cache, a state that cannot be rolled back), about 0.5 MB.

    llama-server logs its state as `llama_memory_recurrent: size = …`, and re-processes a prompt whole whenever
    it does not continue the slot's last one exactly (`forcing full prompt re-processing`) unless a checkpoint
    covers it. Returns ``path``.
    """
    return _write_recurrent(path, "mamba", [0, 0], ctx_train=ctx_train)


def write_tiny_jamba(path: Path, *, ctx_train: int = CTX_TRAIN) -> Path:
    """Write a tiny Jamba (a hybrid model: a Mamba layer, then an attention layer), about 0.5 MB.

    llama-server logs both a `llama_kv_cache: size = …` line and a `llama_memory_recurrent: size = …` one.
    Returns ``path``.
    """
    return _write_recurrent(path, "jamba", [0, N_HEAD_KV], ctx_train=ctx_train)


def _write_recurrent(path: Path, arch: str, heads_kv: list[int], *, ctx_train: int) -> Path:
    """A 64-wide model whose layers with no KV head are Mamba layers (inner size 128, state 16, conv kernel 4,
    time-step rank 4), the others attention layers with a feed-forward block (Jamba)."""
    rng = np.random.default_rng(0)  # fixed seed: identical bytes on every run
    toks, scores, types = _vocab()
    d_inner, d_state, d_conv, dt_rank = 128, 16, 4, 4
    hybrid = arch != "mamba"
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}-random")
    w.add_context_length(ctx_train)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(len(heads_kv))
    w.add_feed_forward_length(N_FF if hybrid else 0)
    w.add_head_count(N_HEAD if hybrid else 0)
    w.add_head_count_kv(heads_kv if hybrid else 0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_vocab(w, toks, scores, types)

    def tensor(name: str, *shape: int, value: float | None = None) -> None:
        arr: npt.NDArray[np.float32]
        if value is not None:
            arr = np.full(shape, value, np.float32)
        else:
            arr = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        w.add_tensor(name, arr)

    head_dim = N_EMBD // N_HEAD
    tensor("token_embd.weight", len(toks), N_EMBD)
    tensor("output_norm.weight", N_EMBD, value=1.0)
    tensor("output.weight", len(toks), N_EMBD)
    for i, kv in enumerate(heads_kv):
        p = f"blk.{i}."
        tensor(p + "attn_norm.weight", N_EMBD, value=1.0)
        if kv == 0:  # a Mamba layer
            tensor(p + "ssm_in.weight", 2 * d_inner, N_EMBD)
            tensor(p + "ssm_conv1d.weight", d_inner, d_conv)
            tensor(p + "ssm_conv1d.bias", d_inner)
            tensor(p + "ssm_x.weight", dt_rank + 2 * d_state, d_inner)
            if hybrid:  # Jamba normalizes dt, B and C
                tensor(p + "ssm_dt_norm.weight", dt_rank, value=1.0)
                tensor(p + "ssm_b_norm.weight", d_state, value=1.0)
                tensor(p + "ssm_c_norm.weight", d_state, value=1.0)
            tensor(p + "ssm_dt.weight", d_inner, dt_rank)
            tensor(p + "ssm_dt.bias", d_inner)
            tensor(p + "ssm_a", d_inner, d_state, value=-1.0)  # a decaying state
            tensor(p + "ssm_d", d_inner, value=1.0)
            tensor(p + "ssm_out.weight", N_EMBD, d_inner)
        else:
            tensor(p + "attn_q.weight", N_EMBD, N_EMBD)
            tensor(p + "attn_k.weight", head_dim * kv, N_EMBD)
            tensor(p + "attn_v.weight", head_dim * kv, N_EMBD)
            tensor(p + "attn_output.weight", N_EMBD, N_EMBD)
        if hybrid:
            tensor(p + "ffn_norm.weight", N_EMBD, value=1.0)
            tensor(p + "ffn_gate.weight", N_FF, N_EMBD)
            tensor(p + "ffn_up.weight", N_FF, N_EMBD)
            tensor(p + "ffn_down.weight", N_EMBD, N_FF)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_slow_loading_model(path: Path, size_mib: int = 1536) -> Path:
    """Write a tiny llama padded with all-zero feed-forward weights to about ``size_mib`` MiB.

    Used to watch ``/health`` answer 503 ``Loading model`` before it turns 200. Start the server
    with :data:`SLOW_LOAD_SERVER_ARGS` (``-lm none``): by default b11434 mmaps the file, and a
    model that is already in the page cache (it was just written) then loads almost at once.

    Measured with llama-server b11434 on 2 CPU cores, file in the page cache, time from spawn to
    ``/health`` 200 (503 ``Loading model`` from ~20 ms after spawn until then):

    ========  ==========  ===========  =========
    size      ``-lm none``  default mmap  write time
    ========  ==========  ===========  =========
    1024 MiB  1.3-1.7 s   0.5-0.8 s    ~1 s
    1536 MiB  1.7-2.2 s   ~0.8 s       ~1 s
    2048 MiB  ~5 s        ~1 s         ~1.2 s
    ========  ==========  ===========  =========

    The tiny 0.5 MB model is healthy ~20 ms after spawn, too soon to observe the 503 reliably.
    Returns ``path``.
    """
    head_dim = N_EMBD // N_HEAD
    small = 2 * 380 * N_EMBD + N_LAYER * (2 * N_EMBD * head_dim * N_HEAD + 2 * N_EMBD * head_dim * N_HEAD_KV)
    per_ff_row = N_LAYER * 3 * N_EMBD  # float32 elements added per unit of n_ff
    n_ff = max(N_FF, (size_mib * 2**20 // 4 - small) // per_ff_row)
    n_ff -= n_ff % 32  # keep rows a multiple of the ggml block size
    return _write(path, "llama", ctx_train=CTX_TRAIN, n_ff=n_ff, zero_ffn=True)


def write_slow_vocab_llama(path: Path, extra_tokens: int = SLOW_VOCAB_EXTRA_TOKENS) -> Path:
    """Write the tiny llama with ``extra_tokens`` more tokens (300 000: 43 MB): it loads for about a second.

    llama-server's HTTP server answers ``/health`` (503 ``Loading model``) 25-65 ms after spawn; the
    model's load then builds the vocabulary's maps and token-to-piece cache, O(n_vocab), twice in
    b11434: once to fit the parameters to memory (``common_fit_params``), once for the model. The
    extra tokens never occur in the tests' prompts (:func:`_vocab`) and the layers are the tiny
    model's (only each output token pays for the large vocabulary), so a test can watch a start's
    ``Loading model`` and still overflow a pool within a second.

    Measured with llama-server b11434 on 2 CPU cores shared with other jobs (``-c 512 -np 4 -kvu``, file
    in the page cache), time from spawn to ``/health`` 200, and to write the file:

    ============  =====================================  ===========
    extra tokens  load                                   write
    ============  =====================================  ===========
    300 000       1.0-1.3 s (idle), 1.8-4.8 s (busy)     1.6-3.4 s
    400 000       3.7-4.7 s (busy)                       5.3 s
    600 000       2.8-3.3 s                              3.5 s
    1 000 000     5.1 s                                  6.1 s
    ============  =====================================  ===========

    Four requests of the tests' overflow (``llama_requests.run_concurrent_completions``) still outgrow
    512 cells in 0.8-1.1 s with 300 000 or 1 000 000 extra tokens.
    :func:`write_slow_loading_model` at 1 GiB loads as long (1.3 s with ``-lm none``), but its wide
    feed-forward makes the same overflow take 20 s. Returns ``path``.
    """
    return _write(path, "llama", ctx_train=CTX_TRAIN, extra_tokens=extra_tokens)
