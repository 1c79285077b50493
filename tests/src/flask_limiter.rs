//! A provider behind Flask-Limiter, the widely used rate limiter of Python
//! web services (the `limits` library underneath, shared with slowapi):
//! the real package from PyPI, a real Flask server on a loopback address,
//! limiting every request to `/item` to 20 a second in one of its
//! strategies — `moving-window` (a log of the last second's accepted
//! requests) or `fixed-window` (a second that begins at the first request
//! after the last one expired) — with its rate-limit headers on or off.
//! With them, its `X-RateLimit-Reset` is the whole second after the
//! window's end + 1 s and its `Retry-After` the seconds to that: an upper
//! bound on the reset, not the reset (issue 35).
//!
//! The server records every answer (wall-clock time, status); the test
//! reads them at `/stats` (exempt from the limit, asked directly).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::free_port;

const SERVER: &str = r#"
import logging, sys, threading, time
from flask import Flask, jsonify, request
from flask_limiter import Limiter
ip, port, strategy, headers = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
app = Flask(__name__)
seen, lock = [], threading.Lock()
limiter = Limiter(lambda: "all", app=app, default_limits=["20 per second"],
                  headers_enabled=headers, strategy=strategy, storage_uri="memory://")
@app.after_request
def record(resp):
    if request.path == "/item":
        with lock:
            seen.append((time.time(), resp.status_code))
    return resp
@app.route("/item")
def item():
    return "ok"
@app.route("/stats")
@limiter.exempt
def stats():
    with lock:
        return jsonify(seen)
logging.getLogger("werkzeug").setLevel(logging.ERROR)
app.run(host=ip, port=port, threaded=True)
"#;

/// The limiter's strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// `moving-window`.
    Moving,
    /// `fixed-window`.
    Fixed,
}

/// A running Flask-Limiter provider; stopped on drop.
#[derive(Debug)]
pub struct FlaskLimiter {
    child: Child,
    addr: String,
}

/// An answer the provider gave: seconds since the Unix epoch, status.
pub type Seen = (f64, u16);

impl FlaskLimiter {
    /// Starts one on `ip`, 20 a second with `strategy`, its headers on
    /// or off; returns once it answers.
    pub fn start(ip: &str, strategy: Strategy, headers: bool) -> FlaskLimiter {
        let port = free_port(ip);
        let strategy = match strategy {
            Strategy::Moving => "moving-window",
            Strategy::Fixed => "fixed-window",
        };
        let child = Command::new("python3")
            .arg("-c")
            .arg(SERVER)
            .args([
                ip,
                &port.to_string(),
                strategy,
                if headers { "1" } else { "0" },
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 with flask and flask-limiter (scripts/test installs them)");
        let mut f = FlaskLimiter {
            child,
            addr: format!("{ip}:{port}"),
        };
        let mut tries = 0;
        while f.try_seen().is_none() {
            tries += 1;
            assert!(
                tries < 200,
                "Flask-Limiter did not start on {} in 20 s",
                f.addr
            );
            if let Ok(Some(status)) = f.child.try_wait() {
                panic!("Flask-Limiter exited: {status}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        f
    }

    /// The limited URL.
    pub fn url(&self) -> String {
        format!("http://{}/item", self.addr)
    }

    /// Every answer to `/item` so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.try_seen().expect("Flask-Limiter's /stats")
    }

    fn try_seen(&self) -> Option<Vec<Seen>> {
        let mut s = TcpStream::connect(&self.addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(s, "GET /stats HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).ok()?;
        let mut raw = String::new();
        s.read_to_string(&mut raw).ok()?;
        let body = raw.split_once("\r\n\r\n")?.1;
        serde_json::from_str(body).ok()
    }
}

impl Drop for FlaskLimiter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Served per second over `[from, to)` seconds after the first answer, as
/// a share of `limit`, and the share of answers refused.
pub fn judge(seen: &[Seen], from: f64, to: f64, limit: f64) -> (f64, f64) {
    let t0 = seen.first().expect("the provider saw requests").0;
    let span: Vec<u16> = seen
        .iter()
        .filter(|(t, _)| (from..to).contains(&(t - t0)))
        .map(|(_, s)| *s)
        .collect();
    let served = span.iter().filter(|s| **s == 200).count();
    let refused = span.iter().filter(|s| **s == 429).count();
    (
        served as f64 / (to - from) / limit,
        refused as f64 / span.len().max(1) as f64,
    )
}
