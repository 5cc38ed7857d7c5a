//! Running `ttrace view` and asking it things: a server process on a free
//! port and a minimal HTTP/1.1 client (no compression asked, so bodies come
//! as the server computed them).

#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::Path,
    process::{Child, Stdio},
    time::Duration,
};

pub struct Server {
    child: Option<Child>,
    /// The printed URL, e.g. `http://127.0.0.1:41234/` (with `?token=` when set).
    pub url: String,
    pub addr: String,
    pub token: Option<String>,
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

impl Server {
    /// `ttrace view TRACE --port 0 --no-open ARGS`, once it printed its URL.
    pub fn start(trace: &Path, args: &[&str]) -> Server {
        let mut child = super::common::ttrace()
            .arg("view")
            .arg(trace)
            .args(["--port", "0", "--no-open"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ttrace view");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read the URL line");
        let Some(url) = line.split_whitespace().find(|w| w.starts_with("http://")) else {
            let _ = child.kill();
            let mut err = String::new();
            child.stderr.take().map(|mut e| e.read_to_string(&mut err));
            panic!("ttrace view printed no URL (stdout `{line}`), stderr:\n{err}");
        };
        let rest = url.trim_start_matches("http://");
        let (host_port, query) = rest.split_once('/').unwrap_or((rest, ""));
        let port = host_port.rsplit_once(':').expect("host:port").1;
        let token = query.strip_prefix("?token=").map(str::to_string);
        Server { url: url.to_string(), addr: format!("127.0.0.1:{port}"), token, child: Some(child) }
    }

    /// GET `path` (with its query) as is.
    pub fn get(&self, path: &str) -> Reply {
        get(&self.addr, path, &[])
    }

    /// GET `path` with the token added.
    pub fn get_auth(&self, path: &str) -> Reply {
        let t = self.token.as_deref().expect("a token");
        let sep = if path.contains('?') { '&' } else { '?' };
        get(&self.addr, &format!("{path}{sep}token={t}"), &[])
    }

    /// Stops it as Ctrl-C does; it must exit 0.
    pub fn stop(mut self) {
        let child = self.child.take().expect("running");
        // SAFETY: plain syscall on our child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let out = super::common::output_within(child, Duration::from_secs(20), "ttrace view after SIGINT");
        assert!(out.status.success(), "ttrace view did not stop cleanly: {:?}", out.status);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn get(addr: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("end of headers");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|c| c.parse().ok()).unwrap();
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect();
    let mut body = raw[split + 4..].to_vec();
    if headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked")) {
        body = dechunk(&body);
    }
    Reply { status, headers, body }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = raw.windows(2).position(|w| w == b"\r\n").expect("chunk size line");
        let size = usize::from_str_radix(String::from_utf8_lossy(&raw[..eol]).trim(), 16).expect("chunk size");
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
        raw = &raw[eol + 2 + size + 2..];
    }
}
