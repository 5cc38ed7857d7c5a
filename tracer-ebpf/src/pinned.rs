//! Runs a uprobe program's body with preemption off.
//!
//! A uprobe program runs preemptibly (under `migrate_disable` only, since
//! Linux 6.0), and from 6.13 on its stack is a per-CPU area that every run
//! of the program on that CPU shares. So another thread's run of the same
//! program, on the same CPU, could overwrite a preempted run's locals (seen
//! on 7.2: the main thread's `ith` overwritten by a worker's, so the values
//! team never completed), and the per-CPU scratch maps are shared the same
//! way on any kernel. With preemption off, a run ends before another starts
//! on its CPU.
//!
//! `bpf_preempt_disable`/`enable` are kfuncs (Linux 6.10), called through
//! placeholders the loader links (`tracer_common::kfunc`); on older kernels
//! both become no-ops.

use tracer_common::kfunc::Kfunc;

#[inline(always)]
fn call(kfunc: Kfunc) {
    // SAFETY: a call to the placeholder number, which the loader turns into
    // the kfunc's call (no arguments, no return value) or a no-op; an
    // object that reached the kernel unlinked is refused by the verifier
    // as an unknown helper.
    unsafe {
        let f: unsafe extern "C" fn() = core::mem::transmute(kfunc.placeholder() as usize);
        f()
    }
}

/// `body()` with preemption off where the kernel can turn it off.
#[inline(always)]
pub fn pinned<R>(body: impl FnOnce() -> R) -> R {
    call(Kfunc::PreemptDisable);
    let out = body();
    call(Kfunc::PreemptEnable);
    out
}
