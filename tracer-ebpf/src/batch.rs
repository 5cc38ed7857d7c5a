//! `llama_context::process_ubatch(this, const llama_ubatch &, …)` entry: the
//! ubatch's arrays, so every token of the graph that follows gets its
//! sequence id, position and output flag as llama.cpp itself holds them.
//! The graph's own inputs hold positions but no sequence ids (those only
//! shape the KQ mask), and the public batch (`llama_batch_ext`) is an opaque
//! C++ object; the ubatch is plain pointers, after llama.cpp has filled in
//! whatever the caller left out. One trap per ubatch.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::generated::bpf_probe_read_user,
    macros::{map, uprobe},
    maps::PerCpuArray,
    programs::ProbeContext,
};
use tracer_common::{
    EventKind, INPUT_EVENT_FIXED, InputEvent, MAX_INPUT_BYTES, batch,
    layout::{UBATCH_HEAD_BYTES, UBATCH_OFFSET_MASK},
};

use crate::{
    layout::{self, ggml},
    looping::{global_step, repeat},
    maps::{EVENTS, count_lost, header, read_user, read_user_bytes, submit_flags, traced_task},
    pinned::pinned,
};

#[map]
static BATCH_SCRATCH: PerCpuArray<InputEvent> = PerCpuArray::with_max_entries(1, 0);

/// The head of a `llama_ubatch` as copied, read at the layout's offsets
/// (masked, as `layout::RawTensor`'s).
#[repr(C, align(8))]
struct Head([u8; UBATCH_HEAD_BYTES]);

impl Head {
    fn at<T: Copy>(&self, offset: u32) -> T {
        let at = (offset & UBATCH_OFFSET_MASK & !(align_of::<T>() as u32 - 1)) as usize;
        // SAFETY: in bounds and aligned (tracer-common's const asserts).
        unsafe { self.0.as_ptr().add(at).cast::<T>().read() }
    }
}

/// The fields read: `n_tokens` and the arrays.
struct Ubatch {
    n_tokens: u32,
    token: u64,
    pos: u64,
    seq_id: u64,
    output: u64,
}

#[inline(always)]
fn read_head(address: u64) -> Option<Ubatch> {
    // `size` 0: this build's llama_ubatch is not known (sequences off).
    let size = ggml!(ubatch.size) & UBATCH_OFFSET_MASK;
    if !layout::valid() || size == 0 {
        return None;
    }
    let mut head = Head([0; UBATCH_HEAD_BYTES]);
    read_user_bytes(head.0.as_mut_ptr(), size, address).ok()?;
    Some(Ubatch {
        n_tokens: head.at(ggml!(ubatch.n_tokens)),
        token: head.at(ggml!(ubatch.token)),
        pos: head.at(ggml!(ubatch.pos)),
        seq_id: head.at(ggml!(ubatch.seq_id)),
        output: head.at(ggml!(ubatch.output)),
    })
}

#[uprobe]
pub fn ubatch(ctx: ProbeContext) -> u32 {
    pinned(|| ubatch_with::<false>(&ctx))
}

/// Kernels before 5.17 (`looping`).
#[uprobe]
pub fn ubatch_bounded(ctx: ProbeContext) -> u32 {
    ubatch_with::<true>(&ctx)
}

#[inline(always)]
fn ubatch_with<const BOUNDED: bool>(ctx: &ProbeContext) -> u32 {
    let Some(task) = traced_task() else { return 0 };
    let Some(address) = ctx.arg::<u64>(1) else { return 0 };
    let Some(b) = read_head(address) else { return 0 };
    if b.n_tokens == 0 {
        return 0;
    }
    let n = b.n_tokens.min(batch::MAX_BATCH_TOKENS);
    let Some(event) = BATCH_SCRATCH.get_ptr_mut(0) else { return 0 };
    // SAFETY: per-CPU scratch.
    let event = unsafe { &mut *event };
    event.header = header(EventKind::Batch, task);
    event.uid = u64::from(b.n_tokens);
    for (array, address) in [(batch::TOKEN, b.token), (batch::POS, b.pos)] {
        if address != 0 && read_array(event, address, n * 4).is_ok() {
            send(event, array, n * 4);
        }
    }
    if b.seq_id != 0 {
        let mut walk = SeqWalk { seq_id: b.seq_id, ok: 1 };
        // Each step writes within the scratch event's `data`.
        repeat::<BOUNDED, _>(n, batch::MAX_BATCH_TOKENS, read_seq, ttrace_read_seq, &mut walk);
        if walk.ok == 1 {
            send(event, batch::SEQ, n * 4);
        }
    }
    if b.output != 0 && read_outputs::<BOUNDED>(b.output, n).is_ok() {
        send(event, batch::OUTPUT, n * 4);
    }
    0
}

fn read_array(event: &mut InputEvent, address: u64, len: u32) -> Result<(), ()> {
    // Bounded here, where the read is: LLVM knows the callers' `len` is
    // within bounds and drops a `min`, and the verifier before 5.12 cannot
    // follow a bound checked before a spill to the stack.
    // SAFETY: a plain local.
    let len = unsafe { core::ptr::read_volatile(&len) };
    if len > MAX_INPUT_BYTES as u32 {
        return Err(());
    }
    // SAFETY: len is at most the size of `data`.
    let ret = unsafe { bpf_probe_read_user(event.data.as_mut_ptr().cast::<c_void>(), len, address as *const c_void) };
    if ret == 0 { Ok(()) } else { Err(()) }
}

/// `output` is an i8 per token: read 64 at a time, widened to i32s. A
/// `bpf_loop` over the chunks, not an unrolled loop: the verifier then checks
/// one chunk instead of all 16, which cut this program's load from ~150 ms
/// to a few, most of what stood between `attach` and its first record.
fn read_outputs<const BOUNDED: bool>(address: u64, n: u32) -> Result<(), ()> {
    let n = n.min(batch::MAX_BATCH_TOKENS);
    let mut walk = OutputWalk { output: address, ok: 1 };
    // Each step writes within the scratch event's `data`.
    let chunks = batch::MAX_BATCH_TOKENS.div_ceil(64);
    repeat::<BOUNDED, _>(n.div_ceil(64), chunks, read_output_chunk, ttrace_read_output_chunk, &mut walk);
    if walk.ok == 1 { Ok(()) } else { Err(()) }
}

/// The loops' context: scalars only (a bounded loop's global step gets it
/// from a map); the steps find the scratch event themselves.
#[repr(C)]
#[derive(Clone, Copy)]
struct OutputWalk {
    output: u64,
    ok: u64,
}

global_step!(ttrace_read_output_chunk, read_output_chunk, OutputWalk);

#[inline(never)]
extern "C" fn read_output_chunk(chunk: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: the loop passes back the `OutputWalk` given to it.
    let walk = unsafe { &mut *(ctx as *mut OutputWalk) };
    let mut flags = [0u8; 64];
    let first = chunk * 64;
    if read_user(&mut flags, walk.output + first).is_err() {
        walk.ok = 0;
        return 1;
    }
    let Some(event) = BATCH_SCRATCH.get_ptr_mut(0) else { return 1 };
    // SAFETY: per-CPU scratch.
    let event = unsafe { &mut *event };
    for (j, &f) in flags.iter().enumerate() {
        let at = ((first as usize + j) & (batch::MAX_BATCH_TOKENS as usize - 1)) * 4;
        if let Some(slot) = event.data.get_mut(at..at + 4) {
            slot.copy_from_slice(&i32::from(f != 0).to_le_bytes());
        }
    }
    0
}

#[repr(C)]
#[derive(Clone, Copy)]
struct SeqWalk {
    seq_id: u64,
    ok: u64,
}

global_step!(ttrace_read_seq, read_seq, SeqWalk);

#[inline(never)]
extern "C" fn read_seq(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: the loop passes back the `SeqWalk` given to it.
    let walk = unsafe { &mut *(ctx as *mut SeqWalk) };
    let mut ids = 0u64;
    let mut seq = 0i32;
    if read_user(&mut ids, walk.seq_id + index * 8).is_err() || read_user(&mut seq, ids).is_err() {
        walk.ok = 0;
        return 1;
    }
    let at = (index as usize & (batch::MAX_BATCH_TOKENS as usize - 1)) * 4;
    let Some(event) = BATCH_SCRATCH.get_ptr_mut(0) else { return 1 };
    // SAFETY: per-CPU scratch.
    let event = unsafe { &mut *event };
    if let Some(slot) = event.data.get_mut(at..at + 4) {
        slot.copy_from_slice(&seq.to_le_bytes());
    }
    0
}

fn send(event: &mut InputEvent, array: u64, len: u32) {
    // As in `read_array`: bounded where it is used.
    // SAFETY: a plain local.
    let len = unsafe { core::ptr::read_volatile(&len) } as usize;
    if len > MAX_INPUT_BYTES {
        return;
    }
    event.tensor = array;
    event.len = len as u32;
    event._pad = 0;
    let total = INPUT_EVENT_FIXED + len;
    if total > size_of::<InputEvent>() {
        return;
    }
    // SAFETY: total is within the scratch slot, checked above.
    let bytes = unsafe { core::slice::from_raw_parts((event as *const InputEvent).cast::<u8>(), total) };
    if EVENTS.output::<[u8]>(bytes, submit_flags()).is_err() {
        count_lost(EventKind::Batch);
    }
}
