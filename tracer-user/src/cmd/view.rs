//! `ttrace view [TRACE]`: index the trace, then serve it until Ctrl-C.

use std::{
    future::IntoFuture,
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
    time::Instant,
};

use anyhow::{Context, Result};

use crate::{
    cli::ViewArgs,
    view::{assets, index::Index, server},
};

pub fn run(args: ViewArgs) -> Result<()> {
    let started = Instant::now();
    let ip = parse_host(&args.host)?;
    // Bound before loading, so a port in use fails at once.
    let listener = std::net::TcpListener::bind(SocketAddr::new(ip, args.port))
        .with_context(|| format!("cannot listen on {}:{} (pass --port 0 for any free port)", args.host, args.port))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let token = if ip.is_loopback() { None } else { Some(random_token()?) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let stopped = runtime.block_on(async move {
        // Caught from the start: a Ctrl-C while a long trace is indexed, or
        // right after the server's first answer (a script, a test), must
        // meet these handlers, not SIGINT's default action (killed, status
        // 2, seen in CI).
        let mut stop = Stop::catch()?;
        let file = args.file.clone();
        let mut loading = tokio::task::spawn_blocking(move || Index::load(&file));
        let slow = tokio::time::sleep(SAY_INDEXING_AFTER);
        tokio::pin!(slow);
        let mut said = false;
        let index = loop {
            tokio::select! {
                loaded = &mut loading => break loaded?.with_context(|| format!("reading {}", args.file.display()))?,
                signal = stop.wait() => return Ok(Stopped { signal, while_indexing: true, cut_short: false }),
                // Not at once: a trace that is no trace is one line of error.
                () = &mut slow, if !said => {
                    said = true;
                    eprintln!("ttrace: indexing {}…", args.file.display());
                }
            }
        };
        super::report::warn_if_partial(&args.file, &index.analysis);
        if index.analysis.truncated {
            eprintln!(
                "ttrace: {} ends without its end frame (still being written, or cut short): showing it up to its \
                 last complete frame",
                args.file.display()
            );
        }
        if !assets::built() {
            eprintln!("ttrace: {}", assets::HOW_TO_BUILD);
        }
        let url = url(addr, token.as_deref());
        eprintln!(
            "ttrace: {} indexed in {:.1} s: {} ubatches, {} ops",
            args.file.display(),
            started.elapsed().as_secs_f64(),
            index.analysis.ubatches.len(),
            index.ops.len()
        );
        let mut out = std::io::stdout().lock();
        writeln!(out, "ttrace view: {url}  (Ctrl-C stops)")?;
        out.flush()?;
        drop(out);
        if !args.no_open {
            open_browser(&url);
        }
        serve(listener, Arc::new(index), token, stop).await
    })?;
    // Nor does the runtime wait for the computations still running (a
    // simulation, the index): their answers are not worth waiting for, and
    // there is nothing to save.
    runtime.shutdown_timeout(std::time::Duration::ZERO);
    let dropped = if stopped.cut_short { " (a request still computing was dropped)" } else { "" };
    let stage = if stopped.while_indexing { " while indexing" } else { "" };
    eprintln!("ttrace: view stopped{stage} by {}{dropped}", stopped.signal);
    Ok(())
}

/// A long trace's indexing is said after this, so that the wait is not
/// silent (and a test knows the signals are caught).
const SAY_INDEXING_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

/// How the server stopped.
struct Stopped {
    signal: &'static str,
    while_indexing: bool,
    cut_short: bool,
}

/// Serves `index` until a signal, then lets the requests in flight finish
/// for [`STOP_GRACE`] at most.
async fn serve(
    listener: std::net::TcpListener,
    index: Arc<Index>,
    token: Option<String>,
    mut stop: Stop,
) -> Result<Stopped> {
    let warm = index.clone();
    // Beside the report's pass (one core each): the sorts' and the report's
    // peaks add up, but the index is saved a pass sooner.
    std::thread::spawn(move || {
        warm.ops.warm();
        warm.timeline.warm(&warm.ops);
        log::info!("sort orders and op tracks built");
        // With them: the next open does not sort either.
        warm.save();
    });
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let (signalled, mut stopping) = tokio::sync::oneshot::channel();
    let serve = axum::serve(listener, server::router(index, token))
        .with_graceful_shutdown(async move {
            let _ = signalled.send(stop.wait().await);
        })
        .into_future();
    tokio::pin!(serve);
    // A graceful stop waits for the requests in flight, and one may compute
    // for minutes: they get a moment, not more.
    let mut signal = None;
    let cut_short = tokio::select! {
        served = &mut serve => served.map(|()| false)?,
        name = &mut stopping => {
            signal = name.ok();
            tokio::time::timeout(STOP_GRACE, serve).await.is_err()
        }
    };
    let signal = signal.or_else(|| stopping.try_recv().ok()).unwrap_or("a signal");
    Ok(Stopped { signal, while_indexing: false, cut_short })
}

/// How long requests in flight may finish after Ctrl-C or SIGTERM: the
/// process must be gone within a second of either.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_millis(300);

/// Ctrl-C or SIGTERM, caught from when it is made.
struct Stop {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Stop {
    /// Inside the runtime's context.
    fn catch() -> Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("catching SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("catching SIGTERM")?,
        })
    }

    /// The signal's name, when one comes.
    async fn wait(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}

fn parse_host(host: &str) -> Result<IpAddr> {
    if host == "localhost" {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    host.parse().with_context(|| format!("--host {host} is not an IP address (e.g. 127.0.0.1, 0.0.0.0, ::1)"))
}

fn random_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom for the access token")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn url(addr: SocketAddr, token: Option<&str>) -> String {
    let host = match addr.ip() {
        // Listening everywhere: the machine's name is what others can reach.
        ip if ip.is_unspecified() => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| ip.to_string()),
        IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    match token {
        Some(t) => format!("http://{host}:{}/?token={t}", addr.port()),
        None => format!("http://{host}:{}/", addr.port()),
    }
}

/// Best effort: a desktop session's browser; silent where there is none.
fn open_browser(url: &str) {
    if std::env::var_os("DISPLAY").is_none() && std::env::var_os("WAYLAND_DISPLAY").is_none() {
        return;
    }
    let spawned = std::process::Command::new("xdg-open")
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if spawned.is_err() {
        eprintln!("ttrace: could not run xdg-open: open the URL yourself");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_urls() {
        assert!(parse_host("localhost").unwrap().is_loopback());
        assert!(parse_host("::1").unwrap().is_loopback());
        assert!(!parse_host("0.0.0.0").unwrap().is_loopback());
        assert!(parse_host("example.org").is_err());
        let a: SocketAddr = "127.0.0.1:7575".parse().unwrap();
        assert_eq!(url(a, None), "http://127.0.0.1:7575/");
        assert_eq!(url("[::1]:80".parse().unwrap(), Some("ab")), "http://[::1]:80/?token=ab");
        assert_eq!(random_token().unwrap().len(), 32);
    }

    #[test]
    fn missing_trace_is_one_error() {
        let err = Index::load(std::path::Path::new("/nonexistent/x.data")).err().expect("an error");
        assert!(err.to_string().contains("/nonexistent/x.data"), "{err}");
    }
}
