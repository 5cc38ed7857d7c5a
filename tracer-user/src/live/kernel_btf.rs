//! The kernel struct layout the BTF-tracepoint programs read
//! ([`tracer_common::kernel::KernelLayout`]), resolved from the running
//! kernel's BTF: member offsets by name (through anonymous unions, as
//! `folio.index` is) and enum values, so a kernel whose structs moved still
//! gets the right fields, and one that lacks a field is refused by name.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use tracer_common::kernel::{KernelLayout, NO_FIELD};

use crate::live::btf_index::BtfIndex;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error(
        "cannot read the kernel's BTF at {path}: {source} (kernels without CONFIG_DEBUG_INFO_BTF need --tracepoints perf)"
    )]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot parse the kernel's BTF at {path}: {source}")]
    Parse { path: PathBuf, source: crate::live::btf_index::FormatError },
    #[error("the kernel's BTF has no `{0}`: this kernel's layout is not one ttrace knows; use --tracepoints perf")]
    Missing(String),
}

struct Types<'a>(BtfIndex<'a>);

impl Types<'_> {
    fn offset(&self, ty: &str, member: &str) -> Result<u32, BtfError> {
        self.0.member_offset(ty, member).ok_or_else(|| BtfError::Missing(format!("struct {ty}.{member}")))
    }

    /// Value of enumerator `name` of `enum ty`.
    fn enum_value(&self, ty: &str, name: &str) -> Result<u32, BtfError> {
        self.0.enum_value(ty, name).ok_or_else(|| BtfError::Missing(format!("enum {ty}::{name}")))
    }
}

/// What the BTF programs need to know of the running kernel.
#[derive(Debug)]
pub struct KernelTypes {
    pub layout: KernelLayout,
    /// The tracepoints a `tp_btf` program can attach to (`btf_trace_<event>`).
    tracepoints: HashSet<String>,
}

impl KernelTypes {
    pub fn has_tracepoint(&self, event: &str) -> bool {
        self.tracepoints.contains(event)
    }
}

/// What of the layout a program flavour needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Everything the BTF tracepoints read.
    Tracepoints,
    /// Only what the fentry stand-ins read (the perf flavour's): a kernel
    /// whose block or folio structs ttrace cannot read (5.10 has neither
    /// `request_queue.disk` nor folios) still gets them.
    StandIns,
}

/// Resolve the layout from the BTF file at `path` (normally [`VMLINUX_BTF`]).
pub fn resolve(path: &Path, scope: Scope) -> Result<KernelTypes, BtfError> {
    let bytes = std::fs::read(path).map_err(|source| BtfError::Read { path: path.into(), source })?;
    let index = BtfIndex::new(&bytes).map_err(|source| BtfError::Parse { path: path.into(), source })?;
    let tracepoints = index.tracepoints().map(|t| String::from_utf8_lossy(t).into_owned()).collect();
    let t = Types(index);
    let layout = match scope {
        Scope::Tracepoints => layout(&t)?,
        Scope::StandIns => stand_in_layout(&t)?,
    };
    Ok(KernelTypes { layout, tracepoints })
}

/// The fault stand-in's fields and the file behind a mapping (`file_of`);
/// the rest 0.
fn stand_in_layout(t: &Types) -> Result<KernelLayout, BtfError> {
    Ok(KernelLayout {
        vmf_vma: t.offset("vm_fault", "vma")?,
        vmf_pgoff: t.offset("vm_fault", "pgoff")?,
        vma_file: t.offset("vm_area_struct", "vm_file")?,
        file_mapping: t.offset("file", "f_mapping")?,
        ..file_of(t)?
    })
}

/// What every program reads to name a page's file: `mapping->host`'s inode
/// number and device.
fn file_of(t: &Types) -> Result<KernelLayout, BtfError> {
    Ok(KernelLayout {
        valid: 1,
        mapping_host: t.offset("address_space", "host")?,
        inode_ino: t.offset("inode", "i_ino")?,
        inode_sb: t.offset("inode", "i_sb")?,
        inode_rdev: t.offset("inode", "i_rdev")?,
        sb_dev: t.offset("super_block", "s_dev")?,
        ..KernelLayout::default()
    })
}

fn layout(t: &Types) -> Result<KernelLayout, BtfError> {
    let op = |name| t.enum_value("req_op", name);
    let flag = |name| t.enum_value("req_flag_bits", name);
    Ok(KernelLayout {
        request_q: t.offset("request", "q")?,
        request_cmd_flags: t.offset("request", "cmd_flags")?,
        request_data_len: t.offset("request", "__data_len")?,
        request_sector: t.offset("request", "__sector")?,
        queue_disk: t.offset("request_queue", "disk")?,
        gendisk_major: t.offset("gendisk", "major")?,
        gendisk_first_minor: t.offset("gendisk", "first_minor")?,
        folio_flags: t.offset("folio", "flags")?,
        // 6.1 keeps the order in a byte of its own; later kernels in
        // `_flags_1`'s low byte (little-endian: at `_flags_1` itself).
        folio_order: t.offset("folio", "_folio_order").or_else(|_| t.offset("folio", "_flags_1"))?,
        folio_mapping: t.offset("folio", "mapping")?,
        folio_index: t.offset("folio", "index")?,
        pg_head: t.enum_value("pageflags", "PG_head")?,
        regs_ip: t.offset("pt_regs", "ip")?,
        // The first flag bit follows the op bits (`__REQ_FAILFAST_DEV =
        // REQ_OP_BITS`); REQ_OP_BITS itself is a #define, not in BTF.
        req_op_bits: flag("__REQ_FAILFAST_DEV")?,
        op_read: op("REQ_OP_READ")?,
        op_write: op("REQ_OP_WRITE")?,
        op_flush: op("REQ_OP_FLUSH")?,
        op_discard: op("REQ_OP_DISCARD")?,
        op_secure_erase: op("REQ_OP_SECURE_ERASE")?,
        op_drv_in: op("REQ_OP_DRV_IN")?,
        op_drv_out: op("REQ_OP_DRV_OUT")?,
        flag_preflush: flag("__REQ_PREFLUSH")?,
        flag_fua: flag("__REQ_FUA")?,
        flag_rahead: flag("__REQ_RAHEAD")?,
        flag_sync: flag("__REQ_SYNC")?,
        flag_meta: flag("__REQ_META")?,
        flag_atomic: flag("__REQ_ATOMIC").unwrap_or(u32::MAX),
        // Only the fentry stand-in reads these: one missing costs that
        // program (`has_fault_fields`), not the whole flavour.
        vmf_vma: t.offset("vm_fault", "vma").unwrap_or(NO_FIELD),
        vmf_pgoff: t.offset("vm_fault", "pgoff").unwrap_or(NO_FIELD),
        vma_file: t.offset("vm_area_struct", "vm_file").unwrap_or(NO_FIELD),
        file_mapping: t.offset("file", "f_mapping").unwrap_or(NO_FIELD),
        ..file_of(t)?
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// `bpftool btf dump format raw` of the running kernel: per struct or
    /// enum, its members' byte offsets or values (first definition wins).
    fn bpftool_raw() -> HashMap<(String, String), u32> {
        let out = std::process::Command::new("bpftool")
            .args(["btf", "dump", "file", VMLINUX_BTF, "format", "raw"])
            .output()
            .expect("bpftool (installed by `cargo xtask setup`) runs");
        assert!(out.status.success(), "bpftool failed: {}", String::from_utf8_lossy(&out.stderr));
        let mut members = HashMap::new();
        let mut current = None;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if !line.starts_with('\t') {
                // `[582] STRUCT 'gendisk' size=568 vlen=28`
                current = line.split('\'').nth(1).map(str::to_string);
                continue;
            }
            let (Some(ty), Some(name)) = (&current, line.split('\'').nth(1)) else { continue };
            let field = |key: &str| line.split(key).nth(1)?.split_whitespace().next()?.parse::<u64>().ok();
            let value = field("bits_offset=").map(|bits| bits / 8).or_else(|| field("val="));
            if let Some(value) = value {
                members.entry((ty.clone(), name.to_string())).or_insert(value as u32);
            }
        }
        members
    }

    /// This machine's kernel against bpftool's reading of the same BTF.
    #[test]
    fn resolves_this_kernels_layout_as_bpftool_reads_it() {
        let types = resolve(Path::new(VMLINUX_BTF), Scope::Tracepoints).expect("the test machine's kernel has BTF");
        let layout = types.layout;
        assert!(types.has_tracepoint("mm_filemap_fault") && types.has_tracepoint("block_rq_issue"));
        let raw = bpftool_raw();
        let want = |ty: &str, name: &str| raw.get(&(ty.to_string(), name.to_string())).copied();
        for (got, ty, name) in [
            (layout.request_q, "request", "q"),
            (layout.request_cmd_flags, "request", "cmd_flags"),
            (layout.request_data_len, "request", "__data_len"),
            (layout.request_sector, "request", "__sector"),
            (layout.queue_disk, "request_queue", "disk"),
            (layout.gendisk_major, "gendisk", "major"),
            (layout.gendisk_first_minor, "gendisk", "first_minor"),
            (layout.mapping_host, "address_space", "host"),
            (layout.inode_ino, "inode", "i_ino"),
            (layout.inode_sb, "inode", "i_sb"),
            (layout.inode_rdev, "inode", "i_rdev"),
            (layout.sb_dev, "super_block", "s_dev"),
            (layout.regs_ip, "pt_regs", "ip"),
            (layout.vma_file, "vm_area_struct", "vm_file"),
            (layout.file_mapping, "file", "f_mapping"),
            (layout.pg_head, "pageflags", "PG_head"),
            (layout.req_op_bits, "req_flag_bits", "__REQ_FAILFAST_DEV"),
            (layout.flag_fua, "req_flag_bits", "__REQ_FUA"),
            (layout.flag_rahead, "req_flag_bits", "__REQ_RAHEAD"),
            (layout.op_drv_in, "req_op", "REQ_OP_DRV_IN"),
            (layout.op_secure_erase, "req_op", "REQ_OP_SECURE_ERASE"),
        ] {
            assert_eq!(Some(got), want(ty, name), "{ty}.{name}");
        }
        assert_eq!(layout.valid, 1);
        // Members inside anonymous unions resolve (folio.index sits in one).
        assert!(layout.folio_index > layout.folio_flags);
        assert!(layout.folio_order >= 64, "the order is in the folio's second page struct");
        assert!(layout.has_fault_fields());
        // The stand-ins' own scope reads the same fields.
        let stand_ins = resolve(Path::new(VMLINUX_BTF), Scope::StandIns).unwrap().layout;
        assert!(stand_ins.has_fault_fields() && stand_ins.valid == 1);
        assert_eq!((stand_ins.vmf_pgoff, stand_ins.sb_dev), (layout.vmf_pgoff, layout.sb_dev));
    }

    #[test]
    fn a_missing_file_names_the_fix() {
        let err = resolve(Path::new("/nonexistent/vmlinux"), Scope::Tracepoints).unwrap_err().to_string();
        assert!(err.contains("--tracepoints perf"), "{err}");
    }
}
