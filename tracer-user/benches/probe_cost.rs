//! Cost of one probed call, to choose how op durations are measured:
//! a uprobe alone vs a uprobe plus a uretprobe on the same function.
//! Rounds interleave the three setups (none, entry, entry+return) so machine
//! noise hits them alike; prints medians and ratios. Needs root.
//!
//! `sudo -E cargo bench -p tracer-user --bench probe_cost`

use std::time::Instant;

use tracer_common::{markers, programs};
use ttrace::{
    live::collect::EventStream,
    live::load::{LoadOptions, Tracer},
};

#[path = "common/probe_target.rs"]
mod probe_target;
use probe_target::bench_probe_target;

const CALLS: u64 = 200_000;
const RING_BYTES: u32 = 1 << 26;
const ROUNDS: usize = 7;

fn ns_per_call() -> f64 {
    let start = Instant::now();
    for i in 0..CALLS {
        std::hint::black_box(bench_probe_target(i, 7));
    }
    start.elapsed().as_nanos() as f64 / CALLS as f64
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if !ttrace::live::privileges::is_root() {
        eprintln!(
            "probe_cost loads eBPF programs and needs root: run `sudo -E cargo bench -p tracer-user --bench probe_cost`"
        );
        std::process::exit(1);
    }
    let exe = std::env::current_exe().unwrap();
    let pid = std::process::id();
    let mut samples: [Vec<f64>; 3] = Default::default();
    for _ in 0..ROUNDS {
        for (setup, out) in samples.iter_mut().enumerate() {
            let mut tracer = Tracer::load(&LoadOptions { ring_bytes: RING_BYTES, ..Default::default() }).unwrap();
            tracer.add_target(pid).unwrap();
            // As `ttrace run`: no reader wake-up per event (on this VM each
            // costs a self-IPI of several µs), only past a quarter-full ring.
            tracer.set_wakeup_bytes(RING_BYTES / 4).unwrap();
            if setup >= 1 {
                tracer
                    .attach_uprobe(programs::CALL_ARGS, &exe, "bench_probe_target", Some(pid), markers::SELFTEST)
                    .unwrap();
            }
            if setup == 2 {
                tracer
                    .attach_uprobe(programs::CALL_RETURN, &exe, "bench_probe_target", Some(pid), markers::SELFTEST)
                    .unwrap();
            }
            let mut stream = EventStream::new(tracer.take_events().unwrap()).unwrap();
            out.push(ns_per_call());
            stream.drain_now(&mut |_| {});
            assert_eq!(tracer.lost().unwrap().total(), 0, "ring too small for the benchmark");
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let [none, entry, both] = samples.map(|mut v| median(&mut v));
    println!("probe_cost: {CALLS} calls x {ROUNDS} interleaved rounds, median ns per call");
    println!("  untraced            {none:8.1}");
    println!("  uprobe              {entry:8.1}   (+{:.1} ns)", entry - none);
    println!("  uprobe + uretprobe  {both:8.1}   (+{:.1} ns)", both - none);
    println!("  return probe costs {:.2}x the entry probe's overhead", (both - none) / (entry - none));
}
