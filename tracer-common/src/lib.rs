//! Event layouts and map names shared by the kernel (`tracer-ebpf`) and user
//! (`tracer-user`) sides. This crate is the only place they are defined.
//!
//! Every event starts with an [`EventHeader`]; its `kind` says which struct
//! follows. All structs are `#[repr(C)]` with explicit padding so the byte
//! layout is the same on both sides, which the `const` asserts below pin down.
#![no_std]

pub mod tracepoints;

/// Ring buffer carrying every event to user space.
pub const MAP_EVENTS: &str = "EVENTS";
/// Per-CPU `u64` array, indexed by [`EventKind`]: events dropped because the
/// ring buffer was full. The ring buffer keeps no such count itself.
pub const MAP_LOST: &str = "LOST";
/// Hash `u32 tgid -> u8`: the processes whose events are recorded.
pub const MAP_TARGET_TGIDS: &str = "TARGET_TGIDS";

/// Default ring buffer size; user space may override it at load time.
pub const DEFAULT_RING_BYTES: u32 = 16 << 20;
/// Capacity of [`MAP_TARGET_TGIDS`].
pub const MAX_TARGET_TGIDS: u32 = 64;

/// Program names, as the loader looks them up in the object.
pub mod programs {
    /// Uprobe recording the first six integer arguments of any function.
    pub const CALL_ARGS: &str = "call_args";
    /// `exceptions:page_fault_user` tracepoint.
    pub const PAGE_FAULT_USER: &str = "page_fault_user";
}

/// Discriminant of every event; also the index into [`MAP_LOST`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Call = 1,
    PageFault = 2,
}

/// Number of slots in [`MAP_LOST`]; every `EventKind` value is below it.
pub const EVENT_KIND_SLOTS: u32 = 16;

impl EventKind {
    pub const ALL: [EventKind; 2] = [EventKind::Call, EventKind::PageFault];

    pub const fn from_u32(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::Call),
            2 => Some(Self::PageFault),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Call => "call",
            Self::PageFault => "page_fault",
        }
    }
}

/// Common prefix of every event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    /// An [`EventKind`] value.
    pub kind: u32,
    /// CPU the event was recorded on.
    pub cpu: u32,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
    pub ts_ns: u64,
    /// Thread group id (the process id users see).
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
}

/// A probed function was entered: its first six integer arguments
/// (System V x86_64: rdi, rsi, rdx, rcx, r8, r9).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallEvent {
    pub header: EventHeader,
    pub args: [u64; 6],
}

/// A user-space page fault (`exceptions:page_fault_user`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageFaultEvent {
    pub header: EventHeader,
    pub address: u64,
    pub ip: u64,
    pub error_code: u64,
}

// Layout pins: a change here is a trace-format change on both sides.
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<EventHeader>() == 24);
    assert!(offset_of!(EventHeader, ts_ns) == 8);
    assert!(offset_of!(EventHeader, tgid) == 16);
    assert!(size_of::<CallEvent>() == 72);
    assert!(offset_of!(CallEvent, args) == 24);
    assert!(size_of::<PageFaultEvent>() == 48);
    assert!(offset_of!(PageFaultEvent, address) == 24);
    assert!((EventKind::PageFault as u32) < EVENT_KIND_SLOTS);
};

#[cfg(feature = "user")]
mod user {
    use super::*;
    // SAFETY: plain-old-data, `#[repr(C)]`, no padding holes, any bit pattern valid.
    unsafe impl aya::Pod for EventHeader {}
    unsafe impl aya::Pod for CallEvent {}
    unsafe impl aya::Pod for PageFaultEvent {}
}
