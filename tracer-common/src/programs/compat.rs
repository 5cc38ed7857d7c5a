//! Stand-ins for kernels that lack a helper a program calls, each the
//! same program built another way (`tracer-ebpf`'s family files).

use super::{ARGSORT_RETURN, BUFFER_CHANGED, CALL_ARGS, CALL_RETURN, GGML_OP, GRAPH_COMPUTE, MUL_MAT_ID_ENTRY, UBATCH};
use crate::{buffer_action, hooks, markers, values::programs::VALUE_BARRIER, values::programs::VALUE_NODE};

/// Before 5.15 (no `bpf_get_attach_cookie`): a copy of a program
/// that reads its cookie, per cookie it is attached with, the
/// cookie built in. `(program, cookie, copy)`.
pub const COOKIE_COPIES: &[(&str, u64, &str)] = &[
    (CALL_ARGS, markers::SELFTEST, "call_args_0"),
    (CALL_ARGS, markers::SCHED_GRAPH_COMPUTE, "call_args_1"),
    (CALL_ARGS, markers::LLAMA_DECODE, "call_args_3"),
    (CALL_ARGS, markers::LLAMA_PROCESS, "call_args_4"),
    (CALL_ARGS, markers::LLAMA_PERF_RESET, "call_args_5"),
    (CALL_ARGS, markers::OUTPUT_RESERVE, "call_args_19"),
    (CALL_ARGS, markers::SEQ_RM_CHECK, "call_args_21"),
    (CALL_ARGS, markers::LIBRARY_LOADED, "call_args_23"),
    (CALL_ARGS, markers::WHISPER_ENCODE, "call_args_24"),
    (CALL_ARGS, markers::WHISPER_DECODE, "call_args_25"),
    (CALL_ARGS, markers::WHISPER_INIT, "call_args_26"),
    (CALL_RETURN, markers::SCHED_GRAPH_COMPUTE_RETURN, "call_return_2"),
    (CALL_RETURN, markers::GRAPH_COMPUTE_RETURN, "call_return_6"),
    (CALL_RETURN, markers::OUTPUT_RESERVE_RETURN, "call_return_20"),
    (CALL_RETURN, markers::SEQ_RM_CHECK_RETURN, "call_return_22"),
    (BUFFER_CHANGED, buffer_action::SET_USAGE as u64, "buffer_changed_1"),
    (BUFFER_CHANGED, buffer_action::FREED as u64, "buffer_changed_2"),
    (GGML_OP, hooks::EXTRA as u64, "ggml_op_0"),
    (GGML_OP, hooks::FUSED_RMS_NORM as u64, "ggml_op_1"),
    (VALUE_NODE, hooks::EXTRA as u64, "value_node_0"),
    (VALUE_NODE, hooks::FUSED_MUL as u64, "value_node_2"),
];

/// Before 5.17 (no `bpf_loop`): a copy whose loops have a constant
/// bound, each step a global function the verifier checks once.
pub const BOUNDED: &[(&str, &str)] = &[
    (GRAPH_COMPUTE, "graph_compute_bounded"),
    (UBATCH, "ubatch_bounded"),
    (ARGSORT_RETURN, "argsort_return_bounded"),
    (MUL_MAT_ID_ENTRY, "mul_mat_id_bounded"),
    (VALUE_BARRIER, "value_barrier_bounded"),
];

/// The copy of `program` with `cookie` built in, if it reads one.
pub fn cookie_copy(program: &str, cookie: u64) -> Option<&'static str> {
    COOKIE_COPIES.iter().find(|c| c.0 == program && c.1 == cookie).map(|c| c.2)
}

/// The bounded-loop copy of `program`, if it loops.
pub fn bounded(program: &str) -> Option<&'static str> {
    BOUNDED.iter().find(|b| b.0 == program).map(|b| b.1)
}

/// The program a stand-in is a copy of (itself if none).
pub fn original(program: &str) -> &str {
    let copy = COOKIE_COPIES.iter().find(|c| c.2 == program).map(|c| c.0);
    copy.or_else(|| BOUNDED.iter().find(|b| b.1 == program).map(|b| b.0)).unwrap_or(program)
}
