//! `sluice run` (R-RN9): runs for collectors that know nothing of runs.
//!
//! `sluice run --collector NAME --token-file F --request-cap 500 --deadline
//! 15m -- python collect.py` opens a run on the admin API, starts the
//! command with `HTTP_PROXY`/`HTTPS_PROXY` (both cases) carrying the
//! collector's credentials and the CA variables `sluice ca` prints, keeps
//! the lease alive, forwards SIGINT and SIGTERM to the command, finishes
//! the run when the command exits, prints the summary on stderr and exits
//! with the command's status. A command that knows about runs finds the
//! run in `SLUICE_RUN_ID`, `SLUICE_FENCING_TOKEN` and `SLUICE_ADMIN` to
//! commit checkpoints.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::signal::unix::{signal, SignalKind};

use crate::ca::CertAuthority;
use crate::config::Config;
use crate::process::{ca_paths, CaEnv};
use crate::runs::records::Mode;

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
    /// The command and its arguments.
    pub command: Vec<String>,
}

/// Exit status when the run could not be opened because another holds
/// the lease (`EX_TEMPFAIL`: try again later).
const LEASE_HELD: u8 = 75;

/// Runs the command inside a run; the process's exit status.
pub async fn run(cmd: RunCommand, config: &Config) -> ExitCode {
    let token = match std::fs::read_to_string(&cmd.token_file) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
        Ok(_) => return fail(&format!("{} is empty", cmd.token_file.display())),
        Err(e) => return fail(&format!("cannot read {}: {e}", cmd.token_file.display())),
    };
    let Some((program, args)) = cmd.command.split_first() else {
        return fail("no command given (sluice run [options] -- COMMAND ...)");
    };
    let opening = json!({
        "request_cap": cmd.request_cap,
        "deadline_s": cmd.deadline.map(|d| d.as_secs_f64()),
        "retry_ratio": cmd.retry_ratio,
        "mode": cmd.mode.label(),
        "wait_s": cmd.wait.map(|d| d.as_secs_f64()),
    });
    let path = format!("/v1/collectors/{}/runs", cmd.collector);
    let (status, run) = match call(cmd.admin, "POST", &path, Some(&opening), &token).await {
        Ok(r) => r,
        Err(e) => return fail(&format!("admin API at {}: {e}", cmd.admin)),
    };
    if status != 201 {
        let why = run["error"].as_str().unwrap_or("refused");
        eprintln!("sluice run: the run was not opened ({status}): {why}");
        return match run["holder"].as_str() {
            Some(holder) => {
                eprintln!("sluice run: run {holder} holds the lease");
                ExitCode::from(LEASE_HELD)
            }
            None => ExitCode::FAILURE,
        };
    }
    let id = run["id"].as_str().unwrap_or_default().to_string();
    let fence = run["lease"]["fencing_token"].as_u64().unwrap_or(0);
    let ttl_ms = run["lease"]["expires_at_unix_ms"]
        .as_u64()
        .map_or(60_000, |at| at.saturating_sub(crate::store::unix_ms_now()));
    eprintln!("sluice run: run {id} opened for {}", cmd.collector);

    let proxy_url = format!("http://{}:{token}@{}", cmd.collector, cmd.proxy);
    let mut child = tokio::process::Command::new(program);
    child.args(args);
    for var in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        child.env(var, &proxy_url);
    }
    let ca = ca_paths(config);
    if ca.cert.exists() && ca.key.exists() {
        if let Ok(ca) = CertAuthority::load_or_create(ca, 1) {
            for (name, value) in CaEnv::of(&ca).vars() {
                child.env(name, value);
            }
        }
    }
    child
        .env("SLUICE_RUN_ID", &id)
        .env("SLUICE_FENCING_TOKEN", fence.to_string())
        .env("SLUICE_ADMIN", format!("http://{}", cmd.admin));
    let mut child = match child.spawn() {
        Ok(c) => c,
        Err(e) => {
            finish(&cmd, &id, &token).await;
            return fail(&format!("cannot start {program}: {e}"));
        }
    };

    // Keep the lease: a heartbeat three times per lease.
    let beat = Duration::from_millis((ttl_ms / 3).max(200));
    let heartbeat = {
        let (admin, id, token) = (cmd.admin, id.clone(), token.clone());
        tokio::spawn(async move {
            let path = format!("/v1/runs/{id}/heartbeat");
            loop {
                tokio::time::sleep(beat).await;
                if let Err(e) = call(admin, "POST", &path, None, &token).await {
                    eprintln!("sluice run: heartbeat failed: {e}");
                }
            }
        })
    };
    let status = wait_forwarding_signals(&mut child).await;
    heartbeat.abort();
    finish(&cmd, &id, &token).await;
    match status {
        Ok(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
            (Some(code), _) => ExitCode::from(code.clamp(0, 255) as u8),
            (None, Some(sig)) => ExitCode::from((128 + sig).clamp(0, 255) as u8),
            (None, None) => ExitCode::FAILURE,
        },
        Err(e) => fail(&format!("waiting for the command: {e}")),
    }
}

/// Waits for the child, passing SIGINT and SIGTERM on to it.
async fn wait_forwarding_signals(
    child: &mut tokio::process::Child,
) -> std::io::Result<std::process::ExitStatus> {
    let (mut int, mut term) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        _ => return child.wait().await,
    };
    let pid = child.id().map(|p| nix::unistd::Pid::from_raw(p as i32));
    loop {
        let forward = tokio::select! {
            status = child.wait() => return status,
            _ = int.recv() => nix::sys::signal::Signal::SIGINT,
            _ = term.recv() => nix::sys::signal::Signal::SIGTERM,
        };
        if let Some(pid) = pid {
            let _ = nix::sys::signal::kill(pid, forward);
        }
    }
}

/// Finishes the run and prints its summary on stderr.
async fn finish(cmd: &RunCommand, id: &str, token: &str) {
    let path = format!("/v1/runs/{id}/finish");
    match call(cmd.admin, "POST", &path, None, token).await {
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
            eprintln!(
                "sluice run: run {id} finished: {} attempts, {} retries, refused: {refusals}; stop: {}; {} s; {} gap records",
                s["attempts"],
                s["retries"],
                s["stop_reason"].as_str().unwrap_or("none"),
                s["duration_s"],
                s["gaps_recorded"],
            );
        }
        Ok((status, v)) => eprintln!(
            "sluice run: finishing run {id} answered {status}: {}",
            v["error"].as_str().unwrap_or("")
        ),
        Err(e) => eprintln!("sluice run: finishing run {id} failed: {e}"),
    }
}

fn fail(why: &str) -> ExitCode {
    eprintln!("sluice run: {why}");
    ExitCode::FAILURE
}

/// One admin API call: status and JSON answer.
async fn call(
    admin: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
    token: &str,
) -> Result<(u16, Value), Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(admin)).await??;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let bytes = body.map_or_else(Vec::new, |b| b.to_string().into_bytes());
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, admin.to_string())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Full::new(Bytes::from(bytes)))?;
    // Opening may wait for the lease (`--wait`); everything else is quick.
    let resp = send.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}
