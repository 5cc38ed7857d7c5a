//! What a function does with the struct its first argument points at, read
//! from its machine code: each memory operand based on that pointer (or a
//! copy of it), with its offset, width and whether it is read, written or
//! only addressed. Decoded with iced-x86, so `endbr64`, prefixes and other
//! compiler variations are instructions like any other.

use iced_x86::{Decoder, DecoderOptions, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register};

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
        let copy = insn.mnemonic() == Mnemonic::Mov
            && insn.op_kind(0) == OpKind::Register
            && insn.op_kind(1) == OpKind::Register
            && insn.op0_register().size() == 8
            && holders.contains(&insn.op1_register());
        let written: Vec<Register> = used
            .used_registers()
            .iter()
            .filter(|r| matches!(r.access(), OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite))
            .map(|r| r.register().full_register())
            .collect();
        holders.retain(|h| !written.contains(h));
        if copy {
            holders.push(insn.op0_register());
        }
        if holders.is_empty() {
            break;
        }
    }
    out
}

/// The value a function returns as a constant (`mov $0x170, %eax; ret`).
pub fn returned_constant(code: &[u8]) -> Option<u64> {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut value = None;
    for insn in &mut decoder {
        match insn.mnemonic() {
            Mnemonic::Endbr64 | Mnemonic::Nop => {}
            Mnemonic::Mov
                if insn.op_kind(0) == OpKind::Register
                    && insn.op0_register().full_register() == Register::RAX
                    && matches!(
                        insn.op_kind(1),
                        OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate64
                    ) =>
            {
                value = Some(insn.immediate(1));
            }
            Mnemonic::Ret => return value,
            _ => return None,
        }
    }
    None
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
}
