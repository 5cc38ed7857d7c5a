//! What a refused eBPF program comes down to, in one line. The kernel's
//! verifier log runs to thousands of lines; its last meaningful one says why
//! (`combined stack size of 2 calls is 640. Too large`, `BPF program is too
//! large. Processed 1000001 insn`), and a helper the kernel does not have
//! means a kernel feature is missing, which is worth naming with the Linux
//! release that brought it.

use aya::programs::ProgramError;

/// A kernel feature a program needs, and the release that brought it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Needs {
    pub feature: &'static str,
    pub since: &'static str,
}

/// Helpers ttrace's programs call that older kernels lack, by helper id
/// (`enum bpf_func_id`), with the release that added them.
const HELPERS: &[(u32, Needs)] = &[
    (112, Needs { feature: "bpf_probe_read_user", since: "5.5" }),
    (113, Needs { feature: "bpf_probe_read_kernel", since: "5.5" }),
    (114, Needs { feature: "bpf_probe_read_user_str", since: "5.5" }),
    (130, Needs { feature: "the BPF ring buffer (bpf_ringbuf_output)", since: "5.8" }),
    (131, Needs { feature: "the BPF ring buffer (bpf_ringbuf_reserve)", since: "5.8" }),
    (132, Needs { feature: "the BPF ring buffer (bpf_ringbuf_submit)", since: "5.8" }),
    (133, Needs { feature: "the BPF ring buffer (bpf_ringbuf_discard)", since: "5.8" }),
    (134, Needs { feature: "the BPF ring buffer (bpf_ringbuf_query)", since: "5.8" }),
    (174, COOKIE),
    (181, Needs { feature: "bpf_loop", since: "5.17" }),
];

/// Attach cookies tell one program's attachments apart (which hook fired).
const COOKIE: Needs = Needs { feature: "bpf_get_attach_cookie", since: "5.15" };

/// One line for a program error: for a verifier rejection its reason (the
/// log's last meaningful line) or the missing feature, else aya's message.
pub fn summary(error: &ProgramError) -> String {
    match error {
        ProgramError::LoadError { io_error, verifier_log } => {
            let log = verifier_log.to_string();
            if let Some(needs) = needs(&log) {
                return format!("the kernel lacks {} (Linux {}+)", needs.feature, needs.since);
            }
            match reason(&log) {
                Some(reason) => format!("the verifier rejected it: {reason} ({io_error})"),
                None => format!("the kernel refused it: {io_error}"),
            }
        }
        // aya's own probe: the kernel cannot take an attach cookie.
        ProgramError::AttachCookieNotSupported => {
            format!("the kernel lacks {} (Linux {}+)", COOKIE.feature, COOKIE.since)
        }
        // With its causes: `perf_event_open` failed says nothing without the errno.
        other => {
            let mut text = other.to_string();
            let mut cause = std::error::Error::source(other);
            while let Some(c) = cause {
                text.push_str(&format!(": {c}"));
                cause = c.source();
            }
            text
        }
    }
}

/// The kernel feature whose absence made the verifier refuse a program, if
/// that is what its log says.
pub fn missing_feature(error: &ProgramError) -> Option<Needs> {
    match error {
        ProgramError::LoadError { verifier_log, .. } => needs(&verifier_log.to_string()),
        ProgramError::AttachCookieNotSupported => Some(COOKIE),
        _ => None,
    }
}

/// A helper call the kernel does not know: `unknown func bpf_loop#181`
/// (5.x-6.x), `invalid func unknown#181` (an id past the kernel's last).
fn needs(log: &str) -> Option<Needs> {
    log.lines().find_map(|line| {
        let rest = line.strip_prefix("unknown func ").or_else(|| line.strip_prefix("invalid func "))?;
        let id: u32 = rest.rsplit('#').next()?.trim().parse().ok()?;
        HELPERS.iter().find(|(helper, _)| *helper == id).map(|(_, needs)| *needs)
    })
}

/// The log's last line that is not a statistic the verifier appends after
/// its verdict.
fn reason(log: &str) -> Option<&str> {
    const STATISTICS: [&str; 6] = [
        "verification time",
        "stack depth",
        "processed ",
        "insns processed",
        "max_states_per_insn",
        "-- END PROG LOAD LOG --",
    ];
    log.lines().map(str::trim).rev().find(|line| !line.is_empty() && !STATISTICS.iter().any(|s| line.starts_with(s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_the_last_line_before_the_statistics() {
        // The tail of 6.12's and 7.2's logs for graph_compute before it was split.
        let stack = "371: (85) call bpf_loop#181\ncombined stack size of 2 calls is 640. Too large\n\
                     verification time 1498546 usec\nstack depth 336+0+304\n\
                     processed 44833 insns (limit 1000000) max_states_per_insn 9 total_states 754\n";
        assert_eq!(reason(stack), Some("combined stack size of 2 calls is 640. Too large"));
        let large = "942: (7b) *(u64 *)(r10 -280) = r1\nBPF program is too large. Processed 1000001 insn\n\
                     verification time 60290590 usec\nstack depth 336+0+304 max 0\ninsns processed 1000001\n\
                     processed 1000001 insns (limit 1000000) max_states_per_insn 27\n";
        assert_eq!(reason(large), Some("BPF program is too large. Processed 1000001 insn"));
        assert_eq!(reason("\n\n"), None);
    }

    #[test]
    fn unknown_helpers_name_the_release_that_has_them() {
        assert_eq!(needs("5: (85) call unknown#174\ninvalid func unknown#174\n"), Some(HELPERS[8].1));
        assert_eq!(needs("unknown func bpf_loop#181\n"), Some(Needs { feature: "bpf_loop", since: "5.17" }));
        assert_eq!(needs("R2 unbounded memory access\n"), None);
    }
}
