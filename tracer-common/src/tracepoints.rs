//! Field offsets inside kernel tracepoint records, as
//! `/sys/kernel/tracing/events/<group>/<name>/format` gives them. The
//! constants are kernel 6.18's. They are not stable across kernels (6.1's
//! `rwbs` is `char[8]` at 32, 6.12's at 34, 6.18's `char[10]`; 7.2 puts
//! `mm_filemap_add_to_page_cache`'s `i_ino` before `pfn`), so user space
//! reads the running kernel's format files into a [`PerfLayout`] that the
//! perf-event programs read their fields at.

/// Name of the global the perf-event programs read the layout from.
pub const PERF_LAYOUT: &str = "PERF_LAYOUT";

/// A field this kernel's record does not have (read as 0).
pub const NO_FIELD: u32 = u32::MAX;

/// Where the perf-event programs find each field they read in this
/// kernel's records (byte offsets), and the length of the `rwbs` arrays.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerfLayout {
    pub fault_address: u32,
    pub fault_ip: u32,
    pub fault_error_code: u32,
    pub add_ino: u32,
    pub add_index: u32,
    pub add_dev: u32,
    /// [`NO_FIELD`] where the record has no `order` (older kernels): 0 then.
    pub add_order: u32,
    pub filemap_fault_ino: u32,
    pub filemap_fault_dev: u32,
    pub filemap_fault_index: u32,
    pub issue_dev: u32,
    pub issue_sector: u32,
    pub issue_nr_sector: u32,
    pub issue_rwbs: u32,
    pub issue_comm: u32,
    pub complete_dev: u32,
    pub complete_sector: u32,
    pub complete_nr_sector: u32,
    pub complete_error: u32,
    pub complete_rwbs: u32,
    /// `char rwbs[N]`, the same in both block tracepoints (8 up to 6.12,
    /// 10 in 6.18), at most [`MAX_RWBS`].
    pub rwbs_len: u32,
}

/// Bytes of `rwbs` a block event holds.
pub const MAX_RWBS: u32 = 16;

impl PerfLayout {
    /// Kernel 6.18's records: the object's value until user space writes
    /// the running kernel's.
    pub const DEFAULT: Self = Self {
        fault_address: page_fault_user::ADDRESS as u32,
        fault_ip: page_fault_user::IP as u32,
        fault_error_code: page_fault_user::ERROR_CODE as u32,
        add_ino: filemap_add_to_page_cache::I_INO as u32,
        add_index: filemap_add_to_page_cache::INDEX as u32,
        add_dev: filemap_add_to_page_cache::S_DEV as u32,
        add_order: filemap_add_to_page_cache::ORDER as u32,
        filemap_fault_ino: filemap_fault::I_INO as u32,
        filemap_fault_dev: filemap_fault::S_DEV as u32,
        filemap_fault_index: filemap_fault::INDEX as u32,
        issue_dev: block_rq_issue::DEV as u32,
        issue_sector: block_rq_issue::SECTOR as u32,
        issue_nr_sector: block_rq_issue::NR_SECTOR as u32,
        issue_rwbs: block_rq_issue::RWBS as u32,
        issue_comm: block_rq_issue::COMM as u32,
        complete_dev: block_rq_complete::DEV as u32,
        complete_sector: block_rq_complete::SECTOR as u32,
        complete_nr_sector: block_rq_complete::NR_SECTOR as u32,
        complete_error: block_rq_complete::ERROR as u32,
        complete_rwbs: block_rq_complete::RWBS as u32,
        rwbs_len: block_rq_issue::RWBS_LEN as u32,
    };
}

#[cfg(feature = "user")]
// SAFETY: plain `u32` fields, no padding.
unsafe impl aya::Pod for PerfLayout {}

const _: () = assert!(size_of::<PerfLayout>() == 21 * 4);

/// `exceptions:page_fault_user`.
pub mod page_fault_user {
    pub const GROUP: &str = "exceptions";
    pub const NAME: &str = "page_fault_user";
    pub const ADDRESS: usize = 8;
    pub const IP: usize = 16;
    pub const ERROR_CODE: usize = 24;
}

/// `filemap:mm_filemap_add_to_page_cache`.
pub mod filemap_add_to_page_cache {
    pub const GROUP: &str = "filemap";
    pub const NAME: &str = "mm_filemap_add_to_page_cache";
    pub const I_INO: usize = 16;
    pub const INDEX: usize = 24;
    pub const S_DEV: usize = 32;
    pub const ORDER: usize = 36;
}

/// `filemap:mm_filemap_fault`.
pub mod filemap_fault {
    pub const GROUP: &str = "filemap";
    pub const NAME: &str = "mm_filemap_fault";
    pub const I_INO: usize = 8;
    pub const S_DEV: usize = 16;
    pub const INDEX: usize = 24;
}

/// `block:block_rq_issue`.
pub mod block_rq_issue {
    pub const GROUP: &str = "block";
    pub const NAME: &str = "block_rq_issue";
    pub const DEV: usize = 8;
    pub const SECTOR: usize = 16;
    pub const NR_SECTOR: usize = 24;
    pub const RWBS: usize = 34;
    /// `char rwbs[RWBS_LEN]`, the same in both block tracepoints.
    pub const RWBS_LEN: usize = 10;
    pub const COMM: usize = 44;
}

/// `block:block_rq_complete`.
pub mod block_rq_complete {
    pub const GROUP: &str = "block";
    pub const NAME: &str = "block_rq_complete";
    pub const DEV: usize = 8;
    pub const SECTOR: usize = 16;
    pub const NR_SECTOR: usize = 24;
    pub const ERROR: usize = 28;
    pub const RWBS: usize = 34;
}
