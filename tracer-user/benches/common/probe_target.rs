//! The probed function both benchmarks call.

/// Starts like a compiled C function (`push rbp`), as the ggml functions
/// ttrace probes do: the kernel emulates a probed `push`, while a probed
/// `mov` (what rustc emits for a leaf function) is single-stepped out of
/// line, a second trap: ~16 µs instead of ~1 µs per call on this VM.
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub extern "C" fn bench_probe_target(a: u64, b: u64) -> u64 {
    core::arch::naked_asm!(
        "push rbp",
        "mov rbp, rsp",
        "mov rax, rdi",
        "shl rax, 5",
        "sub rax, rdi",
        "xor rax, rsi",
        "pop rbp",
        "ret",
    )
}
