//! Ingest throughput: one thread calls a uprobed function at increasing,
//! busy-wait-paced rates while the reader drains the ring concurrently, as
//! `ttrace run` does (wake-up threshold plus a drain timer). Per step it
//! prints one CSV line: `traced,target_per_s,achieved_per_s,calls,delivered,lost`.
//! A final unpaced step (target 0) shows what the loop reaches at all; a
//! first untraced unpaced step shows the loop's own ceiling.
//! Needs root.
//!
//! `sudo -E cargo bench -p tracer-user --bench ingest [-- SECONDS_PER_STEP]`

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use ttrace::{
    collect::EventStream,
    events::Event,
    load::{LoadOptions, Tracer},
};

/// Starts like a compiled C function (`push rbp`), as the ggml functions
/// ttrace probes do: the kernel emulates a probed `push`, while a probed
/// `mov` (what rustc emits for a leaf function) is single-stepped out of
/// line, a second trap: 16 µs instead of 0.6 µs per call on this VM.
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub extern "C" fn bench_ingest_target(a: u64, b: u64) -> u64 {
    core::arch::naked_asm!(
        "push rbp",
        "mov rbp, rsp",
        "mov rax, rdi",
        "shl rax, 5",
        "sub rax, rdi",
        "xor rax, rsi",
        "pop rbp",
        "ret",
    )
}

const RATES: &[u64] = &[100_000, 250_000, 500_000, 1_000_000, 2_000_000, 4_000_000, 0];
const RING_BYTES: u32 = 1 << 24;
const WAKEUP_BYTES: u32 = 1 << 18;

/// Call the target `rate` times per second (0: as fast as possible) for `secs`.
fn paced_calls(rate: u64, secs: f64) -> (u64, f64) {
    let start = Instant::now();
    let total = if rate == 0 { u64::MAX } else { (rate as f64 * secs) as u64 };
    let mut n = 0u64;
    while n < total {
        let elapsed = start.elapsed().as_secs_f64();
        if elapsed >= secs {
            break;
        }
        // Catch up in small bursts to the schedule, then spin.
        let due = if rate == 0 { n + 256 } else { ((elapsed * rate as f64) as u64).min(total).min(n + 256) };
        while n < due {
            std::hint::black_box(bench_ingest_target(n, 7));
            n += 1;
        }
        if rate != 0 {
            std::hint::spin_loop();
        }
    }
    (n, start.elapsed().as_secs_f64())
}

async fn step(rate: u64, secs: f64, traced: bool) -> (u64, f64, u64, u64) {
    if !traced {
        let (calls, elapsed) = paced_calls(rate, secs);
        return (calls, elapsed, 0, 0);
    }
    let exe = std::env::current_exe().unwrap();
    let pid = std::process::id();
    let mut tracer = Tracer::load(&LoadOptions { ring_bytes: RING_BYTES }).unwrap();
    tracer.add_target(pid).unwrap();
    tracer.set_wakeup_bytes(WAKEUP_BYTES).unwrap();
    tracer.attach_call_args(&exe, "bench_ingest_target", Some(pid)).unwrap();
    let mut stream = EventStream::new(tracer.take_events().unwrap()).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    let worker = std::thread::spawn(move || {
        let out = paced_calls(rate, secs);
        flag.store(true, Ordering::Release);
        out
    });
    let mut delivered = 0u64;
    let mut sink = |e: Event| {
        if matches!(e, Event::Call(_)) {
            delivered += 1;
        }
    };
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    while !done.load(Ordering::Acquire) {
        tokio::select! {
            r = stream.readable() => { r.unwrap(); stream.drain_now(&mut sink); }
            _ = tick.tick() => { stream.drain_now(&mut sink); }
        }
    }
    let (calls, elapsed) = worker.join().unwrap();
    stream.drain_now(&mut sink);
    let lost = tracer.lost().unwrap().total();
    (calls, elapsed, delivered, lost)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if !ttrace::privileges::is_root() {
        eprintln!("ingest loads eBPF programs and needs root: run `sudo -E cargo bench -p tracer-user --bench ingest`");
        std::process::exit(1);
    }
    let secs: f64 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(1.0);
    println!("traced,target_per_s,achieved_per_s,calls,delivered,lost");
    let (calls, elapsed, _, _) = step(0, secs, false).await;
    println!("0,0,{:.0},{calls},0,0", calls as f64 / elapsed);
    for &rate in RATES {
        let (calls, elapsed, delivered, lost) = step(rate, secs, true).await;
        println!("1,{rate},{:.0},{calls},{delivered},{lost}", calls as f64 / elapsed);
    }
}
