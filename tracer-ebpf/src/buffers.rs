//! ggml backend buffers: created (`ggml_backend_buffer_init` return, the
//! only constructor), given a usage (`ggml_backend_buffer_set_usage`) and
//! freed (`ggml_backend_buffer_free`). Buffers are made a handful of times
//! per run (model load, KV cache, compute reserve), so these probes cost
//! nothing per token. Each record re-reads `buft`: CPU_REPACK replaces it
//! after the plain CPU buffer under it was created.

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext,
    helpers::generated::{bpf_get_attach_cookie, bpf_probe_read_user_str},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{BufferEvent, ENDBR64, EventKind, MAX_BUFFER_TYPE_NAME, buffer_action};

use crate::{
    layout::{self, ggml},
    looping::cookie_copies,
    maps::{emit, header, read_user, traced_task},
    pinned::pinned,
};

#[uretprobe]
pub fn buffer_created(ctx: RetProbeContext) -> u32 {
    pinned(|| {
        let Some(task) = traced_task() else { return 0 };
        let buffer = ctx.ret::<u64>();
        if buffer != 0 {
            record(task, buffer, buffer_action::CREATED, None);
        }
        0
    })
}

#[uprobe]
pub fn buffer_changed(ctx: ProbeContext) -> u32 {
    // SAFETY: ctx is the program's own context.
    pinned(|| changed_with(&ctx, unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }))
}

cookie_copies!(uprobe, ProbeContext, changed_with;
    buffer_changed_1 = buffer_action::SET_USAGE as u64,
    buffer_changed_2 = buffer_action::FREED as u64,
);

#[inline(always)]
fn changed_with(ctx: &ProbeContext, cookie: u64) -> u32 {
    let Some(task) = traced_task() else { return 0 };
    let action = cookie as u32;
    let Some(buffer) = ctx.arg::<u64>(0).filter(|&b| b != 0) else { return 0 };
    // set_usage writes its argument after this probe ran.
    let usage = (action == buffer_action::SET_USAGE).then(|| ctx.arg::<u64>(1).unwrap_or(0) as u32);
    record(task, buffer, action, usage);
    0
}

#[inline(always)]
fn record(task: (u32, u32), buffer: u64, action: u32, usage: Option<u32>) {
    if !layout::valid() || ggml!(buffer.usage) == 0 {
        return;
    }
    let mut event = BufferEvent { header: header(EventKind::Buffer, task), buffer, action, ..Default::default() };
    // A field that cannot be read stays 0; user space keeps what it had.
    let _ = read_user(&mut event.buft, buffer + u64::from(ggml!(buffer.buft)));
    let _ = read_user(&mut event.context, buffer + u64::from(ggml!(buffer.context)));
    let _ = read_user(&mut event.size, buffer + u64::from(ggml!(buffer.size)));
    match usage {
        Some(u) => event.usage = u,
        None => {
            let _ = read_user(&mut event.usage, buffer + u64::from(ggml!(buffer.usage)));
        }
    }
    read_type_name(event.buft, &mut event.type_name);
    emit(EventKind::Buffer, event);
}

/// `buft->iface.get_name` (its first member) is, in every CPU buffer type,
/// `lea disp32(%rip), %rax; ret`, after an `endbr64` in CET builds (which
/// distributions make): decode it and read the string it returns, since a
/// probe cannot call it.
#[inline(always)]
fn read_type_name(buft: u64, out: &mut [u8; MAX_BUFFER_TYPE_NAME]) {
    let mut get_name = 0u64;
    if buft == 0 || read_user(&mut get_name, buft).is_err() || get_name == 0 {
        return;
    }
    let mut code = [0u8; 8];
    if read_user(&mut code, get_name).is_err() {
        return;
    }
    if code[..4] == ENDBR64 {
        get_name += ENDBR64.len() as u64;
        if read_user(&mut code, get_name).is_err() {
            return;
        }
    }
    if code[..3] != LEA_RIP_RAX || code[7] != RET {
        return;
    }
    let disp = i32::from_le_bytes([code[3], code[4], code[5], code[6]]);
    let name = get_name.wrapping_add(7).wrapping_add_signed(i64::from(disp));
    // SAFETY: `out` holds MAX_BUFFER_TYPE_NAME bytes.
    unsafe {
        bpf_probe_read_user_str(out.as_mut_ptr().cast::<c_void>(), MAX_BUFFER_TYPE_NAME as u32, name as *const c_void)
    };
}

/// `lea disp32(%rip), %rax` (REX.W 8D /r, ModRM 00 000 101) and `ret`.
const LEA_RIP_RAX: [u8; 3] = [0x48, 0x8d, 0x05];
const RET: u8 = 0xc3;
