//! Ingest throughput: producer threads call a uprobed function at an
//! aggregate offered rate (each paced to offered / threads) while the reader
//! drains the ring concurrently exactly as `ttrace run` does: the same
//! `EventStream` (woken at a quarter-full ring, drained on a 20 ms timer
//! otherwise), every event passed to the trace `Recorder` (here writing to
//! `io::sink()`). `delivered` counts the call events that reader decoded;
//! `lost` is the eBPF program's own per-CPU lost counter, summed.
//!
//! Prints CSV, one line per measurement:
//!
//! - `step,traced,threads,offered_per_s,achieved_per_s,calls,delivered,lost,secs,reader_cpu_s,producer_cpu_s`:
//!   `offered` 0 = unpaced (as fast as the threads go); `achieved` = calls /
//!   wall time of the producers; `reader_cpu_s` is the reader thread's CPU
//!   time, `producer_cpu_s` the producers' (user + kernel: the trap and the
//!   eBPF program run on the producer's CPU time).
//! - `drain,threads,records,secs,cpu_s,records_per_cpu_s,lost`: the reader
//!   alone. Producers fill the ring (≈ 80 % of it) while the reader waits,
//!   then one `drain_now` empties it, timed in wall and in the reader
//!   thread's CPU seconds: records per CPU second is the reader's ceiling
//!   with a core to itself (wall time also counts preemption by whatever
//!   else runs). One line per fill.
//!
//! The first step is an untraced unpaced loop (its own ceiling). The machine
//! has 2 cores; the reader shares them with the producers, so unpaced
//! multi-thread steps show what the reader keeps up with when it has to
//! compete for a CPU. Needs root.
//!
//! `sudo -E cargo bench -p tracer-user --bench ingest [-- SECONDS_PER_STEP]`

use std::{
    io::{BufWriter, Sink},
    sync::{
        Arc, Barrier,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tracer_common::CallEvent;
use ttrace::{
    events::Event,
    format::{Header, TraceWriter},
    live::collect::EventStream,
    live::load::{LoadOptions, Tracer},
    live::recorder::{Recorder, Resolver},
};

#[path = "common/probe_target.rs"]
mod probe_target;
use probe_target::bench_probe_target;

/// `(producer threads, aggregate offered calls/s)`; 0 = unpaced.
const STEPS: &[(usize, u64)] = &[
    (1, 1_000_000),
    (1, 2_000_000),
    (1, 0),
    (2, 1_000_000),
    (2, 1_500_000),
    (2, 2_000_000),
    (2, 2_500_000),
    (2, 3_000_000),
    (2, 4_000_000),
    (2, 0),
    (3, 0),
    (4, 0),
];
/// `ttrace run`'s defaults (`--ring-bytes`, session.rs: wake-up at a
/// quarter-full ring, drain timer).
const RING_BYTES: u32 = tracer_common::DEFAULT_RING_BYTES;
const WAKEUP_BYTES: u32 = RING_BYTES / 4;
const TICK: Duration = Duration::from_millis(20);
/// Ring-buffer record: 8-byte header plus the event, 8-byte aligned.
const RECORD_BYTES: usize = (8 + size_of::<CallEvent>()).next_multiple_of(8);
const DRAIN_FILLS: usize = 5;
/// Calls per burst; a paced thread ahead of schedule sleeps until its next
/// burst is due, leaving the CPU to the reader.
const BURST: u64 = 256;

fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: plain syscall writing into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

struct Produced {
    calls: u64,
    start: Instant,
    end: Instant,
    cpu_s: f64,
}

/// Call the target `rate` times per second (0: as fast as possible) for
/// `secs`, or until `limit` calls.
fn paced_calls(rate: u64, secs: f64, limit: u64) -> Produced {
    let cpu0 = thread_cpu_s();
    let start = Instant::now();
    let total = if rate == 0 { limit } else { ((rate as f64 * secs) as u64).min(limit) };
    let mut n = 0u64;
    while n < total {
        let elapsed = start.elapsed().as_secs_f64();
        if elapsed >= secs {
            break;
        }
        let due = if rate == 0 { n + BURST } else { ((elapsed * rate as f64) as u64).min(n + BURST) }.min(total);
        if due <= n {
            let wait = (n + BURST) as f64 / rate as f64 - elapsed;
            if wait > 50e-6 {
                std::thread::sleep(Duration::from_secs_f64(wait.min(secs - elapsed)));
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        while n < due {
            std::hint::black_box(bench_probe_target(n, 7));
            n += 1;
        }
    }
    Produced { calls: n, start, end: Instant::now(), cpu_s: thread_cpu_s() - cpu0 }
}

/// `threads` producers started together, `rate / threads` calls/s each.
struct Producers {
    handles: Vec<std::thread::JoinHandle<Produced>>,
    running: Arc<AtomicUsize>,
}

impl Producers {
    fn start(threads: usize, rate: u64, secs: f64, limit: u64) -> Self {
        let barrier = Arc::new(Barrier::new(threads));
        let running = Arc::new(AtomicUsize::new(threads));
        let handles = (0..threads)
            .map(|i| {
                let (barrier, running) = (barrier.clone(), running.clone());
                let share = rate / threads as u64 + u64::from((i as u64) < rate % threads as u64);
                let limit = limit / threads as u64;
                std::thread::spawn(move || {
                    barrier.wait();
                    let out = paced_calls(share, secs, limit);
                    running.fetch_sub(1, Ordering::Release);
                    out
                })
            })
            .collect();
        Self { handles, running }
    }

    fn done(&self) -> bool {
        self.running.load(Ordering::Acquire) == 0
    }

    /// Total calls, wall seconds from the first start to the last end, CPU seconds.
    fn join(self) -> (u64, f64, f64) {
        let all: Vec<Produced> = self.handles.into_iter().map(|h| h.join().unwrap()).collect();
        let start = all.iter().map(|p| p.start).min().unwrap();
        let end = all.iter().map(|p| p.end).max().unwrap();
        (all.iter().map(|p| p.calls).sum(), (end - start).as_secs_f64(), all.iter().map(|p| p.cpu_s).sum())
    }
}

/// A loaded tracer probing `bench_probe_target` in this process, and the
/// reader side as `ttrace run` has it.
struct Traced {
    tracer: Tracer,
    stream: EventStream,
    recorder: Recorder<BufWriter<Sink>>,
}

impl Traced {
    fn new() -> Self {
        let exe = std::env::current_exe().unwrap();
        let pid = std::process::id();
        let mut tracer = Tracer::load(&LoadOptions { ring_bytes: RING_BYTES, ..Default::default() }).unwrap();
        tracer.add_target(pid).unwrap();
        tracer.set_wakeup_bytes(WAKEUP_BYTES).unwrap();
        tracer.attach_call_args(&exe, "bench_probe_target", Some(pid)).unwrap();
        let stream = EventStream::new(tracer.take_events().unwrap()).unwrap();
        let writer =
            TraceWriter::create(BufWriter::with_capacity(1 << 20, std::io::sink()), &Header::default()).unwrap();
        Self { tracer, stream, recorder: Recorder::new(writer, Resolver::new(pid)) }
    }

    /// Drain what is in the ring now; call events decoded.
    fn drain(&mut self) -> u64 {
        let mut calls = 0u64;
        let recorder = &mut self.recorder;
        self.stream.drain_now(&mut |e: Event| {
            calls += u64::from(matches!(e, Event::Call(_)));
            recorder.record(&e).expect("writing to io::sink");
        });
        calls
    }

    fn lost(&self) -> u64 {
        self.tracer.lost().unwrap().total()
    }
}

struct Step {
    calls: u64,
    secs: f64,
    delivered: u64,
    lost: u64,
    reader_cpu_s: f64,
    producer_cpu_s: f64,
}

async fn step(threads: usize, rate: u64, secs: f64, traced: bool) -> Step {
    if !traced {
        let (calls, secs, producer_cpu_s) = Producers::start(threads, rate, secs, u64::MAX).join();
        return Step { calls, secs, delivered: 0, lost: 0, reader_cpu_s: 0.0, producer_cpu_s };
    }
    let mut t = Traced::new();
    let cpu0 = thread_cpu_s();
    let producers = Producers::start(threads, rate, secs, u64::MAX);
    let mut delivered = 0u64;
    let mut tick = tokio::time::interval(TICK);
    while !producers.done() {
        tokio::select! {
            r = t.stream.readable() => { r.unwrap(); delivered += t.drain(); }
            _ = tick.tick() => { delivered += t.drain(); }
        }
    }
    let (calls, secs, producer_cpu_s) = producers.join();
    delivered += t.drain();
    let reader_cpu_s = thread_cpu_s() - cpu0;
    assert_eq!(t.recorder.writer.stats.markers, delivered, "every delivered call is recorded");
    Step { calls, secs, delivered, lost: t.lost(), reader_cpu_s, producer_cpu_s }
}

/// Fill the ring to ~80 % with the reader idle, then time one drain:
/// `(records, wall s, CPU s, lost)` per fill.
fn drain_alone(threads: usize) -> Vec<(u64, f64, f64, u64)> {
    let mut t = Traced::new();
    let fill = (RING_BYTES as usize / RECORD_BYTES * 4 / 5) as u64;
    let mut lost_before = 0;
    (0..DRAIN_FILLS)
        .map(|_| {
            let (calls, _, _) = Producers::start(threads, 0, f64::INFINITY, fill).join();
            let (start, cpu0) = (Instant::now(), thread_cpu_s());
            let records = t.drain();
            let (secs, cpu_s) = (start.elapsed().as_secs_f64(), thread_cpu_s() - cpu0);
            let lost_total = t.lost();
            let lost = lost_total - std::mem::replace(&mut lost_before, lost_total);
            assert_eq!(records + lost, calls, "every call is delivered or counted lost");
            (records, secs, cpu_s, lost)
        })
        .collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if !ttrace::live::privileges::is_root() {
        eprintln!("ingest loads eBPF programs and needs root: run `sudo -E cargo bench -p tracer-user --bench ingest`");
        std::process::exit(1);
    }
    let secs: f64 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(1.0);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "# cores {cores}, ring {RING_BYTES} bytes, {RECORD_BYTES} bytes per record, wake-up {WAKEUP_BYTES} bytes, drain timer {TICK:?}"
    );
    println!(
        "# step,traced,threads,offered_per_s,achieved_per_s,calls,delivered,lost,secs,reader_cpu_s,producer_cpu_s"
    );
    let print = |traced: bool, threads: usize, rate: u64, s: &Step| {
        println!(
            "step,{},{threads},{rate},{:.0},{},{},{},{:.3},{:.3},{:.3}",
            u8::from(traced),
            s.calls as f64 / s.secs,
            s.calls,
            s.delivered,
            s.lost,
            s.secs,
            s.reader_cpu_s,
            s.producer_cpu_s
        );
    };
    print(false, 1, 0, &step(1, 0, secs, false).await);
    for &(threads, rate) in STEPS {
        print(true, threads, rate, &step(threads, rate, secs, true).await);
    }
    println!("# drain,threads,records,secs,cpu_s,records_per_cpu_s,lost");
    for (records, secs, cpu_s, lost) in drain_alone(2) {
        println!("drain,2,{records},{secs:.6},{cpu_s:.6},{:.0},{lost}", records as f64 / cpu_s);
    }
}
