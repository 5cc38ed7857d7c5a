//! Uprobes on ggml's CPU backend: every executed graph node, with its
//! destination and source tensors.
//!
//! Events are built in a per-CPU scratch slot (too big for the 512-byte BPF
//! stack) and sent up to the last source present, so a node with two sources
//! costs 112 + 3 * 192 bytes of ring, not the full 2224.

use core::ptr::{addr_of_mut, read_volatile};

use aya_ebpf::{
    EbpfContext,
    bindings::pt_regs,
    helpers::generated::bpf_get_attach_cookie,
    macros::{map, uprobe},
    maps::PerCpuArray,
    programs::ProbeContext,
};
use tracer_common::{
    EventKind, MAX_OP_TENSORS, MAX_TOKEN_IDS, OP_EVENT_FIXED, OpEvent, SLOT_ABSENT, SLOT_DST, TENSOR_RECORD_SIZE,
    TensorRecord, config, ggml, hooks,
};

use crate::{
    layout::{self, RawTensor, ggml},
    looping::cookie_copies,
    maps::{CONFIG, EVENTS, count_lost, header, read_user, read_user_bytes, submit_flags, traced_task},
};

#[map]
static OP_SCRATCH: PerCpuArray<OpEvent> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub(crate) static TENSOR_SCRATCH: PerCpuArray<RawTensor> = PerCpuArray::with_max_entries(1, 0);

/// One program for every node hook, told apart by its attach cookie (a
/// `hooks` value), so the verifier checks the node recorder once:
/// - `EXTRA`: `ggml_cpu_extra_compute_forward(params, tensor)`, called for
///   every executed node by every worker thread, before the op dispatch;
/// - `FUSED_RMS_NORM`: `ggml_compute_forward_rms_norm_mul_fused(params,
///   rms, mul)`: fused nodes bypass the dispatcher; both are recorded, the
///   second as `FUSED_MUL`.
#[uprobe]
pub fn ggml_op(ctx: ProbeContext) -> u32 {
    // SAFETY: ctx is the program's own context.
    op_with(&ctx, unsafe { bpf_get_attach_cookie(ctx.as_ptr()) })
}

cookie_copies!(uprobe, ProbeContext, op_with;
    ggml_op_0 = hooks::EXTRA as u64,
    ggml_op_1 = hooks::FUSED_RMS_NORM as u64,
);

#[inline(always)]
fn op_with(ctx: &ProbeContext, cookie: u64) -> u32 {
    // SAFETY: ctx is the program's own context, a pt_regs.
    let (hook, params, second, third) = unsafe {
        let regs = ctx.as_ptr() as *const pt_regs;
        // Volatile: LLVM would otherwise fold the choice into one load at a
        // computed context offset, which the verifier rejects.
        (
            read_volatile(&cookie) as u32,
            read_volatile(&(*regs).rdi),
            read_volatile(&(*regs).rsi),
            read_volatile(&(*regs).rdx),
        )
    };
    if hook == hooks::FUSED_RMS_NORM {
        // Both fused nodes from one probe, in ggml's order: two probes on
        // one address run in the reverse of their attach order.
        let _ = record_node(params, second, hooks::FUSED_RMS_NORM);
        let _ = record_node(params, third, hooks::FUSED_MUL);
        return 0;
    }
    let _ = record_node(params, second, hook);
    0
}

#[inline(always)]
fn config(slot: u32) -> u64 {
    CONFIG.get(slot).copied().unwrap_or(0)
}

fn record_node(params: u64, node: u64, hook: u32) -> Result<(), ()> {
    let task = traced_task().ok_or(())?;
    if !layout::valid() {
        return Err(());
    }
    // `ith, nth` are adjacent in every layout (`ParamsLayout::check`).
    let mut thread = [0u32; 2];
    read_user(&mut thread, params + u64::from(ggml!(params.ith)))?;
    let [ith, nth] = thread;
    if ith != 0 && config(config::FLAGS) & config::FLAG_ALL_THREADS == 0 {
        return Ok(());
    }
    let event = OP_SCRATCH.get_ptr_mut(0).ok_or(())?;
    let tensor = TENSOR_SCRATCH.get_ptr_mut(0).ok_or(())?;
    // SAFETY: per-CPU scratch slots; a uprobe cannot be preempted by another on this CPU.
    let (event, tensor) = unsafe { (&mut *event, &mut *tensor) };
    event.header = header(EventKind::Op, task);
    event.ith = ith;
    event.nth = nth;
    event.hook = hook;
    event.n_token_ids = 0;

    let size = layout::tensor_size();
    read_user_bytes(addr_of_mut!(tensor.0).cast(), size, node)?;
    copy_record(&mut event.tensors[0], node, tensor, SLOT_DST);
    let sources = tensor.src();
    let is_get_rows = tensor.op() as u64 == config(config::GET_ROWS_OP);
    // Source i always goes to record i + 1, so no register depends on which
    // sources were present: a running count would multiply the verifier's
    // paths by two per source. The count lives in map memory instead.
    event.n_tensors = 1;
    for (i, &src) in sources.iter().enumerate() {
        let record = &mut event.tensors[i + 1];
        if src == 0 || read_user_bytes(addr_of_mut!(tensor.0).cast(), size, src).is_err() {
            record.slot = SLOT_ABSENT;
            continue;
        }
        copy_record(record, src, tensor, i as u32);
        event.n_tensors = i as u32 + 2;
        // Token ids: GET_ROWS's index source (slot 1) of type I32.
        if i == 1 && is_get_rows && tensor.type_() == ggml::TYPE_I32 {
            let count = tensor.ne()[0].clamp(0, MAX_TOKEN_IDS as i64) as u32;
            if read_user(&mut event.token_ids, tensor.data()).is_ok() {
                event.n_token_ids = count;
            }
        }
    }
    let n = event.n_tensors as usize;
    if n == 0 || n > MAX_OP_TENSORS {
        return Err(());
    }
    let len = OP_EVENT_FIXED + n * TENSOR_RECORD_SIZE;
    // SAFETY: len is within the scratch slot, checked above.
    let bytes = unsafe { core::slice::from_raw_parts((event as *const OpEvent).cast::<u8>(), len) };
    if EVENTS.output::<[u8]>(bytes, submit_flags()).is_err() {
        count_lost(EventKind::Op);
    }
    Ok(())
}

/// The record of the tensor copied into `t`, read at the layout's offsets.
#[inline(always)]
fn copy_record(record: &mut TensorRecord, address: u64, t: &RawTensor, slot: u32) {
    record.tensor = address;
    record.data = t.data();
    record.ne = t.ne();
    record.nb = t.nb();
    record.view_src = t.u64(ggml!(tensor.view_src));
    record.view_offs = t.u64(ggml!(tensor.view_offs));
    record.extra = t.u64(ggml!(tensor.extra));
    record.type_ = t.type_();
    record.op = t.op();
    record.op_param0 = t.i32(ggml!(tensor.op_params));
    record.flags = t.flags();
    record.slot = slot;
    record._pad = 0;
    record.name = t.name();
}
