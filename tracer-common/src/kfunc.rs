//! Kernel functions (kfuncs) the programs call. Our toolchain (aya 0.14,
//! bpf-linker 0.13) cannot emit a kfunc call, so the object calls each one
//! as if it were a helper with a placeholder number, far above any real
//! helper's, and the loader links each such call before the object reaches
//! the kernel: to the kfunc's BTF id where the running kernel has it, else
//! to a no-op.

/// A kfunc the programs call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kfunc {
    /// `bpf_preempt_disable` (Linux 6.10).
    PreemptDisable,
    /// `bpf_preempt_enable` (Linux 6.10).
    PreemptEnable,
}

/// Every kfunc, in placeholder order.
pub const ALL: [Kfunc; 2] = [Kfunc::PreemptDisable, Kfunc::PreemptEnable];

/// The first placeholder: helper ids are below 300 in 2026's kernels.
const PLACEHOLDER_BASE: i32 = 0x7e6b_0000;

impl Kfunc {
    /// The helper number the object calls this kfunc by.
    pub const fn placeholder(self) -> i32 {
        PLACEHOLDER_BASE + self as i32
    }

    /// The kfunc that `placeholder` stands for, if any.
    pub fn of_placeholder(placeholder: i32) -> Option<Self> {
        ALL.into_iter().find(|k| k.placeholder() == placeholder)
    }

    /// Its name in the kernel's BTF.
    pub const fn name(self) -> &'static str {
        match self {
            Kfunc::PreemptDisable => "bpf_preempt_disable",
            Kfunc::PreemptEnable => "bpf_preempt_enable",
        }
    }
}
