//! Runs the real `sluice` binary for a test.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The built `sluice` binary: `SLUICE_BIN`, or `target/<profile>/sluice`
/// next to the test executable.
pub fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // A test: target/<profile>/deps/<test> → target/<profile>/sluice; a
    // bench binary: target/<profile>/<bench> → target/<profile>/sluice.
    let dir = exe.parent().expect("target dir");
    let bin = [dir, dir.parent().unwrap_or(dir)]
        .iter()
        .map(|d| d.join("sluice"))
        .find(|b| b.exists())
        .unwrap_or_else(|| dir.join("sluice"));
    assert!(
        bin.exists(),
        "{} not found: build it first (scripts/test does: cargo build -p sluice)",
        bin.display()
    );
    bin
}

/// A Debian package's daemon: in /usr/sbin, which not every PATH has, or
/// /usr/bin, or wherever PATH finds it.
pub fn debian_bin(name: &str) -> PathBuf {
    ["/usr/sbin", "/usr/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// A port free on `ip` now.
pub fn free_port(ip: &str) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .expect("a free port")
        .local_addr()
        .expect("its address")
        .port()
}

/// Stops a server that has children of its own (nginx's workers, squid's
/// helpers): SIGTERM, so it stops them, then SIGKILL if it has not exited
/// within 3 s. A SIGKILL alone left nginx's worker running, still
/// listening and holding its connections.
pub fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    for _ in 0..150 {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A fresh directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates it.
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sluice-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    /// A path inside it.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running sluice process; killed on drop.
#[derive(Debug)]
pub struct Sluice {
    child: Child,
    /// Proxy listener.
    pub proxy: SocketAddr,
    /// Admin listener.
    pub admin: SocketAddr,
    /// Its directory: config, state, log.
    pub dir: TempDir,
}

impl Sluice {
    /// Starts sluice with this config text (listeners on port 0 unless the
    /// config sets them), waiting until it listens.
    pub fn start(config: &str) -> Sluice {
        let dir = TempDir::new("proxy");
        Sluice::start_in(dir, config)
    }

    /// Starts sluice in an existing directory (to reuse its state).
    pub fn start_in(dir: TempDir, config: &str) -> Sluice {
        Sluice::start_with(dir, config, &[])
    }

    /// Starts sluice in `dir` with extra command-line arguments.
    pub fn start_with(dir: TempDir, config: &str, args: &[&str]) -> Sluice {
        Sluice::spawn(dir, config, args, "info,sluice=debug")
    }

    /// Starts sluice in `dir` logging as it does by default (`info`): for
    /// benches, where the tests' debug line per request would be measured.
    pub fn start_as_deployed(dir: TempDir, config: &str) -> Sluice {
        Sluice::spawn(dir, config, &[], "info")
    }

    fn spawn(dir: TempDir, config: &str, args: &[&str], level: &str) -> Sluice {
        let mut text = String::new();
        if !config.contains("listen =") && !config.contains("listen=") {
            text.push_str("listen = \"127.0.0.1:0\"\n");
        }
        if !config.contains("admin =") && !config.contains("admin=") {
            text.push_str("admin = \"127.0.0.1:0\"\n");
        }
        text.push_str(config);
        let cfg = dir.join("sluice.toml");
        std::fs::write(&cfg, text).unwrap();
        // Appends: a restarted sluice keeps one log across its lives.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("sluice.log"))
            .unwrap();
        let mut child = Command::new(binary())
            .arg("--config")
            .arg(&cfg)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(args)
            // A panic of sluice's own is logged with its stack, whatever
            // the tests run with (scripts/test runs them without).
            .env("RUST_BACKTRACE", "1")
            .env("SLUICE_LOG", level)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn sluice");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| {
                let log = std::fs::read_to_string(dir.join("sluice.log")).unwrap_or_default();
                panic!("sluice did not start; log:\n{log}")
            });
        let field = |name: &str| -> SocketAddr {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {line:?}"))
        };
        Sluice {
            proxy: field("proxy="),
            admin: field("admin="),
            child,
            dir,
        }
    }

    /// The process id (to read its memory, send it signals).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `http://127.0.0.1:port` for `HTTP_PROXY`.
    pub fn proxy_url(&self) -> String {
        format!("http://{}", self.proxy)
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sluice.log")).unwrap_or_default()
    }

    /// Sends SIGTERM and waits (bounded, polling without blocking the
    /// runtime) for the exit status.
    pub async fn terminate(mut self) -> (std::process::ExitStatus, TempDir) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let dir = std::mem::replace(&mut self.dir, TempDir(PathBuf::new()));
                return (status, dir);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "sluice did not stop on SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the process with SIGKILL — no chance to save anything.
    pub fn kill9(mut self) -> TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::replace(&mut self.dir, TempDir(PathBuf::new()))
    }

    /// Sends a signal (`HUP`, `TERM`, …).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Rewrites the config file (listeners kept), e.g. before a SIGHUP.
    pub fn rewrite_config(&self, config: &str) {
        let text = format!(
            "listen = \"{}\"\nadmin = \"{}\"\n{config}",
            self.proxy, self.admin
        );
        std::fs::write(self.dir.join("sluice.toml"), text).unwrap();
    }

    /// GETs an admin path directly (no proxy): status and body.
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        let out = tokio::process::Command::new("curl")
            .args([
                "-sS",
                "--noproxy",
                "*",
                "--max-time",
                "10",
                "-w",
                "\n%{http_code}",
            ])
            .arg(format!("http://{}{path}", self.admin))
            .output()
            .await
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    /// The value of an unlabelled series on `/metrics` (`None`: absent).
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = self.admin_get("/metrics").await;
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Calls the admin API directly (no proxy) with a JSON body: status
    /// and the JSON answer (`Value::Null` if it was not JSON).
    pub async fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        api_call(self.admin, method, path, body, None).await
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every file below `dir`.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// One call to the admin API: status and JSON answer (`Value::Null` if
/// it was not JSON). Panics if the admin does not answer within 60 s.
pub async fn api_call(
    admin: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
    bearer: Option<&str>,
) -> (u16, serde_json::Value) {
    tokio::time::timeout(
        Duration::from_secs(60),
        try_api_call(admin, method, path, body, bearer),
    )
    .await
    .expect("admin answered in time")
    .expect("admin answered")
}

/// [`api_call`] for a sluice that may be gone (a crash loop): an error
/// instead of a panic when the connection fails or closes unanswered.
pub async fn try_api_call(
    admin: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
    bearer: Option<&str>,
) -> Result<(u16, serde_json::Value), Box<dyn std::error::Error + Send + Sync>> {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::TcpStream::connect(admin).await?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let bytes = body.map_or_else(Vec::new, |b| serde_json::to_vec(b).unwrap());
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", admin.to_string())
        .header("content-type", "application/json");
    if let Some(token) = bearer {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let req = req.body(Full::new(bytes::Bytes::from(bytes)))?;
    let resp = send.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((
        status,
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    ))
}

/// Milliseconds since the Unix epoch, by the wall clock (as the admin API
/// states instants).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Sluice {
    /// `sluice run --collector collector-a --token-file DIR/a.token [args]
    /// -- COMMAND…` against this sluice's admin and proxy, with the
    /// machine's proxy variables removed (the command gets only what
    /// `sluice run` gives it), stdin closed, killed when dropped.
    pub fn run_command(&self, args: &[&str], command: &[&str]) -> tokio::process::Command {
        self.run_command_as("collector-a", "a.token", args, command)
    }

    /// [`Sluice::run_command`] for collector `name`, its token in
    /// `DIR/token_file`.
    pub fn run_command_as(
        &self,
        name: &str,
        token_file: &str,
        args: &[&str],
        command: &[&str],
    ) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(binary());
        c.args(["run", "--collector", name, "--token-file"])
            .arg(self.dir.join(token_file))
            .args(args)
            .arg("--admin-url")
            .arg(format!("http://{}", self.admin))
            .arg("--proxy-url")
            .arg(format!("http://{}", self.proxy))
            .arg("--")
            .args(command)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        for v in [
            "http_proxy",
            "HTTP_PROXY",
            "https_proxy",
            "HTTPS_PROXY",
            "no_proxy",
            "NO_PROXY",
        ] {
            c.env_remove(v);
        }
        c
    }
}
