//! Attach cookies of `call_args`/`call_return`: which function fired.

pub const SELFTEST: u64 = 0;
/// `ggml_graph_compute(cgraph, cplan)` returned: a CPU graph is done.
pub const GRAPH_COMPUTE_RETURN: u64 = 6;
/// `ggml_backend_sched_graph_compute_async(sched, graph)`: one ubatch graph.
pub const SCHED_GRAPH_COMPUTE: u64 = 1;
pub const SCHED_GRAPH_COMPUTE_RETURN: u64 = 2;
/// `llama_decode(ctx, batch)` (llama-cpp-python and older tools).
pub const LLAMA_DECODE: u64 = 3;
/// `llama_process(ctx, type, batch_ext)` (llama.cpp's own tools).
pub const LLAMA_PROCESS: u64 = 4;
/// `llama_perf_context_reset(ctx)`: llama's counters restart here.
pub const LLAMA_PERF_RESET: u64 = 5;
/// `llama_context::output_reserve(n_outputs)` entry and return: a buffer
/// created in between on the same thread is llama.cpp's output buffer
/// (logits and embeddings), which ggml leaves at usage ANY.
pub const OUTPUT_RESERVE: u64 = 19;
pub const OUTPUT_RESERVE_RETURN: u64 = 20;
/// `common_context_can_seq_rm(ctx)` entry and return: llama-server's
/// start-up check of its context decodes the tokens [0, 0] and clears
/// them. A decode in between is no prompt.
pub const SEQ_RM_CHECK: u64 = 21;
pub const SEQ_RM_CHECK_RETURN: u64 = 22;
/// The dynamic loader's `_dl_debug_state()`, which it calls for
/// debuggers before and after each change to the loaded libraries
/// (a `dlopen`'s libraries are then mapped, their constructors not yet
/// run). With [`super::config::HOLD_AT_LIBRARY_LOAD`] set, the target
/// is stopped here until ttrace has looked for ggml in its maps.
pub const LIBRARY_LOADED: u64 = 23;
/// whisper.cpp's `whisper_encode_internal` and `whisper_decode_internal`
/// (static, in libwhisper's .symtab): the graphs their thread computes
/// next are the encoder's (conv, encoder, cross) or the decoder's.
pub const WHISPER_ENCODE: u64 = 24;
pub const WHISPER_DECODE: u64 = 25;
/// whisper.cpp's `whisper_init_from_file_with_params_no_state(path, ...)`,
/// which every from-file init goes through: its first argument names the
/// model file it reads into memory (the reader reads the string at once,
/// while the loader still runs).
pub const WHISPER_INIT: u64 = 26;
/// `sched:sched_process_exec` of a process a traced one started (or one
/// such process exec'ing again), while the library hold is on: it is traced
/// from here, and stopped until ttrace has hooked the loader it runs with
/// (`unshare --fork chroot ROOT PROGRAM`, `sh -c`). No arguments.
pub const PROCESS_EXEC: u64 = 27;
