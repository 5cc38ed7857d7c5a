//! What the running kernel lets the uprobe programs call, and the stand-in
//! each program is swapped for where it lacks something
//! (`tracer_common::programs::compat`): the same recording, built without
//! the helper.

use aya::{
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported},
};
use tracer_common::programs::compat;

/// Test aid: the stand-ins of older kernels on this one (`cookie,loop`).
pub const STAND_INS_ENV: &str = "TTRACE_STAND_INS";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSupport {
    /// `bpf_get_attach_cookie` (Linux 5.15).
    pub attach_cookie: bool,
    /// `bpf_loop` (Linux 5.17).
    pub bpf_loop: bool,
}

impl KernelSupport {
    /// Asks the kernel, with a two-instruction program per helper. A probe
    /// that cannot tell counts as present: loading the program then says why.
    pub fn detect() -> Self {
        let has = |helper| {
            is_helper_supported(ProgramType::KProbe, helper)
                .inspect_err(|e| log::debug!("probing helper {helper:?}: {e}"))
                .unwrap_or(true)
        };
        let asked = std::env::var(STAND_INS_ENV).unwrap_or_default();
        if !asked.trim().is_empty() {
            log::warn!("{STAND_INS_ENV}={asked}: loading the stand-ins of older kernels on this one");
        }
        let found =
            Self { attach_cookie: has(BpfHelper::BPF_FUNC_get_attach_cookie), bpf_loop: has(BpfHelper::BPF_FUNC_loop) };
        let support = found.without(asked.split(','));
        log::debug!("kernel support: {support:?}");
        support
    }

    /// As if the kernel lacked the helpers named (`cookie`, `loop`): the
    /// suite runs the stand-ins of older kernels on this one with them.
    fn without<'a>(mut self, lacking: impl Iterator<Item = &'a str>) -> Self {
        for name in lacking {
            match name.trim() {
                "cookie" => self.attach_cookie = false,
                "loop" => self.bpf_loop = false,
                "" => {}
                other => log::warn!("{STAND_INS_ENV}: unknown helper `{other}` (cookie, loop)"),
            }
        }
        self
    }

    /// What to attach for `program` with `cookie`: the program itself with
    /// its cookie, or its stand-in (a copy with the cookie built in takes
    /// none).
    pub fn stand_in(&self, program: &'static str, cookie: u64) -> (&'static str, Option<u64>) {
        if !self.attach_cookie
            && let Some(copy) = compat::cookie_copy(program, cookie)
        {
            return (copy, None);
        }
        let program = if self.bpf_loop { program } else { compat::bounded(program).unwrap_or(program) };
        (program, self.attach_cookie.then_some(cookie))
    }

    /// Every program `check` loads for `program`: its stand-ins where this
    /// kernel needs them (each cookie's copy), else itself.
    pub fn programs_for(&self, program: &'static str) -> Vec<&'static str> {
        let copies: Vec<&'static str> = compat::COOKIE_COPIES.iter().filter(|c| c.0 == program).map(|c| c.2).collect();
        if !self.attach_cookie && !copies.is_empty() {
            return copies;
        }
        vec![self.stand_in(program, 0).0]
    }

    /// Why `program` is loaded in a stand-in's form here, if it is.
    pub fn fallback_reason(&self, program: &str) -> Option<String> {
        let mut why = Vec::new();
        if !self.bpf_loop && compat::bounded(program).is_some() {
            why.push("bounded loops: no bpf_loop before Linux 5.17");
        }
        if !self.attach_cookie && compat::COOKIE_COPIES.iter().any(|c| c.0 == program) {
            why.push("a copy per attach cookie: no bpf_get_attach_cookie before Linux 5.15");
        }
        (!why.is_empty()).then(|| why.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::{markers, programs};

    use super::*;

    const OLD: KernelSupport = KernelSupport { attach_cookie: false, bpf_loop: false };
    const NEW: KernelSupport = KernelSupport { attach_cookie: true, bpf_loop: true };

    #[test]
    fn a_new_kernel_attaches_each_program_with_its_cookie() {
        assert_eq!(NEW.stand_in(programs::CALL_ARGS, markers::LLAMA_DECODE), (programs::CALL_ARGS, Some(3)));
        assert_eq!(NEW.programs_for(programs::GRAPH_COMPUTE), [programs::GRAPH_COMPUTE]);
        assert_eq!(NEW.programs_for(programs::GGML_OP), [programs::GGML_OP]);
        assert_eq!(NEW.fallback_reason(programs::UBATCH), None);
    }

    #[test]
    fn an_old_kernel_attaches_copies_without_cookies() {
        assert_eq!(OLD.stand_in(programs::CALL_ARGS, markers::LLAMA_DECODE), ("call_args_3", None));
        assert_eq!(OLD.stand_in(programs::UBATCH, 0), ("ubatch_bounded", None));
        assert_eq!(OLD.stand_in(programs::BUFFER_CREATED, 0), (programs::BUFFER_CREATED, None));
        assert_eq!(OLD.programs_for(programs::GRAPH_COMPUTE), ["graph_compute_bounded"]);
        assert_eq!(OLD.programs_for(programs::GGML_OP), ["ggml_op_0", "ggml_op_1"]);
        let kernel_5_15 = KernelSupport { attach_cookie: true, bpf_loop: false };
        assert_eq!(kernel_5_15.stand_in(programs::ARGSORT_RETURN, 0), ("argsort_return_bounded", Some(0)));
    }

    /// Every cookie a session attaches a cookie-reading program with has a copy.
    #[test]
    fn every_attached_cookie_has_a_copy() {
        let hooks = crate::live::session::hooks_with_cookies();
        for (program, cookie) in hooks {
            if compat::COOKIE_COPIES.iter().any(|c| c.0 == program) {
                assert!(compat::cookie_copy(program, cookie).is_some(), "{program} with cookie {cookie} has no copy");
            }
        }
    }
}
