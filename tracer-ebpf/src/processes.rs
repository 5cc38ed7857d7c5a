//! Following the processes a traced one starts, while the library hold is on
//! (`run` of a command with no ggml linked): `unshare --fork chroot ROOT
//! PROGRAM`, as a container runs a program, or `sh -c`. The program that
//! loads ggml is then a descendant with a loader of its own (the root's),
//! which ttrace can only hook once it has exec'd. So a child is traced from
//! its exec and stopped there until ttrace has hooked that loader.
//!
//! Perf-event tracepoints, whose records every kernel has: `sched_process_fork`
//! names the child, `sched_process_exec` runs in it.

use aya_ebpf::{
    bindings::BPF_RB_FORCE_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, generated::bpf_send_signal},
    macros::{map, tracepoint},
    maps::LruHashMap,
    programs::TracePointContext,
};
use tracer_common::{CallEvent, EventKind, MAX_NEW_CHILDREN, config, markers, split_pid_tgid, traced};

use crate::maps::{CONFIG, TARGET_TGIDS, count_lost, emit_with, header, traced_task};

/// Tasks a traced process created, until they exec (or are pushed out).
#[map]
static NEW_CHILDREN: LruHashMap<u32, u8> = LruHashMap::with_max_entries(MAX_NEW_CHILDREN, 0);

const SIGSTOP: u32 = 19;
/// Offsets into the fork record are below this + 1.
const RECORD_MASK: u64 = 0xff;

/// The record offset of `child_pid` while the hold is on; `None` otherwise.
#[inline(always)]
fn following() -> Option<u64> {
    if CONFIG.get(config::HOLD_AT_LIBRARY_LOAD).copied().unwrap_or(0) == 0 {
        return None;
    }
    CONFIG.get(config::FORK_CHILD_PID).copied().filter(|&offset| offset != 0)
}

/// In the parent, before the child first runs (`kernel_clone` fires the
/// tracepoint before `wake_up_new_task`): remember the child.
#[tracepoint]
pub fn process_fork(ctx: TracePointContext) -> u32 {
    let Some(offset) = following() else { return 0 };
    if traced_task().is_none() {
        return 0;
    }
    // Bounded for the verifier, which allows no unbounded math on the
    // context pointer (the record is far shorter).
    let offset = (offset & RECORD_MASK) as usize;
    // SAFETY: a helper read of the record, which checks the address.
    let Ok(child) = (unsafe { ctx.read_at::<u32>(offset) }) else { return 0 };
    // A full LRU map pushes the oldest out: a thread, most likely.
    let _ = NEW_CHILDREN.insert(child, 0, 0);
    0
}

/// In the process that exec'd, before its new program's first instruction:
/// a remembered child becomes traced; a followed process (a child before,
/// or exec'ing again, as `chroot` does) is stopped until ttrace continues it.
#[tracepoint]
pub fn process_exec(_ctx: TracePointContext) -> u32 {
    if following().is_none() {
        return 0;
    }
    let task @ (tgid, _) = split_pid_tgid(bpf_get_current_pid_tgid());
    let followed = match TARGET_TGIDS.get_ptr(tgid) {
        // SAFETY: a map value, read once.
        Some(kind) => (unsafe { *kind }) == traced::FOLLOWED,
        None => {
            if NEW_CHILDREN.get_ptr(tgid).is_none() {
                return 0;
            }
            let _ = NEW_CHILDREN.remove(tgid);
            if TARGET_TGIDS.insert(tgid, traced::FOLLOWED, 0).is_err() {
                // More processes than the map holds: this one runs untraced.
                count_lost(EventKind::Call);
                return 0;
            }
            true
        }
    };
    if !followed {
        return 0;
    }
    // The stop before the marker: ttrace continues the process when it reads
    // the marker, and a continue that came first would leave it stopped.
    // SAFETY: a helper call with a constant signal, to the current task.
    unsafe { bpf_send_signal(SIGSTOP) };
    let marker = CallEvent { header: header(EventKind::Call, task), cookie: markers::PROCESS_EXEC, args: [0; 6] };
    emit_with(EventKind::Call, marker, u64::from(BPF_RB_FORCE_WAKEUP));
    0
}
