//! The run API on the admin listener (R-RN4–R-RN6), JSON in and out:
//!
//! * `POST /v1/collectors/{name}/runs` opens a run (`409` naming the
//!   holder; `wait_s` waits for the lease); `GET …/runs?limit=N` history;
//! * `GET /v1/runs/{id}`; `POST /v1/runs/{id}/heartbeat`; `POST
//!   /v1/runs/{id}/finish` (the summary);
//! * `PUT /v1/runs/{id}/checkpoints/{stream}`; `GET
//!   /v1/collectors/{name}/checkpoints`; `DELETE
//!   /v1/collectors/{name}/checkpoints/{stream}?mode=…`;
//! * `POST /v1/runs/{id}/gaps`; `GET
//!   /v1/collectors/{name}/gaps?max_bytes=N&after=TOKEN`; `POST
//!   /v1/gaps/{id}/resolve`;
//! * `GET /v1/collectors`, `/v1/collectors/{name}`: the readout.
//!
//! Bad input gets a `400` whose body names the field. A call from beyond
//! loopback (the admin listener bound wider, as a sidecar's is for
//! Prometheus) needs a collector's token as `Authorization: Bearer`; a
//! call from loopback — the same host, or the same pod — needs none, as
//! linkerd2-proxy's admin decides by the client's address. A token given
//! anyway must be the collector's whose run or records are asked for.

use std::net::{IpAddr, SocketAddr};

use http::{header, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Map, Value};

use crate::app::App;
use crate::http::body::{full, ResBody};
use crate::runs::records::{split_id, Checkpoint, Gap, Mode, RunRecord, MAX_GAP_PAGE_BYTES};
use crate::runs::{CollectorView, RunError, RunView};
use crate::serve::auth::constant_time_eq;
use crate::serve::bodies::{self, invalid, Invalid};

/// The largest JSON body accepted (a cursor may be long).
const MAX_BODY: usize = 1 << 20;

fn reply(status: StatusCode, v: &Value) -> Response<ResBody> {
    let mut resp = Response::new(full(v.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// A `4xx` that names what was wrong with the request.
fn bad(status: StatusCode, field: &str, why: impl Into<String>) -> Response<ResBody> {
    reply(status, &json!({ "error": why.into(), "field": field }))
}

fn refuse(e: Invalid) -> Response<ResBody> {
    bad(e.status, &e.field, e.why)
}

fn run_error(e: RunError) -> Response<ResBody> {
    let msg = e.to_string();
    match e {
        RunError::UnknownCollector => bad(StatusCode::NOT_FOUND, "collector", msg),
        RunError::UnknownRun => bad(StatusCode::NOT_FOUND, "id", msg),
        RunError::NotActive(_) => bad(StatusCode::CONFLICT, "id", msg),
        RunError::Held(holder) => reply(
            StatusCode::CONFLICT,
            &json!({ "error": msg, "field": "collector", "holder": holder }),
        ),
        RunError::StaleFence(_) => bad(StatusCode::CONFLICT, "fencing_token", msg),
        RunError::SliceNotAdvancing { .. } => bad(StatusCode::CONFLICT, "slice", msg),
        RunError::WrongMode { .. } => bad(StatusCode::CONFLICT, "mode", msg),
        RunError::UnknownGap => bad(StatusCode::NOT_FOUND, "id", msg),
        RunError::NotDurable(_) => {
            // Nothing was stored: the caller may send it again shortly.
            let mut resp = bad(StatusCode::SERVICE_UNAVAILABLE, "store", msg);
            resp.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
            resp
        }
    }
}

/// Answers the run API's paths; any other request comes back.
pub async fn route(
    app: &App,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<ResBody>, Request<Incoming>> {
    answer(app, req, peer).await
}

async fn answer(
    app: &App,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<ResBody>, Request<Incoming>> {
    let path = req.uri().path().to_string();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let owner = match segments.as_slice() {
        ["v1", "collectors"] => None,
        ["v1", "collectors", name, ..] => Some((*name).to_string()),
        ["v1", "runs", id, ..] | ["v1", "gaps", id, ..] => {
            Some(split_id(id).map_or_else(String::new, |(c, _)| c.to_string()))
        }
        _ => return Err(req),
    };
    if let Some(refused) = authorize(app, &req, peer, owner.as_deref()) {
        return Ok(refused);
    }
    let method = req.method().clone();
    let query = req.uri().query().unwrap_or("").to_string();
    let seg: Vec<String> = segments.iter().map(|s| s.to_string()).collect();
    let seg: Vec<&str> = seg.iter().map(String::as_str).collect();
    let resp = match (method, seg.as_slice()) {
        (Method::GET, ["v1", "collectors"]) => {
            let list: Vec<Value> = app.runs.collectors().iter().map(collector_json).collect();
            reply(StatusCode::OK, &json!({ "collectors": list }))
        }
        (Method::GET, ["v1", "collectors", name]) => match app.runs.collector(name) {
            Ok(c) => reply(StatusCode::OK, &collector_json(&c)),
            Err(e) => run_error(e),
        },
        (Method::POST, ["v1", "collectors", name, "runs"]) => {
            open(app, name, read_json(req).await).await
        }
        (Method::GET, ["v1", "collectors", name, "runs"]) => history(app, name, &query).await,
        (Method::GET, ["v1", "collectors", name, "checkpoints"]) => {
            match app.runs.checkpoints(name) {
                Ok(list) => reply(
                    StatusCode::OK,
                    &json!({ "checkpoints": checkpoints_json(&list) }),
                ),
                Err(e) => run_error(e),
            }
        }
        (Method::DELETE, ["v1", "collectors", name, "checkpoints", stream]) => {
            reset_checkpoint(app, name, &decode(stream), &query).await
        }
        (Method::GET, ["v1", "collectors", name, "gaps"]) => gaps(app, name, &query).await,
        (Method::GET, ["v1", "runs", id]) => run_view(app, id).await,
        (Method::POST, ["v1", "runs", id, "heartbeat"]) => match app.runs.heartbeat(id) {
            Ok(view) => reply(StatusCode::OK, &view_json(&view)),
            Err(e) => run_error(e),
        },
        (Method::POST, ["v1", "runs", id, "finish"]) => finish(app, id, req).await,
        (Method::PUT, ["v1", "runs", id, "checkpoints", stream]) => {
            checkpoint(app, id, &decode(stream), read_json(req).await).await
        }
        (Method::POST, ["v1", "runs", id, "gaps"]) => gap(app, id, read_json(req).await).await,
        (Method::POST, ["v1", "gaps", id, "resolve"]) => match app.runs.resolve_gap(id).await {
            Ok(()) => reply(StatusCode::OK, &json!({ "resolved": id })),
            Err(e) => run_error(e),
        },
        _ => bad(StatusCode::NOT_FOUND, "path", "no such endpoint or method"),
    };
    Ok(resp)
}

/// `GET /v1/collectors/{name}/runs?limit=N`: the newest runs first.
async fn history(app: &App, name: &str, query: &str) -> Response<ResBody> {
    let limit = match param(query, "limit").map(|v| v.parse::<usize>()) {
        None => 20,
        Some(Ok(n)) if n > 0 => n.min(1000),
        Some(_) => return bad(StatusCode::BAD_REQUEST, "limit", "a number from 1"),
    };
    match app.runs.history(name, limit).await {
        Ok(runs) => reply(
            StatusCode::OK,
            &json!({ "runs": runs.iter().map(record_json).collect::<Vec<_>>() }),
        ),
        Err(e) => run_error(e),
    }
}

/// `DELETE /v1/collectors/{name}/checkpoints/{stream}?mode=…`.
async fn reset_checkpoint(app: &App, name: &str, stream: &str, query: &str) -> Response<ResBody> {
    let mode = match param(query, "mode").as_deref().map(Mode::parse) {
        Some(Some(m)) => m,
        _ => {
            return bad(
                StatusCode::BAD_REQUEST,
                "mode",
                "mode=steady or mode=catchup",
            )
        }
    };
    match app.runs.reset_checkpoint(name, stream, mode).await {
        Ok(true) => reply(StatusCode::OK, &json!({ "reset": true })),
        Ok(false) => bad(
            StatusCode::NOT_FOUND,
            "stream",
            "no checkpoint for this stream and mode",
        ),
        Err(e) => run_error(e),
    }
}

/// `GET /v1/collectors/{name}/gaps?max_bytes=N&after=T`: one page.
async fn gaps(app: &App, name: &str, query: &str) -> Response<ResBody> {
    let max_bytes = match param(query, "max_bytes").map(|v| v.parse::<usize>()) {
        None => 64 * 1024,
        Some(Ok(n)) if n > 0 && n <= MAX_GAP_PAGE_BYTES => n,
        Some(_) => {
            return bad(
                StatusCode::BAD_REQUEST,
                "max_bytes",
                format!("a number from 1 to {MAX_GAP_PAGE_BYTES}"),
            )
        }
    };
    let after = param(query, "after");
    if after.as_deref().is_some_and(|a| split_id(a).is_none()) {
        return bad(StatusCode::BAD_REQUEST, "after", "not a continuation token");
    }
    match app.runs.gaps(name, max_bytes, after.as_deref()).await {
        Ok(page) => reply(
            StatusCode::OK,
            &json!({
                "gaps": page.gaps.iter().map(gap_json).collect::<Vec<_>>(),
                "next": page.next,
                "drained": page.next.is_none(),
            }),
        ),
        Err(e) => run_error(e),
    }
}

/// `GET /v1/runs/{id}`: the run's record with its providers' readout.
async fn run_view(app: &App, id: &str) -> Response<ResBody> {
    // What ends now is queued first, and every write queued so far
    // is read back before the record is: an ended run's record on
    // its way to the store (a lapse, a restart's interrupted runs)
    // was read as it stood before — still active.
    app.runs.sweep(tokio::time::Instant::now());
    app.store_applied().await;
    match app.runs.get(id) {
        Ok(view) => {
            let mut j = view_json(&view);
            j["providers"] = run_providers(app, &view.record);
            reply(StatusCode::OK, &j)
        }
        Err(e) => run_error(e),
    }
}

/// `POST /v1/runs/{id}/finish`, optionally `{"exit_status": N}`: how the
/// run's command ended.
async fn finish(app: &App, id: &str, req: Request<Incoming>) -> Response<ResBody> {
    let exit_status = match read_json(req).await {
        Ok(map) => match map.get("exit_status") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_i64() {
                Some(n) => Some(n),
                None => {
                    return bad(
                        StatusCode::BAD_REQUEST,
                        "exit_status",
                        "an integer: the command's exit status",
                    )
                }
            },
        },
        Err(e) => return refuse(e),
    };
    match app.runs.finish(id, exit_status) {
        Ok(record) => reply(StatusCode::OK, &record_json(&record)),
        Err(e) => run_error(e),
    }
}

/// Whether a call from `peer` must carry a collector's token: every call
/// from beyond loopback. IPv4 peers of a dual-stack listener arrive as
/// IPv4-mapped IPv6 addresses, which are loopback too.
fn token_required(peer: IpAddr) -> bool {
    !peer.to_canonical().is_loopback()
}

/// A call from beyond loopback needs a collector's token; a token given
/// anyway must be the owner's.
fn authorize(
    app: &App,
    req: &Request<Incoming>,
    peer: SocketAddr,
    owner: Option<&str>,
) -> Option<Response<ResBody>> {
    let config = app.config();
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(token) = given else {
        if !token_required(peer.ip()) {
            return None;
        }
        return Some(bad(
            StatusCode::UNAUTHORIZED,
            "authorization",
            "a collector's token is required as Authorization: Bearer",
        ));
    };
    let whose = config
        .collectors
        .iter()
        .find(|(_, c)| constant_time_eq(c.token.as_bytes(), token.as_bytes()))
        .map(|(name, _)| name.clone());
    // Each answer says what to change (issue 36): a collector the running
    // config lacks, a token that is another collector's.
    let known = |name: &str| config.collectors.contains_key(name);
    match (whose, owner) {
        (None, Some(owner)) if !owner.is_empty() && !known(owner) => Some(bad(
            StatusCode::UNAUTHORIZED,
            "authorization",
            format!(
                "no collector {owner:?} in the running sluice's config: add [collectors.{owner}] \
                 with its token_file and reload (SIGHUP)"
            ),
        )),
        (None, _) => Some(bad(
            StatusCode::UNAUTHORIZED,
            "authorization",
            "unknown token: no collector of the running sluice's config has it \
             (each [collectors.NAME] has its token_file; changed since? reload with SIGHUP)",
        )),
        (Some(who), Some(owner)) if !owner.is_empty() && who != owner => Some(bad(
            StatusCode::FORBIDDEN,
            "id",
            format!(
                "this token is collector {who:?}'s, not {owner:?}'s: use --collector {who}, \
                 or {owner}'s token_file"
            ),
        )),
        _ => None,
    }
}

/// The body as a JSON object (an empty body is `{}`), or the answer that
/// says why not.
async fn read_json(req: Request<Incoming>) -> Result<Map<String, Value>, Invalid> {
    let limited = http_body_util::Limited::new(req.into_body(), MAX_BODY);
    match limited.collect().await {
        Ok(b) => bodies::object(&b.to_bytes()),
        Err(_) => Err(invalid(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body",
            "at most 1 MiB of JSON",
        )),
    }
}

async fn open(
    app: &App,
    name: &str,
    body: Result<Map<String, Value>, Invalid>,
) -> Response<ResBody> {
    let parsed = body.and_then(|map| bodies::opening(&map));
    let (opening, wait) = match parsed {
        Ok(p) => p,
        Err(e) => return refuse(e),
    };
    match app.runs.open(name, opening, wait).await {
        Ok(view) => {
            let mut v = view_json(&view);
            let collector = app.runs.collector(name).ok();
            v["checkpoints"] = collector
                .as_ref()
                .map_or(json!({}), |c| checkpoints_json(&c.checkpoints));
            v["pending_gaps"] = json!(collector.map_or(0, |c| c.pending_gaps));
            reply(StatusCode::CREATED, &v)
        }
        Err(e) => run_error(e),
    }
}

async fn checkpoint(
    app: &App,
    id: &str,
    stream: &str,
    body: Result<Map<String, Value>, Invalid>,
) -> Response<ResBody> {
    let parsed = body
        .and_then(|map| bodies::commit(&map))
        .map(|c| (c.mode, c.slice, c.cursor, c.fencing_token));
    let (mode, slice, cursor, fence) = match parsed {
        Ok(p) => p,
        Err(e) => return refuse(e),
    };
    if stream.is_empty() {
        return bad(StatusCode::BAD_REQUEST, "stream", "a stream name");
    }
    match app
        .runs
        .checkpoint(id, stream, mode, slice, cursor, fence)
        .await
    {
        Ok(c) => reply(
            StatusCode::OK,
            &json!({ "stream": stream, "mode": mode.label(), "checkpoint": checkpoint_json(&c) }),
        ),
        Err(e) => run_error(e),
    }
}

async fn gap(app: &App, id: &str, body: Result<Map<String, Value>, Invalid>) -> Response<ResBody> {
    let parsed = body
        .and_then(|map| bodies::gap(&map))
        .map(|g| (g.stream, g.cursor, g.reason, g.detail));
    let (stream, cursor, reason, detail) = match parsed {
        Ok(p) => p,
        Err(e) => return refuse(e),
    };
    match app.runs.add_gap(id, stream, cursor, reason, detail).await {
        Ok(g) => reply(StatusCode::CREATED, &gap_json(&g)),
        Err(e) => run_error(e),
    }
}

/// One query parameter, percent-decoded.
fn param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| decode(v))
}

/// Percent-decodes a path segment or query value (`+` stays `+`).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn record_json(r: &RunRecord) -> Value {
    let duration_s = r.ended_unix_ms.unwrap_or_else(crate::store::unix_ms_now) as f64 / 1000.0
        - r.started_unix_ms as f64 / 1000.0;
    json!({
        "id": r.id,
        "collector": r.collector,
        "mode": r.mode.label(),
        "phase": r.phase.label(),
        "request_cap": r.request_cap,
        "deadline_s": r.deadline_s,
        "retry_ratio": r.retry_ratio,
        "fencing_token": r.fencing_token,
        "started_unix_ms": r.started_unix_ms,
        "ended_unix_ms": r.ended_unix_ms,
        "duration_s": (duration_s.max(0.0) * 1000.0).round() / 1000.0,
        "stop_reason": r.stop_reason,
        "provider_stops": r.provider_stops,
        "attempts": r.attempts,
        "units": r.units,
        "retries": r.retries,
        "cooldown_waits": r.cooldown_waits,
        "refusals": r.refusals,
        "gaps_recorded": r.gaps_recorded,
        "gaps_posted": r.gaps_posted,
        "failed": r.failed,
    })
}

/// The providers a run sent to — attempts, cool-downs waited out, its
/// stop there — each with the breaker transitions made while the run was
/// on (run-scoped evidence, R-CB2): only states, reasons and counters.
fn run_providers(app: &App, r: &RunRecord) -> Value {
    let until = r.ended_unix_ms.unwrap_or_else(crate::store::unix_ms_now);
    let mut out = serde_json::Map::new();
    for (name, p) in &r.providers {
        let recent = app
            .providers
            .live(name)
            .map(|live| live.policy.breaker.recent())
            .unwrap_or_default();
        let evidence: Vec<Value> = super::evidence::evidence(app, name, &recent)
            .into_iter()
            .filter(|e| {
                e["at_unix_ms"]
                    .as_u64()
                    .is_some_and(|at| at >= r.started_unix_ms && at <= until)
            })
            .collect();
        out.insert(
            name.clone(),
            json!({
                "attempts": p.attempts,
                "cooldown_waits": p.waits,
                "stopped": p.stopped,
                "evidence": evidence,
            }),
        );
    }
    Value::Object(out)
}

fn view_json(v: &RunView) -> Value {
    let mut j = record_json(&v.record);
    j["lease"] = match v.lease_expires_unix_ms {
        Some(at) => json!({
            "fencing_token": v.record.fencing_token,
            "expires_at": rfc3339(at),
            "expires_at_unix_ms": at,
        }),
        None => json!(null),
    };
    j
}

/// Milliseconds since the epoch as RFC 3339 UTC (`2026-11-26T06:01:02.345Z`).
fn rfc3339(unix_ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

fn checkpoint_json(c: &Checkpoint) -> Value {
    json!({ "slice": c.slice, "cursor": c.cursor, "run": c.run, "at_unix_ms": c.at_unix_ms })
}

fn checkpoints_json(list: &[(Mode, String, Checkpoint)]) -> Value {
    let mut out = json!({ "steady": {}, "catchup": {} });
    for (mode, stream, c) in list {
        out[mode.label()][stream] = checkpoint_json(c);
    }
    out
}

fn gap_json(g: &Gap) -> Value {
    json!({
        "id": g.id,
        "stream": g.stream,
        "cursor": g.cursor,
        "reason": g.reason,
        "detail": g.detail,
        "provider": g.provider,
        "mode": g.mode.map(|m| m.label()),
        "slice": g.slice,
        // Recorded by a run's stop (superseded, resolved by a later commit)
        // or posted by the collector. The fields are the stored record's,
        // so a page's bytes are what the reader gets.
        "stop": g.stop,
        "run": g.run,
        "at_unix_ms": g.at_unix_ms,
    })
}

fn collector_json(c: &CollectorView) -> Value {
    let unknown = || json!("unknown");
    json!({
        "name": c.name,
        // The steady run if one is active, else the catch-up run; both
        // in `active_runs` (one per mode at most, R-FS1).
        "active_run": c.active.first().map_or_else(unknown, view_json),
        "active_runs": c.active.iter().map(view_json).collect::<Vec<_>>(),
        "lease": c.active.first().map_or_else(unknown, |a| view_json(a)["lease"].clone()),
        "last_run": c.last.as_ref().map_or_else(unknown, record_json),
        "attempts": c.active.first().map_or_else(unknown, |a| json!(a.record.attempts)),
        "stop_reason": c
            .active
            .first()
            .map(|a| &a.record)
            .or(c.last.as_ref())
            .map_or_else(unknown, |r| json!(r.stop_reason)),
        "checkpoints": checkpoints_json(&c.checkpoints),
        "pending_gaps": c.pending_gaps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only loopback callers go without a token; the addresses beyond it
    /// are classified here, never connected to (tests touch loopback only).
    #[test]
    fn a_token_is_required_beyond_loopback() {
        for free in ["127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"] {
            assert!(!token_required(free.parse().unwrap()), "{free}");
        }
        for needs in [
            "10.1.2.3",
            "192.168.1.5",
            "172.16.0.1",
            "203.0.113.7",
            "::ffff:10.0.0.1",
            "fd00::1",
        ] {
            assert!(token_required(needs.parse().unwrap()), "{needs}");
        }
    }
}
