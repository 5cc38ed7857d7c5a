//! Loops over a run-time count, two ways: `bpf_loop` (Linux 5.17), whose
//! callback the verifier checks once, and, for the stand-in programs of
//! older kernels (`tracer_common::programs::compat::BOUNDED`), a loop with
//! a constant bound. One source, two programs: a kernel that lacks
//! `bpf_loop` refuses any program that names it, even on a path it never
//! takes.
//!
//! The bounded loop calls its step as a global function, which the verifier
//! checks once, apart from its callers (Linux 5.6+), instead of once per
//! iteration: walked inline, 1024 MoE routing rows took over its million
//! instructions. A global function takes only scalars before 5.12, so the
//! step's context goes through a per-CPU slot ([`context`]).

use core::{ffi::c_void, mem::size_of};

use aya_ebpf::{helpers::generated::bpf_loop, macros::map, maps::PerCpuArray};

/// A `bpf_loop` step: `(index, context) -> 0` to go on, anything else to stop.
pub type Step = extern "C" fn(u64, *mut c_void) -> i64;
/// The same step as a global function, its context in [`context`].
pub type GlobalStep = extern "C" fn(u64) -> i64;

/// Bytes of the largest loop context.
const CONTEXT_BYTES: usize = 64;

#[map]
static LOOP_CONTEXT: PerCpuArray<[u64; CONTEXT_BYTES / 8]> = PerCpuArray::with_max_entries(1, 0);

/// Runs the step for `i` in `0..n.min(max)` until it returns non-zero:
/// `step(i, ctx)` through `bpf_loop`, or `global(i)` with `*ctx` in the
/// per-CPU slot, copied back after the loop.
#[inline(always)]
pub fn repeat<const BOUNDED: bool, T: Copy>(n: u32, max: u32, step: Step, global: GlobalStep, ctx: &mut T) {
    let n = n.min(max);
    if !BOUNDED {
        // SAFETY: `step` takes `ctx` back, as bpf_loop hands it.
        unsafe { bpf_loop(n, step as *mut c_void, (ctx as *mut T).cast(), 0) };
        return;
    }
    const { assert!(size_of::<T>() <= CONTEXT_BYTES) };
    let Some(slot) = context::<T>() else { return };
    // SAFETY: a per-CPU slot large enough for T; a uprobe is not preempted
    // by another program on its CPU.
    unsafe { slot.write(*ctx) };
    let mut i = 0;
    while i < max {
        if i >= n || global(u64::from(i)) != 0 {
            break;
        }
        i += 1;
    }
    // SAFETY: as above.
    *ctx = unsafe { slot.read() };
}

/// The bounded loop's context, for its global step.
#[inline(always)]
pub fn context<T>() -> Option<*mut T> {
    LOOP_CONTEXT.get_ptr_mut(0).map(|p| p.cast::<T>())
}

/// A program body taking its attach cookie, exported once per cookie with
/// that cookie built in (`tracer_common::programs::compat::COOKIE_COPIES`
/// names them): kernels before 5.15 have no `bpf_get_attach_cookie`.
macro_rules! cookie_copies {
    ($attr:ident, $ctx:ty, $body:ident; $($name:ident = $cookie:expr),+ $(,)?) => {
        $(
            #[$attr]
            pub fn $name(ctx: $ctx) -> u32 {
                crate::pinned::pinned(|| $body(&ctx, $cookie))
            }
        )+
    };
}
pub(crate) use cookie_copies;

/// The global twin of a `bpf_loop` step, `$global(i)`: `$step(i, ctx)` on
/// the loop's context slot.
macro_rules! global_step {
    ($global:ident, $step:ident, $ctx:ty) => {
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn $global(index: u64) -> i64 {
            match crate::looping::context::<$ctx>() {
                Some(ctx) => $step(index, ctx.cast()),
                None => 1,
            }
        }
    };
}
pub(crate) use global_step;
