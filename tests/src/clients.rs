//! Real clients, configured only by environment: curl and Python
//! requests, pointed at sluice with `HTTP_PROXY` / `HTTPS_PROXY`.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// Sets the proxy variables every client reads (curl only reads the
/// lower-case `http_proxy`), and clears any bypass list.
pub fn with_proxy(cmd: &mut Command, proxy: &str) {
    for var in ["http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"] {
        cmd.env(var, proxy);
    }
    for var in ["no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"] {
        cmd.env_remove(var);
    }
}

/// The variables a client process keeps of the test's environment: where
/// its interpreter and libraries are, its locale, its CA roots. Everything
/// else — nextest's and cargo's forty-odd `NEXTEST_*`/`CARGO_*` variables,
/// the CI's own — is left out: Python requests walks the whole environment
/// for proxy settings twice on every request: 1.7 ms of CPU a request
/// with these alone, 2.0 with this machine's 35 variables, 2.5 with 95
/// (24 threads, measured 2026-12-07) — the test runner adds some thirty,
/// and what the clients spend is taken from the sluice under test on a
/// two-core machine.
const CLIENT_ENV: [&str; 17] = [
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TMPDIR",
    "PYENV_ROOT",
    "PYENV_VERSION",
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "RUST_BACKTRACE",
    "RUST_LOG",
];

/// Starts `cmd` from a clean environment holding only [`CLIENT_ENV`] of
/// this process's (what [`with_proxy`] and the caller then add is all the
/// client is configured by).
pub fn client_env(cmd: &mut Command) -> &mut Command {
    cmd.env_clear();
    for var in CLIENT_ENV {
        if let Some(v) = std::env::var_os(var) {
            cmd.env(var, v);
        }
    }
    cmd
}

/// What curl got.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The final status (0 if none).
    pub status: u16,
    /// The final response's header block.
    pub headers: String,
    /// The body.
    pub body: String,
    /// curl's stderr.
    pub stderr: String,
    /// The HTTP version of the final response (`1.1`, `2`).
    pub version: String,
}

impl Reply {
    /// A header of the final response, case-insensitive.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

/// Runs curl through `proxy` with extra `args` against `url`, bounded by
/// `max_time`.
pub async fn curl(proxy: &str, args: &[&str], url: &str, max_time: Duration) -> Reply {
    let dir = crate::harness::TempDir::new("curl");
    let (hdr, body) = (dir.join("headers"), dir.join("body"));
    let mut cmd = Command::new("curl");
    cmd.arg("-sS")
        .arg("--max-time")
        .arg(format!("{}", max_time.as_secs_f64()))
        .arg("-D")
        .arg(&hdr)
        .arg("-o")
        .arg(&body)
        .arg("-w")
        .arg("%{http_code} %{http_version}")
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    with_proxy(&mut cmd, proxy);
    let out = cmd.output().await.expect("run curl (is it installed?)");
    let headers = std::fs::read_to_string(&hdr).unwrap_or_default();
    // With a tunnel, curl writes the CONNECT answer's block first.
    let last = headers
        .split("\r\n\r\n")
        .filter(|b| !b.trim().is_empty())
        .last()
        .unwrap_or("")
        .to_string();
    let written = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut fields = written.split_whitespace();
    Reply {
        status: fields.next().and_then(|c| c.parse().ok()).unwrap_or(0),
        version: fields.next().unwrap_or("").to_string(),
        headers: last,
        body: std::fs::read_to_string(&body).unwrap_or_default(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs a Python script with the proxy variables set; returns stdout, and
/// panics with stderr if it failed.
pub async fn python(proxy: &str, script: &str, args: &[&str]) -> String {
    python_env(proxy, script, args, &[]).await
}

/// [`python`] with extra environment (e.g. `REQUESTS_CA_BUNDLE`). A
/// script still running after [`PYTHON_LIMIT`] fails the test with every
/// thread's Python stack.
pub async fn python_env(proxy: &str, script: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    python_within(PYTHON_LIMIT, proxy, script, args, env).await
}

/// How long a short client script may run: far longer than any needs, so
/// reaching it means a hang, which then fails the test instead of the CI
/// run's time limit.
pub const PYTHON_LIMIT: Duration = Duration::from_secs(120);

/// [`python_env`] bounded by `limit` (see [`python_output`]).
pub async fn python_within(
    limit: Duration,
    proxy: &str,
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> String {
    let mut cmd = Command::new("python3");
    client_env(&mut cmd).envs(env.iter().copied());
    cmd.arg("-c").arg(script).args(args);
    with_proxy(&mut cmd, proxy);
    python_output(cmd, limit, "python").await
}

/// Runs a `python3` command with `limit`: stdout, or a panic naming
/// `what` with stderr — with every thread's stack if it was still running
/// at the limit (it then gets `SIGABRT`, which Python's fault handler,
/// switched on here, answers with the stacks).
async fn python_output(mut cmd: Command, limit: Duration, what: &str) -> String {
    use tokio::io::AsyncReadExt;
    cmd.env("PYTHONFAULTHANDLER", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("run python3");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let stdout = tokio::spawn(async move {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b).await;
        b
    });
    let stderr = tokio::spawn(async move {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b).await;
        b
    });
    let (status, hung) = match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => (status.expect("wait for python3"), false),
        Err(_) => {
            if let Some(pid) = child.id() {
                let _ = Command::new("kill")
                    .args(["-ABRT", &pid.to_string()])
                    .status()
                    .await;
            }
            let status = match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
                Ok(status) => status.expect("wait for python3"),
                Err(_) => {
                    let _ = child.kill().await;
                    child.wait().await.expect("wait for python3")
                }
            };
            (status, true)
        }
    };
    let (stdout, stderr) = (stdout.await.unwrap(), stderr.await.unwrap());
    assert!(
        !hung && status.success(),
        "{what} {}: {status}\n{}",
        if hung {
            format!("still running after {limit:?}")
        } else {
            "failed".to_string()
        },
        String::from_utf8_lossy(&stderr)
    );
    String::from_utf8_lossy(&stdout).into_owned()
}

/// Fetches `url` with Node's undici through `EnvHttpProxyAgent` (which
/// reads `HTTP_PROXY`/`HTTPS_PROXY`), with extra environment such as
/// `NODE_EXTRA_CA_CERTS`. Returns the status, or panics with stderr.
pub async fn undici(proxy: &str, url: &str, env: &[(&str, &str)]) -> u16 {
    const SCRIPT: &str = r#"
const { EnvHttpProxyAgent, fetch } = require("undici");
const dispatcher = new EnvHttpProxyAgent();
fetch(process.argv[1], { dispatcher })
  .then(async (r) => { await r.arrayBuffer(); console.log(r.status); process.exit(0); })
  .catch((e) => { console.error(e, e.cause); process.exit(1); });
"#;
    let modules = concat!(env!("CARGO_MANIFEST_DIR"), "/node/node_modules");
    assert!(
        std::path::Path::new(modules).join("undici").exists(),
        "undici is not installed: scripts/test runs npm install in tests/node"
    );
    let mut cmd = Command::new("node");
    cmd.arg("-e")
        .arg(SCRIPT)
        .arg(url)
        .env("NODE_PATH", modules)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    with_proxy(&mut cmd, proxy);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("node finished within 60 s")
        .expect("run node");
    assert!(
        out.status.success(),
        "node failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a status")
}

/// Naive collectors: `clients` Python threads, each sending GETs to `url`
/// back to back for `secs` seconds with no backoff of their own. Prints
/// (returns) what they saw, status → count.
pub async fn naive_clients(
    proxy: &str,
    url: &str,
    clients: u32,
    secs: u32,
    env: &[(&str, &str)],
) -> String {
    const SCRIPT: &str = r#"
import sys, threading, time, requests
url, clients, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + secs
counts = {}
lock = threading.Lock()
def run():
    s = requests.Session()
    while time.monotonic() < deadline:
        try:
            code = s.get(url, timeout=30).status_code
        except Exception as e:
            code = type(e).__name__
        with lock:
            counts[code] = counts.get(code, 0) + 1
threads = [threading.Thread(target=run) for _ in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(" ".join(f"{k}={v}" for k, v in sorted(counts.items(), key=str)))
"#;
    // Each request may take its own 30 s past the deadline.
    python_within(
        Duration::from_secs(u64::from(secs)) + PYTHON_LIMIT,
        proxy,
        SCRIPT,
        &[url, &clients.to_string(), &secs.to_string()],
        env,
    )
    .await
}

/// [`naive_clients`] to several URLs from one Python process: `clients`
/// threads for each URL. What each URL's clients saw, in the URLs' order.
pub async fn naive_clients_each(
    proxy: &str,
    urls: &[String],
    clients: u32,
    secs: u32,
) -> Vec<String> {
    const SCRIPT: &str = r#"
import sys, threading, time, requests
clients, secs, urls = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
deadline = time.monotonic() + secs
counts = [{} for _ in urls]
lock = threading.Lock()
def run(i):
    s = requests.Session()
    while time.monotonic() < deadline:
        try:
            code = s.get(urls[i], timeout=30).status_code
        except Exception as e:
            code = type(e).__name__
        with lock:
            counts[i][code] = counts[i].get(code, 0) + 1
threads = [threading.Thread(target=run, args=(i,)) for i in range(len(urls)) for _ in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
for c in counts:
    print(" ".join(f"{k}={v}" for k, v in sorted(c.items(), key=str)))
"#;
    let mut args = vec![clients.to_string(), secs.to_string()];
    args.extend(urls.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = python_within(
        Duration::from_secs(u64::from(secs)) + PYTHON_LIMIT,
        proxy,
        SCRIPT,
        &args,
        &[],
    )
    .await;
    out.lines().map(str::to_string).collect()
}

/// `clients` threads sending to `url` for `secs` directly (no proxy), gated
/// by the AWS SDK's own adaptive rate limiter — botocore's
/// `ClientRateLimiter`, built as `botocore.retries.adaptive` builds it (its
/// CUBIC calculator, rate clocker, token bucket and
/// `ThrottlingErrorDetector`), each `429` handed to it with a throttling
/// error code as an AWS service sends one. Returns what the clients saw.
pub async fn botocore_clients(url: &str, clients: u32, secs: u32) -> String {
    const SCRIPT: &str = r#"
import sys, threading, time, urllib.request, urllib.error
from botocore.retries import adaptive, bucket, standard, throttling
url, clients, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
clock = bucket.Clock()
limiter = adaptive.ClientRateLimiter(
    rate_adjustor=throttling.CubicCalculator(starting_max_rate=0, start_time=clock.current_time()),
    rate_clocker=adaptive.RateClocker(clock),
    token_bucket=bucket.TokenBucket(max_rate=1, clock=clock),
    throttling_detector=standard.ThrottlingErrorDetector(retry_event_adapter=standard.RetryEventAdapter()),
    clock=clock,
)
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
deadline = time.monotonic() + secs
counts = {}
lock = threading.Lock()
def run():
    while time.monotonic() < deadline:
        limiter.on_sending_request(request=None)
        try:
            status = opener.open(url, timeout=30).status
        except urllib.error.HTTPError as e:
            status = e.code
        parsed = {"ResponseMetadata": {"HTTPStatusCode": status}}
        if status == 429:
            parsed["Error"] = {"Code": "ThrottlingException", "Message": "Rate exceeded"}
        limiter.on_receiving_response(response=(None, parsed), attempts=1, operation=None,
                                      caught_exception=None, request_dict={"context": {}})
        with lock:
            counts[status] = counts.get(status, 0) + 1
threads = [threading.Thread(target=run) for _ in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(" ".join(f"{k}={v}" for k, v in sorted(counts.items())))
"#;
    let mut cmd = Command::new("python3");
    client_env(&mut cmd)
        .arg("-c")
        .arg(SCRIPT)
        .args([url, &clients.to_string(), &secs.to_string()]);
    // scripts/test installs botocore.
    python_output(
        cmd,
        Duration::from_secs(u64::from(secs)) + PYTHON_LIMIT,
        "botocore clients",
    )
    .await
}
