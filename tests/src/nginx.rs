//! Debian's nginx as a provider: an HTTPS upstream speaking HTTP/2, and a
//! real `limit_req` limiter (issue 21). Stopped on drop.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub use crate::answers::{figures, now_ms, Answer};
use crate::harness::{free_port, TempDir};
use crate::pki::TestCa;

/// A running nginx.
pub struct Nginx {
    child: Child,
    /// The port every server listens on (each on its own address).
    pub port: u16,
    dir: TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        crate::harness::stop(&mut self.child);
    }
}

/// How a `limit_req` server treats a request over the rate.
#[derive(Debug, Clone, Copy)]
pub enum Burst {
    /// `burst=N`: up to N wait their turn, the rest get `503`.
    Delay(u32),
    /// `burst=N nodelay`: up to N pass at once, the rest get `503`.
    NoDelay(u32),
}

impl Nginx {
    /// nginx on `ip` with TLS (h2 and http/1.1), answering `ok` with the
    /// protocol it spoke.
    pub fn tls(ip: &str, ca: &TestCa) -> Nginx {
        let dir = TempDir::new("nginx");
        let (cert, key) = ca.leaf_pem(&[ip]);
        std::fs::write(dir.join("leaf.pem"), cert).unwrap();
        std::fs::write(dir.join("leaf.key"), key).unwrap();
        let port = free_port(ip);
        let d = dir.join("").display().to_string();
        let server = format!(
            "  server {{\n    listen {ip}:{port} ssl http2;\n\
               ssl_certificate {d}leaf.pem;\n    ssl_certificate_key {d}leaf.key;\n\
               location / {{ return 200 \"ok $server_protocol\\n\"; }}\n  }}\n"
        );
        Nginx::run(dir, &[ip], port, "", &server)
    }

    /// A fast origin for the overhead benches: `ip:port` answering
    /// `200 ok` to everything over kept-alive HTTP/1.1, without logging;
    /// with TLS (a leaf for `name` from `ca`, HTTP/1.1 only) when `tls`
    /// names it.
    pub fn origin(ip: &str, tls: Option<(&str, &TestCa)>) -> Nginx {
        let dir = TempDir::new("nginx-origin");
        let port = free_port(ip);
        let d = dir.join("").display().to_string();
        let listen = match tls {
            None => format!("listen {ip}:{port};"),
            Some((name, ca)) => {
                let (cert, key) = ca.leaf_pem(&[name]);
                std::fs::write(dir.join("leaf.pem"), cert).unwrap();
                std::fs::write(dir.join("leaf.key"), key).unwrap();
                format!(
                    "listen {ip}:{port} ssl;\n    ssl_certificate {d}leaf.pem;\n\
                     \x20   ssl_certificate_key {d}leaf.key;"
                )
            }
        };
        let server = format!(
            "  server {{\n    {listen}\n    access_log off;\n    keepalive_requests 10000000;\n\
             \x20   location / {{ return 200 \"ok\\n\"; }}\n  }}\n"
        );
        Nginx::run(dir, &[ip], port, "", &server)
    }

    /// nginx with one plain-HTTP server per address in `ips`, each with
    /// its own `limit_req` zone at `rate` req/s and `burst`, refusing with
    /// nginx's default, a bare `503`; others get `200 ok`. Every answer is
    /// logged (time in ms, status, address) for [`Nginx::answers`].
    pub fn limit_req(ips: &[&str], rate: u32, burst: Burst) -> Nginx {
        let dir = TempDir::new("nginx-limit");
        // One port on every address: one free on the first and the rest.
        let port = (0..100)
            .map(|_| free_port(ips[0]))
            .find(|p| ips.iter().all(|ip| TcpListener::bind((*ip, *p)).is_ok()))
            .expect("a port free on every address");
        let d = dir.join("").display().to_string();
        // A file to serve: `return` would answer before `limit_req` runs.
        std::fs::create_dir_all(dir.join("www")).unwrap();
        std::fs::write(dir.join("www").join("ok"), "ok\n").unwrap();
        let (mut zones, mut servers) = (String::new(), String::new());
        let burst = match burst {
            Burst::Delay(n) => format!("burst={n}"),
            Burst::NoDelay(n) => format!("burst={n} nodelay"),
        };
        for (i, ip) in ips.iter().enumerate() {
            zones.push_str(&format!(
                "  limit_req_zone $server_addr zone=z{i}:1m rate={rate}r/s;\n"
            ));
            servers.push_str(&format!(
                "  server {{\n    listen {ip}:{port};\n    keepalive_requests 100000;\n\
                 \x20   location / {{ limit_req zone=z{i} {burst}; default_type text/plain;\n\
                 \x20     root {d}www; try_files /ok =404; }}\n  }}\n"
            ));
        }
        let http = format!(
            "  log_format answers '$msec $status $server_addr';\n\
             \x20 access_log {d}answers.log answers;\n{zones}"
        );
        Nginx::run(dir, ips, port, &http, &servers)
    }

    fn run(dir: TempDir, ips: &[&str], port: u16, http: &str, servers: &str) -> Nginx {
        let d = dir.join("").display().to_string();
        let conf = format!(
            "daemon off;\nuser root;\nworker_processes 1;\npid {d}nginx.pid;\n\
             error_log {d}error.log;\nevents {{ worker_connections 1024; }}\n\
             http {{\n  access_log {d}access.log;\n  client_body_temp_path {d}body;\n\
               proxy_temp_path {d}proxy;\n  fastcgi_temp_path {d}fastcgi;\n\
               uwsgi_temp_path {d}uwsgi;\n  scgi_temp_path {d}scgi;\n{http}{servers}}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let mut child = Command::new(crate::harness::debian_bin("nginx"))
            .arg("-p")
            .arg(dir.join(""))
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .arg("-e")
            .arg(dir.join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run nginx (scripts/test installs Debian's nginx)");
        // Bounded wait until every server listens.
        for _ in 0..100 {
            if ips
                .iter()
                .all(|ip| std::net::TcpStream::connect((*ip, port)).is_ok())
            {
                return Nginx { child, port, dir };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "nginx did not listen: {}",
            std::fs::read_to_string(dir.join("error.log")).unwrap_or_default()
        );
    }

    /// The URL of the server on `ip`.
    pub fn url(&self, ip: &str, path: &str) -> String {
        format!("http://{ip}:{}{path}", self.port)
    }

    /// The answers the `limit_req` server on `ip` gave, in order.
    pub fn answers(&self, ip: &str) -> Vec<Answer> {
        let log = std::fs::read_to_string(self.dir.join("answers.log")).unwrap_or_default();
        log.lines()
            .filter_map(|line| {
                let mut f = line.split_whitespace();
                let (at, status, addr) = (f.next()?, f.next()?, f.next()?);
                let at_ms = (at.parse::<f64>().ok()? * 1000.0).round() as u64;
                (addr == ip).then_some(Answer {
                    at_ms,
                    status: status.parse().ok()?,
                })
            })
            .collect()
    }
}
