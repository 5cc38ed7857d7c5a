//! Delta-encoded timestamps, as Perfetto's own SDK writes them: the first
//! packet defines a clock of the packet sequence that is incremental (each
//! timestamp on it is a delta from the sequence's previous one) and makes it
//! the sequence's default. A ubatch's weight slices all start and end
//! together, so most deltas are 0: one byte instead of six or seven.
//!
//! Packets are not written in time order (an op is written when it ends,
//! after shorter ops that started later on other threads); a packet earlier
//! than the previous one carries its absolute time on the trace clock
//! instead, which leaves the incremental clock where it was.

use super::proto::{ClockSnapshot, TracePacket, TracePacketDefaults, clock_snapshot};

/// Ids 64–127 are clocks a producer defines for its own packet sequence.
pub const DELTA_CLOCK: u32 = 64;
/// The clock ttrace's times were always read as: Perfetto's default trace
/// clock. The delta clock is defined equal to it.
pub const TRACE_CLOCK: u32 = clock_snapshot::clock::BuiltinClocks::Boottime as u32;

#[derive(Default)]
pub struct DeltaClock {
    /// The delta clock's time after the last packet on it; `None` until the
    /// snapshot that defines it is written.
    last: Option<u64>,
}

impl DeltaClock {
    /// The first packet's additions: the snapshot defining the delta clock
    /// at `start`, and the defaults naming it. The packet itself is stamped
    /// on the trace clock.
    pub fn define(&mut self, start: u64, p: &mut TracePacket) {
        let clock = |clock_id, is_incremental| clock_snapshot::Clock {
            clock_id: Some(clock_id),
            timestamp: Some(start),
            is_incremental,
        };
        p.clock_snapshot =
            Some(ClockSnapshot { clocks: vec![clock(TRACE_CLOCK, None), clock(DELTA_CLOCK, Some(true))] });
        p.trace_packet_defaults = Some(TracePacketDefaults { timestamp_clock_id: Some(DELTA_CLOCK) });
        p.timestamp = Some(start);
        p.timestamp_clock_id = Some(TRACE_CLOCK);
        self.last = Some(start);
    }

    /// Rewrites a packet's absolute `timestamp` for the sequence.
    pub fn stamp(&mut self, p: &mut TracePacket) {
        let Some(ts) = p.timestamp.filter(|_| p.timestamp_clock_id.is_none()) else { return };
        match self.last {
            Some(last) if ts >= last => {
                p.timestamp = Some(ts - last);
                self.last = Some(ts);
            }
            _ => p.timestamp_clock_id = Some(TRACE_CLOCK),
        }
    }
}
