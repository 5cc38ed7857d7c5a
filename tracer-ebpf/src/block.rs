//! Block-request tracepoints on the devices holding the model files. Every
//! request on those devices is sent; user space keeps the ones whose sectors
//! fall in a model file's extents. Two flavours fill the same event: BTF
//! tracepoints reading `struct request` (the default), and perf-event
//! tracepoints reading the formatted record (kernels without BTF).

use aya_ebpf::{
    helpers::bpf_get_current_comm,
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use tracer_common::{BlockEvent, BlockKind, EventKind, kernel::blk_status_errno, split_pid_tgid};

use crate::{
    kernel::{field, layout, layout_valid, perf, read, rwbs},
    maps::{BLOCK_DEVICES, emit, header},
};

// Both read their fields at the running kernel's offsets (`PERF_LAYOUT`).
#[tracepoint]
pub fn block_rq_issue(ctx: TracePointContext) -> u32 {
    let Ok(dev) = field::<u32>(&ctx, perf!(issue_dev)) else { return 0 };
    if BLOCK_DEVICES.get_ptr(dev).is_none() {
        return 0;
    }
    let (Ok(sector), Ok(nr_sector)) =
        (field::<u64>(&ctx, perf!(issue_sector)), field::<u32>(&ctx, perf!(issue_nr_sector)))
    else {
        return 0;
    };
    let mut event = block_event(BlockKind::Issue, dev, sector, nr_sector);
    event.rwbs = rwbs(&ctx, perf!(issue_rwbs));
    if let Ok(comm) = field::<[u8; 16]>(&ctx, perf!(issue_comm)) {
        event.comm = comm;
    }
    emit(EventKind::Block, event);
    0
}

#[tracepoint]
pub fn block_rq_complete(ctx: TracePointContext) -> u32 {
    let Ok(dev) = field::<u32>(&ctx, perf!(complete_dev)) else { return 0 };
    if BLOCK_DEVICES.get_ptr(dev).is_none() {
        return 0;
    }
    let fields = (
        field::<u64>(&ctx, perf!(complete_sector)),
        field::<u32>(&ctx, perf!(complete_nr_sector)),
        field::<i32>(&ctx, perf!(complete_error)),
    );
    let (Ok(sector), Ok(nr_sector), Ok(error)) = fields else { return 0 };
    let mut event = block_event(BlockKind::Complete, dev, sector, nr_sector);
    event.error = error;
    event.rwbs = rwbs(&ctx, perf!(complete_rwbs));
    emit(EventKind::Block, event);
    0
}

/// `block_rq_issue(struct request *rq)`: the fields its `TP_fast_assign`
/// records, read from `rq`.
#[btf_tracepoint(function = "block_rq_issue")]
pub fn block_rq_issue_btf(ctx: BtfTracePointContext) -> u32 {
    let Some(rq) = Request::of(ctx.arg(0)) else { return 0 };
    // Passthrough commands carry no sector range (blk_rq_trace_sector).
    let (sector, nr_sector) = if rq.passthrough() { (0, 0) } else { (rq.sector, rq.data_len >> 9) };
    let mut event = block_event(BlockKind::Issue, rq.dev, sector, nr_sector);
    event.rwbs = rq.rwbs();
    if let Ok(comm) = bpf_get_current_comm() {
        event.comm = comm;
    }
    emit(EventKind::Block, event);
    0
}

/// `block_rq_complete(struct request *rq, blk_status_t error, unsigned int
/// nr_bytes)`.
#[btf_tracepoint(function = "block_rq_complete")]
pub fn block_rq_complete_btf(ctx: BtfTracePointContext) -> u32 {
    let Some(rq) = Request::of(ctx.arg(0)) else { return 0 };
    let status: u64 = ctx.arg(1);
    let nr_bytes: u64 = ctx.arg(2);
    let mut event = block_event(BlockKind::Complete, rq.dev, rq.sector, (nr_bytes >> 9) as u32);
    event.error = blk_status_errno(status as u8);
    event.rwbs = rq.rwbs();
    emit(EventKind::Block, event);
    0
}

/// What the block tracepoints read from a `struct request` on a watched
/// device.
struct Request {
    dev: u32,
    cmd_flags: u32,
    data_len: u32,
    sector: u64,
}

impl Request {
    /// `None` unless `rq` is on a watched device.
    #[inline(always)]
    fn of(rq: u64) -> Option<Self> {
        if !layout_valid() {
            return None;
        }
        // dev: disk_devt(rq->q->disk), 0 without a disk, as the tracepoint.
        let queue: u64 = read(rq, layout!(request_q))?;
        let disk: u64 = read(queue, layout!(queue_disk)).unwrap_or(0);
        let dev = if disk == 0 {
            0
        } else {
            let major: u32 = read(disk, layout!(gendisk_major))?;
            let minor: u32 = read(disk, layout!(gendisk_first_minor))?;
            major << 20 | minor
        };
        BLOCK_DEVICES.get_ptr(dev)?;
        Some(Self {
            dev,
            cmd_flags: read(rq, layout!(request_cmd_flags))?,
            data_len: read(rq, layout!(request_data_len))?,
            sector: read(rq, layout!(request_sector))?,
        })
    }

    #[inline(always)]
    fn op(&self) -> u32 {
        let bits = layout!(req_op_bits) & 31;
        self.cmd_flags & ((1u32 << bits) - 1)
    }

    #[inline(always)]
    fn flag(&self, bit: u32) -> bool {
        bit < 32 && (self.cmd_flags >> (bit & 31)) & 1 != 0
    }

    #[inline(always)]
    fn passthrough(&self) -> bool {
        let op = self.op();
        op == layout!(op_drv_in) || op == layout!(op_drv_out)
    }

    /// The flags as `blk_fill_rwbs` prints them.
    #[inline(always)]
    fn rwbs(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        let mut n = 0;
        let mut put = |c: u8| {
            if n < out.len() {
                out[n] = c;
                n += 1;
            }
        };
        if self.flag(layout!(flag_preflush)) {
            put(b'F');
        }
        let op = self.op();
        if op == layout!(op_write) {
            put(b'W');
        } else if op == layout!(op_discard) {
            put(b'D');
        } else if op == layout!(op_secure_erase) {
            put(b'D');
            put(b'E');
        } else if op == layout!(op_flush) {
            put(b'F');
        } else if op == layout!(op_read) {
            put(b'R');
        } else {
            put(b'N');
        }
        let flags = [
            (layout!(flag_fua), b'F'),
            (layout!(flag_rahead), b'A'),
            (layout!(flag_sync), b'S'),
            (layout!(flag_meta), b'M'),
            (layout!(flag_atomic), b'U'),
        ];
        for (bit, c) in flags {
            if self.flag(bit) {
                put(c);
            }
        }
        out
    }
}

#[inline(always)]
fn block_event(kind: BlockKind, dev: u32, sector: u64, nr_sector: u32) -> BlockEvent {
    BlockEvent {
        header: header(EventKind::Block, task()),
        dev,
        nr_sector,
        sector,
        kind: kind as u32,
        ..Default::default()
    }
}

/// Completions run in interrupt context: the task is whoever was running.
#[inline(always)]
fn task() -> (u32, u32) {
    let pid_tgid = aya_ebpf::helpers::bpf_get_current_pid_tgid();
    split_pid_tgid(pid_tgid)
}
