//! A provider simulator: a real HTTP server on a loopback address whose
//! behaviour is chosen by the request path, recording every request it
//! sees (arrival time, path, status) so tests measure at the provider.
//!
//! Paths:
//! * `/ok` — 200; `/item/{n}` — 200 (a collector's n-th item, counted by
//!   path).
//! * `/status/{code}` — that status.
//! * `/limited` — a hidden token bucket (see [`Sim::set_limit`]): 200 while
//!   it has tokens, else 429 without `Retry-After`; `/limited/{tag}` the
//!   same bucket, the tag telling callers apart in the hits.
//! * `/limited503` — the same bucket, answering a bare 503 (no
//!   `Retry-After`) when over it.
//! * `/limited-ra/{secs}` — the same bucket, answering 429 with
//!   `Retry-After: {secs}` when over it.
//! * `/noise/{permille}` — 200, except that this many requests in a
//!   thousand, at random, get a bare 503.
//! * `/heavy/{percent}/{ms}` — 200, this many requests in a hundred, at
//!   random, `ms` slower (`lo-hi`: uniformly between the two).
//! * `/queue/{rps}` — a provider that never refuses but serves `rps`
//!   requests a second, in arrival order: pushed past that, every answer
//!   waits its turn (the wait is recorded in [`Hit::delay`]).
//! * `/ra/{secs}/{key}` — the first request for this path gets 429 with
//!   `Retry-After: {secs}` (delta-seconds); later ones 200.
//! * `/ra-date/{secs}/{key}` — the same with an HTTP-date.
//! * `/fail503/{n}/{key}` — the first `n` requests get 503, then 200.
//! * `/quota/{family}/{limit}/{window_s}/{lie}` — a fixed-window quota of
//!   `limit` requests per `window_s` seconds (windows from this path's
//!   first request), advertised in every answer in `family` — `ietf`
//!   (`RateLimit-Policy: "w";q=…;w=…` and `RateLimit: "w";r=…;t=…`) or `x`
//!   (`X-RateLimit-Limit`, `-Remaining`, `-Reset` as a Unix time) — or
//!   `none`; `lie` multiplies what it advertises (2: it claims twice what
//!   it allows). Over the quota: 429 with `Retry-After` to the window's
//!   end.
//! * `/graphql` — a points quota (see [`Sim::set_units`]; 1,000 per 60 s
//!   by default): a `POST` costs 10 points, anything else 1; advertised in
//!   IETF `RateLimit` headers, the cost in `x-cost`; over it, 429 with
//!   `Retry-After` to the window's end. Hits are recorded with their
//!   method as the path's suffix (`/graphql#POST`).
//! * `/dialect/{kind}/{key}` — a provider's dialect, as its documentation
//!   describes it: `github-primary` (the first request 403 with
//!   `x-ratelimit-remaining: 0` and a Unix-time reset a second on),
//!   `github-secondary` (the first 403 with `retry-after: 1` and the
//!   secondary-limit message), `github-forbidden` (always 403 with budget
//!   left, a permission message and a 40 KiB body), `openai-quota`
//!   (always 429 `insufficient_quota`), `anthropic-overloaded` (the first
//!   two 529 `overloaded_error`); otherwise 200.
//! * `/slow/{ms}` — 200 after a delay.
//! * `/hang` — never answers.
//! * `/reset` — closes the connection without an answer.
//! * `/reset-after-body` — reads the whole request body, then closes the
//!   connection without an answer: a request the provider may have
//!   acted on.
//! * `/echo` — 200 with the request body, a header listing request header
//!   names (`x-seen-headers`) and one with the `Host` it got
//!   (`x-seen-host`).
//! * `/stall` — 200 whose body sends one chunk (`partial`) and then
//!   nothing, forever.
//!
//! Started with [`Sim::start_model`], it answers every path as a provider's
//! documentation says instead ([`crate::github`], [`crate::discord`]).
//!
//! Outages, whatever the path: [`Sim::set_outage`] answers every request
//! with a bare status (a deploy's `503`s) or resets every connection
//! before an answer; [`Sim::stop`] closes the listener and every open
//! connection (the provider's process gone: connections refused) and
//! [`Sim::restart`] listens on the same port again.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::model::{Rng, TokenBucket};

/// One request the provider saw.
#[derive(Debug, Clone)]
pub struct Hit {
    /// When it arrived.
    pub at: Instant,
    /// Its path.
    pub path: String,
    /// What the simulator answered (0 for no answer).
    pub status: u16,
    /// The HTTP version it arrived with.
    pub version: http::Version,
    /// How long the simulator held the answer back.
    pub delay: Duration,
}

/// Provider-side figures over a window (see [`Sim::figures`]).
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Requests accepted (200).
    pub accepted: usize,
    /// Requests refused (429 or 503).
    pub throttled: usize,
    /// All requests seen.
    pub attempts: usize,
    /// Accepted per second as a share of the hidden limit.
    pub goodput: f64,
    /// 429s and 503s as a share of attempts.
    pub throttled_share: f64,
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} accepted ({:.1} % of the limit), {} of {} attempts refused ({:.2} %)",
            self.accepted,
            self.goodput * 100.0,
            self.throttled,
            self.attempts,
            self.throttled_share * 100.0
        )
    }
}

/// An outage the simulator plays, whatever the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outage {
    /// Every request gets this status, bare (no `Retry-After`).
    Status(u16),
    /// Every connection is reset before an answer.
    Reset,
}

#[derive(Debug, Default)]
struct State {
    hits: Vec<Hit>,
    outage: Option<Outage>,
    counts: HashMap<String, u32>,
    bucket: Option<TokenBucket>,
    /// The random paths' generator (seeded: repeatable).
    rng: Option<Rng>,
    /// When `/queue`'s server is next free.
    queue_free: Option<Instant>,
    /// `/quota` paths: when their windows began, and the current window's
    /// number and requests.
    quotas: HashMap<String, (Instant, u64, u64)>,
    /// `/graphql`'s points quota: points per window.
    units: Option<(u64, Duration)>,
    /// Answering as a provider's documentation says, every path
    /// ([`Sim::start_model`]).
    model: Option<Box<dyn Model>>,
    /// Requests being answered at once (GitHub's secondary limit).
    in_flight: usize,
    /// Connections accepted, and those still open.
    connections: (u64, u64),
}

impl State {
    fn uniform(&mut self) -> f64 {
        self.rng.get_or_insert_with(|| Rng::new(0)).uniform()
    }

    fn take(&mut self, now: Instant) -> bool {
        self.bucket.as_mut().is_none_or(|b| b.take(now))
    }
}

/// A running simulator; stops when dropped.
pub struct Sim {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    task: tokio::task::JoinHandle<()>,
    /// Closes every open connection when the simulator stops.
    stop: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim").field("addr", &self.addr).finish()
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.task.abort();
        self.stop.send_replace(true);
    }
}

impl Sim {
    /// Starts a plain-HTTP simulator on `ip` (a loopback address), port 0.
    pub async fn start(ip: &str) -> Sim {
        Sim::start_inner(ip, 0, None).await
    }

    /// Starts a plain-HTTP simulator on `ip:port` (port 80 needs root, as
    /// the tests run).
    pub async fn start_on(ip: &str, port: u16) -> Sim {
        Sim::start_inner(ip, port, None).await
    }

    /// Starts a plain-HTTP simulator on `ip` that answers every path as
    /// `model` says (a provider written from its documentation:
    /// [`crate::github`], [`crate::discord`]).
    pub async fn start_model(ip: &str, model: impl Model) -> Sim {
        let sim = Sim::start_inner(ip, 0, None).await;
        sim.state.lock().unwrap().model = Some(Box::new(model));
        sim
    }

    /// [`Sim::start_model`] over HTTPS with this server config.
    pub async fn start_model_tls(
        ip: &str,
        tls: Arc<rustls::ServerConfig>,
        model: impl Model,
    ) -> Sim {
        let sim = Sim::start_tls(ip, tls).await;
        sim.state.lock().unwrap().model = Some(Box::new(model));
        sim
    }

    /// Reads the model of a simulator started with [`Sim::start_model`].
    pub fn model<M: Model, T>(&self, read: impl FnOnce(&M) -> T) -> T {
        let st = self.state.lock().unwrap();
        let any: &dyn std::any::Any = st.model.as_deref().expect("a model");
        read(any.downcast_ref::<M>().expect("a model of this kind"))
    }

    /// Starts an HTTPS simulator with this server config.
    pub async fn start_tls(ip: &str, tls: Arc<rustls::ServerConfig>) -> Sim {
        Sim::start_inner(ip, 0, Some(tokio_rustls::TlsAcceptor::from(tls))).await
    }

    async fn start_inner(ip: &str, port: u16, tls: Option<tokio_rustls::TlsAcceptor>) -> Sim {
        let listener = TcpListener::bind((ip, port)).await.expect("bind simulator");
        let addr = listener.local_addr().unwrap();
        let state: Arc<Mutex<State>> = Arc::default();
        let (stop, _) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(accept(listener, state.clone(), tls.clone(), stop.clone()));
        Sim {
            addr,
            state,
            tls,
            task,
            stop,
        }
    }

    /// Plays an outage (or ends it, `None`), whatever the path.
    pub fn set_outage(&self, outage: Option<Outage>) {
        self.state.lock().unwrap().outage = outage;
    }

    /// The provider's process goes away: the listener and every open
    /// connection close, and new connections are refused.
    pub fn stop(&mut self) {
        self.task.abort();
        self.stop.send_replace(true);
    }

    /// The provider comes back on the same address.
    pub async fn restart(&mut self) {
        let listener = TcpListener::bind(self.addr)
            .await
            .expect("bind the simulator again");
        self.stop.send_replace(false);
        self.task = tokio::spawn(accept(
            listener,
            self.state.clone(),
            self.tls.clone(),
            self.stop.clone(),
        ));
    }

    /// Sets `/graphql`'s points quota (default 1,000 per 60 s).
    pub fn set_units(&self, limit: u64, window: Duration) {
        self.state.lock().unwrap().units = Some((limit, window));
    }

    /// Sets the hidden limit of `/limited`: a token bucket.
    pub fn set_limit(&self, rate: f64, burst: f64) {
        self.state.lock().unwrap().bucket = Some(TokenBucket::new(rate, burst, Instant::now()));
    }

    /// Connections accepted since start, and those open now.
    pub fn connections(&self) -> (u64, u64) {
        self.state.lock().unwrap().connections
    }

    /// Every request seen whose path starts with `prefix`.
    pub fn hits(&self, prefix: &str) -> Vec<Hit> {
        self.state
            .lock()
            .unwrap()
            .hits
            .iter()
            .filter(|h| h.path.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// Waits until `secs` seconds have passed since the first request on
    /// `path`, so that a window of [`Sim::figures`] ending there is whole
    /// when it is read. A test's clock starts before its clients do: on a
    /// loaded two-core machine eight Python clients beside sixteen sluice
    /// processes sent their first request 3–6 s after the test began, and
    /// a window read at the test's 55 s lacked its last seconds. Panics if
    /// no request arrives within 30 s.
    pub async fn wait_past(&self, path: &str, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let first = loop {
            if let Some(h) = self.hits(path).first() {
                break h.at;
            }
            assert!(Instant::now() < deadline, "no request on {path} in 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        tokio::time::sleep_until(first + Duration::from_secs(secs)).await;
    }

    /// What the provider saw on `path` between `from` and `to` seconds
    /// after the first request there, against its hidden `limit`.
    pub fn figures(&self, path: &str, from: u64, to: u64, limit: f64) -> Figures {
        let hits = self.hits(path);
        let start = hits.first().expect("the provider saw requests").at;
        let (a, b) = (
            start + Duration::from_secs(from),
            start + Duration::from_secs(to),
        );
        let window: Vec<_> = hits.iter().filter(|h| h.at >= a && h.at < b).collect();
        let accepted = window.iter().filter(|h| h.status == 200).count();
        let throttled = window
            .iter()
            .filter(|h| h.status == 429 || h.status == 503)
            .count();
        Figures {
            accepted,
            throttled,
            attempts: window.len(),
            goodput: accepted as f64 / (to - from) as f64 / limit,
            throttled_share: throttled as f64 / window.len().max(1) as f64,
        }
    }

    /// Each refusal on `path` between `from` and `to` seconds after the
    /// first request there, as `at s (n in the 250 ms before, longest gap
    /// in the second before ms)`: whether the provider saw a burst after
    /// a stall (the machine) or an even stream too fast (the pacing).
    pub fn refusals(&self, path: &str, from: u64, to: u64) -> Vec<String> {
        let hits = self.hits(path);
        let Some(start) = hits.first().map(|h| h.at) else {
            return Vec::new();
        };
        let (a, b) = (
            start + Duration::from_secs(from),
            start + Duration::from_secs(to),
        );
        let mut out = Vec::new();
        for (i, h) in hits.iter().enumerate() {
            if h.at < a || h.at >= b || (h.status != 429 && h.status != 503) {
                continue;
            }
            let before = &hits[..i];
            let near = before
                .iter()
                .filter(|p| h.at - p.at <= Duration::from_millis(250))
                .count();
            let second: Vec<_> = before
                .iter()
                .filter(|p| h.at - p.at <= Duration::from_secs(1))
                .map(|p| p.at)
                .chain([h.at])
                .collect();
            let gap = second
                .windows(2)
                .map(|w| w[1] - w[0])
                .max()
                .unwrap_or_default();
            out.push(format!(
                "{:.2} s ({near} in 250 ms, gap {} ms)",
                (h.at - start).as_secs_f64(),
                gap.as_millis()
            ));
        }
        out
    }

    /// `http://addr` or `https://addr` base URL.
    pub fn url(&self, scheme: &str, path: &str) -> String {
        format!("{scheme}://{}{path}", self.addr)
    }
}

/// A provider as its documentation describes it: answers every request.
pub trait Model: std::any::Any + Send + std::fmt::Debug {
    /// The answer to a request of `method` to `path_and_query` with
    /// `body`, `in_flight` requests being answered at once (this one
    /// included).
    fn answer(
        &mut self,
        method: &http::Method,
        path_and_query: &str,
        body: &[u8],
        in_flight: usize,
        now: Instant,
    ) -> ModelAnswer;
    /// How long each answer takes (5 ms unless the model says).
    fn service(&self) -> Duration {
        Duration::from_millis(5)
    }
}

/// A model's answer: status, headers, body.
pub type ModelAnswer = (u16, Vec<(&'static str, String)>, String);

/// One request answered by the model: judged at once, answered after its
/// service time, counted in flight meanwhile.
async fn modelled(
    state: Arc<Mutex<State>>,
    req: Request<Incoming>,
    version: http::Version,
    now: Instant,
) -> Response<Body> {
    struct InFlight(Arc<Mutex<State>>);
    impl Drop for InFlight {
        fn drop(&mut self) {
            self.0.lock().unwrap().in_flight -= 1;
        }
    }
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let (parts, body) = req.into_parts();
    let sent = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let ((status, headers, body), service) = {
        let mut st = state.lock().unwrap();
        st.in_flight += 1;
        let in_flight = st.in_flight;
        let model = st.model.as_mut().expect("a model");
        let answer = model.answer(&parts.method, &path, &sent, in_flight, now);
        let service = model.service();
        st.hits.push(Hit {
            at: now,
            path: parts.uri.path().to_string(),
            status: answer.0,
            version,
            delay: service,
        });
        (answer, service)
    };
    let _in_flight = InFlight(state);
    tokio::time::sleep(service).await;
    let mut resp = Response::new(Full::new(Bytes::from(body)).map_err(|e| match e {}).boxed());
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    resp.headers_mut().insert(
        "content-type",
        "application/json; charset=utf-8".parse().unwrap(),
    );
    for (name, value) in headers {
        if let Ok(v) = value.parse() {
            resp.headers_mut().insert(name, v);
        }
    }
    resp
}

/// Accepts and serves connections until aborted; each connection closes
/// when `stop` says so.
async fn accept(
    listener: TcpListener,
    st: Arc<Mutex<State>>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stop: tokio::sync::watch::Sender<bool>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let st = st.clone();
        let tls = tls.clone();
        let mut stopped = stop.subscribe();
        {
            let mut s = st.lock().unwrap();
            s.connections.0 += 1;
            s.connections.1 += 1;
        }
        let closed = ConnectionClosed(st.clone());
        tokio::spawn(async move {
            let _closed = closed;
            let service = service_fn(move |req| {
                let st = st.clone();
                async move { answer(st, req).await }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let serve = async {
                match tls {
                    Some(acceptor) => {
                        if let Ok(s) = acceptor.accept(stream).await {
                            let _ = builder.serve_connection(TokioIo::new(s), service).await;
                        }
                    }
                    None => {
                        let _ = builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    }
                }
            };
            tokio::select! {
                _ = serve => {}
                _ = stopped.wait_for(|s| *s) => {}
            }
        });
    }
}

/// Counts a connection closed when dropped.
struct ConnectionClosed(Arc<Mutex<State>>);

impl Drop for ConnectionClosed {
    fn drop(&mut self) {
        if let Ok(mut s) = self.0.lock() {
            s.connections.1 -= 1;
        }
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

/// A body that sends one chunk and then stalls forever.
struct Stall(bool);

impl http_body::Body for Stall {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        if self.0 {
            // Never ready again, and never woken: a provider that stalls.
            return std::task::Poll::Pending;
        }
        self.0 = true;
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
            b"partial",
        )))))
    }
}

async fn answer(
    state: Arc<Mutex<State>>,
    req: Request<Incoming>,
) -> Result<Response<Body>, std::io::Error> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let version = req.version();
    let header_names: Vec<String> = req.headers().keys().map(|k| k.to_string()).collect();
    let host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let now = Instant::now();
    let mut delay = Duration::ZERO;
    let mut retry_after: Option<String> = None;
    let mut extra_headers: Vec<(&'static str, String)> = Vec::new();
    let mut body = Bytes::new();
    let outage = state.lock().unwrap().outage;
    if let Some(outage) = outage {
        state.lock().unwrap().hits.push(Hit {
            at: now,
            path: path.clone(),
            status: match outage {
                Outage::Status(code) => code,
                Outage::Reset => 0,
            },
            version,
            delay: Duration::ZERO,
        });
        return match outage {
            Outage::Status(code) => {
                let mut resp =
                    Response::new(Full::new(Bytes::new()).map_err(|e| match e {}).boxed());
                *resp.status_mut() =
                    StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
                Ok(resp)
            }
            Outage::Reset => Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "outage: reset",
            )),
        };
    }
    if state.lock().unwrap().model.is_some() {
        return Ok(modelled(state, req, version, now).await);
    }
    let status: u16 = {
        let mut st = state.lock().unwrap();
        let n = {
            let c = st.counts.entry(path.clone()).or_insert(0);
            *c += 1;
            *c
        };
        let status = match parts.as_slice() {
            ["ok"] | ["echo"] | ["stall"] | ["item", _] => 200,
            ["status", code] => code.parse().unwrap_or(400),
            // `/limited/{tag}`: the same bucket, the tag telling callers apart.
            ["limited"] | ["limited", _] => {
                if st.take(now) {
                    200
                } else {
                    429
                }
            }
            ["limited503"] => {
                if st.take(now) {
                    200
                } else {
                    503
                }
            }
            ["limited-ra", secs] => {
                if st.take(now) {
                    200
                } else {
                    retry_after = Some(secs.to_string());
                    429
                }
            }
            ["noise", permille] => {
                let share = permille.parse::<f64>().unwrap_or(0.0) / 1000.0;
                if st.uniform() < share {
                    503
                } else {
                    200
                }
            }
            ["queue", rps] => {
                let rps: f64 = rps.parse().unwrap_or(1.0);
                let start = st.queue_free.map_or(now, |f| f.max(now));
                let free = start + Duration::from_secs_f64(1.0 / rps.max(0.001));
                st.queue_free = Some(free);
                delay = free - now;
                200
            }
            ["heavy", percent, ms] => {
                let share = percent.parse::<f64>().unwrap_or(0.0) / 100.0;
                if st.uniform() < share {
                    // `ms`, or `lo-hi`: uniform between them.
                    let (lo, hi) = ms.split_once('-').unwrap_or((ms, ms));
                    let (lo, hi) = (lo.parse().unwrap_or(0.0), hi.parse().unwrap_or(0.0));
                    let extra: f64 = lo + (hi - lo) * st.uniform();
                    delay = Duration::from_secs_f64(extra.max(0.0) / 1000.0);
                }
                200
            }
            ["ra", secs, ..] if n == 1 => {
                retry_after = Some(secs.to_string());
                429
            }
            ["ra-date", secs, ..] if n == 1 => {
                let s: u64 = secs.parse().unwrap_or(1);
                retry_after = Some(httpdate::fmt_http_date(
                    SystemTime::now() + Duration::from_secs(s),
                ));
                429
            }
            ["ra", ..] | ["ra-date", ..] => 200,
            ["fail503", count, ..] => {
                if n <= count.parse().unwrap_or(0) {
                    503
                } else {
                    200
                }
            }
            ["quota", family, limit, window, lie] => {
                let limit: u64 = limit.parse().unwrap_or(1);
                let window = Duration::from_secs(window.parse().unwrap_or(1).max(1));
                let lie: u64 = lie.parse().unwrap_or(1);
                let (epoch, index, used) = st.quotas.entry(path.clone()).or_insert((now, 0, 0));
                let current = ((now - *epoch).as_secs_f64() / window.as_secs_f64()) as u64;
                if current != *index {
                    *index = current;
                    *used = 0;
                }
                let ends = *epoch + window * (current as u32 + 1);
                let left = ends - now;
                let ok = *used < limit;
                if ok {
                    *used += 1;
                }
                let advertised = limit * lie;
                let remaining = advertised.saturating_sub(*used);
                // Whole seconds, rounded up, as servers send them.
                let reset = left.as_secs() + u64::from(left.subsec_nanos() > 0);
                match *family {
                    "ietf" => {
                        extra_headers.push((
                            "ratelimit-policy",
                            format!("\"w\";q={advertised};w={}", window.as_secs()),
                        ));
                        extra_headers.push(("ratelimit", format!("\"w\";r={remaining};t={reset}")));
                    }
                    "x" => {
                        let at = SystemTime::now() + left;
                        let unix = at
                            .duration_since(SystemTime::UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0));
                        extra_headers.push(("x-ratelimit-limit", advertised.to_string()));
                        extra_headers.push(("x-ratelimit-remaining", remaining.to_string()));
                        extra_headers.push(("x-ratelimit-reset", unix.to_string()));
                    }
                    _ => {}
                }
                if ok {
                    200
                } else {
                    retry_after = Some(reset.to_string());
                    429
                }
            }
            ["graphql"] => {
                // A points quota: a POST (a query) costs 10 points, any other
                // request 1; windows from the first request; advertised in
                // IETF headers; over it, 429 to the window's end.
                let cost: u64 = if method == http::Method::POST { 10 } else { 1 };
                let (limit, window) = st.units.unwrap_or((1000, Duration::from_secs(60)));
                let (epoch, index, used) = st
                    .quotas
                    .entry("graphql".to_string())
                    .or_insert((now, 0, 0));
                let current = ((now - *epoch).as_secs_f64() / window.as_secs_f64()) as u64;
                if current != *index {
                    *index = current;
                    *used = 0;
                }
                let left = *epoch + window * (current as u32 + 1) - now;
                let ok = *used + cost <= limit;
                if ok {
                    *used += cost;
                }
                let reset = left.as_secs() + u64::from(left.subsec_nanos() > 0);
                extra_headers.push((
                    "ratelimit-policy",
                    format!("\"w\";q={limit};w={}", window.as_secs()),
                ));
                extra_headers.push((
                    "ratelimit",
                    format!("\"w\";r={};t={reset}", limit.saturating_sub(*used)),
                ));
                extra_headers.push(("x-cost", cost.to_string()));
                if ok {
                    200
                } else {
                    retry_after = Some(reset.to_string());
                    429
                }
            }
            // Provider dialects, as their documentation describes them.
            ["dialect", kind, ..] => {
                let unix_in = |secs: u64| {
                    (SystemTime::now() + Duration::from_secs(secs))
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs() + 1)
                };
                let json = |text: String| Bytes::from(text);
                match *kind {
                    // GitHub's primary limit: 403, nothing remaining, the
                    // reset a Unix time (docs: "Rate limits for the REST
                    // API").
                    "github-primary" if n == 1 => {
                        extra_headers.push(("x-ratelimit-limit", "60".into()));
                        extra_headers.push(("x-ratelimit-remaining", "0".into()));
                        extra_headers.push(("x-ratelimit-reset", unix_in(1).to_string()));
                        extra_headers.push(("x-ratelimit-resource", "core".into()));
                        body = json(r#"{"message":"API rate limit exceeded for 127.0.0.1. (But here's the good news: Authenticated requests get a higher rate limit.)","documentation_url":"https://docs.github.com/rest/overview/resources-in-the-rest-api#rate-limiting"}"#.into());
                        403
                    }
                    // The secondary limit: 403 with `retry-after`.
                    "github-secondary" if n == 1 => {
                        extra_headers.push(("x-ratelimit-remaining", "4000".into()));
                        retry_after = Some("1".into());
                        body = json(r#"{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"}"#.into());
                        403
                    }
                    "github-primary" | "github-secondary" => {
                        extra_headers.push(("x-ratelimit-remaining", "59".into()));
                        200
                    }
                    // A real permission error: budget left, another
                    // message — with a body past what is read ahead.
                    "github-forbidden" => {
                        extra_headers.push(("x-ratelimit-remaining", "4999".into()));
                        let pad = "x".repeat(40 * 1024);
                        body = json(format!(
                            r#"{{"message":"Resource not accessible by integration","pad":"{pad}","end":true}}"#
                        ));
                        403
                    }
                    // OpenAI's billing quota: 429, never fixed by waiting
                    // (docs: "Error codes").
                    "openai-quota" => {
                        body = json(r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#.into());
                        429
                    }
                    // Anthropic's capacity: 529 (docs: "Errors"), twice.
                    "anthropic-overloaded" if n <= 2 => {
                        body = json(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#.into());
                        529
                    }
                    _ => 200,
                }
            }
            ["slow", ms] => {
                delay = Duration::from_millis(ms.parse().unwrap_or(0));
                200
            }
            ["hang"] => 0,
            ["reset"] | ["reset-after-body"] => 0,
            _ => 404,
        };
        st.hits.push(Hit {
            at: now,
            path: if path == "/graphql" {
                format!("/graphql#{method}")
            } else {
                path.clone()
            },
            status,
            version,
            delay,
        });
        status
    };
    match parts.as_slice() {
        ["hang"] => {
            std::future::pending::<()>().await;
        }
        ["reset"] => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "reset",
            ));
        }
        ["reset-after-body"] => {
            let _ = req.into_body().collect().await;
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "reset after the body",
            ));
        }
        ["echo"] => {
            body = req
                .into_body()
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
        }
        _ => {}
    }
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let body: Body = if parts.as_slice() == ["stall"] {
        Stall(false).boxed()
    } else {
        Full::new(body).map_err(|e| match e {}).boxed()
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    if let Some(ra) = retry_after {
        resp.headers_mut()
            .insert("retry-after", ra.parse().unwrap());
    }
    for (name, value) in extra_headers {
        if let Ok(v) = value.parse() {
            resp.headers_mut().insert(name, v);
        }
    }
    if let Ok(v) = header_names.join(",").parse() {
        resp.headers_mut().insert("x-seen-headers", v);
    }
    if let Ok(v) = host.parse() {
        resp.headers_mut().insert("x-seen-host", v);
    }
    Ok::<_, std::io::Error>(resp)
}
