//! `ttrace check`'s recursion self-test: a forced, counted recursion miss.
//! `recursion_trigger` (a uprobe) prints once through `bpf_trace_printk`,
//! whose tracepoint runs `recursion_selftest`, which prints again: that
//! nested run of the same program is the one the kernel skips, and counts
//! in its `recursion_misses`. So one call of the probed function is one
//! miss, read back the way a run reads its I/O programs' misses.

use aya_ebpf::{
    helpers::bpf_printk,
    macros::{btf_tracepoint, uprobe},
    programs::{BtfTracePointContext, ProbeContext},
};

use crate::maps::traced_task;

#[uprobe]
pub fn recursion_trigger(_ctx: ProbeContext) -> u32 {
    if traced_task().is_some() {
        // SAFETY: a constant format with no arguments.
        unsafe { bpf_printk!(c"ttrace check: recursion self-test") };
    }
    0
}

#[btf_tracepoint(function = "bpf_trace_printk")]
pub fn recursion_selftest(_ctx: BtfTracePointContext) -> u32 {
    if traced_task().is_some() {
        // SAFETY: as above. Fires this tracepoint again, inside this program.
        unsafe { bpf_printk!(c"ttrace check: recursion self-test, nested") };
    }
    0
}
