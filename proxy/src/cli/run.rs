//! `sluice run` (R-RN9, R-RN11): runs for collectors that know nothing of
//! runs.
//!
//! `sluice run --collector NAME --token-file F --request-cap 500 --deadline
//! 15m -- python collect.py` opens a run on the admin API, starts the
//! command with `HTTP_PROXY`/`HTTPS_PROXY` (both cases) carrying the
//! collector's credentials (its user names the run's mode,
//! `NAME+steady` or `NAME+catchup`, so that a steady and a catch-up run of
//! one collector can go on side by side), the CA variables `sluice ca` prints, and the
//! admin API added to `NO_PROXY`/`no_proxy` (a collector's calls to
//! `SLUICE_ADMIN` must not go through the proxy, whose destination guard
//! refuses loopback), keeps the lease alive, forwards SIGINT and SIGTERM to
//! the command, finishes the run when the command exits, and prints the
//! summary on stderr.
//!
//! A planned stop is the schedule's success, not the command's failure
//! (R-RN11): when the run stops on a budget (cap, deadline, retry budget)
//! the command is stopped gracefully — SIGTERM, a grace period, SIGKILL —
//! rather than left to meet `403`s, and `sluice run` exits 0; a command
//! that exits non-zero after a planned stop met that stop, and exits 0
//! too. A provider that stopped its part of the run (down past the run's
//! cycle guard, R-RN8), or that failed requests of a command that then
//! failed (its part is stopped at the finish, with gap records), makes
//! `sluice run` exit 69 (`EX_UNAVAILABLE`) naming it: part of the work
//! was not done. A command that fails with no provider to blame passes its
//! status through; `--pass-status` always passes it. A lost lease ends the
//! run: the command is stopped and `sluice run` exits 75 (`EX_TEMPFAIL`).
//!
//! A command that knows about runs finds the run in `SLUICE_RUN_ID`,
//! `SLUICE_MODE` (`steady` or `catchup`: what its commits must name),
//! `SLUICE_FENCING_TOKEN` and `SLUICE_ADMIN` to commit checkpoints, where
//! to resume in `SLUICE_CHECKPOINTS` (a JSON file: the run's mode's cursor
//! per stream) and `SLUICE_GAPS` (a JSON file: the collector's pending gap
//! records, every page drained), and its budget in `SLUICE_REQUEST_CAP` and
//! `SLUICE_DEADLINE_S` when set.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::process::{ca_paths, CaEnv};
use crate::config::Config;
use crate::runs::records::Mode;
use crate::tunnel::tls::ca::CertAuthority;

/// What `sluice run` was asked to do.
#[derive(Debug, Clone)]
pub struct RunCommand {
    /// The collector.
    pub collector: String,
    /// The file holding its token.
    pub token_file: std::path::PathBuf,
    /// The run's request cap.
    pub request_cap: Option<u64>,
    /// The run's deadline.
    pub deadline: Option<Duration>,
    /// Retries as a share of first attempts.
    pub retry_ratio: Option<f64>,
    /// Which cursor the run moves.
    pub mode: Mode,
    /// How long to wait for the collector's lease.
    pub wait: Option<Duration>,
    /// The admin listener.
    pub admin: SocketAddr,
    /// The proxy listener, as the command reaches it.
    pub proxy: SocketAddr,
    /// How long the command has after SIGTERM, when sluice stops it,
    /// before SIGKILL.
    pub grace: Duration,
    /// Always exit with the command's status, even after a planned stop.
    pub pass_status: bool,
    /// The command and its arguments.
    pub command: Vec<String>,
}

/// Exit status when the run could not be opened because another holds
/// the lease, or when its lease was lost (`EX_TEMPFAIL`: try again later).
const LEASE_HELD: u8 = 75;

/// How often the lease is renewed and the run's state read: often enough
/// that a planned stop reaches the command within a second.
const BEAT: Duration = Duration::from_secs(1);

/// How a run ended while its command ran.
#[derive(Debug, Clone, PartialEq)]
enum Ended {
    /// The run stopped on a budget: a planned stop.
    Stopped(String),
    /// The lease was lost: the run is over.
    LeaseLost(String),
}

/// Runs the command inside a run; the process's exit status: the run is
/// opened, the command started with the run in its environment, the lease
/// kept while it runs, and the run finished with how it ended.
pub async fn run(cmd: RunCommand, config: &Config) -> ExitCode {
    let token = match std::fs::read_to_string(&cmd.token_file) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
        Ok(_) => {
            return fail(&format!(
                "the token file (--token-file) {} is empty",
                cmd.token_file.display()
            ))
        }
        Err(e) => {
            return fail(&format!(
                "cannot read the token file (--token-file) {}: {e}",
                cmd.token_file.display()
            ))
        }
    };
    let Some((program, args)) = cmd.command.split_first() else {
        return fail("no command given (sluice run [options] -- COMMAND ...)");
    };
    let opened = match open_run(&cmd, &token).await {
        Ok(o) => o,
        Err(code) => return code,
    };
    let id = opened.id.clone();
    eprintln!("sluice run: run {id} opened for {}", cmd.collector);
    let mut child = command(&cmd, program, args, &token, &opened, config);
    let handoff = match handoff(&cmd, &id, &opened.run, &token).await {
        Ok(h) => h,
        Err(e) => {
            finish(&cmd, &id, &token, None).await;
            return fail(&format!("cannot hand the run's state to the command: {e}"));
        }
    };
    child
        .env("SLUICE_CHECKPOINTS", &handoff.checkpoints)
        .env("SLUICE_GAPS", &handoff.gaps);
    let mut child = match child.spawn() {
        Ok(c) => c,
        Err(e) => {
            finish(&cmd, &id, &token, None).await;
            handoff.remove();
            return fail(&format!("cannot start {program}: {e}"));
        }
    };

    // Keep the lease, and watch for the run's end.
    let beat = Duration::from_millis((opened.ttl_ms / 3).max(200)).min(BEAT);
    let (ended_tx, mut ended) = tokio::sync::watch::channel(None);
    let heartbeat = tokio::spawn(keep_lease(
        cmd.admin,
        id.clone(),
        token.clone(),
        beat,
        ended_tx,
    ));
    let status = wait_forwarding_signals(&mut child, &mut ended, cmd.grace).await;
    heartbeat.abort();
    let ended = ended.borrow().clone();
    let status = match status {
        Ok(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
            (Some(code), _) => code.clamp(0, 255) as u8,
            (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
            (None, None) => 1,
        },
        Err(e) => {
            finish(&cmd, &id, &token, None).await;
            handoff.remove();
            return fail(&format!("waiting for the command: {e}"));
        }
    };
    let summary = finish(&cmd, &id, &token, Some(status)).await;
    handoff.remove();
    if let Some(Ended::LeaseLost(why)) = &ended {
        eprintln!("sluice run: the run's lease was lost ({why}); the command was stopped");
        return ExitCode::from(LEASE_HELD);
    }
    exit_status(summary.as_ref(), status, cmd.pass_status)
}

/// A run the admin API opened.
struct Opened {
    /// The run's id.
    id: String,
    /// Its fencing token.
    fence: u64,
    /// How long its lease lasts, in ms.
    ttl_ms: u64,
    /// The API's answer, whole (the hand-off reads it).
    run: Value,
}

/// Opens the run; refused, the exit status to end with (`LEASE_HELD`
/// when another run holds the lease).
async fn open_run(cmd: &RunCommand, token: &str) -> Result<Opened, ExitCode> {
    let opening = json!({
        "request_cap": cmd.request_cap,
        "deadline_s": cmd.deadline.map(|d| d.as_secs_f64()),
        "retry_ratio": cmd.retry_ratio,
        "mode": cmd.mode.label(),
        "wait_s": cmd.wait.map(|d| d.as_secs_f64()),
    });
    let path = format!("/v1/collectors/{}/runs", cmd.collector);
    let (status, run) = match call(cmd.admin, "POST", &path, Some(&opening), Some(token)).await {
        Ok(r) => r,
        Err(e) => return Err(fail(&format!("admin API at {}: {e}", cmd.admin))),
    };
    if status != 201 {
        let why = run["error"].as_str().unwrap_or("refused");
        eprintln!("sluice run: the run was not opened ({status}): {why}");
        return Err(match run["holder"].as_str() {
            Some(holder) => {
                eprintln!("sluice run: run {holder} holds the lease");
                ExitCode::from(LEASE_HELD)
            }
            None => ExitCode::FAILURE,
        });
    }
    Ok(Opened {
        id: run["id"].as_str().unwrap_or_default().to_string(),
        fence: run["lease"]["fencing_token"].as_u64().unwrap_or(0),
        ttl_ms: run["lease"]["expires_at_unix_ms"]
            .as_u64()
            .map_or(60_000, |at| at.saturating_sub(crate::store::unix_ms_now())),
        run,
    })
}

/// The command, its environment set: the proxy with the run's
/// credentials, the admin API beside it unproxied, sluice's CA for the
/// common TLS stacks, and the run's id, mode, token and budgets.
fn command(
    cmd: &RunCommand,
    program: &str,
    args: &[String],
    token: &str,
    opened: &Opened,
    config: &Config,
) -> tokio::process::Command {
    // The user names the run's mode (`collector-a+catchup`): a steady and
    // a catch-up run of one collector may be active at once, and each
    // command's requests belong to its own run (R-FS1).
    let proxy_url = format!(
        "http://{}+{}:{token}@{}",
        cmd.collector,
        cmd.mode.label(),
        cmd.proxy
    );
    let mut child = tokio::process::Command::new(program);
    child.args(args);
    for var in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        child.env(var, &proxy_url);
    }
    let (admin_url, no_proxy) = admin_for_command(cmd.admin);
    child.env("NO_PROXY", &no_proxy).env("no_proxy", &no_proxy);
    let ca = ca_paths(config);
    if ca.cert.exists() && ca.key.exists() {
        if let Ok(ca) = CertAuthority::load_or_create(ca, 1) {
            for (name, value) in CaEnv::of(&ca).vars() {
                child.env(name, value);
            }
        }
    }
    child
        .env("SLUICE_RUN_ID", &opened.id)
        .env("SLUICE_MODE", cmd.mode.label())
        .env("SLUICE_FENCING_TOKEN", opened.fence.to_string())
        .env("SLUICE_ADMIN", &admin_url);
    if let Some(cap) = cmd.request_cap {
        child.env("SLUICE_REQUEST_CAP", cap.to_string());
    }
    if let Some(d) = cmd.deadline {
        child.env("SLUICE_DEADLINE_S", d.as_secs_f64().to_string());
    }
    child
}

/// Heartbeats every `beat` until the run stops on a budget or its lease is
/// lost, and says which on `ended`.
async fn keep_lease(
    admin: SocketAddr,
    id: String,
    token: String,
    beat: Duration,
    ended: tokio::sync::watch::Sender<Option<Ended>>,
) {
    let path = format!("/v1/runs/{id}/heartbeat");
    loop {
        tokio::time::sleep(beat).await;
        match call(admin, "POST", &path, None, Some(&token)).await {
            Ok((200, v)) => {
                if let Some(reason) = v["stop_reason"].as_str() {
                    let _ = ended.send(Some(Ended::Stopped(reason.to_string())));
                    return;
                }
            }
            Ok((status, v)) => {
                let why = v["error"].as_str().unwrap_or("refused").to_string();
                let _ = ended.send(Some(Ended::LeaseLost(format!("{status}: {why}"))));
                return;
            }
            Err(e) => eprintln!("sluice run: heartbeat failed: {e}"),
        }
    }
}

/// Exit status when a provider's part of the run stopped on source
/// pressure (`EX_UNAVAILABLE`): a provider stayed down past the run's
/// cycle guard, or failed the command's requests and the command failed.
/// Part of the work was not done, and the gap records say which.
const PROVIDER_STOPPED: u8 = 69;

/// What `sluice run` exits with, from the run's summary and the command's
/// status (R-RN11): a provider's part stopped on source pressure → 69,
/// naming it; a planned stop (a budget) → 0 even when the command's own
/// status was not (it met the stop); else the command's status.
/// `--pass-status` always passes the command's status.
fn exit_status(summary: Option<&Value>, status: u8, pass_status: bool) -> ExitCode {
    let Some(summary) = summary else {
        return ExitCode::from(status);
    };
    let what = planned_stop(summary);
    let providers = summary["provider_stops"]
        .as_object()
        .filter(|p| !p.is_empty());
    if let Some(what) = &what {
        let kind = if providers.is_some() {
            "stop"
        } else {
            "planned stop"
        };
        eprintln!("sluice run: {kind}: {what}");
    }
    if pass_status {
        return ExitCode::from(status);
    }
    if let Some(providers) = providers {
        let named: Vec<String> = providers
            .iter()
            .map(|(p, r)| format!("{p} ({})", r.as_str().unwrap_or("stopped")))
            .collect();
        eprintln!(
            "sluice run: the provider part of the run stopped on source pressure: {}; the command exited {status}: exiting {PROVIDER_STOPPED}",
            named.join(", ")
        );
        return ExitCode::from(PROVIDER_STOPPED);
    }
    if what.is_some() && status != 0 {
        eprintln!("sluice run: the command's status {status} met the planned stop: exiting 0");
        return ExitCode::SUCCESS;
    }
    ExitCode::from(status)
}

/// The admin API as the command should reach it, and `NO_PROXY` as the
/// command should see it: what the environment had, plus the admin API.
/// A loopback admin is named `localhost:PORT` in both, so that only the
/// admin's port bypasses the proxy: clients ignore the port of an IP in
/// `NO_PROXY`, and the bare `127.0.0.1` would send a collector's requests
/// to a provider on the same host around sluice, unpaced.
fn admin_for_command(admin: SocketAddr) -> (String, String) {
    let host = if admin.ip().is_loopback() {
        format!("localhost:{}", admin.port())
    } else {
        admin.ip().to_string()
    };
    let url = if admin.ip().is_loopback() {
        format!("http://{host}")
    } else {
        format!("http://{admin}")
    };
    let had = std::env::var("NO_PROXY")
        .or_else(|_| std::env::var("no_proxy"))
        .unwrap_or_default();
    let mut list: Vec<&str> = had
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect();
    if !list.contains(&host.as_str()) {
        list.push(&host);
    }
    (url, list.join(","))
}

/// A planned stop the summary records — the run's budget stop, or the
/// providers whose part stopped — in words, if there was one.
fn planned_stop(summary: &Value) -> Option<String> {
    let gaps = summary["gaps_recorded"].as_u64().unwrap_or(0);
    let mut parts = Vec::new();
    if let Some(reason) = summary["stop_reason"].as_str() {
        parts.push(reason.to_string());
    }
    if let Some(stops) = summary["provider_stops"].as_object() {
        for (provider, reason) in stops {
            parts.push(format!(
                "{} at {provider}",
                reason.as_str().unwrap_or("stopped")
            ));
        }
    }
    (!parts.is_empty()).then(|| {
        format!(
            "{}; remainder recorded as {gaps} gap records",
            parts.join(", ")
        )
    })
}

/// The files `SLUICE_CHECKPOINTS` and `SLUICE_GAPS` name.
struct Handoff {
    dir: std::path::PathBuf,
    checkpoints: std::path::PathBuf,
    gaps: std::path::PathBuf,
}

impl Handoff {
    fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes where the command resumes: the run's mode's cursor per stream
/// (from the run's opening) and every pending gap of the collector.
async fn handoff(cmd: &RunCommand, id: &str, run: &Value, token: &str) -> Result<Handoff, String> {
    let dir = std::env::temp_dir().join(format!("sluice-run-{}-{id}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let h = Handoff {
        checkpoints: dir.join("checkpoints.json"),
        gaps: dir.join("gaps.json"),
        dir,
    };
    let cursors = &run["checkpoints"][cmd.mode.label()];
    let cursors = if cursors.is_object() {
        cursors.clone()
    } else {
        json!({})
    };
    let mut gaps = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!("/v1/collectors/{}/gaps?after={a}", cmd.collector),
            None => format!("/v1/collectors/{}/gaps", cmd.collector),
        };
        let page = match call_through_restart(cmd.admin, "GET", &path, None, Some(token)).await {
            Ok((200, page)) => page,
            Ok((status, v)) => return Err(format!("gaps answered {status}: {v}")),
            Err(e) => return Err(format!("gaps: {e}")),
        };
        gaps.extend(page["gaps"].as_array().cloned().unwrap_or_default());
        match page["next"].as_str() {
            Some(next) if page["drained"] != true => after = Some(next.to_string()),
            _ => break,
        }
    }
    for (path, value) in [(&h.checkpoints, cursors), (&h.gaps, Value::Array(gaps))] {
        std::fs::write(path, value.to_string()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(h)
}

/// Waits for the child, passing SIGINT and SIGTERM on to it; when the run
/// ends under it (a planned stop, a lost lease), stops it gracefully:
/// SIGTERM, `grace`, SIGKILL.
async fn wait_forwarding_signals(
    child: &mut tokio::process::Child,
    ended: &mut tokio::sync::watch::Receiver<Option<Ended>>,
    grace: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    let (mut int, mut term) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        _ => return child.wait().await,
    };
    let pid = child.id().map(|p| nix::unistd::Pid::from_raw(p as i32));
    let mut watching = true;
    loop {
        let forward = tokio::select! {
            status = child.wait() => return status,
            _ = int.recv() => nix::sys::signal::Signal::SIGINT,
            _ = term.recv() => nix::sys::signal::Signal::SIGTERM,
            changed = ended.changed(), if watching => {
                watching = false;
                match (changed, ended.borrow().clone()) {
                    (Ok(()), Some(Ended::Stopped(reason))) => eprintln!(
                        "sluice run: the run stopped ({reason}): stopping the command"
                    ),
                    (Ok(()), Some(Ended::LeaseLost(why))) => eprintln!(
                        "sluice run: the run's lease was lost ({why}): stopping the command"
                    ),
                    _ => continue,
                }
                if let Some(pid) = pid {
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                }
                return match tokio::time::timeout(grace, child.wait()).await {
                    Ok(status) => status,
                    Err(_) => {
                        let _ = child.start_kill();
                        child.wait().await
                    }
                };
            }
        };
        if let Some(pid) = pid {
            let _ = nix::sys::signal::kill(pid, forward);
        }
    }
}

/// Finishes the run, telling how its command ended (`status`), and prints
/// its summary on stderr; the summary.
async fn finish(cmd: &RunCommand, id: &str, token: &str, status: Option<u8>) -> Option<Value> {
    let path = format!("/v1/runs/{id}/finish");
    let body = json!({ "exit_status": status });
    match call_through_restart(cmd.admin, "POST", &path, Some(&body), Some(token)).await {
        Ok((200, s)) => {
            let refusals = s["refusals"]
                .as_object()
                .filter(|r| !r.is_empty())
                .map_or_else(
                    || "none".to_string(),
                    |r| {
                        r.iter()
                            .map(|(k, v)| format!("{k} {v}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    },
                );
            let mut stops: Vec<String> = s["stop_reason"]
                .as_str()
                .map(str::to_string)
                .into_iter()
                .collect();
            if let Some(p) = s["provider_stops"].as_object() {
                stops.extend(
                    p.iter()
                        .map(|(p, r)| format!("{} at {p}", r.as_str().unwrap_or("stopped"))),
                );
            }
            let stop = if stops.is_empty() {
                "none".to_string()
            } else {
                stops.join(", ")
            };
            eprintln!(
                "sluice run: run {id} finished: {} attempts, {} retries, refused: {refusals}; stop: {stop}; {} s; {} gap records of the stop, {} posted by the command",
                s["attempts"],
                s["retries"],
                s["duration_s"],
                s["gaps_recorded"],
                s["gaps_posted"].as_u64().unwrap_or(0),
            );
            Some(s)
        }
        Ok((status, v)) => {
            eprintln!(
                "sluice run: finishing run {id} answered {status}: {}",
                v["error"].as_str().unwrap_or("")
            );
            None
        }
        Err(e) => {
            eprintln!("sluice run: finishing run {id} failed: {e}");
            None
        }
    }
}

fn fail(why: &str) -> ExitCode {
    eprintln!("sluice run: {why}");
    ExitCode::FAILURE
}

/// How long an open run's calls to the admin API are tried again while it
/// cannot be reached: sluice restarting (a `kill -9` and its supervisor's
/// restart take about a second), which the run and its lease survive
/// (R-RN10) — as the heartbeat does, which keeps trying.
const THROUGH_RESTART: Duration = Duration::from_secs(15);

/// [`call`], tried again while the admin API cannot be reached, for up to
/// [`THROUGH_RESTART`]: between the run's opening and its command's start
/// (the hand-off), and at its finish. An answer is returned at once,
/// whatever its status.
async fn call_through_restart(
    admin: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
    token: Option<&str>,
) -> Result<(u16, Value), Box<dyn std::error::Error + Send + Sync>> {
    let until = tokio::time::Instant::now() + THROUGH_RESTART;
    let mut pause = Duration::from_millis(100);
    loop {
        match call(admin, method, path, body, token).await {
            Err(_) if tokio::time::Instant::now() + pause < until => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            answered => return answered,
        }
    }
}

/// One admin API call: status and JSON answer.
pub(crate) async fn call(
    admin: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
    token: Option<&str>,
) -> Result<(u16, Value), Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(admin)).await??;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let bytes = body.map_or_else(Vec::new, |b| b.to_string().into_bytes());
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, admin.to_string())
        .header(http::header::CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let req = req.body(Full::new(Bytes::from(bytes)))?;
    // Opening may wait for the lease (`--wait`); everything else is quick.
    let resp = send.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}
