//! ttrace's kernel side: one module per probe family. Everything is emitted
//! through the shared ring buffer in `maps`, filtered to the traced processes.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// `values`: a locked add, the only full fence BPF offers (x86 lets a load
// pass an earlier store otherwise).
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

mod batch;
mod block;
mod buffers;
mod calls;
mod faults;
mod ggml;
mod graph;
mod kernel;
mod layout;
mod looping;
mod maps;
mod pagecache;
mod pinned;
mod processes;
mod routing;
mod selftest;
mod values;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects programs that could reach a panic.
    unsafe { core::hint::unreachable_unchecked() }
}

/// Host builds (e.g. `cargo clippy --workspace`) only type-check the programs.
#[cfg(not(target_arch = "bpf"))]
fn main() {}

// GPL-compatible: bpf_probe_read_user and friends are GPL-only helpers.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
