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
