//! A computation too long for one request (the Memory tab's simulation,
//! minutes on a long trace): the first request starts it on a thread of its
//! own, later ones share it, and until it is done each is answered with how
//! far it got. The thread runs when no query wants a CPU.

use std::{
    panic::AssertUnwindSafe,
    sync::{Arc, Mutex},
};

use indicatif::ProgressBar;

/// Where a computation is.
#[derive(Clone, Debug)]
pub enum Status {
    /// Done this fraction (0 to 1) of its work.
    Computing(f64),
    /// Its answer, or why there is none.
    Done(Result<Arc<Vec<u8>>, String>),
}

/// One background computation, started at most once.
#[derive(Default)]
pub struct Background {
    state: Mutex<State>,
}

#[derive(Default)]
enum State {
    #[default]
    Idle,
    /// Its stages' bars, each with its share of the whole.
    Running(Vec<(f64, ProgressBar)>),
    Done(Result<Arc<Vec<u8>>, String>),
}

impl Background {
    /// Its status, starting `work` on the first call. `work` gets one bar
    /// per share of `stages` (their lengths set by `work` or here), in
    /// that order; the shares sum to 1.
    pub fn poll<W>(self: &Arc<Self>, name: &str, stages: &[(f64, u64)], work: W) -> std::io::Result<Status>
    where
        W: FnOnce(&[ProgressBar]) -> Result<Vec<u8>, String> + Send + 'static,
    {
        let mut state = self.lock();
        match &*state {
            State::Done(answer) => return Ok(Status::Done(answer.clone())),
            State::Running(bars) => return Ok(Status::Computing(fraction(bars))),
            State::Idle => {}
        }
        let hidden = indicatif::ProgressDrawTarget::hidden;
        let bars: Vec<(f64, ProgressBar)> =
            stages.iter().map(|&(share, len)| (share, ProgressBar::with_draw_target(Some(len), hidden()))).collect();
        let given: Vec<ProgressBar> = bars.iter().map(|(_, bar)| bar.clone()).collect();
        let this = self.clone();
        let job = name.to_string();
        std::thread::Builder::new().name(name.into()).spawn(move || {
            yield_to_queries();
            let started = std::time::Instant::now();
            let answer = std::panic::catch_unwind(AssertUnwindSafe(|| work(&given))).unwrap_or_else(|panic| {
                let why = (panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(format!("{job} failed, a bug: {why}"))
            });
            log::info!("{job} computed in {:.2?}", started.elapsed());
            *this.lock() = State::Done(answer.map(Arc::new));
        })?;
        *state = State::Running(bars);
        Ok(Status::Computing(0.0))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The stages' shares, each in proportion to how far its bar got; below
/// 1 until the answer is in.
fn fraction(bars: &[(f64, ProgressBar)]) -> f64 {
    let done: f64 = bars
        .iter()
        .map(|(share, bar)| match bar.length() {
            Some(len) if len > 0 => share * (bar.position().min(len) as f64 / len as f64),
            _ => 0.0,
        })
        .sum();
    done.clamp(0.0, 0.99)
}

/// Puts this thread (and the threads it starts, which inherit it) in
/// `SCHED_IDLE`: it uses every CPU no query wants, and a query that wakes
/// takes a CPU from it at once. Leaving a CPU aside instead halved the
/// replays on 2 CPUs (the Memory tab 72 s against the CLI's 48 s on the
/// long trace) while the queries ran a few ms out of every 200.
pub fn yield_to_queries() {
    // SAFETY: a zeroed sched_param is priority 0 (musl's has more fields
    // than glibc's, all zero here), the only one SCHED_IDLE takes; any
    // thread may lower itself to it, and failing leaves it as it was.
    let lowered = unsafe {
        let param: libc::sched_param = std::mem::zeroed();
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param)
    };
    if lowered != 0 {
        log::info!("could not lower the background thread's priority: {}", std::io::Error::last_os_error());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_done(job: &Arc<Background>) -> Result<Arc<Vec<u8>>, String> {
        loop {
            match job.poll("test", &[], |_| unreachable!("started once")).unwrap() {
                Status::Done(answer) => return answer,
                Status::Computing(f) => assert!((0.0..1.0).contains(&f), "{f}"),
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn started_once_with_progress_then_answered() {
        let job = Arc::new(Background::default());
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (halfway, reached) = std::sync::mpsc::channel::<()>();
        let first = job
            .poll("test", &[(0.25, 4), (0.75, 0)], move |bars| {
                bars[0].inc(4);
                bars[1].set_length(2);
                bars[1].inc(1);
                halfway.send(()).unwrap();
                wait.recv().unwrap();
                Ok(vec![7])
            })
            .unwrap();
        assert!(matches!(first, Status::Computing(f) if f == 0.0));
        reached.recv().unwrap();
        // Shared: a second poll neither starts another nor waits.
        match job.poll("test", &[], |_| unreachable!("started once")).unwrap() {
            Status::Computing(f) => assert!((f - 0.625).abs() < 1e-9, "{f}"),
            Status::Done(_) => panic!("done before it was let go"),
        }
        go.send(()).unwrap();
        assert_eq!(*wait_done(&job).unwrap(), vec![7]);
    }

    #[test]
    fn a_failure_or_a_panic_is_an_answer() {
        let failed = Arc::new(Background::default());
        failed.poll("test", &[], |_| Err("no model reads".into())).unwrap();
        assert_eq!(wait_done(&failed).unwrap_err(), "no model reads");
        let panicked = Arc::new(Background::default());
        panicked.poll("test", &[], |_| panic!("a bug")).unwrap();
        assert!(wait_done(&panicked).unwrap_err().contains("a bug"));
    }

    #[test]
    fn the_thread_and_its_workers_yield_to_queries() {
        // SAFETY: reads this thread's policy.
        let policy = || unsafe { libc::sched_getscheduler(0) };
        let before = policy();
        let lowered = std::thread::spawn(move || {
            yield_to_queries();
            let worker = std::thread::spawn(policy).join().unwrap();
            (policy(), worker)
        });
        assert_eq!(lowered.join().unwrap(), (libc::SCHED_IDLE, libc::SCHED_IDLE));
        assert_eq!(policy(), before, "only the background thread is lowered");
    }
}
