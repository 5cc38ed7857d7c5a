//! ggml's backend buffers in Perfetto: a `backend buffers` group (uuid
//! [`BUFFERS_UUID`]) with one counter per usage, `bytes: weights`,
//! `bytes: KV cache`, … (uuid `BUFFERS_UUID + 1 + usage`), stepping at
//! every creation and free.

use std::io::Write;

use super::{CHILD_ORDERING_EXPLICIT, PerfettoSink, track};
use crate::{
    analyze::{Analysis, buffers::Usage},
    export::ExportError,
};

use super::proto::{CounterDescriptor, TrackDescriptor, UNIT_SIZE_BYTES};

pub const BUFFERS_UUID: u64 = 0x5_0000_0000;

pub fn usage_uuid(usage: Usage) -> u64 {
    BUFFERS_UUID + 1 + Usage::ALL.iter().position(|&u| u == usage).unwrap_or(0) as u64
}

impl<W: Write> PerfettoSink<W> {
    /// The group, a counter per usage that has buffers, and their steps.
    pub(super) fn buffer_counters(&mut self, a: &Analysis) -> Result<(), ExportError> {
        if a.buffers.is_empty() {
            return Ok(());
        }
        self.descriptor(TrackDescriptor {
            child_ordering: Some(CHILD_ORDERING_EXPLICIT),
            ..track(BUFFERS_UUID, "backend buffers", None)
        })?;
        let start = a.header.start_monotonic_ns;
        for (rank, usage) in Usage::ALL.into_iter().enumerate() {
            let buffers: Vec<_> = a.buffers.list.iter().filter(|b| b.usage == usage).collect();
            if buffers.is_empty() {
                continue;
            }
            let uuid = usage_uuid(usage);
            self.descriptor(TrackDescriptor {
                counter: Some(CounterDescriptor { unit: Some(UNIT_SIZE_BYTES), unit_name: Some("bytes".into()) }),
                sibling_order_rank: Some(rank as i32),
                ..track(uuid, &format!("bytes: {}", usage.name()), Some(BUFFERS_UUID))
            })?;
            let mut steps: Vec<(u64, i64)> = Vec::new();
            for b in buffers {
                steps.push((b.created_ns.unwrap_or(start), b.size as i64));
                if let Some(f) = b.freed_ns {
                    steps.push((f, -(b.size as i64)));
                }
            }
            // Frees after allocations at the same instant: the sum never dips below 0.
            steps.sort_by_key(|&(t, delta)| (t, delta < 0));
            let mut total = 0i64;
            for (t, delta) in steps {
                total += delta;
                self.counter_on(uuid, t, total)?;
            }
        }
        Ok(())
    }
}
