//! Where on a function its uprobe costs least. x86 uprobes emulate a few
//! instructions (push, jmp, call, conditional jumps, nop) and single-step
//! every other one out of line, which costs 16-60 µs per hit on this
//! project's VMs against ~1.5 µs for an emulated one. `llama_process`, hit
//! once per decode, begins with `test %esi,%esi; je`: probed one
//! instruction later, it is emulated, with the same argument registers.
//! (A jump back to that second instruction would hit the probe again; a
//! dispatch on an argument at a function's entry is no loop head.)

use std::path::Path;

use iced_x86::{Decoder, DecoderOptions, FlowControl, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register};
use tracer_common::ENDBR64;

use super::{TargetError, elf};
pub use elf::ProbeSite;

/// What a probe's program reads of the hit: what must still be as at the
/// call where the probe sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reads {
    /// Any register, the stack and the return address (a return probe's entry).
    Everything,
    /// The call's argument registers only ([`args_only_skip`]).
    Arguments,
    /// The return address at `rsp` (and the page of `rip`) only ([`return_address_skip`]).
    ReturnAddress,
}

/// Where ttrace's probes on `names` go in `path`: past the first
/// instructions the kernel would single-step, as far as what the program
/// reads ([`Reads`]) stays as at the call, and never where a branch inside
/// the function could reach the site again without a new call.
pub fn probe_sites(path: &Path, names: &[(&str, Reads)]) -> Result<Vec<Option<ProbeSite>>, TargetError> {
    let symbols: Vec<&str> = names.iter().map(|n| n.0).collect();
    elf::probe_sites(path, &symbols, |name, code| {
        let reads = names.iter().find(|n| n.0 == name).map_or(Reads::Everything, |n| n.1);
        skip(code, reads)
    })
}

/// As [`probe_sites`], their file offsets (what uprobes attach to).
pub fn probe_file_offsets(path: &Path, names: &[(&str, Reads)]) -> Result<Vec<Option<u64>>, TargetError> {
    Ok(probe_sites(path, names)?.into_iter().map(|s| s.map(|s| s.file_offset)).collect())
}

/// Bytes to skip into `code`, a whole function, for a probe reading `reads`.
pub fn skip(code: &[u8], reads: Reads) -> u64 {
    let site = match reads {
        Reads::Everything => entry_skip(code),
        Reads::Arguments => args_only_skip(code),
        Reads::ReturnAddress => return_address_skip(code),
    };
    if site > 0 && reentered(code, site) { 0 } else { site }
}

/// Whether a direct branch or call inside `code` lands past its entry and
/// at or before `site`: a loop through the skipped instructions would hit
/// a probe there once per pass, not once per call. (An indirect jump is a
/// switch's dispatch, whose cases follow the prologue.)
fn reentered(code: &[u8], site: u64) -> bool {
    Decoder::with_ip(64, code, 0, DecoderOptions::NONE).iter().any(|i| {
        matches!(
            i.flow_control(),
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call
        ) && (1..=site).contains(&i.near_branch_target())
    })
}

/// Whether the kernel emulates `instruction` for a uprobe rather than
/// single-stepping it: relative jumps and calls, conditional jumps, and a
/// push of a register.
fn emulated(instruction: &iced_x86::Instruction) -> bool {
    matches!(
        instruction.flow_control(),
        FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call
    ) && matches!(instruction.op0_kind(), OpKind::NearBranch64 | OpKind::NearBranch32 | OpKind::NearBranch16)
        || instruction.mnemonic() == Mnemonic::Push && instruction.op0_kind() == OpKind::Register
}

/// Bytes to skip so that a probe that reads only the return address (at
/// `rsp`) and the page of its own address sits on the first instruction the
/// kernel emulates: the ones before it must fall through and write neither
/// `rsp` nor memory. `ggml_barrier` (about 470 hits a token per thread with
/// `--values`) begins `mov 0x68(%rdi),%eax; cmp $0x1,%ax; je`: probed on the
/// `je`, no hit is single-stepped. Falls back to [`entry_skip`].
pub fn return_address_skip(code: &[u8]) -> u64 {
    let mut info = InstructionInfoFactory::new();
    for instruction in Decoder::with_ip(64, code, 0, DecoderOptions::NONE).iter().take(8) {
        if instruction.is_invalid() {
            break;
        }
        if emulated(&instruction) {
            return instruction.ip();
        }
        let used = info.info(&instruction);
        let writes_stack = used
            .used_registers()
            .iter()
            .any(|r| r.access() != OpAccess::Read && r.register().full_register() == Register::RSP);
        let writes_memory = used.used_memory().iter().any(|m| m.access() != OpAccess::Read);
        if instruction.flow_control() != FlowControl::Next || writes_stack || writes_memory {
            break;
        }
    }
    entry_skip(code)
}

/// The System V argument registers: what a probe reading only its call's
/// arguments needs kept.
const ARGUMENT_REGISTERS: [Register; 6] =
    [Register::RDI, Register::RSI, Register::RDX, Register::RCX, Register::R8, Register::R9];

/// Bytes to skip so that a probe that reads only the call's argument
/// registers (not the stack: no return probe, no stack argument) sits on
/// the first `push` of a register, which the kernel emulates: the
/// instructions before it must fall through and write no argument
/// register. GCC's stack-realigning prologue (`lea 0x8(%rsp),%r10; and
/// $-64,%rsp; push -0x8(%r10); push %rbp`) would otherwise single-step its
/// first instruction at every hit (`ggml_compute_forward_rms_norm_mul_fused`,
/// about 100 hits a token per thread). Falls back to [`entry_skip`].
pub fn args_only_skip(code: &[u8]) -> u64 {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    for instruction in decoder.iter().take(8) {
        if instruction.is_invalid() {
            break;
        }
        if instruction.mnemonic() == Mnemonic::Push && instruction.op0_kind() == OpKind::Register {
            return instruction.ip();
        }
        let writes_argument = info.info(&instruction).used_registers().iter().any(|used| {
            used.access() != OpAccess::Read && ARGUMENT_REGISTERS.contains(&used.register().full_register())
        });
        if instruction.flow_control() != FlowControl::Next || writes_argument {
            break;
        }
    }
    entry_skip(code)
}

/// Bytes to skip from a function's first instruction so that its probe sits
/// on one the kernel emulates: the length of a leading register-to-register
/// `test` or `cmp` when a conditional jump follows (those write only the
/// flags, which the jump then reads in the target's own state, so every
/// register, `rsp` and the return address included, is as at the call), or 0.
/// A leading `endbr64` (CET builds: distributions') is skipped too: it only
/// marks an indirect-branch target, and the kernel single-steps it.
pub fn entry_skip(code: &[u8]) -> u64 {
    if let Some(rest) = code.strip_prefix(&ENDBR64) {
        return ENDBR64.len() as u64 + entry_skip(rest);
    }
    let rex = usize::from(code.first().is_some_and(|b| b & 0xf0 == 0x40));
    let (Some(&opcode), Some(&modrm)) = (code.get(rex), code.get(rex + 1)) else { return 0 };
    // test r/m8,r8 / test r/m,r / cmp r/m8,r8 / cmp r/m,r / cmp r8,r/m8 / cmp r,r/m.
    let flags_only = matches!(opcode, 0x84 | 0x85 | 0x38 | 0x39 | 0x3a | 0x3b) && modrm >> 6 == 0b11;
    let len = rex + 2;
    let jcc = matches!(code.get(len..), Some([0x70..=0x7f, ..] | [0x0f, 0x80..=0x8f, ..]));
    if flags_only && jcc { len as u64 } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::{Reads, args_only_skip, entry_skip, return_address_skip, skip};

    /// ggml_barrier of llama.cpp 0c1e570 (OpenMP): mov 0x68(%rdi),%eax;
    /// cmp $0x1,%ax; je +16; jmp GOMP_barrier@plt; xchg %ax,%ax; ret
    const BARRIER: [u8; 17] =
        [0x8b, 0x47, 0x68, 0x66, 0x83, 0xf8, 0x01, 0x74, 0x07, 0xe9, 0x32, 0xe6, 0xff, 0xff, 0x66, 0x90, 0xc3];

    #[test]
    fn a_return_address_probe_moves_to_the_first_emulated_instruction() {
        assert_eq!(return_address_skip(&BARRIER), 7);
        assert_eq!(skip(&BARRIER, Reads::ReturnAddress), 7);
        // The same code read for its registers stays at the entry (eax is written).
        assert_eq!(skip(&BARRIER, Reads::Everything), 0);
        // sub $8,%rsp first: the return address is no longer at rsp.
        assert_eq!(return_address_skip(&[0x48, 0x83, 0xec, 0x08, 0x74, 0x02]), 0);
        // mov %eax,(%rdi) first: a store could be the return address's slot.
        assert_eq!(return_address_skip(&[0x89, 0x07, 0x74, 0x02]), 0);
    }

    #[test]
    fn a_site_a_branch_in_the_function_reaches_again_is_not_used() {
        // The barrier's code followed by a loop back onto its `je` (+7):
        // probed there, each pass would count as a barrier.
        let looping = [&BARRIER[..], &[0xeb, 0xf4][..]].concat();
        assert_eq!(return_address_skip(&looping), 7);
        assert_eq!(skip(&looping, Reads::ReturnAddress), 0);
        // A loop back to the entry hits an entry probe once per pass too: allowed.
        let to_entry = [&BARRIER[..], &[0xeb, (-19i8) as u8][..]].concat();
        assert_eq!(skip(&to_entry, Reads::ReturnAddress), 7);
    }

    #[test]
    fn a_stack_realigning_prologue_is_skipped_to_its_first_register_push() {
        // ggml_compute_forward_rms_norm_mul_fused (llama.cpp 0c1e570, -march=native):
        // lea 0x8(%rsp),%r10; and $-64,%rsp; push -0x8(%r10); push %rbp
        let native = [0x4c, 0x8d, 0x54, 0x24, 0x08, 0x48, 0x83, 0xe4, 0xc0, 0x41, 0xff, 0x72, 0xf8, 0x55, 0x48, 0x89];
        assert_eq!(args_only_skip(&native), 13);
        // The portable build moves rdx to rax first: rdx itself is kept.
        let portable =
            [0x4c, 0x8d, 0x54, 0x24, 0x08, 0x48, 0x83, 0xe4, 0xe0, 0x48, 0x89, 0xd0, 0x41, 0xff, 0x72, 0xf8, 0x55];
        assert_eq!(args_only_skip(&portable), 16);
        // With endbr64 (CET builds) before it.
        let cet = [&[0xf3, 0x0f, 0x1e, 0xfa][..], &native[..]].concat();
        assert_eq!(args_only_skip(&cet), 4 + 13);
        // Already a push: the entry.
        assert_eq!(args_only_skip(&[0x41, 0x55, 0x41, 0x54]), 0);
    }

    #[test]
    fn an_argument_written_or_a_jump_before_any_push_keeps_the_entry() {
        // mov %rsi,%rdi; push %rbp: rdi no longer the first argument.
        assert_eq!(args_only_skip(&[0x48, 0x89, 0xf7, 0x55]), 0);
        // lea 0x8(%rsp),%r10; jmp: control leaves the prologue.
        assert_eq!(args_only_skip(&[0x4c, 0x8d, 0x54, 0x24, 0x08, 0xeb, 0x00, 0x55]), 0);
        // test %esi,%esi; je: entry_skip's choice.
        assert_eq!(args_only_skip(&[0x85, 0xf6, 0x74, 0x0c, 0x83, 0xfe]), 2);
    }

    #[test]
    fn endbr64_is_skipped_and_what_follows_judged_alone() {
        assert_eq!(entry_skip(&[0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x56]), 4);
        assert_eq!(entry_skip(&[0xf3, 0x0f, 0x1e, 0xfa, 0x85, 0xf6, 0x74, 0x0c]), 6);
    }

    #[test]
    fn a_register_test_before_a_conditional_jump_is_skipped() {
        // llama_process (llama.cpp 0c1e570): test %esi,%esi; je +0xc
        assert_eq!(entry_skip(&[0x85, 0xf6, 0x74, 0x0c, 0x83, 0xfe]), 2);
        // test %rdi,%rdi; jne (near)
        assert_eq!(entry_skip(&[0x48, 0x85, 0xff, 0x0f, 0x85, 0, 1, 0, 0]), 3);
        // cmp %r8d,%esi; jl
        assert_eq!(entry_skip(&[0x44, 0x39, 0xc6, 0x7c, 0x10]), 3);
    }

    #[test]
    fn anything_else_stays_at_the_entry() {
        // push %r14 (emulated already)
        assert_eq!(entry_skip(&[0x41, 0x56, 0x41, 0x55]), 0);
        // test %esi,%esi; mov ... (no jump follows: the mov would be single-stepped anyway)
        assert_eq!(entry_skip(&[0x85, 0xf6, 0x89, 0xf0]), 0);
        // test %esi,(%rdi): reads memory, a different instruction to keep whole
        assert_eq!(entry_skip(&[0x85, 0x37, 0x74, 0x0c]), 0);
        // lea 0x8(%rsp),%r10
        assert_eq!(entry_skip(&[0x4c, 0x8d, 0x54, 0x24, 0x08]), 0);
        // jmp to the PLT
        assert_eq!(entry_skip(&[0xe9, 0, 0, 0, 0]), 0);
        assert_eq!(entry_skip(&[0x85, 0xf6]), 0);
        assert_eq!(entry_skip(&[]), 0);
    }
}
