//! The `server` kind of run: llama-server traced while N clients send one
//! `/completion` each, all at once; then it is stopped (SIGINT, as Ctrl-C
//! would) and its exit ends the trace. The clients speak HTTP/1.1 over a
//! plain socket: one request per connection, on loopback.

use std::{
    io::{Read, Write},
    net::TcpStream,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::export::dataset::Served;

/// How long the server may take to load the model and answer `/health`.
const READY_WITHIN: Duration = Duration::from_secs(300);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// A free loopback port (the server binds it a moment later).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits for the server, runs the clients, stops the server (`pid`).
/// `cancel`: the trace ended without us (the server died).
pub fn drive(
    port: u16,
    pid: u32,
    clients: u32,
    body: serde_json::Value,
    cancel: Arc<AtomicBool>,
) -> Result<Vec<Served>, String> {
    let ready = Instant::now();
    loop {
        if cancel.load(Ordering::SeqCst) {
            return Err("the server exited before it answered /health".into());
        }
        if matches!(request(port, "GET", "/health", None), Ok((200, _))) {
            break;
        }
        if ready.elapsed() > READY_WITHIN {
            stop(pid);
            return Err(format!("llama-server did not answer /health within {} s", READY_WITHIN.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = body.to_string();
    let answers: Vec<Result<Served, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients).map(|_| s.spawn(|| complete(port, &text))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a client panicked".into()))).collect()
    });
    stop(pid);
    answers.into_iter().collect()
}

fn complete(port: u16, body: &str) -> Result<Served, String> {
    let (status, text) = request(port, "POST", "/completion", Some(body)).map_err(|e| format!("/completion: {e}"))?;
    if status != 200 {
        return Err(format!("/completion answered {status}: {}", text.chars().take(300).collect::<String>()));
    }
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("/completion's answer: {e}"))?;
    let timings = &doc["timings"];
    Ok(Served {
        slot: doc["id_slot"].as_i64(),
        prompt_n: timings["prompt_n"].as_u64(),
        predicted_n: timings["predicted_n"].as_u64(),
    })
}

/// SIGINT: llama-server finishes and exits 0.
fn stop(pid: u32) {
    // SAFETY: kill only sends a signal.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
}

/// One request; the status and the body.
fn request(port: u16, method: &str, path: &str, body: Option<&str>) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let body = body.unwrap_or("");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let chunked = head.lines().any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding: chunked"));
    Ok((status, if chunked { dechunk(rest) } else { rest.to_string() }))
}

/// A chunked body's data: `SIZE\r\nDATA\r\n` until size 0.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}
