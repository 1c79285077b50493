//! A real `redis-server` on loopback for the shared-budget tests (Debian's
//! package; `scripts/test` installs it when missing).

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use crate::harness::TempDir;

/// A running `redis-server`, killed on drop.
#[derive(Debug)]
pub struct Redis {
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: TempDir,
    /// Serving TLS only, with this certificate and key (PEM files).
    tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl Redis {
    /// Starts one on a free port, waiting until it accepts connections.
    pub fn start() -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut r = Redis {
            child: None,
            port,
            dir: TempDir::new("redis"),
            tls: None,
        };
        r.restart();
        r
    }

    /// Starts one that speaks TLS only (Debian's build has it), with a
    /// leaf for 127.0.0.1 from `ca`.
    pub fn start_tls(ca: &crate::pki::TestCa) -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = TempDir::new("redis-tls");
        let (cert, key) = ca.leaf_pem(&["127.0.0.1"]);
        let (cert_file, key_file) = (dir.join("redis.crt"), dir.join("redis.key"));
        std::fs::write(&cert_file, cert).unwrap();
        std::fs::write(&key_file, key).unwrap();
        let mut r = Redis {
            child: None,
            port,
            dir,
            tls: Some((cert_file, key_file)),
        };
        r.restart();
        r
    }

    /// `redis://127.0.0.1:{port}/0`, or `rediss://` for a TLS one.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/0", self.port)
    }

    /// Kills it (`kill -9`: no goodbye to its clients).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, empty (no persistence).
    pub fn restart(&mut self) {
        self.kill();
        let mut cmd = Command::new("redis-server");
        match &self.tls {
            Some((cert, key)) => {
                cmd.args(["--port", "0", "--tls-port", &self.port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(cert)
                    .arg("--tls-key-file")
                    .arg(key)
                    .args(["--tls-auth-clients", "no"]);
            }
            None => {
                cmd.args(["--port", &self.port.to_string()]);
            }
        }
        let child = cmd
            .args([
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--enable-debug-command",
                "local",
                "--appendonly",
                "no",
                "--dir",
            ])
            .arg(&self.dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (apt-get install redis-server)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `redis-cli` against it.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
