//! Real kernel round trip (root): load the tracer object, uprobe a function
//! in this test binary and trace page faults, then check that exactly what
//! was done arrives through the ring buffer — and that a full ring buffer is
//! accounted for by the program's own lost-event counter.
// Traces real processes (or uses the live side): needs the default `live` feature.
#![cfg(feature = "live")]

use std::collections::HashSet;

use ttrace::{
    cli::TracepointChoice,
    format::Tracepoints,
    live::selftest::{self, RoundTrip, TAG},
};

mod common;

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn roundtrip_probe_target(seq: u64, tag: u64) -> u64 {
    std::hint::black_box(seq.wrapping_mul(3) ^ tag)
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn overflow_probe_target(seq: u64, tag: u64) -> u64 {
    std::hint::black_box(seq.wrapping_mul(5) ^ tag)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uprobe_and_btf_page_faults_arrive_exactly() {
    let ips = uprobe_and_page_faults_arrive_exactly(TracepointChoice::Btf, Tracepoints::Btf).await;
    // The faulting instruction, read from `regs->ip` at a BTF offset, is
    // the one the perf-event record carries.
    let perf_ips = uprobe_and_page_faults_arrive_exactly(TracepointChoice::Perf, Tracepoints::Perf).await;
    assert_eq!(ips, perf_ips, "the same code faulted at the same instructions");
}

/// One round trip; the set of instruction pointers that faulted on the
/// touched pages.
async fn uprobe_and_page_faults_arrive_exactly(choice: TracepointChoice, want: Tracepoints) -> HashSet<u64> {
    common::require_root();
    const N: u64 = 10_000;
    const K: usize = 128;
    let observed = selftest::run(RoundTrip {
        symbol: "roundtrip_probe_target",
        function: roundtrip_probe_target,
        calls: N,
        pages: K,
        ring_bytes: 1 << 22,
        read_concurrently: true,
        tracepoints: choice,
        recursion_misses: 5,
    })
    .await
    .expect("round trip");
    assert_eq!(observed.tracepoints, Some(want));
    // A forced recursion (a BTF tracepoint program that fires its own
    // tracepoint) is counted, once per nested run, where runs' misses are read.
    let forced = (want == Tracepoints::Btf).then_some((5, 5));
    assert_eq!(observed.recursion_misses, forced, "(forced, counted) recursion misses");

    let pid = std::process::id();
    assert_eq!(observed.calls.len() as u64, N, "exactly one uprobe event per call");
    // One thread made the calls in order, so events arrive in call order.
    for (seq, event) in observed.calls.iter().enumerate() {
        let seq = seq as u64;
        assert_eq!(event.header.tgid, pid);
        assert_eq!(event.args[0], seq, "first argument of call {seq}");
        assert_eq!(event.args[1], seq ^ TAG, "second argument of call {seq}");
    }
    let tids: HashSet<u32> = observed.calls.iter().map(|e| e.header.tid).collect();
    assert_eq!(tids.len(), 1, "all calls came from one worker thread");

    assert!(observed.faults.len() >= K, "at least one fault per touched page");
    let fault_addresses: HashSet<u64> = observed.faults.iter().map(|f| f.address).collect();
    for (i, addr) in observed.touched.iter().enumerate() {
        assert!(fault_addresses.contains(addr), "page {i}: no fault at {addr:#x}");
    }
    assert!(observed.faults.iter().all(|f| f.header.tgid == pid), "faults are filtered to this process");
    assert_eq!(observed.lost.total(), 0);
    assert_eq!(observed.decode_errors, 0);
    let touched: HashSet<u64> = observed.touched.iter().copied().collect();
    let ips: HashSet<u64> = observed.faults.iter().filter(|f| touched.contains(&f.address)).map(|f| f.ip).collect();
    assert!(!ips.contains(&0), "every fault has its instruction pointer");
    ips
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_ring_buffer_is_counted_as_lost() {
    common::require_root();
    const N: u64 = 5_000;
    // One page of ring, nobody reading while the calls run: most are dropped.
    let observed = selftest::run(RoundTrip {
        symbol: "overflow_probe_target",
        function: overflow_probe_target,
        calls: N,
        pages: 0,
        ring_bytes: 4096,
        read_concurrently: false,
        tracepoints: TracepointChoice::Auto,
        recursion_misses: 0,
    })
    .await
    .expect("round trip");

    let delivered = observed.calls.len() as u64;
    assert!(delivered > 0 && delivered < N, "ring delivered {delivered} of {N}");
    assert!(observed.lost.call > 0);
    assert_eq!(observed.lost.call, N - delivered, "lost counter equals attempted minus delivered");
    // What was delivered is the first calls, intact.
    for (seq, event) in observed.calls.iter().enumerate() {
        assert_eq!(event.args[0], seq as u64);
    }
}

#[test]
fn tracepoint_offsets_match_this_kernel() {
    common::require_root();
    use tracer_common::tracepoints::page_fault_user as tp;
    ttrace::live::tracefs::ensure_mounted().expect("tracefs");
    for (field, offset) in [("address", tp::ADDRESS), ("ip", tp::IP), ("error_code", tp::ERROR_CODE)] {
        let found = ttrace::live::tracefs::field_offset(tp::GROUP, tp::NAME, field).expect("format file");
        assert_eq!(found, Some(offset), "{}:{} field {field}", tp::GROUP, tp::NAME);
    }
}

#[test]
fn object_defines_every_shared_map_and_program() {
    // No root needed: parse the embedded object.
    let obj = aya_obj_names();
    let maps = [
        tracer_common::MAP_EVENTS,
        tracer_common::MAP_LOST,
        tracer_common::MAP_TARGET_TGIDS,
        tracer_common::MAP_NEW_CHILDREN,
    ];
    for name in maps {
        assert!(obj.contains(&name.to_string()), "map {name} missing from the eBPF object");
    }
    use tracer_common::programs;
    for name in [programs::CALL_ARGS, programs::PAGE_FAULT_USER, programs::PROCESS_FORK, programs::PROCESS_EXEC] {
        assert!(obj.contains(&name.to_string()), "program {name} missing from the eBPF object");
    }
    // The stand-ins of older kernels, named in tracer-common and built by a
    // macro in tracer-ebpf: the two lists must agree.
    use tracer_common::programs::compat;
    let stand_ins = compat::COOKIE_COPIES.iter().map(|c| c.2).chain(compat::BOUNDED.iter().map(|b| b.1));
    for name in stand_ins {
        assert!(obj.contains(&name.to_string()), "stand-in program {name} missing from the eBPF object");
    }
}

/// Symbol names in the embedded object (maps and programs are global symbols).
fn aya_obj_names() -> Vec<String> {
    use object::{Object, ObjectSymbol};
    let file = object::File::parse(ttrace::live::load::EBPF_OBJECT).expect("valid ELF");
    file.symbols().filter_map(|s| s.name().ok().map(str::to_string)).collect()
}
