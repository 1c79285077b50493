//! The admin listener, on its own port so the proxy port never serves
//! anything but proxying (R-SF1):
//!
//! * `/healthz` — the process is up; `/readyz` — listeners bound and the
//!   store open (R-OP3);
//! * `/metrics` — Prometheus text (R-OP1);
//! * `/v1/providers`, `/v1/providers/{name}` — the live readout (R-OP2):
//!   rate, ceiling, last back-off, breaker state with evidence, hold,
//!   queue. Where there is no state yet the field says `"unknown"` — never
//!   a zero that looks like a measurement;
//! * `/v1/history` — the last minutes of each provider's pace, sampled
//!   every few seconds;
//! * `/` — the admin page (R-OP7): one self-contained document, embedded
//!   in the binary, that polls the readouts above and draws them for
//!   people. It carries no data itself; what it shows comes through the
//!   same API calls, with the same credentials, as anyone else's.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::accept::AcceptBackoff;
use super::evidence::evidence;
use crate::app::App;
use crate::http::body::{full, ResBody};
use crate::providers::Provider;
use crate::store::unix_ms_now;

/// One endpoint of the admin listener, for the reference.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint {
    /// Its method.
    pub method: &'static str,
    /// Its path (`{name}`: a collector, `{id}`: a run or gap, `{stream}`).
    pub path: &'static str,
    /// What it answers.
    pub what: &'static str,
}

/// Every endpoint of the admin listener: [`route`]'s and the collectors'
/// ([`super::collectors::route`]). The book's admin API reference is made
/// from this list, and a test asks each of a live sluice.
pub const ENDPOINTS: &[Endpoint] = &[
    Endpoint { method: "GET", path: "/", what: "The admin page (HTML): each provider's pace, breaker and throttle point, live; its first paint comes from the server." },
    Endpoint { method: "GET", path: "/healthz", what: "`ok` (text) while the process serves." },
    Endpoint { method: "GET", path: "/readyz", what: "`ready` (text) once the listeners are up and the store is open; `503` naming what is missing before." },
    Endpoint { method: "GET", path: "/metrics", what: "Prometheus text exposition: see the [metrics reference](metrics.md)." },
    Endpoint { method: "GET", path: "/v1/providers", what: "`{\"total\": N, \"providers\": [...]}`: every live provider's readout — rate, ceiling, what sets the pace, throttle point and its evidence, breaker, budgets, parking, shared budget; `?limit=N`: only the `N` used last (configured providers not yet used are listed too)." },
    Endpoint { method: "GET", path: "/v1/providers/{name}", what: "One provider's readout, with its breaker's evidence (from the store, across restarts); a provider not live shows what is kept for it." },
    Endpoint { method: "GET", path: "/v1/history", what: "The last minutes of each provider's rate, answers and refusals, for the page's charts." },
    Endpoint { method: "GET", path: "/v1/collectors", what: "`{\"collectors\": [...]}`: each collector, its active runs and fair share." },
    Endpoint { method: "GET", path: "/v1/collectors/{name}", what: "One collector." },
    Endpoint { method: "POST", path: "/v1/collectors/{name}/runs", what: "Opens a run: body `{\"mode\", \"request_cap\", \"deadline_s\", \"retry_ratio\", \"wait_s\", …}`; `201` with the run, its lease and checkpoints; `409` while another run of its mode holds the lease." },
    Endpoint { method: "GET", path: "/v1/collectors/{name}/runs", what: "The collector's runs, newest first (`?limit=N`)." },
    Endpoint { method: "GET", path: "/v1/collectors/{name}/checkpoints", what: "The collector's committed checkpoints by stream and mode." },
    Endpoint { method: "DELETE", path: "/v1/collectors/{name}/checkpoints/{stream}", what: "Resets a stream's checkpoint (`?mode=`)." },
    Endpoint { method: "GET", path: "/v1/collectors/{name}/gaps", what: "The collector's gap records (`?state=pending`)." },
    Endpoint { method: "GET", path: "/v1/runs/{id}", what: "One run: its budget, attempts, refusals, stop reason." },
    Endpoint { method: "POST", path: "/v1/runs/{id}/heartbeat", what: "Keeps the run's lease." },
    Endpoint { method: "POST", path: "/v1/runs/{id}/finish", what: "Ends the run: its report (attempts, retries, refusals, stop reason, gaps recorded)." },
    Endpoint { method: "PUT", path: "/v1/runs/{id}/checkpoints/{stream}", what: "Commits a checkpoint (`200` once flushed to disk; `409` for one that does not advance or a stale fencing token)." },
    Endpoint { method: "POST", path: "/v1/runs/{id}/gaps", what: "Records a gap: data the run did not fetch." },
    Endpoint { method: "POST", path: "/v1/gaps/{id}/resolve", what: "Marks a gap fetched." },
];

/// Serves the admin API until the process ends.
pub async fn serve(app: Arc<App>, listener: TcpListener) {
    let mut backoff = AcceptBackoff::new("admin");
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                backoff.back_off(&e, &app.metrics).await;
                continue;
            }
        };
        backoff.accepted();
        let app = app.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let app = app.clone();
                async move {
                    let resp = match super::collectors::route(&app, req, peer).await {
                        Ok(resp) => resp,
                        Err(req) => {
                            if req.uri().path().starts_with("/v1/providers/") {
                                // Its evidence comes from the store.
                                app.store_applied().await;
                            }
                            route(&app, req)
                        }
                    };
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn text(
    status: StatusCode,
    body: impl Into<bytes::Bytes>,
    content_type: &'static str,
) -> Response<ResBody> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn json_response(status: StatusCode, v: &Value) -> Response<ResBody> {
    text(status, v.to_string(), "application/json")
}

/// The admin listener's endpoints: all `GET`.
fn route(app: &App, req: Request<Incoming>) -> Response<ResBody> {
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n", "text/plain");
    }
    let path = req.uri().path();
    match path {
        "/" => page(app),
        "/v1/history" => json_response(StatusCode::OK, &history_json(app)),
        "/healthz" => text(StatusCode::OK, "ok\n", "text/plain"),
        "/readyz" => readyz(app),
        "/metrics" => metrics(app),
        "/v1/providers" => match limit(req.uri().query()) {
            Ok(limit) => providers(app, limit),
            Err(bad) => json_response(
                StatusCode::BAD_REQUEST,
                &json!({ "error": "limit must be a whole number", "field": "limit", "got": bad }),
            ),
        },
        _ => match path.strip_prefix("/v1/providers/") {
            Some(name) if !name.is_empty() => provider(app, name),
            _ => text(StatusCode::NOT_FOUND, "not found\n", "text/plain"),
        },
    }
}

/// `/readyz`: ready once the listeners are up and the store is open.
fn readyz(app: &App) -> Response<ResBody> {
    let ready = app.ready.load(Ordering::SeqCst);
    match (ready, app.store.is_some()) {
        (true, true) => text(StatusCode::OK, "ready\n", "text/plain"),
        (false, _) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: listeners\n",
            "text/plain",
        ),
        (true, false) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: state store not open\n",
            "text/plain",
        ),
    }
}

/// `/metrics`: the gauges refreshed from each provider's snapshot, then
/// the text exposition.
fn metrics(app: &App) -> Response<ResBody> {
    let providers = app.providers.all();
    let now = Instant::now();
    app.metrics.refresh(providers.iter().map(|p| {
        let budget = p.budget().map(|b| b.readout());
        (p.policy.snapshot(now), p.visible(), budget)
    }));
    app.metrics.tasks_alive.set(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks() as i64,
    );
    let pool = app.providers.upstream().connections();
    app.metrics.upstream_connections.set(pool.open as i64);
    app.metrics
        .upstream_connections_resting
        .set(pool.resting as i64);
    // The pool counts; the counter catches up to it at each scrape.
    let counted = app.metrics.upstream_idle_closed.get();
    app.metrics
        .upstream_idle_closed
        .inc_by(pool.idle_closed.saturating_sub(counted));
    if let Some(a) = crate::observe::allocator::read() {
        // The allocator counts; the counter catches up to it.
        let counted = app.metrics.allocations.get();
        app.metrics
            .allocations
            .inc_by(a.requests.saturating_sub(counted));
        app.metrics.allocated.set(a.allocated as i64);
    }
    app.runs.export();
    text(
        StatusCode::OK,
        app.metrics.render(),
        "text/plain; version=0.0.4",
    )
}

/// `/v1/providers`: every provider in the table, and the named ones not
/// yet used.
///
/// Written out one provider at a time: a broad crawl tracks up to
/// `max_providers` of them, and the whole list as one JSON tree took 15 KB
/// a provider — a gigabyte for 52,000 (issue 38, measured). `?limit=N`
/// keeps the `N` used last (the page asks for a few hundred); `total`
/// says how many are live.
fn providers(app: &App, limit: Option<usize>) -> Response<ResBody> {
    let counts = app.metrics.attempt_counts();
    let (live, total) = app.providers.recent(limit.unwrap_or(usize::MAX));
    let mut out = format!("{{\"total\":{total},\"providers\":[");
    let mut first = true;
    let mut add = |v: Value| {
        if !std::mem::take(&mut first) {
            out.push(',');
        }
        out.push_str(&v.to_string());
    };
    for p in live {
        add(provider_json(app, &p, false, &counts));
    }
    for name in app.providers.named() {
        if app.providers.live(&name).is_none() {
            add(unknown_json(app, &name, false));
        }
    }
    out.push_str("]}");
    text(StatusCode::OK, out, "application/json")
}

/// The `limit` of a query string, if it names one.
fn limit(query: Option<&str>) -> Result<Option<usize>, String> {
    let Some(v) = query
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("limit="))
    else {
        return Ok(None);
    };
    v.parse().map(Some).map_err(|_| v.to_string())
}

/// `/v1/providers/{name}`: one provider with its evidence; a named or
/// remembered provider not in the table answers what is known of it.
fn provider(app: &App, name: &str) -> Response<ResBody> {
    match app.providers.live(name) {
        Some(p) => json_response(
            StatusCode::OK,
            &provider_json(app, &p, true, &app.metrics.attempt_counts()),
        ),
        None if app.providers.named().iter().any(|n| n == name)
            || app
                .store
                .as_ref()
                .is_some_and(|s| !s.evidence(name).is_empty()) =>
        {
            json_response(StatusCode::OK, &unknown_json(app, name, true))
        }
        None => json_response(
            StatusCode::NOT_FOUND,
            &json!({ "error": "no such provider", "name": name }),
        ),
    }
}

/// The admin page: HTML, CSS and script in one document, from the binary.
const PAGE: &str = include_str!("page.html");

/// The providers the page's script draws first, drawn by the server into
/// the page itself: a text browser or `curl` sees them too, and a browser
/// shows them before its first poll (issue 36: "No provider has been used
/// yet." while providers were live). The same figures, rounded as the
/// script rounds them; the script replaces them on its first poll.
const NO_PROVIDER: &str =
    r#"<div class="grid" id="providers"><p class="note">No provider has been used yet.</p></div>"#;

fn first_paint(app: &App) -> String {
    let now = Instant::now();
    let mut live: Vec<_> = app.providers.all();
    live.sort_by(|a, b| a.name().cmp(b.name()));
    if live.is_empty() {
        return PAGE.to_string();
    }
    let mut cards = String::new();
    for p in live.iter().take(24) {
        let s = p.policy.snapshot(now);
        let point = s.pacer.limit_rps.map_or("unknown".to_string(), rate);
        cards.push_str(&format!(
            "<div class=\"card\" data-provider=\"{name}\"><h3>{name} <span class=\"badge\">breaker {breaker}</span></h3>\
             <div><span class=\"big\">{pace}</span> <span class=\"sub\">of {ceiling} ceiling</span></div>\
             <dl><dt>pace set by</dt><dd>{authority}</dd><dt>throttle point</dt><dd>{point}</dd></dl></div>",
            name = html_escape(p.name()),
            breaker = s.breaker.state.label(),
            pace = rate(s.pacer.rate_rps),
            ceiling = rate(s.pacer.ceiling_rps),
            authority = html_escape(s.pacer.authority),
        ));
    }
    PAGE.replacen(
        NO_PROVIDER,
        &format!(r#"<div class="grid" id="providers">{cards}</div>"#),
        1,
    )
}

/// A rate as the page's script writes it: `3.85 req/s`, `12.5 req/s`,
/// `120 req/s` (`sluice status`'s rounding, which the script's matches).
fn rate(x: f64) -> String {
    format!("{} req/s", crate::observe::format::num(x))
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn page(app: &App) -> Response<ResBody> {
    let mut resp = text(StatusCode::OK, first_paint(app), "text/html; charset=utf-8");
    let h = resp.headers_mut();
    // Nothing from anywhere but this admin port, and no framing.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'",
        ),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// Each provider's samples, column by column.
fn history_json(app: &App) -> Value {
    let providers: serde_json::Map<String, Value> = app
        .history
        .all()
        .into_iter()
        .map(|(name, samples)| {
            let col = |f: &dyn Fn(&crate::observe::history::Sample) -> Value| {
                Value::Array(samples.iter().map(f).collect())
            };
            let round = |x: f32| (f64::from(x) * 1000.0).round() / 1000.0;
            (
                name,
                json!({
                    "at_unix_ms": col(&|s| json!(s.at_unix_ms)),
                    "rate_rps": col(&|s| json!(round(s.rate_rps))),
                    "throttle_point_rps": col(&|s| s.throttle_point_rps.map_or(Value::Null, |l| json!(round(l)))),
                    "sent": col(&|s| json!(s.sent)),
                    "refused": col(&|s| json!(s.refused)),
                }),
            )
        })
        .collect();
    json!({
        "every_s": crate::observe::history::EVERY.as_secs(),
        "providers": providers,
    })
}

/// Milliseconds since the epoch of a monotonic instant, through one
/// anchor taken at the first call: the same instant reads the same at
/// every call (deriving it from "now" at each read made it jitter by the
/// time between two clock reads).
fn unix_ms(at: Instant) -> u64 {
    static ANCHOR: OnceLock<(Instant, SystemTime)> = OnceLock::new();
    let (mono, wall) = *ANCHOR.get_or_init(|| (Instant::now(), SystemTime::now()));
    let t = if at >= mono {
        wall.checked_add(at - mono)
    } else {
        wall.checked_sub(mono - at)
    };
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0
}

/// One provider's readout for `/v1/providers` (the page and `sluice
/// status` read it). About 110 lines because it is one `json!` literal:
/// the document's shape as it is served, each field beside its source;
/// split, the API's contract would be spread over helpers.
fn provider_json(
    app: &App,
    p: &Provider,
    with_evidence: bool,
    counts: &std::collections::HashMap<String, (u64, u64)>,
) -> Value {
    // Attempts since start (sent, refused as throttled): the readout's
    // refusal share before the history has a sample of them.
    let (sent, throttled) = counts.get(p.label()).copied().unwrap_or_default();
    let now = Instant::now();
    let s = p.policy.snapshot(now);
    let unknown = || json!("unknown");
    let mut breaker = json!({
        "state": s.breaker.state.label(),
        "in_state_ms": s.breaker.in_state.as_millis() as u64,
        "window_calls": s.breaker.calls,
        "window_failures": s.breaker.failures,
        "open_remaining_ms": s.breaker.open_remaining.map(|d| d.as_millis() as u64),
    });
    if with_evidence {
        breaker["evidence"] = json!(evidence(app, p.name(), &p.policy.breaker.recent()));
    }
    json!({
        "name": &**p.name(),
        "live": true,
        "restored": p.restored,
        "rate_rps": s.pacer.rate_rps,
        "interval_ms": ms(s.pacer.interval),
        "ceiling_rps": s.pacer.ceiling_rps,
        "start_rps": s.pacer.start_rps,
        "throttle_point_rps": s.pacer.limit_rps.map_or_else(unknown, |l| json!(l)),
        // How it is known (kept across restarts): the provider's hold
        // after a refusal, and whether the settle point sits close under it.
        "throttle_point_evidence": json!({
            "hold_ms": s.pacer.known.hold.map(|h| h.as_millis() as u64),
            "fitted": s.pacer.known.fitted,
            "sharp": s.pacer.known.sharp,
            "steady": s.pacer.known.steady,
        }),
        "baseline_ttfb_ms": s.pacer.baseline_ttfb.map_or_else(unknown, |b| json!(ms(b))),
        "error_baseline": s.pacer.error_baseline.map_or_else(unknown, |e| json!(e)),
        "cut_on_trial": s.pacer.on_trial,
        "condition": s.pacer.belief.map_or_else(|| json!({ "state": "clear" }), |b| json!({
            "state": b.condition.label(),
            "why": b.why,
            "failures_in_a_row": b.failures,
            "since_ms": now.saturating_duration_since(b.since).as_millis() as u64,
        })),
        "outages": s.pacer.outages,
        // Parking (R-RN8, R-RN13): down or not, and who waits for its return.
        "outage": json!({
            "down": s.park.watch.down.is_some(),
            "why": s.park.watch.down.map(|(_, r)| r.label()),
            "down_for_ms": s.park.watch.down.map(|(d, _)| d.as_millis() as u64),
            "failures_in_a_row": s.park.watch.streak,
            "parked": s.park.parked,
            "episodes": s.park.watch.episodes,
            "probes": s.park.watch.probes,
            "resumed": s.park.resumed,
            "gave_up": s.park.gave_up,
        }),
        "pace_authority": s.pacer.authority,
        // How its answers are read (R-PD2): by its host or its config.
        "dialect": p.policy.bulkhead.dialect().name(),
        // A budget of its own on its provider's hosts (R-PD1): the
        // provider it is a lane of (its name is `{resource}@{provider}`).
        "lane_of": p.lane_of,
        // An LLM provider's tokens budget beside its requests one (R-PD1):
        // what it tells, what a request costs as its ledger shows, and
        // the requests a second that allows.
        "tokens": s.pacer.tokens.map_or_else(unknown, |t| json!({
            "limit": t.told.limit,
            "remaining": t.told.remaining,
            "refill_per_s": t.told.policy_rate(),
            "per_request": t.per_request.map_or_else(unknown, |p| json!(p.round())),
            "rate_rps": t.rate_rps.map_or_else(unknown, |r| json!(r)),
        })),
        "quota": s.pacer.quota.map_or_else(unknown, |q| json!({
            "family": q.advertised.family.label(),
            "limit": q.advertised.limit.map_or_else(unknown, |l| json!(l)),
            "window_s": q.advertised.window.map_or_else(unknown, |w| json!(w.as_secs_f64())),
            "remaining": q.advertised.remaining,
            "reset_ms": q.reset_in.as_millis() as u64,
            "even_rate_rps": q.rate_rps.map_or_else(|| json!("none left: held until the reset"), |r| json!(r)),
            "trusted": q.trusted,
        })),
        "allowance": s.pacer.allowance.map_or_else(|| json!("none"), |a| json!({
            "units": a.allowance.units,
            "per_s": a.allowance.per.as_secs_f64(),
            "spent": a.spent,
            "left": (a.allowance.units as f64 - a.spent).max(0.0),
            "resets_in_ms": a.resets_in.as_millis() as u64,
            "rate_rps": a.rate_rps,
        })),
        "last_backoff": s.pacer.last_backoff.map_or_else(unknown, |b| json!({
            "at_unix_ms": unix_ms(b.at),
            "ago_ms": now.saturating_duration_since(b.at).as_millis() as u64,
            "reason": b.reason.label(),
            "from_rps": b.from_rps,
            "to_rps": b.to_rps,
        })),
        "hold": s.pacer.hold_remaining.map_or_else(|| json!("none"), |h| json!({
            "remaining_ms": h.as_millis() as u64,
        })),
        "queue": {
            "waiting": s.pacer.queue_len,
            // Per collector ("-": proxy users without one), those waiting.
            "by_collector": s
                .pacer
                .waiting_by_collector
                .iter()
                .map(|(c, n)| (if c.is_empty() { "-".to_string() } else { c.clone() }, json!(n)))
                .collect::<serde_json::Map<String, Value>>(),
            "in_flight": s.in_flight,
            "bulkhead_waiting": s.bulkhead_waiting,
        },
        "retry_budget_left": s.retry_budget_left,
        "attempts": { "sent": sent, "throttled": throttled },
        "shared": p.budget().map_or_else(|| json!(false), |b| {
            let b = b.readout();
            json!({
                "state": b.mode.label(),
                "rate_rps": b.rate_rps.map_or_else(unknown, |r| json!(r)),
                "share": b.share.map_or_else(unknown, |s| json!(s)),
                "admitted_here": b.admitted_here,
                "redis": b.redis,
                "node": b.node.map_or_else(unknown, |n| json!(n)),
                "degraded_times": b.degraded,
                "last_degraded_unix_ms": b.degraded_at.map_or_else(unknown, |t| json!(unix_ms(t))),
                "last_rejoined_unix_ms": b.rejoined_at.map_or_else(unknown, |t| json!(unix_ms(t))),
                "seat": b.seat.map_or_else(unknown, |s| json!(s)),
            })
        }),
        "intercept": p.intercept(),
        "request_visibility": p.visible(),
        "breaker": breaker,
        "as_of_unix_ms": unix_ms_now(),
    })
}

/// A provider that exists in the config (or in the evidence) but has no
/// live state yet.
fn unknown_json(app: &App, name: &str, with_evidence: bool) -> Value {
    let settings = app
        .config()
        .providers
        .iter()
        .find(|p| p.name == name)
        .map(|p| p.settings.clone());
    let mut v = json!({
        "name": name,
        "live": false,
        "restored": false,
        "rate_rps": "unknown",
        "interval_ms": "unknown",
        "ceiling_rps": settings.as_ref().map_or_else(|| json!("unknown"), |s| json!(s.ceiling_rps)),
        "start_rps": settings.as_ref().map_or_else(|| json!("unknown"), |s| json!(s.start_rate())),
        "throttle_point_rps": "unknown",
        "baseline_ttfb_ms": "unknown",
        "error_baseline": "unknown",
        "cut_on_trial": "unknown",
        "condition": "unknown",
        "outages": "unknown",
        "outage": "unknown",
        "pace_authority": "unknown",
        "dialect": "unknown",
        "lane_of": null,
        "tokens": "unknown",
        "quota": "unknown",
        "shared": "unknown",
        "last_backoff": "unknown",
        "hold": "unknown",
        "queue": "unknown",
        "retry_budget_left": "unknown",
        "breaker": { "state": "unknown" },
        "as_of_unix_ms": unix_ms_now(),
    });
    // Learned before and kept (from the store, or when it was evicted):
    // what it will start from when first used, not "unknown".
    if let Some((k, age)) = app.providers.kept(name) {
        let ceiling = settings.as_ref().map_or(k.rate_rps, |s| s.ceiling_rps);
        v["restored"] = json!(true);
        v["restored_age_ms"] = json!(age.as_millis() as u64);
        v["rate_rps"] = json!(k.rate_rps.min(ceiling));
        v["interval_ms"] = json!(1000.0 / k.rate_rps.min(ceiling));
        v["throttle_point_rps"] = k.limit_rps.map_or_else(|| json!("unknown"), |l| json!(l));
        v["baseline_ttfb_ms"] = k
            .baseline
            .map_or_else(|| json!("unknown"), |b| json!(ms(b)));
        v["breaker"]["state"] = json!(k.breaker.label());
    }
    if with_evidence {
        v["breaker"]["evidence"] = json!(evidence(app, name, &[]));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server's first paint rounds as the page's script does.
    #[test]
    fn rates_are_written_as_the_page_writes_them() {
        assert_eq!(rate(3.854), "3.85 req/s");
        assert_eq!(rate(12.46), "12.5 req/s");
        assert_eq!(rate(120.4), "120 req/s");
        assert_eq!(rate(5.0), "5 req/s");
        assert_eq!(rate(0.5), "0.5 req/s");
        assert_eq!(html_escape("<a&\"b>"), "&lt;a&amp;&quot;b&gt;");
    }

    /// The placeholder the first paint replaces is in the page as written.
    #[test]
    fn the_page_has_the_placeholder_the_first_paint_replaces() {
        assert!(PAGE.contains(NO_PROVIDER));
    }
}
