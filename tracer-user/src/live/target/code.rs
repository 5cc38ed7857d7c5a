//! What a function does with the struct its first argument points at, read
//! from its machine code: each memory operand based on that pointer (or a
//! copy of it), with its offset, width and whether it is read, written or
//! only addressed. Decoded with iced-x86, so `endbr64`, prefixes and other
//! compiler variations are instructions like any other.

use iced_x86::{
    Decoder, DecoderOptions, Instruction, InstructionInfo, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register,
};

/// How an instruction uses a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    Read,
    Write,
    /// Read and written by one instruction (`or $1, 0x94(%rdi)`).
    Update,
    /// Its address taken (`lea 0x100(%rdi), %rax`).
    Address,
}

/// One use of `arg + offset`, `width` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub offset: u32,
    pub width: u32,
    pub how: Use,
}

/// The first argument's accesses in `code`, in address order. The pointer is
/// followed through register copies (`mov %rdi, %rax`) until a register that
/// holds it is overwritten; a loop that reloads it (`mov 0xe8(%rdi), %rdi`)
/// is seen only up to the reload.
pub fn accesses(code: &[u8]) -> Vec<Access> {
    accesses_of(code, Register::RDI)
}

/// The accesses through the argument passed in `arg` (`RSI`: a method's
/// first argument after `this`), as [`accesses`].
pub fn accesses_of(code: &[u8], arg: Register) -> Vec<Access> {
    let mut holders = vec![arg];
    let mut out = Vec::new();
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut insn = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut insn);
        if insn.is_invalid() {
            break;
        }
        // iced lists no memory use for LEA, which only computes the address.
        if insn.mnemonic() == Mnemonic::Lea
            && insn.memory_index() == Register::None
            && holders.contains(&insn.memory_base())
            && let Ok(offset) = u32::try_from(insn.memory_displacement64())
        {
            out.push(Access { offset, width: 0, how: Use::Address });
        }
        let used = info.info(&insn);
        for m in used.used_memory() {
            if m.index() != Register::None || !holders.contains(&m.base()) {
                continue;
            }
            let Ok(offset) = u32::try_from(m.displacement()) else { continue };
            let how = match m.access() {
                OpAccess::NoMemAccess => Use::Address,
                OpAccess::Read | OpAccess::CondRead => Use::Read,
                OpAccess::Write | OpAccess::CondWrite => Use::Write,
                OpAccess::ReadWrite | OpAccess::ReadCondWrite => Use::Update,
                _ => continue,
            };
            out.push(Access { offset, width: m.memory_size().size() as u32, how });
        }
        let copy = copy_of(&insn, &holders);
        forget_written(&mut holders, used);
        holders.extend(copy);
        if holders.is_empty() {
            break;
        }
    }
    out
}

/// The 64-bit register `insn` copies one of `holders` into (`mov %rdi,%rax`).
fn copy_of(insn: &Instruction, holders: &[Register]) -> Option<Register> {
    (insn.mnemonic() == Mnemonic::Mov
        && insn.op_kind(0) == OpKind::Register
        && insn.op_kind(1) == OpKind::Register
        && insn.op0_register().size() == 8
        && holders.contains(&insn.op1_register()))
    .then(|| insn.op0_register())
}

/// Drops from `holders` every register the instruction writes.
fn forget_written(holders: &mut Vec<Register>, used: &InstructionInfo) {
    for r in used.used_registers() {
        if matches!(r.access(), OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite) {
            holders.retain(|h| *h != r.register().full_register());
        }
    }
}

/// The constant `insn` moves into RAX (or EAX), if it does.
fn rax_immediate(insn: &Instruction) -> Option<u64> {
    (insn.mnemonic() == Mnemonic::Mov
        && insn.op_kind(0) == OpKind::Register
        && insn.op0_register().full_register() == Register::RAX
        && matches!(insn.op_kind(1), OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate64))
    .then(|| insn.immediate(1))
}

/// The value a function returns as a constant (`mov $0x170, %eax; ret`).
pub fn returned_constant(code: &[u8]) -> Option<u64> {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut value = None;
    for insn in &mut decoder {
        match insn.mnemonic() {
            Mnemonic::Endbr64 | Mnemonic::Nop => {}
            Mnemonic::Mov if rax_immediate(&insn).is_some() => value = rax_immediate(&insn),
            Mnemonic::Ret => return value,
            _ => return None,
        }
    }
    None
}

/// Where `code` (decoded as at `ip`) stores the value of a 64-bit counter
/// taken there: the result of a call to one of `counters` (in RAX), or the
/// old value a `lock xadd` leaves in its register. Each store of that value
/// (or a copy of it) to `base + displacement`, 8 bytes, off the stack, gives
/// its displacement. A call or a write ends what a register holds.
pub fn counter_stores(code: &[u8], ip: u64, counters: &[u64]) -> Vec<u32> {
    let mut holders: Vec<Register> = Vec::new();
    let mut out = Vec::new();
    let mut decoder = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut insn = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut insn);
        if insn.is_invalid() {
            break;
        }
        if insn.is_call_near() {
            holders.clear();
            if counters.contains(&insn.near_branch_target()) {
                holders.push(Register::RAX);
            }
            continue;
        }
        let stored = insn.mnemonic() == Mnemonic::Mov
            && insn.op_kind(0) == OpKind::Memory
            && insn.op_kind(1) == OpKind::Register
            && insn.op1_register().size() == 8
            && holders.contains(&insn.op1_register())
            && insn.memory_index() == Register::None
            && !matches!(insn.memory_base(), Register::RSP | Register::RIP | Register::None);
        if stored && let Ok(displacement) = u32::try_from(insn.memory_displacement64()) {
            out.push(displacement);
        }
        let taken =
            (insn.mnemonic() == Mnemonic::Xadd && insn.has_lock_prefix() && insn.op_kind(1) == OpKind::Register)
                .then(|| insn.op1_register())
                .filter(|r| r.size() == 8);
        let copy = copy_of(&insn, &holders);
        forget_written(&mut holders, info.info(&insn));
        holders.extend(taken.into_iter().chain(copy));
    }
    out
}

/// Whether `code` increments a 64-bit counter and returns its old value, as
/// `ggml_graph_next_uid` compiles (`mov $1,%eax; lock xadd %rax,counter(%rip); ret`).
pub fn is_counter_increment(code: &[u8]) -> bool {
    let (mut one, mut added) = (false, false);
    for insn in Decoder::with_ip(64, code, 0, DecoderOptions::NONE) {
        match insn.mnemonic() {
            Mnemonic::Ret => return added,
            _ if added => return false,
            Mnemonic::Endbr64 | Mnemonic::Nop => {}
            Mnemonic::Mov if rax_immediate(&insn) == Some(1) => one = true,
            Mnemonic::Xadd
                if one
                    && insn.has_lock_prefix()
                    && insn.op_kind(0) == OpKind::Memory
                    && insn.memory_base() == Register::RIP
                    && insn.op1_register() == Register::RAX =>
            {
                added = true;
            }
            _ => return false,
        }
    }
    false
}

/// Targets of `code`'s direct near calls (decoded as at `ip`).
pub fn call_targets(code: &[u8], ip: u64) -> Vec<u64> {
    let mut targets: Vec<u64> = Decoder::with_ip(64, code, ip, DecoderOptions::NONE)
        .into_iter()
        .take_while(|i| !i.is_invalid())
        .filter(|i| i.is_call_near())
        .map(|i| i.near_branch_target())
        .collect();
    targets.sort_unstable();
    targets.dedup();
    targets
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(offset: u32, width: u32, how: Use) -> Access {
        Access { offset, width, how }
    }

    #[test]
    fn accessors_as_gcc_and_cet_builds_compile_them() {
        // lea 0x100(%rdi),%rax; ret
        let name = [0x48, 0x8d, 0x87, 0x00, 0x01, 0x00, 0x00, 0xc3];
        assert_eq!(accesses(&name), [access(0x100, 0, Use::Address)]);
        // endbr64; mov 0xf8(%rdi),%rax; ret
        let data = [0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8b, 0x87, 0xf8, 0x00, 0x00, 0x00, 0xc3];
        assert_eq!(accesses(&data), [access(0xf8, 8, Use::Read)]);
        // mov 0x50(%rdi),%edx; test %edx,%edx; jne +8; orl $0x1,0x94(%rdi); ret
        let set_input = [0x8b, 0x57, 0x50, 0x85, 0xd2, 0x75, 0x08, 0x83, 0x8f, 0x94, 0x00, 0x00, 0x00, 0x01, 0xc3];
        assert_eq!(accesses(&set_input), [access(0x50, 4, Use::Read), access(0x94, 4, Use::Update)]);
    }

    #[test]
    fn the_pointer_is_followed_through_copies_until_overwritten() {
        // mov %rdi,%rax; movl $0,(%rax); mov 0x10(%rsi),%rdi; mov %ecx,0x4(%rax); xor %eax,%eax; mov %rdx,8(%rax)
        let code = [
            0x48, 0x89, 0xf8, 0xc7, 0x00, 0x00, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x7e, 0x10, 0x89, 0x48, 0x04, 0x31, 0xc0,
            0x48, 0x89, 0x50, 0x08,
        ];
        assert_eq!(accesses(&code), [access(0, 4, Use::Write), access(4, 4, Use::Write)]);
    }

    #[test]
    fn constants_are_read_from_mov_ret_only() {
        assert_eq!(returned_constant(&[0xb8, 0x70, 0x01, 0x00, 0x00, 0xc3]), Some(0x170));
        assert_eq!(returned_constant(&[0xf3, 0x0f, 0x1e, 0xfa, 0xb8, 0x70, 0x01, 0x00, 0x00, 0xc3]), Some(0x170));
        // mov $0x170,%eax; add %edi,%eax; ret
        assert_eq!(returned_constant(&[0xb8, 0x70, 0x01, 0x00, 0x00, 0x01, 0xf8, 0xc3]), None);
    }

    #[test]
    fn a_counter_taken_by_a_call_or_inlined_is_followed_to_its_stores() {
        // Debian's ggml 0.27 ggml_graph_next_uid: endbr64; mov $1,%eax; lock xadd %rax,0x888fe(%rip); ret
        let next_uid =
            [0xf3, 0x0f, 0x1e, 0xfa, 0xb8, 0x01, 0, 0, 0, 0xf0, 0x48, 0x0f, 0xc1, 0x05, 0xfe, 0x88, 0x08, 0, 0xc3];
        assert!(is_counter_increment(&next_uid));
        assert!(!is_counter_increment(&next_uid[..next_uid.len() - 1]));
        // mov $2,%eax: not an increment by one
        let by_two = [0xb8, 0x02, 0, 0, 0, 0xf0, 0x48, 0x0f, 0xc1, 0x05, 0xfe, 0x88, 0x08, 0, 0xc3];
        assert!(!is_counter_increment(&by_two));
        // At 0x2d164 of its ggml_backend_sched_split_graph: call 0x15700;
        // mov 0x20(%rsp),%r15; mov 0x8(%r15),%r10d; mov %rax,0x58(%r15); mov %rax,0x10(%rsp)
        let ip = 0x2d164;
        let split = [
            0xe8, 0x97, 0x85, 0xfe, 0xff, 0x4c, 0x8b, 0x7c, 0x24, 0x20, 0x45, 0x8b, 0x57, 0x08, 0x49, 0x89, 0x47, 0x58,
            0x48, 0x89, 0x44, 0x24, 0x10,
        ];
        assert_eq!(call_targets(&split, ip), [0x15700]);
        assert_eq!(counter_stores(&split, ip, &[0x15700]), [0x58]);
        assert_eq!(counter_stores(&split, ip, &[0x15800]), Vec::<u32>::new());
        // Inlined: mov $1,%ecx; lock xadd %rcx,0x100(%rip); mov %rcx,%rdx; call; mov %rdx,0x58(%rbx)
        let inlined = [
            0xb9, 0x01, 0, 0, 0, 0xf0, 0x48, 0x0f, 0xc1, 0x0d, 0x00, 0x01, 0, 0, 0x48, 0x89, 0xca, 0x48, 0x89, 0x53,
            0x58, 0xe8, 0, 0, 0, 0, 0x48, 0x89, 0x53, 0x60,
        ];
        assert_eq!(counter_stores(&inlined, 0, &[]), [0x58]);
    }
}
