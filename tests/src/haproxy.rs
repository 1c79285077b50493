//! Debian's HAProxy as a provider with a real limiter of another shape
//! than a token bucket (issue 21, R-SG5): a stick table counting
//! `http_req_rate(1s)` per client address — every request, refused ones
//! too — and denying with a bare `429` (no `Retry-After`) past the limit.
//! Each frontend (one per loopback address) has its own table, so several
//! contenders can run side by side without sharing a budget. Every answer
//! is logged (accept time in ms, status, frontend address) to HAProxy's
//! stdout, which is what the figures are measured from.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use crate::answers::{figures, now_ms, Answer};
use crate::harness::TempDir;

/// A running HAProxy; stopped on drop.
pub struct Haproxy {
    child: Child,
    ports: Vec<(String, u16)>,
    log: Arc<Mutex<Vec<(String, Answer)>>>,
    _dir: TempDir,
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Haproxy {
    /// HAProxy with one frontend per address in `ips`, each denying with
    /// `429` once a client's `http_req_rate(1s)` exceeds `limit`, and
    /// answering `200 ok` otherwise.
    pub fn start(ips: &[&str], limit: u32) -> Haproxy {
        let dir = TempDir::new("haproxy");
        let mut conf = String::from(
            "global\n  log stdout format raw local0\n  maxconn 4000\n\
             defaults\n  mode http\n  log global\n  log-format \"%Ts%ms %ST %fi\"\n\
             \x20 timeout connect 2s\n  timeout client 30s\n  timeout server 30s\n\
             \x20 timeout http-keep-alive 30s\n",
        );
        let mut ports = Vec::new();
        for (i, ip) in ips.iter().enumerate() {
            let port = TcpListener::bind((*ip, 0))
                .expect("a free port")
                .local_addr()
                .expect("its address")
                .port();
            conf.push_str(&format!(
                "frontend f{i}\n  bind {ip}:{port}\n\
                 \x20 stick-table type ip size 100 expire 60s store http_req_rate(1s)\n\
                 \x20 http-request track-sc0 src\n\
                 \x20 http-request deny deny_status 429 if {{ sc_http_req_rate(0) gt {limit} }}\n\
                 \x20 http-request return status 200 content-type text/plain string \"ok\"\n"
            ));
            ports.push((ip.to_string(), port));
        }
        std::fs::write(dir.join("haproxy.cfg"), conf).expect("write the config");
        let mut child = Command::new(crate::harness::debian_bin("haproxy"))
            .arg("-db")
            .arg("-f")
            .arg(dir.join("haproxy.cfg"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run haproxy (Debian's haproxy package)");
        let log = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().expect("its stdout");
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut f = line.split_whitespace();
                let (Some(at), Some(status), Some(ip)) = (f.next(), f.next(), f.next()) else {
                    continue;
                };
                if let (Ok(at_ms), Ok(status)) = (at.parse(), status.parse()) {
                    sink.lock()
                        .unwrap()
                        .push((ip.to_string(), Answer { at_ms, status }));
                }
            }
        });
        // Bounded wait until every frontend listens.
        for (ip, port) in &ports {
            let mut up = false;
            for _ in 0..100 {
                if std::net::TcpStream::connect((ip.as_str(), *port)).is_ok() {
                    up = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(up, "haproxy did not listen on {ip}:{port}");
        }
        Haproxy {
            child,
            ports,
            log,
            _dir: dir,
        }
    }

    /// The URL of the frontend on `ip`.
    pub fn url(&self, ip: &str, path: &str) -> String {
        let (_, port) = self
            .ports
            .iter()
            .find(|(i, _)| i == ip)
            .expect("a frontend on this address");
        format!("http://{ip}:{port}{path}")
    }

    /// The answers the frontend on `ip` gave, in order.
    pub fn answers(&self, ip: &str) -> Vec<Answer> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(i, _)| i == ip)
            .map(|(_, a)| *a)
            .collect()
    }
}
