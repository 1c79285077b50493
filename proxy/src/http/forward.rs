//! Forwarding one HTTP request through its provider's stack (R-PX1).

use std::sync::Arc;

use http::header::{self, HeaderName, HeaderValue};
use http::request::Parts;
use http::uri::Scheme;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use sluice_policy::attempt::{Attempt, Class, Lane};
use sluice_policy::classify as outcome;
use sluice_policy::error::Cause;
use sluice_policy::retry::retryable_method;
use sluice_policy::run::RunHandle;

use crate::app::App;
use crate::config::{normalise_host, Config};
use crate::http::body::{collect_limited, IdleTimeout, ProxyBody, ResBody, UpstreamBody};
use crate::http::edge::{self, ErrorType, Refusal};
use crate::http::framing::Verdicts;
pub use crate::http::headers::oversize_head;
use crate::http::headers::{add_via, strip_hop_by_hop};
pub use crate::http::target::Target;
use crate::http::target::{self, invalid_port};
use crate::http::upgrade::{switch, upgrade_protocol};
use crate::providers::Provider;
use crate::runs::records::Mode;
use crate::serve::identity::Identity;

/// Refuses a request that carried both `Content-Length` and
/// `Transfer-Encoding` (RFC 9112 §6.1; see [`crate::http::framing`]): 400, and
/// the connection closes. Counted and logged without the request's data.
pub fn ambiguous_length(app: &App) -> Response<ResBody> {
    bad_request(
        app,
        "ambiguous_length",
        "a request must not carry both Content-Length and Transfer-Encoding",
    )
}

/// A malformed request's 400: counted by `reason`, logged without the
/// request's data, the connection closed.
fn bad_request(app: &App, reason: &'static str, details: &'static str) -> Response<ResBody> {
    app.metrics.bad_request(reason);
    tracing::warn!(reason, "malformed request refused");
    let mut resp = Refusal::new(
        StatusCode::BAD_REQUEST,
        ErrorType::HttpRequestError,
        details,
    )
    .into_response();
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// A request no provider should see: a target port of 0 or above 65535,
/// refused before any DNS look-up or connect (it used to reach the
/// connector and come back as a 502 blaming the provider). Counted and
/// logged without the request's data; the connection is closed.
fn malformed(app: &App, target: &Target) -> Option<Response<ResBody>> {
    if !invalid_port(&target.authority) {
        return None;
    }
    Some(bad_request(
        app,
        "invalid_port",
        "the target's port must be 1 to 65535",
    ))
}

/// A request that arrived inside a CONNECT tunnel (plain or intercepted):
/// checked like any request, tagged with the tunnel's identity, then
/// forwarded to the tunnel's target.
pub async fn tunnelled(
    app: Arc<App>,
    req: Request<Incoming>,
    target: Target,
    identity: Identity,
    verdicts: &Verdicts,
) -> Response<ResBody> {
    if verdicts.next_is_ambiguous() {
        return ambiguous_length(&app);
    }
    if req.method() == http::Method::CONNECT {
        return Refusal::new(
            StatusCode::BAD_REQUEST,
            ErrorType::HttpRequestError,
            "CONNECT inside a tunnel",
        )
        .into_response();
    }
    // One config snapshot for the whole request: a SIGHUP while it is
    // under way cannot mix two configs.
    let config = app.config();
    if let Some(resp) = oversize_head(req.headers(), config.limits.max_header_bytes) {
        return resp;
    }
    forward(app, &config, req, target, identity, false).await
}

/// Forwards `req` to `target` through the provider's stack and returns
/// the answer — the provider's, or sluice's own refusal. `config` is the
/// snapshot the request started with; `identity`, who sent it; `local`,
/// whether its client connected from this machine (a plain request's
/// listener says; a tunnel's requests are never taken as local).
///
/// About 90 lines: it is the request's steps in order (refused target,
/// address, body, the attempt's facts, the stack, the run's record of the
/// answer), each a named function or a few lines, and each able to end the
/// request early with its own answer — split further, the early answers
/// would hide in the callees.
pub async fn forward(
    app: Arc<App>,
    config: &Config,
    mut req: Request<Incoming>,
    target: Target,
    identity: Identity,
    local: bool,
) -> Response<ResBody> {
    let started = sluice_policy::clock::now();
    if let Some(refusal) = malformed(&app, &target) {
        return refusal;
    }
    // Only for a client on this machine: the admin listener takes its
    // calls as loopback ones, which need no collector's token.
    if local && is_own_admin(app.admin, &target) {
        return Box::pin(own_admin(app.admin, req)).await;
    }
    // R-PX5: an HTTP/1.1 Upgrade (WebSocket) keeps its Upgrade through the
    // stack — the handshake is one admitted request — and on 101 the two
    // connections are joined.
    let upgrade = upgrade_protocol(&req);
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let host = match refused_target(&app, config, &target, &identity) {
        Ok(host) => host,
        Err(refusal) => return refusal.into_response(),
    };
    let (mut parts, body) = req.into_parts();
    if let Err(refusal) = target::address(&mut parts, &target) {
        return refusal.into_response();
    }
    strip_hop_by_hop(&mut parts.headers);
    add_via(&mut parts.headers);
    if let Some(protocol) = &upgrade {
        parts.headers.insert(header::UPGRADE, protocol.clone());
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    parts.version = http::Version::HTTP_11;

    // The provider's lane: its own, or one of a budget of its own on the
    // same hosts (R-PD1), which the request then carries to the layers.
    let base = app.providers.get(&host);
    let (provider, resource) = app.providers.lane(&base, &parts.method, parts.uri.path());
    drop(base);
    if let Some(resource) = resource {
        parts.extensions.insert(resource);
    }
    let body = match request_body(&provider, &parts, body).await {
        Ok(body) => body,
        Err(refusal) => return refusal.into_response(),
    };
    let method = parts.method.clone();
    let Identity { user, mode } = identity;
    let (attempt, run) = attempt_of(&app, config, user.as_deref(), mode).await;
    let mut req = Request::from_parts(parts, body);
    if let Some(attempt) = attempt {
        *Attempt::of_mut(&mut req) = attempt;
    }
    let result = app.providers.send(&provider, req).await;
    if let (Some(user), Some(run)) = (&user, &run) {
        let answer = match &result {
            Ok(resp) => crate::runs::Answer::Status(resp.status().as_u16()),
            Err(e) => crate::runs::Answer::Failed(e),
        };
        app.runs.after(user, run, Some(provider.name()), answer);
    }
    let elapsed_ms = sluice_policy::clock::elapsed(started).as_millis() as u64;
    app.metrics
        .request_with(provider.label(), &provider.requests, final_outcome(&result));
    let remaining = run.as_ref().map(run_remaining);
    let mut resp = match result {
        Ok(resp) => {
            if let (StatusCode::SWITCHING_PROTOCOLS, Some(client)) = (resp.status(), client_upgrade)
            {
                return switch(&app, provider.label(), resp, client);
            }
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            add_via(&mut parts.headers);
            // The client's connection is HTTP/1.1 whatever the upstream spoke.
            parts.version = http::Version::HTTP_11;
            tracing::debug!(provider = %provider.name(), %method, status = parts.status.as_u16(), elapsed_ms, "forwarded");
            // The body holds its attempt's bulkhead permit until it is done.
            let body = IdleTimeout::new(body, config.limits.body_idle_timeout).boxed();
            Response::from_parts(parts, body)
        }
        Err(e) => {
            let refusal = edge::refusal(&e);
            tracing::info!(
                provider = %provider.name(),
                %method,
                status = refusal.status.as_u16(),
                error = refusal.error.label(),
                details = %refusal.details,
                elapsed_ms,
                "refused"
            );
            refusal.into_response()
        }
    };
    if let Some(v) = remaining {
        resp.headers_mut().insert(RUN_REMAINING, v);
    }
    resp
}

/// Whether `target` is this sluice's own admin listener: its address, or
/// a loopback name for it where it listens on loopback or everywhere.
fn is_own_admin(admin: std::net::SocketAddr, target: &Target) -> bool {
    if target.scheme != Scheme::HTTP {
        return false;
    }
    let port = crate::config::port_of(target.authority.as_str()).unwrap_or(80);
    if port != admin.port() {
        return false;
    }
    let host = normalise_host(target.authority.host());
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare == "localhost"
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) if ip == admin.ip() => true,
        _ => loopback && (admin.ip().is_loopback() || admin.ip().is_unspecified()),
    }
}

/// A request through the proxy to sluice's own admin API (a user with
/// `HTTP_PROXY` exported asking `curl http://127.0.0.1:9901/…`): sent to
/// the admin listener straight — never paced as a provider, never refused
/// by the destination guard, never counted as traffic (issue 36).
async fn own_admin(admin: std::net::SocketAddr, req: Request<Incoming>) -> Response<ResBody> {
    let mut addr = admin;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let unreachable = |why: String| {
        Refusal::new(
            StatusCode::BAD_GATEWAY,
            ErrorType::DestinationUnavailable,
            format!("sluice's own admin listener {addr}: {why}"),
        )
        .into_response()
    };
    let (mut parts, body) = req.into_parts();
    parts.uri = parts
        .uri
        .path_and_query()
        .and_then(|pq| pq.as_str().parse().ok())
        .unwrap_or_else(|| http::Uri::from_static("/"));
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::PROXY_AUTHORIZATION);
    let stream = match tokio::net::TcpStream::connect(addr).await {
        Ok(stream) => stream,
        Err(e) => return unreachable(e.to_string()),
    };
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(io).await {
        Ok(pair) => pair,
        Err(e) => return unreachable(e.to_string()),
    };
    tokio::spawn(conn);
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(resp) => resp.map(|b| b.map_err(Into::into).boxed()),
        Err(e) => unreachable(e.to_string()),
    }
}

/// The target's normalised host, or why the request is refused before
/// anything is sent: a scheme other than http(s), no host, an IP literal
/// the destination guard refuses, a host outside the collector's
/// allowlist.
fn refused_target<'t>(
    app: &App,
    config: &Config,
    target: &'t Target,
    identity: &Identity,
) -> Result<std::borrow::Cow<'t, str>, Refusal> {
    let refuse = |status, error, details: &'static str| Err(Refusal::new(status, error, details));
    if target.scheme != Scheme::HTTP && target.scheme != Scheme::HTTPS {
        return refuse(
            StatusCode::BAD_REQUEST,
            ErrorType::HttpRequestError,
            "only http and https targets",
        );
    }
    let host = normalise_host(target.host());
    if host.is_empty() {
        return refuse(
            StatusCode::BAD_REQUEST,
            ErrorType::HttpRequestError,
            "request has no host",
        );
    }
    if let Err(e) = app.guard.check_literal(&host) {
        return Err(destination_refused(app, &host, &e));
    }
    if let Some(refused) = outside_allowlist(config, identity.user.as_deref(), &host) {
        app.metrics.destination_refused("collector_allow");
        return Err(refused);
    }
    Ok(host)
}

/// The guard refused `host` before any connection or pacing slot: logged
/// (the host, never a path) and counted by the address's class; the
/// answer names the address and the key that allows it (R-SF2).
pub(crate) fn destination_refused(
    app: &App,
    host: &str,
    e: &crate::upstream::guard::GuardError,
) -> Refusal {
    let class = e.class().unwrap_or("unresolved");
    app.metrics.destination_refused(class);
    tracing::info!(
        host,
        class,
        "destination refused: not in destinations.allow"
    );
    Refusal::new(
        StatusCode::FORBIDDEN,
        ErrorType::DestinationIpProhibited,
        e.to_string(),
    )
}

/// The body the stack sends: a replay copy where a retry or a parked
/// re-send may need one (an idempotent or opted-in method, a declared
/// length within `replay_limit`), else the client's stream.
async fn request_body(
    provider: &Provider,
    parts: &Parts,
    body: Incoming,
) -> Result<ProxyBody, Refusal> {
    if http_body::Body::is_end_stream(&body) {
        return Ok(ProxyBody::empty());
    }
    let settings = provider.policy.settings();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let may_retry = retryable_method(&parts.method, &settings.retry_methods);
    match declared {
        Some(len) if may_retry && len <= settings.replay_limit => {
            match collect_limited(body, settings.replay_limit).await {
                Ok(bytes) => Ok(ProxyBody::whole(bytes)),
                Err(_) => Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    ErrorType::HttpRequestError,
                    "request body could not be read",
                )),
            }
        }
        _ => Ok(ProxyBody::stream(body)),
    }
}

/// What the request is for the provider's stack ([`Attempt`]), and its
/// run: a collector's request belongs to its active run, if it has one —
/// the run's budgets apply to every attempt, and the request renews the
/// run's lease (R-RN4) — and waits for the provider as its collector, at
/// its weight, in the lane of the run it is for (R-FS1); other proxy users
/// share the default class (no attempt is set for them).
async fn attempt_of(
    app: &App,
    config: &Config,
    user: Option<&str>,
    mode: Option<Mode>,
) -> (Option<Attempt>, Option<RunHandle>) {
    let attached = match user {
        Some(u) => app.runs.attach(u, mode).await,
        None => None,
    };
    let class = user.and_then(|u| config.collectors.get(u)).map(|c| {
        let mode = attached.as_ref().map(|(_, m)| *m).or(mode);
        Class {
            name: c.name.clone(),
            weight: c.weight,
            catchup_floor: c.catchup_floor,
            lane: match mode {
                Some(Mode::Catchup) => Lane::Catchup,
                Some(Mode::Steady) | None => Lane::Steady,
            },
        }
    });
    let run = attached.map(|(run, _)| run);
    let attempt = (run.is_some() || class.is_some()).then(|| Attempt {
        run: run.clone(),
        class,
        ..Attempt::default()
    });
    (attempt, run)
}

/// What a run has left, on every answer to one of its requests, so a
/// collector can stop at a slice boundary rather than at a `403`.
const RUN_REMAINING: HeaderName = HeaderName::from_static("sluice-run-remaining");

/// A collector's request to a destination outside its allowlist (R-FS3):
/// `403`, before any connection, naming the allowlist.
pub(crate) fn outside_allowlist(
    config: &Config,
    user: Option<&str>,
    host: &str,
) -> Option<Refusal> {
    let name = user?;
    let collector = config.collectors.get(name)?;
    if collector.allows(host) {
        return None;
    }
    Some(Refusal::new(
        StatusCode::FORBIDDEN,
        ErrorType::DestinationIpProhibited,
        format!("not in collectors.{name}.allow"),
    ))
}

/// `attempts=N, deadline_s=S` (each `unbounded` when the run has none),
/// and `stopped=REASON` once the run has stopped.
fn run_remaining(run: &RunHandle) -> HeaderValue {
    let (attempts, deadline, stopped) = run.remaining(sluice_policy::clock::now());
    let attempts = attempts.map_or_else(|| "unbounded".to_string(), |n| n.to_string());
    let deadline = deadline.map_or_else(
        || "unbounded".to_string(),
        |left| format!("{:.1}", left.as_secs_f64()),
    );
    let mut text = format!("attempts={attempts}, deadline_s={deadline}");
    if let Some(r) = stopped {
        text.push_str(&format!(", stopped={}", r.label()));
    }
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// The label of a client request's final outcome (R-OP1).
fn final_outcome(result: &Result<Response<UpstreamBody>, Cause>) -> &'static str {
    match result {
        // The bulkhead stamped it: no clock read in the usual case.
        Ok(resp) => outcome::of_response_now(resp).label(),
        Err(cause) => cause.outcome_label(),
    }
}
