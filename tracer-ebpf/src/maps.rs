//! Maps shared by every probe family and the helpers that write to them.
//! Names must equal the `MAP_*` constants in tracer-common (checked by a
//! user-side test against the built object).

use core::{ffi::c_void, mem::size_of};

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns, generated::bpf_probe_read_user},
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
};
use tracer_common::{
    DEFAULT_RING_BYTES, EVENT_KIND_SLOTS, EventHeader, EventKind, FileKey, MAX_MODEL_FILES, MAX_TARGET_TGIDS, config,
    split_pid_tgid,
};

#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

#[map]
pub static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(EVENT_KIND_SLOTS, 0);

#[map]
pub static CONFIG: Array<u64> = Array::with_max_entries(config::SLOTS, 0);

#[map]
pub static MODEL_FILES: HashMap<FileKey, u8> = HashMap::with_max_entries(MAX_MODEL_FILES, 0);

#[map]
pub static BLOCK_DEVICES: HashMap<u32, u8> = HashMap::with_max_entries(MAX_MODEL_FILES, 0);

#[map]
pub static TARGET_TGIDS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_TARGET_TGIDS, 0);

/// The current task if its process is traced: `(tgid, tid)`.
#[inline(always)]
pub fn traced_task() -> Option<(u32, u32)> {
    let (tgid, tid) = split_pid_tgid(bpf_get_current_pid_tgid());
    TARGET_TGIDS.get_ptr(tgid)?;
    Some((tgid, tid))
}

#[inline(always)]
pub fn header(kind: EventKind, (tgid, tid): (u32, u32)) -> EventHeader {
    EventHeader {
        kind: kind as u32,
        // SAFETY: plain helper calls with no arguments.
        cpu: unsafe { bpf_get_smp_processor_id() },
        ts_ns: unsafe { bpf_ktime_get_ns() },
        tgid,
        tid,
    }
}

/// Count one event of `kind` dropped because the ring buffer was full.
#[inline(always)]
pub fn count_lost(kind: EventKind) {
    count_lost_n(kind, 1);
}

#[inline(always)]
pub fn count_lost_n(kind: EventKind, n: u64) {
    if let Some(slot) = LOST.get_ptr_mut(kind as u32) {
        // SAFETY: per-CPU slot, so no other writer races with this one.
        unsafe { *slot += n };
    }
}

/// Submit flags: waking the reader on every event would put it on a CPU
/// (on 2 cores, the traced program's) thousands of times a second, so only
/// a ring filling past `WAKEUP_BYTES` wakes it; it drains on a timer otherwise.
#[inline(always)]
pub fn submit_flags() -> u64 {
    let threshold = CONFIG.get(config::WAKEUP_BYTES).copied().unwrap_or(0);
    if threshold == 0 || EVENTS.query(u64::from(BPF_RB_AVAIL_DATA)) >= threshold {
        u64::from(BPF_RB_FORCE_WAKEUP)
    } else {
        u64::from(BPF_RB_NO_WAKEUP)
    }
}

/// Write `event` straight into a ring-buffer reservation (no stack copy of a
/// second buffer), or count it lost.
#[inline(always)]
pub fn emit<T: 'static>(kind: EventKind, event: T) {
    emit_with(kind, event, submit_flags());
}

/// `emit` with explicit submit flags (`BPF_RB_FORCE_WAKEUP` for an event the
/// reader must see while the target is still alive).
#[inline(always)]
pub fn emit_with<T: 'static>(kind: EventKind, event: T, flags: u64) {
    match EVENTS.reserve::<T>(0) {
        Some(mut entry) => {
            entry.write(event);
            entry.submit(flags);
        }
        None => count_lost(kind),
    }
}

/// Copy `len` bytes (bounded by the caller) from the traced process's
/// memory at `src` into `dst`.
#[inline(always)]
pub fn read_user_bytes(dst: *mut u8, len: u32, src: u64) -> Result<(), ()> {
    // SAFETY: the caller's buffer holds at least `len` bytes.
    let ret = unsafe { bpf_probe_read_user(dst.cast::<c_void>(), len, src as *const c_void) };
    if ret == 0 { Ok(()) } else { Err(()) }
}

/// Copy a `T` from the traced process's memory at `src` into `dst`.
#[inline(always)]
pub fn read_user<T>(dst: *mut T, src: u64) -> Result<(), ()> {
    // SAFETY: dst points to a map value or stack slot of size_of::<T>().
    let ret = unsafe { bpf_probe_read_user(dst.cast::<c_void>(), size_of::<T>() as u32, src as *const c_void) };
    if ret == 0 { Ok(()) } else { Err(()) }
}
