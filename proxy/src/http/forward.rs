//! Forwarding one HTTP request through its provider's stack (R-PX1).

use std::sync::Arc;
use tokio::time::Instant;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, Scheme};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use sluice_policy::attempt::{Attempt, Class, Lane};
use sluice_policy::bulkhead::InFlight;
use sluice_policy::classify as outcome;
use sluice_policy::error::Cause;
use sluice_policy::retry::retryable_method;
use sluice_policy::run::RunHandle;
use tower::ServiceExt;

use crate::app::App;
use crate::config::{normalise_host, Config};
use crate::http::body::{collect_limited, IdleTimeout, ProxyBody, ResBody};
use crate::http::edge::{self, Refusal};
use crate::http::framing::Verdicts;
use crate::runs::records::Mode;
use crate::serve::identity::Identity;

/// `Via` value sluice adds (RFC 9110 §7.6.3).
const VIA: &str = "1.1 sluice";

/// Headers that belong to one connection, never forwarded (RFC 9110
/// §7.6.1), besides those named in `Connection`. Names, not strings: a
/// string is parsed again at every look-up.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including those `Connection` names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names decides; a head without any (most answers)
    // is left as it is.
    if !headers.keys().any(|k| HOP_BY_HOP.contains(k)) {
        return;
    }
    if headers.contains_key(header::CONNECTION) {
        // `keep-alive` and `close`, the usual tokens, name nothing more to
        // remove: only other names are gathered (no copy in the usual case).
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| !t.eq_ignore_ascii_case("close") && !t.eq_ignore_ascii_case("keep-alive"))
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            .filter(|n| !HOP_BY_HOP.contains(n))
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

fn add_via(headers: &mut HeaderMap) {
    headers.append(header::VIA, HeaderValue::from_static(VIA));
}

/// Refuses a request head larger than `limit` bytes with 431 (R-SF3).
/// hyper bounds its read buffer, but a head that arrives in one read can
/// pass that bound; this check is exact.
pub fn oversize_head(headers: &HeaderMap, limit: usize) -> Option<Response<ResBody>> {
    let size: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if size > limit {
        let mut resp = Refusal::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "http_request_error",
            "request headers too large",
        )
        .into_response();
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return Some(resp);
    }
    None
}

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
    let mut resp =
        Refusal::new(StatusCode::BAD_REQUEST, "http_request_error", details).into_response();
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

/// A port is written but is not 1 to 65535.
fn invalid_port(authority: &Authority) -> bool {
    let s = authority.as_str();
    // After an IPv6 literal's closing bracket, if any.
    let tail = s.rsplit_once(']').map_or(s, |(_, t)| t);
    match tail.rsplit_once(':') {
        Some((_, port)) => !matches!(port.parse::<u16>(), Ok(p) if p != 0),
        None => false,
    }
}

/// `authority` without the port when it is `scheme`'s default (`host:443`
/// for https is `host`).
fn without_default_port(scheme: &Scheme, authority: &Authority) -> Authority {
    let default = if *scheme == Scheme::HTTPS { 443 } else { 80 };
    match authority.port_u16() {
        Some(p) if p == default => authority
            .as_str()
            .rsplit_once(':')
            .and_then(|(host, _)| host.parse().ok())
            .unwrap_or_else(|| authority.clone()),
        _ => authority.clone(),
    }
}

/// Where a request goes: from its absolute-form URI, or from the CONNECT
/// tunnel it arrived through.
#[derive(Debug, Clone)]
pub struct Target {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// `host[:port]`, never with userinfo.
    pub authority: Authority,
    /// From the request-target itself (absolute-form), so its authority
    /// replaces any `Host` the client sent (RFC 9112 §3.2.2). Inside a
    /// tunnel the client's `Host` stands.
    pub absolute: bool,
}

impl Target {
    /// The target of an absolute-form request. Userinfo
    /// (`http://user:pass@host/`) is dropped: it must never reach a `Host`
    /// header, a log or the provider.
    pub fn of(uri: &Uri) -> Option<Target> {
        let authority = uri.authority()?;
        let authority = match authority.as_str().rsplit_once('@') {
            Some((_, bare)) => bare.parse().ok()?,
            // The usual case: nothing to drop, nothing to parse again.
            None => authority.clone(),
        };
        Some(Target {
            scheme: uri.scheme().cloned()?,
            authority,
            absolute: true,
        })
    }
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
            "http_request_error",
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
    forward(app, &config, req, target, identity).await
}

/// Forwards `req` to `target` through the provider's stack and returns
/// the answer — the provider's, or sluice's own refusal. `config` is the
/// snapshot the request started with; `identity`, who sent it.
pub async fn forward(
    app: Arc<App>,
    config: &Config,
    mut req: Request<Incoming>,
    target: Target,
    identity: Identity,
) -> Response<ResBody> {
    let started = Instant::now();
    if let Some(refusal) = malformed(&app, &target) {
        return refusal;
    }
    // R-PX5: an HTTP/1.1 Upgrade (WebSocket) keeps its Upgrade through the
    // stack — the handshake is one admitted request — and on 101 the two
    // connections are joined.
    let upgrade = upgrade_protocol(&req);
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    if target.scheme != Scheme::HTTP && target.scheme != Scheme::HTTPS {
        return Refusal::new(
            StatusCode::BAD_REQUEST,
            "http_request_error",
            "only http and https targets",
        )
        .into_response();
    }
    let host = normalise_host(target.authority.host());
    if host.is_empty() {
        return Refusal::new(
            StatusCode::BAD_REQUEST,
            "http_request_error",
            "request has no host",
        )
        .into_response();
    }
    if app.guard.check_literal(&host).is_err() {
        return Refusal::new(
            StatusCode::FORBIDDEN,
            "destination_ip_prohibited",
            "destination address not allowed",
        )
        .into_response();
    }
    if let Some(refused) = outside_allowlist(config, identity.user.as_deref(), &host) {
        return refused;
    }
    let (mut parts, body) = req.into_parts();
    // The authority travels in the URI only, without the scheme's default
    // port: hyper-util writes it as `Host` over HTTP/1.1 and as
    // `:authority` over HTTP/2, where a `Host` header beside it is a
    // duplicate that servers such as nginx refuse (RFC 9113 §8.3.1).
    let authority = without_default_port(&target.scheme, &target.authority);
    // An absolute-form URI that already says exactly this (no userinfo, no
    // default port) is kept as it came; otherwise it is built again.
    let as_is = target.absolute
        && parts.uri.authority().map(Authority::as_str) == Some(authority.as_str())
        && parts.uri.path_and_query().is_some();
    if !as_is {
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        parts.uri = match Uri::builder()
            .scheme(target.scheme.clone())
            .authority(authority.clone())
            .path_and_query(path)
            .build()
        {
            Ok(uri) => uri,
            Err(_) => {
                return Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "http_request_error",
                    "invalid request target",
                )
                .into_response()
            }
        };
    }
    strip_hop_by_hop(&mut parts.headers);
    add_via(&mut parts.headers);
    if let Some(protocol) = &upgrade {
        parts.headers.insert(header::UPGRADE, protocol.clone());
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    // An absolute-form target's authority replaces the client's `Host`
    // (RFC 9112 §3.2.2); inside a tunnel a `Host` naming the target itself
    // is the same authority, written again by the client. Either way it
    // goes, and hyper-util writes the URI's. A tunnelled `Host` naming
    // something else (virtual hosting) stands.
    let redundant = !target.absolute
        && parts.headers.get(header::HOST).is_some_and(|h| {
            h.to_str()
                .ok()
                .and_then(|h| h.parse::<Authority>().ok())
                .is_some_and(|h| {
                    without_default_port(&target.scheme, &h)
                        .as_str()
                        .eq_ignore_ascii_case(authority.as_str())
                })
        });
    if target.absolute || redundant {
        parts.headers.remove(header::HOST);
    }
    parts.version = http::Version::HTTP_11;

    let provider = app.providers.get(&host);
    let body = if http_body::Body::is_end_stream(&body) {
        ProxyBody::Empty
    } else {
        let settings = provider.policy.settings();
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let may_retry = retryable_method(&parts.method, &settings.retry_methods);
        match declared {
            // Keep a replay copy only where a retry may need it.
            Some(len) if may_retry && len <= settings.replay_limit => {
                match collect_limited(body, settings.replay_limit).await {
                    Ok(bytes) => ProxyBody::Whole(Some(bytes)),
                    Err(_) => {
                        return Refusal::new(
                            StatusCode::BAD_REQUEST,
                            "http_request_error",
                            "request body could not be read",
                        )
                        .into_response()
                    }
                }
            }
            _ => ProxyBody::Stream(body),
        }
    };
    let method = parts.method.clone();
    // A collector's request belongs to its active run, if it has one: the
    // run's budgets apply to every attempt, and the request renews the
    // run's lease (R-RN4).
    let Identity { user, mode } = identity;
    let attached = match user.as_deref() {
        Some(u) => app.runs.attach(u, mode).await,
        None => None,
    };
    // A collector waits for the provider as itself, at its weight, in the
    // lane of the run the request is for (R-FS1); other proxy users share
    // the default class.
    let class = user
        .as_deref()
        .and_then(|u| config.collectors.get(u))
        .map(|c| {
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
    // What the request is, for every layer of the stack (the only value
    // the proxy hands it besides the request itself).
    if run.is_some() || class.is_some() {
        parts.extensions.insert(Attempt {
            run: run.clone(),
            class,
            ..Attempt::default()
        });
    }
    let req = Request::from_parts(parts, body);
    let result = provider.service.clone().oneshot(req).await;
    if let (Some(user), Some(run)) = (&user, &run) {
        let answer = match &result {
            Ok(resp) => crate::runs::Answer::Status(resp.status().as_u16()),
            Err(e) => crate::runs::Answer::Failed(e),
        };
        app.runs.after(user, run, Some(&provider.name), answer);
    }
    let elapsed_ms = started.elapsed().as_millis() as u64;
    app.metrics
        .request_with(&provider.label, &provider.requests, final_outcome(&result));
    let remaining = run.as_ref().map(run_remaining);
    let mut resp = match result {
        Ok(resp) => {
            if let (StatusCode::SWITCHING_PROTOCOLS, Some(client)) = (resp.status(), client_upgrade)
            {
                return switch(&app, &provider.label, resp, client);
            }
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            add_via(&mut parts.headers);
            // The client's connection is HTTP/1.1 whatever the upstream spoke.
            parts.version = http::Version::HTTP_11;
            tracing::debug!(provider = %provider.name, %method, status = parts.status.as_u16(), elapsed_ms, "forwarded");
            let in_flight = parts.extensions.remove::<InFlight>();
            let body = IdleTimeout::new(body, config.limits.body_idle_timeout, in_flight).boxed();
            Response::from_parts(parts, body)
        }
        Err(e) => {
            let refusal = edge::refusal(&e);
            tracing::info!(
                provider = %provider.name,
                %method,
                status = refusal.status.as_u16(),
                error = refusal.error,
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

/// What a run has left, on every answer to one of its requests, so a
/// collector can stop at a slice boundary rather than at a `403`.
const RUN_REMAINING: HeaderName = HeaderName::from_static("sluice-run-remaining");

/// `attempts=N, deadline_s=S` (each `unbounded` when the run has none),
/// and `stopped=REASON` once the run has stopped.
/// A collector's request to a destination outside its allowlist (R-FS3):
/// `403`, before any connection, naming the allowlist.
pub(crate) fn outside_allowlist(
    config: &Config,
    user: Option<&str>,
    host: &str,
) -> Option<Response<ResBody>> {
    let name = user?;
    let collector = config.collectors.get(name)?;
    if collector.allows(host) {
        return None;
    }
    Some(
        Refusal::new(
            StatusCode::FORBIDDEN,
            "destination_ip_prohibited",
            format!("not in collectors.{name}.allow"),
        )
        .into_response(),
    )
}

fn run_remaining(run: &RunHandle) -> HeaderValue {
    let (attempts, deadline, stopped) = run.remaining(Instant::now());
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

/// The protocol an HTTP/1.1 request asks to upgrade to (`Upgrade`, with
/// `upgrade` among its `Connection` tokens), if it does.
fn upgrade_protocol<B>(req: &Request<B>) -> Option<HeaderValue> {
    if req.version() != http::Version::HTTP_11 {
        return None;
    }
    let asks = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| req.headers().get(header::UPGRADE).cloned())
        .flatten()
}

/// The provider switched protocols: answer the client's 101, then carry
/// bytes both ways between the two upgraded connections until either side
/// closes (counted in `sluice_upgrades_total`, open ones in
/// `sluice_upgraded_connections`).
fn switch(
    app: &App,
    label: &str,
    mut upstream: Response<Incoming>,
    client: hyper::upgrade::OnUpgrade,
) -> Response<ResBody> {
    let on_upstream = hyper::upgrade::on(&mut upstream);
    let guard = app.metrics.upgraded(label);
    // Like a raw tunnel, an upgraded connection holds SIGTERM's drain (up
    // to the grace): sluice cannot see a message boundary to close it at.
    let tracked = app.shutdown.tracker();
    tokio::spawn(async move {
        let (_open, _tracked) = (guard, tracked);
        match tokio::join!(client, on_upstream) {
            (Ok(c), Ok(u)) => {
                let (mut c, mut u) = (TokioIo::new(c), TokioIo::new(u));
                if let Err(e) = tokio::io::copy_bidirectional(&mut c, &mut u).await {
                    tracing::debug!(error = %e, "upgraded connection ended with an error");
                }
            }
            (c, u) => tracing::debug!(
                client = c.is_ok(),
                upstream = u.is_ok(),
                "an upgrade did not complete"
            ),
        }
    });
    let (mut parts, _) = upstream.into_parts();
    let protocol = parts.headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(&mut parts.headers);
    add_via(&mut parts.headers);
    if let Some(p) = protocol {
        parts.headers.insert(header::UPGRADE, p);
    }
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    parts.version = http::Version::HTTP_11;
    parts.extensions.remove::<InFlight>();
    Response::from_parts(
        parts,
        http_body_util::Empty::new().map_err(|e| match e {}).boxed(),
    )
}

/// The label of a client request's final outcome (R-OP1).
fn final_outcome<R>(result: &Result<Response<R>, Cause>) -> &'static str {
    match result {
        // The bulkhead stamped it: no clock read in the usual case.
        Ok(resp) => outcome::of_response_now(resp).label(),
        Err(cause) => cause.outcome_label(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_ports() {
        let a = |s: &str| s.parse::<Authority>().unwrap();
        for bad in [
            "h.test:0",
            "h.test:65536",
            "h.test:70000",
            "[::1]:0",
            "h.test:",
        ] {
            assert!(invalid_port(&a(bad)), "{bad}");
        }
        for good in ["h.test", "h.test:1", "h.test:65535", "[::1]", "[::1]:443"] {
            assert!(!invalid_port(&a(good)), "{good}");
        }
    }

    #[test]
    fn default_ports_are_dropped_from_the_authority() {
        let a = |s: &str| s.parse::<Authority>().unwrap();
        assert_eq!(
            without_default_port(&Scheme::HTTPS, &a("h.test:443")).as_str(),
            "h.test"
        );
        assert_eq!(
            without_default_port(&Scheme::HTTP, &a("h.test:80")).as_str(),
            "h.test"
        );
        assert_eq!(
            without_default_port(&Scheme::HTTPS, &a("h.test:8443")).as_str(),
            "h.test:8443"
        );
        assert_eq!(
            without_default_port(&Scheme::HTTP, &a("h.test:443")).as_str(),
            "h.test:443"
        );
        assert_eq!(
            without_default_port(&Scheme::HTTPS, &a("[::1]:443")).as_str(),
            "[::1]"
        );
        assert_eq!(
            without_default_port(&Scheme::HTTPS, &a("h.test")).as_str(),
            "h.test"
        );
    }

    #[test]
    fn targets_drop_userinfo() {
        let t = Target::of(&"http://user:secret@api.test:8080/x".parse().unwrap()).unwrap();
        assert_eq!(t.authority.as_str(), "api.test:8080");
        assert!(t.absolute);
        assert!(Target::of(&"/relative".parse().unwrap()).is_none());
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_go() {
        let mut h = HeaderMap::new();
        h.insert("connection", "close, x-secret-hop".parse().unwrap());
        h.insert("x-secret-hop", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("proxy-authorization", "Basic eA==".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("x-kept", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }
}
