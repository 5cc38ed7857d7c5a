//! What `ttrace check` loads: every program `run` and `attach` can load,
//! with `--values` and `--op-timing` too, grouped into the features a user
//! turns on, each loaded into the kernel (not attached) so the verifier of
//! this kernel has its say. A check that passed where `run` then failed to
//! load a program would be worse than none, so the list is tied to the
//! probe plans by a test.

use tracer_common::{kfunc::Kfunc, programs, values::programs as value_programs};

use crate::live::{
    load::{IoSource, Kfuncs, LoadError, Tracer},
    verifier,
};

/// A feature made of uprobe programs.
pub struct Feature {
    pub what: &'static str,
    /// When `run` and `attach` load it.
    pub when: &'static str,
    pub programs: &'static [&'static str],
}

pub const UPROBE_FEATURES: &[Feature] = &[
    Feature { what: "ops, read per graph", when: "default", programs: &[programs::GRAPH_COMPUTE] },
    Feature { what: "ops, per-node probes", when: "--op-timing", programs: &[programs::GGML_OP] },
    Feature {
        what: "tensor values",
        when: "--values",
        programs: &[value_programs::VALUE_GRAPH, value_programs::VALUE_NODE, value_programs::VALUE_BARRIER],
    },
    Feature {
        what: "MoE routing",
        when: "default",
        programs: &[programs::ARGSORT_ENTRY, programs::ARGSORT_RETURN, programs::MUL_MAT_ID_ENTRY],
    },
    Feature { what: "sequences", when: "default", programs: &[programs::UBATCH] },
    Feature {
        what: "backend buffers",
        when: "default",
        programs: &[programs::BUFFER_CREATED, programs::BUFFER_CHANGED],
    },
    Feature { what: "calls and boundaries", when: "default", programs: &[programs::CALL_ARGS, programs::CALL_RETURN] },
];

/// How a feature stands on this kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Loaded as designed (with how, for the I/O events).
    Available(Option<String>),
    /// Loaded, in a stand-in's form, and why.
    Fallback(String),
    /// Not loadable here, and why.
    Missing(String),
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Status::Available(None) => f.write_str("available"),
            Status::Available(Some(how)) => write!(f, "available ({how})"),
            Status::Fallback(why) => write!(f, "fallback ({why})"),
            Status::Missing(why) => write!(f, "missing ({why})"),
        }
    }
}

/// One line of the report.
pub struct Checked {
    pub what: String,
    pub status: Status,
}

/// Load every program of every feature; the I/O ones as `tracer` was
/// loaded for (its `--tracepoints` flavour).
pub fn check(tracer: &mut Tracer) -> Vec<Checked> {
    let mut out = Vec::new();
    for feature in UPROBE_FEATURES {
        let failed = feature.programs.iter().find_map(|&program| tracer.verify_uprobe(program).err());
        let when = if feature.when == "default" { String::new() } else { format!(", {}", feature.when) };
        let what = format!("{} ({}{when})", feature.what, feature.programs.join(", "));
        let support = tracer.support();
        let mut reasons: Vec<String> = feature.programs.iter().filter_map(|p| support.fallback_reason(p)).collect();
        reasons.dedup();
        let fallback = (!reasons.is_empty()).then(|| reasons.join("; "));
        let status = match (failed, fallback) {
            (Some(e), _) => Status::Missing(why(&e)),
            (None, Some(how)) => Status::Fallback(how),
            (None, None) => Status::Available(None),
        };
        out.push(Checked { what, status });
    }
    // Without it a preempted run shares its per-CPU scratch (and, from 6.13,
    // its stack) with the next run on its CPU.
    let status = match tracer.kfuncs() {
        Kfuncs::Linked(_) => Status::Available(Some(Kfunc::PreemptDisable.name().into())),
        Kfuncs::Absent(why) => Status::Fallback(format!(
            "{why}: on a fully preemptible kernel a preempted run's per-CPU scratch can be overwritten"
        )),
    };
    out.push(Checked { what: "uprobe programs run with preemption off".into(), status });
    // `run` of a command with no ggml linked follows the processes it starts.
    let status = match tracer.verify_process_tracepoints() {
        Ok(()) => Status::Available(Some("perf-event tracepoint".into())),
        Err(e) => Status::Missing(why(&e)),
    };
    let what = "processes a command starts, held at exec (sched_process_fork, sched_process_exec)";
    out.push(Checked { what: what.into(), status });
    for io in tracer.verify_io() {
        let status = match (&io.source, io.loaded) {
            (IoSource::Unavailable(why), _) => Status::Missing(why.clone()),
            (_, Err(e)) => Status::Missing(why(&e)),
            (IoSource::Btf, Ok(())) => Status::Available(Some("BTF tracepoint".into())),
            (IoSource::Perf, Ok(())) => Status::Available(Some("perf-event tracepoint".into())),
            (IoSource::FEntry, Ok(())) => Status::Fallback(format!(
                "fentry on {}(): this kernel has no tracepoint {}",
                io.function.unwrap_or("?"),
                io.event
            )),
        };
        out.push(Checked { what: format!("{} ({})", io.what, io.event), status });
    }
    out
}

/// Why a program did not load, in one line: the kernel feature it needs
/// when the verifier's log names one, else the verifier's reason.
fn why(error: &LoadError) -> String {
    let program_error = match error {
        LoadError::Program { error, .. } => Some(error.as_ref()),
        _ => None,
    };
    match program_error.and_then(verifier::missing_feature) {
        Some(needs) => format!("needs {}, Linux {}+", needs.feature, needs.since),
        None => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every uprobe program a session can attach is in a feature `check` loads.
    #[test]
    fn check_loads_every_program_run_attaches() {
        let checked: Vec<&str> = UPROBE_FEATURES.iter().flat_map(|f| f.programs.iter().copied()).collect();
        for program in crate::live::session::uprobe_programs() {
            assert!(checked.contains(&program), "`ttrace check` does not load {program}");
        }
    }
}
