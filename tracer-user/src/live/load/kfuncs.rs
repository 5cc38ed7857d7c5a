//! Links the object's kfunc placeholders (`tracer_common::kfunc`) for the
//! running kernel before aya reads it: each `call <placeholder>` becomes a
//! kfunc call by the kfunc's BTF id where this kernel has every kfunc the
//! programs call (they come in pairs, a disable with its enable), else a
//! no-op. Aya 0.14 cannot link kfuncs itself.

use object::{Object, ObjectSection, SectionKind};
use tracer_common::kfunc::{self, Kfunc};

use crate::live::{btf_index::BtfIndex, kernel_btf::VMLINUX_BTF};

/// `BPF_JMP | BPF_CALL`.
const CALL: u8 = 0x85;
/// `BPF_JMP | BPF_JA`, offset 0: a no-op.
const NOP: [u8; 8] = [0x05, 0, 0, 0, 0, 0, 0, 0];
/// A call's source register for a kfunc of vmlinux (offset 0).
const PSEUDO_KFUNC_CALL: u8 = 2;

#[derive(Debug, thiserror::Error)]
pub enum KfuncError {
    #[error("the embedded eBPF object is not readable ELF: {0}")]
    Elf(#[from] object::Error),
}

/// Whether the kfuncs are linked on this kernel, and why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kfuncs {
    /// Every kfunc's BTF id, in `kfunc::ALL`'s order.
    Linked(Vec<u32>),
    /// Calls become no-ops, for this reason.
    Absent(String),
}

impl Kfuncs {
    /// The running kernel's kfuncs, from its BTF.
    pub fn of_this_kernel() -> Self {
        match std::fs::read(VMLINUX_BTF) {
            Ok(blob) => match BtfIndex::new(&blob) {
                Ok(btf) => Self::in_btf(&btf),
                Err(e) => Self::Absent(format!("the kernel's BTF ({VMLINUX_BTF}) cannot be parsed: {e}")),
            },
            Err(e) => Self::Absent(format!("the kernel's BTF ({VMLINUX_BTF}) cannot be read: {e}")),
        }
    }

    fn in_btf(btf: &BtfIndex) -> Self {
        let ids: Option<Vec<u32>> = kfunc::ALL.iter().map(|k| btf.func_id(k.name())).collect();
        match ids {
            Some(ids) => Self::Linked(ids),
            None => Self::Absent(format!("no {} before Linux 6.10", Kfunc::PreemptDisable.name())),
        }
    }

    fn id(&self, kfunc: Kfunc) -> Option<u32> {
        match self {
            Self::Linked(ids) => ids.get(kfunc as usize).copied(),
            Self::Absent(_) => None,
        }
    }
}

/// An ELF object in memory aligned for the ELF reader (as aya's
/// `include_bytes_aligned!` is).
pub struct AlignedObject {
    words: Vec<u64>,
    len: usize,
}

impl AlignedObject {
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

/// `object` with every placeholder call linked as `kfuncs` says.
pub fn link(object: &[u8], kfuncs: &Kfuncs) -> Result<AlignedObject, KfuncError> {
    let mut out = AlignedObject { words: vec![0; object.len().div_ceil(8)], len: object.len() };
    out.bytes_mut().copy_from_slice(object);
    let file = object::File::parse(object)?;
    for section in file.sections().filter(|s| s.kind() == SectionKind::Text) {
        let Some((start, len)) = section.file_range() else { continue };
        let (Ok(start), Ok(len)) = (usize::try_from(start), usize::try_from(len)) else { continue };
        let Some(code) = out.bytes_mut().get_mut(start..start + len) else { continue };
        for insn in code.chunks_exact_mut(8) {
            // A helper call (source register 0) to a placeholder number.
            let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
            if insn[0] != CALL || insn[1] >> 4 != 0 {
                continue;
            }
            let Some(kfunc) = Kfunc::of_placeholder(imm) else { continue };
            match kfuncs.id(kfunc) {
                Some(id) => {
                    insn[1] = PSEUDO_KFUNC_CALL << 4;
                    insn[2..4].fill(0);
                    insn[4..8].copy_from_slice(&id.to_le_bytes());
                }
                None => insn.copy_from_slice(&NOP),
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::load::EBPF_OBJECT;

    /// The calls in the object's code: (kfunc placeholder or kfunc id, as seen).
    fn calls(object: &[u8]) -> (Vec<Kfunc>, Vec<u32>, usize) {
        let file = object::File::parse(object).unwrap();
        let (mut placeholders, mut kfunc_ids, mut nops) = (Vec::new(), Vec::new(), 0);
        for section in file.sections().filter(|s| s.kind() == SectionKind::Text) {
            for insn in section.data().unwrap().chunks_exact(8) {
                let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
                match (insn[0], insn[1] >> 4) {
                    (CALL, 0) => placeholders.extend(Kfunc::of_placeholder(imm)),
                    (CALL, PSEUDO_KFUNC_CALL) => kfunc_ids.push(imm as u32),
                    _ if insn == NOP => nops += 1,
                    _ => {}
                }
            }
        }
        (placeholders, kfunc_ids, nops)
    }

    #[test]
    fn every_placeholder_is_linked_and_each_disable_has_its_enable() {
        let (placeholders, ids, _) = calls(EBPF_OBJECT);
        assert!(ids.is_empty(), "the object as built calls no kfunc directly");
        let count = |k| placeholders.iter().filter(|&&p| p == k).count();
        assert!(count(Kfunc::PreemptDisable) >= 10, "every uprobe program is pinned");
        assert_eq!(count(Kfunc::PreemptDisable), count(Kfunc::PreemptEnable));

        let linked = link(EBPF_OBJECT, &Kfuncs::Linked(vec![1001, 1002])).unwrap();
        assert_eq!(linked.bytes().len(), EBPF_OBJECT.len());
        let (left, ids, _) = calls(linked.bytes());
        assert!(left.is_empty(), "{left:?} left unlinked");
        assert_eq!(ids.iter().filter(|&&id| id == 1001).count(), count(Kfunc::PreemptDisable));
        assert_eq!(ids.iter().filter(|&&id| id == 1002).count(), count(Kfunc::PreemptEnable));

        let (_, nop_before, nops_before) = calls(EBPF_OBJECT);
        assert!(nop_before.is_empty());
        let absent = link(EBPF_OBJECT, &Kfuncs::Absent("old".into())).unwrap();
        let (left, ids, nops) = calls(absent.bytes());
        assert!(left.is_empty() && ids.is_empty());
        assert_eq!(nops - nops_before, placeholders.len(), "each call became a no-op");
    }

    #[test]
    fn this_kernel_has_both_kfuncs_or_says_why_not() {
        match Kfuncs::of_this_kernel() {
            Kfuncs::Linked(ids) => assert!(ids.len() == kfunc::ALL.len() && ids.iter().all(|&id| id > 0)),
            Kfuncs::Absent(why) => assert!(why.contains("bpf_preempt_disable") || why.contains("BTF"), "{why}"),
        }
    }
}
