//! Program names, as the loader looks them up in the object.

/// Uprobe recording the first six integer arguments of any function.
pub const CALL_ARGS: &str = "call_args";
/// Uretprobe twin of [`CALL_ARGS`]: the return value.
pub const CALL_RETURN: &str = "call_return";
/// Every executed ggml node: `ggml_cpu_extra_compute_forward(params,
/// tensor)`, and `ggml_compute_forward_rms_norm_mul_fused(params, rms,
/// mul)` (both nodes); the attach cookie (a [`crate::hooks`] value) says which.
pub const GGML_OP: &str = "ggml_op";
/// `ggml_graph_compute(cgraph, cplan)`: reads the whole CPU graph (nodes
/// and the tensors they read) unless it is unchanged since its last run,
/// then its small integer inputs (token ids, positions).
pub const GRAPH_COMPUTE: &str = "graph_compute";
/// `ggml_compute_forward_argsort(params, dst)` entry and return: on an
/// `ffn_moe_argsort-L` node, the rows (tokens) the returning thread
/// sorted, that is the experts ranked for each of them.
pub const ARGSORT_ENTRY: &str = "argsort_entry";
pub const ARGSORT_RETURN: &str = "argsort_return";
/// Where ggml has no `ggml_compute_forward_argsort` symbol (it was
/// static before 2025): `ggml_compute_forward_mul_mat_id(params, dst)`
/// entry on `ffn_moe_down-L`, whose `ids` source is a view of the
/// layer's argsort node, whole until that last consumer is done.
pub const MUL_MAT_ID_ENTRY: &str = "mul_mat_id_entry";
/// `llama_context::process_ubatch(this, ubatch, …)`: the ubatch's
/// tokens, positions, sequence ids and output flags ([`super::batch`]).
pub const UBATCH: &str = "ubatch";
/// `exceptions:page_fault_user` tracepoint.
pub const PAGE_FAULT_USER: &str = "page_fault_user";
/// `filemap:mm_filemap_add_to_page_cache`: a page of a model file filled.
pub const PAGE_CACHE_ADD: &str = "page_cache_add";
/// `filemap:mm_filemap_fault`: a fault served from a model file's page cache.
pub const FILEMAP_FAULT: &str = "filemap_fault";
/// `block:block_rq_issue` / `block:block_rq_complete`.
pub const BLOCK_RQ_ISSUE: &str = "block_rq_issue";
pub const BLOCK_RQ_COMPLETE: &str = "block_rq_complete";
/// The same five as BTF tracepoints (`tp_btf`): the kernel skips one
/// only when that same program is already running on the CPU, where it
/// skips a perf-event tracepoint program whenever any BPF program runs
/// there (a uprobe interrupted by a block completion, say).
pub const PAGE_FAULT_USER_BTF: &str = "page_fault_user_btf";
pub const PAGE_CACHE_ADD_BTF: &str = "page_cache_add_btf";
pub const FILEMAP_FAULT_BTF: &str = "filemap_fault_btf";
/// Where the kernel has no `filemap:mm_filemap_fault` (5.10, 6.1): an
/// fentry program on `filemap_fault(vmf)`, where that tracepoint fires,
/// recording the same page. Loaded against the kernel's BTF, in either
/// flavour.
pub const FILEMAP_FAULT_FENTRY: &str = "filemap_fault_fentry";
/// The kernel function it attaches to.
pub const FILEMAP_FAULT_FUNCTION: &str = "filemap_fault";
pub const BLOCK_RQ_ISSUE_BTF: &str = "block_rq_issue_btf";
pub const BLOCK_RQ_COMPLETE_BTF: &str = "block_rq_complete_btf";
/// `ttrace check`'s forced recursion miss: a uprobe that prints through
/// `bpf_trace_printk`, and a BTF tracepoint on that print that prints
/// again (the nested run is skipped and counted).
pub const RECURSION_TRIGGER: &str = "recursion_trigger";
pub const RECURSION_SELFTEST: &str = "recursion_selftest";
/// `ggml_backend_buffer_init` return: a backend buffer was created
/// ([`crate::BufferEvent`], [`crate::buffer_action::CREATED`]).
pub const BUFFER_CREATED: &str = "buffer_created";
/// `ggml_backend_buffer_set_usage(buffer, usage)` and
/// `ggml_backend_buffer_free(buffer)` entry; the cookie is the
/// [`crate::buffer_action`].
pub const BUFFER_CHANGED: &str = "buffer_changed";

/// `sched:sched_process_fork` and `sched:sched_process_exec` (perf-event
/// tracepoints, on every kernel): while the library hold is on, a process
/// a traced one starts is traced from its exec and held there
/// ([`crate::markers::PROCESS_EXEC`]).
pub const PROCESS_FORK: &str = "process_fork";
pub const PROCESS_EXEC: &str = "process_exec";

/// Stand-ins for kernels that lack a helper a program calls.
pub mod compat;
