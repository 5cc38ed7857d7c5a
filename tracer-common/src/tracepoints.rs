//! Field offsets inside kernel tracepoint records, read from
//! `/sys/kernel/tracing/events/<group>/<name>/format` on kernel 6.18.
//! They are stable kernel ABI for these events; a root test re-reads the
//! running kernel's format files and fails if any offset moved.

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
