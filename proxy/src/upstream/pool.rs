//! sluice's pool of upstream connections, over hyper's connection API
//! (R-PF1, R-HU2, issue 38).
//!
//! hyper-util's pooled client keeps every connection it made until a
//! request to the same destination checks it out again — with no
//! timer, never otherwise; a closed one still holds its dispatch
//! channel (a block of 32 request slots, ~11 KiB). A crawl over 10,000
//! hosts kept 27.5 KB per host. Here:
//!
//! * an HTTP/1.1 connection is *idle* from the end of its answer's body
//!   until a request takes it again; HTTP/2 connections are shared and
//!   stay listed while open;
//! * at most `max_idle` idle connections are kept, across destinations:
//!   beyond, the one idle longest is dropped — and with it its socket,
//!   buffers and channel, at once;
//! * one idle past `idle_timeout`, or closed by the server, is dropped
//!   when the pool is next touched;
//! * a request that met a reused connection closing before it was sent
//!   is sent again on another (what every client does when a server
//!   closes an idle connection).

use std::collections::{BTreeMap, HashMap};
use std::error::Error as StdError;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use http::uri::{Authority, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use http_body::Body;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper::rt::{Read, Write};
use hyper_util::client::legacy::connect::Connection;
use hyper_util::rt::TokioExecutor;
use sluice_policy::BoxError;
use tower::{Service, ServiceExt};

/// Idle upstream connections kept by default: a sidecar's few providers,
/// each with a busy pool, stay under it; a broad crawl's thousands of
/// hosts are cut to it.
pub const DEFAULT_MAX_IDLE: usize = 256;

/// What a pooled connection is reached by: scheme and authority.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    scheme: Scheme,
    authority: Authority,
}

/// A connect that failed: the connector's error, named as a connect's
/// (the edge answers it as a refused or timed-out connection).
#[derive(Debug, thiserror::Error)]
#[error("connect failed: {0}")]
pub struct ConnectError(#[source] pub BoxError);

/// A request that cannot be sent: no scheme or authority.
#[derive(Debug, thiserror::Error)]
#[error("an upstream request needs an absolute URI")]
pub struct NotAbsolute;

enum Sender<B> {
    H1(http1::SendRequest<B>),
    H2(http2::SendRequest<B>),
}

impl<B> Sender<B> {
    fn is_closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }
}

struct Idle<B> {
    key: Key,
    sender: Sender<B>,
    since: Instant,
}

struct State<B> {
    /// Idle connections (and open HTTP/2 ones) by when they were last
    /// used, a sequence number: the first is the least recently used.
    idle: BTreeMap<u64, Idle<B>>,
    /// Each destination's entries in `idle`, most recent last.
    by_key: HashMap<Key, Vec<u64>>,
    seq: u64,
}

/// The pool: a connector (TCP, the guard, TLS) and the idle connections
/// it made.
pub struct Pool<C, B> {
    connector: C,
    h1: http1::Builder,
    h2: http2::Builder<TokioExecutor>,
    list: Arc<IdleList<B>>,
    /// Connections open (idle or in use), by their tasks.
    open: Arc<AtomicUsize>,
}

impl<C, B> std::fmt::Debug for Pool<C, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("max_idle", &self.list.max_idle)
            .field("open", &self.open.load(Ordering::Relaxed))
            .finish()
    }
}

/// The idle connections, bounded.
struct IdleList<B> {
    max_idle: usize,
    idle_timeout: Duration,
    state: Mutex<State<B>>,
    /// Idle connections dropped for `max_idle`, since start.
    closed: AtomicU64,
}

impl<C, B> Pool<C, B>
where
    C: Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: Read + Write + Connection + Unpin + Send + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    /// A pool over `connector` keeping at most `max_idle` idle
    /// connections, none idle longer than `idle_timeout`.
    pub fn new(connector: C, max_idle: usize, idle_timeout: Duration) -> Arc<Self> {
        Arc::new(Pool {
            connector,
            h1: http1::Builder::new(),
            h2: http2::Builder::new(TokioExecutor::new()),
            list: Arc::new(IdleList {
                max_idle,
                idle_timeout,
                state: Mutex::new(State {
                    idle: BTreeMap::new(),
                    by_key: HashMap::new(),
                    seq: 0,
                }),
                closed: AtomicU64::new(0),
            }),
            open: Arc::default(),
        })
    }

    /// Connections open now (idle or in use), and idle ones dropped for
    /// the bound since start.
    pub fn connections(&self) -> (usize, u64) {
        (
            self.open.load(Ordering::Relaxed),
            self.list.closed.load(Ordering::Relaxed),
        )
    }

    /// Sends `req` (absolute-form) on an idle connection to its
    /// destination, or a new one. Its answer's body gives an HTTP/1.1
    /// connection back when it ends ([`Checkin`]).
    pub async fn send(
        self: &Arc<Self>,
        mut req: Request<B>,
    ) -> Result<(Response<Incoming>, Option<Checkin<B>>), BoxError> {
        let uri = req.uri().clone();
        let key = match (uri.scheme(), uri.authority()) {
            (Some(s), Some(a)) => Key {
                scheme: s.clone(),
                authority: a.clone(),
            },
            _ => return Err(NotAbsolute.into()),
        };
        loop {
            let (sender, reused) = match self.list.checkout(&key) {
                Some(sender) => (sender, true),
                None => (self.connect(&key).await?, false),
            };
            match sender {
                Sender::H2(mut s) => {
                    if let Err(e) = s.ready().await {
                        if reused {
                            continue; // closed meanwhile: another
                        }
                        return Err(e.into());
                    }
                    match s.try_send_request(req).await {
                        Ok(resp) => return Ok((resp, None)),
                        Err(mut e) => match e.take_message() {
                            Some(back) if reused => req = back,
                            _ => return Err(e.into_error().into()),
                        },
                    }
                }
                Sender::H1(mut s) => {
                    if let Err(e) = s.ready().await {
                        if reused {
                            continue;
                        }
                        return Err(e.into());
                    }
                    origin_form(&mut req, &uri);
                    match s.try_send_request(req).await {
                        Ok(resp) => {
                            let checkin = Checkin {
                                list: Arc::clone(&self.list),
                                back: Some((key, s)),
                            };
                            return Ok((resp, Some(checkin)));
                        }
                        Err(mut e) => match e.take_message() {
                            Some(mut back) if reused => {
                                *back.uri_mut() = uri.clone();
                                req = back;
                            }
                            _ => return Err(e.into_error().into()),
                        },
                    }
                }
            }
        }
    }

    /// A new connection to `key`: connected, TLS done where the scheme
    /// asks, HTTP/2 where ALPN chose it; its task spawned.
    async fn connect(&self, key: &Key) -> Result<Sender<B>, BoxError> {
        let dst = Uri::builder()
            .scheme(key.scheme.clone())
            .authority(key.authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|e| ConnectError(e.into()))?;
        let io = self
            .connector
            .clone()
            .oneshot(dst)
            .await
            .map_err(|e| ConnectError(e.into()))?;
        let open = Open::new(&self.open);
        if io.connected().is_negotiated_h2() {
            let (sender, conn) = self.h2.handshake(io).await?;
            tokio::spawn(async move {
                let _open = open;
                let _ = conn.await;
            });
            // Shared: listed at once, for the requests that follow —
            // unless another is (concurrent first requests each made one:
            // the extra one closes with its last stream).
            if !self.list.has_h2(key) {
                self.list.checkin(key.clone(), Sender::H2(sender.clone()));
            }
            Ok(Sender::H2(sender))
        } else {
            let (sender, conn) = self.h1.handshake(io).await?;
            tokio::spawn(async move {
                let _open = open;
                let _ = conn.await;
            });
            Ok(Sender::H1(sender))
        }
    }
}

impl<B> IdleList<B> {
    fn lock(&self) -> MutexGuard<'_, State<B>> {
        // A panic while holding it leaves a list, never broken memory.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether an open HTTP/2 connection to `key` is listed.
    fn has_h2(&self, key: &Key) -> bool {
        let s = self.lock();
        s.by_key.get(key).is_some_and(|seqs| {
            seqs.iter().any(|at| {
                s.idle
                    .get(at)
                    .is_some_and(|e| matches!(e.sender, Sender::H2(_)) && !e.sender.is_closed())
            })
        })
    }

    /// The most recently used open connection to `key`, if any: an
    /// HTTP/1.1 one leaves the list; an HTTP/2 one stays, moved to the
    /// back.
    fn checkout(&self, key: &Key) -> Option<Sender<B>> {
        let mut s = self.lock();
        let now = Instant::now();
        self.expire(&mut s, now);
        let State { idle, by_key, seq } = &mut *s;
        let seqs = by_key.get_mut(key)?;
        let mut found = None;
        while let Some(at) = seqs.pop() {
            let Some(entry) = idle.remove(&at) else {
                continue;
            };
            if entry.sender.is_closed() {
                continue;
            }
            match entry.sender {
                Sender::H2(h2) => {
                    *seq += 1;
                    seqs.push(*seq);
                    let again = h2.clone();
                    idle.insert(
                        *seq,
                        Idle {
                            key: entry.key,
                            sender: Sender::H2(h2),
                            since: now,
                        },
                    );
                    found = Some(Sender::H2(again));
                }
                h1 => found = Some(h1),
            }
            break;
        }
        if seqs.is_empty() {
            by_key.remove(key);
        }
        found
    }

    /// Lists a connection as idle (an HTTP/1.1 one whose answer ended, a
    /// new HTTP/2 one), then trims the list to `max_idle`.
    fn checkin(&self, key: Key, sender: Sender<B>) {
        if sender.is_closed() {
            return;
        }
        let mut s = self.lock();
        let now = Instant::now();
        s.seq += 1;
        let at = s.seq;
        s.by_key.entry(key.clone()).or_default().push(at);
        s.idle.insert(
            at,
            Idle {
                key,
                sender,
                since: now,
            },
        );
        self.expire(&mut s, now);
        while s.idle.len() > self.max_idle {
            let Some((at, entry)) = s.idle.pop_first() else {
                break;
            };
            forget(&mut s.by_key, &entry.key, at);
            self.closed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drops the idle connections past `idle_timeout` (the oldest come
    /// first) and closed ones met on the way.
    fn expire(&self, s: &mut State<B>, now: Instant) {
        while let Some(entry) = s.idle.first_entry() {
            let stale = now.saturating_duration_since(entry.get().since) > self.idle_timeout;
            if !stale && !entry.get().sender.is_closed() {
                return;
            }
            let (at, entry) = entry.remove_entry();
            forget(&mut s.by_key, &entry.key, at);
        }
    }
}

/// Removes `at` from `key`'s list.
fn forget(by_key: &mut HashMap<Key, Vec<u64>>, key: &Key, at: u64) {
    if let Some(seqs) = by_key.get_mut(key) {
        seqs.retain(|s| *s != at);
        if seqs.is_empty() {
            by_key.remove(key);
        }
    }
}

/// An HTTP/1.1 request goes out in origin form, with a `Host` header
/// (the client's, or the URI's authority).
fn origin_form<B>(req: &mut Request<B>, uri: &Uri) {
    if !req.headers().contains_key(http::header::HOST) {
        if let Some(host) = uri
            .authority()
            .and_then(|a| HeaderValue::from_str(authority_for_host(a, uri)).ok())
        {
            req.headers_mut().insert(http::header::HOST, host);
        }
    }
    let path = uri
        .path_and_query()
        .filter(|p| p.as_str() != "/")
        .map_or_else(Uri::default, |p| Uri::from(p.clone()));
    *req.uri_mut() = path;
}

/// The `Host` of an authority: without a default port.
fn authority_for_host<'a>(a: &'a Authority, uri: &Uri) -> &'a str {
    let default = match uri.scheme_str() {
        Some("https") => Some(443),
        Some("http") => Some(80),
        _ => None,
    };
    if a.port_u16().is_some() && a.port_u16() == default {
        a.host()
    } else {
        a.as_str()
    }
}

/// An HTTP/1.1 connection in use by one answer: listed idle again once
/// hyper is done with the exchange — whether the answer's body was read
/// to its end or dropped before it (an answer sluice retried or parked:
/// hyper drains a short rest and keeps the connection, or closes it), as
/// hyper-util's pool does.
pub struct Checkin<B: Send + 'static> {
    list: Arc<IdleList<B>>,
    back: Option<(Key, http1::SendRequest<B>)>,
}

impl<B: Send + 'static> std::fmt::Debug for Checkin<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkin")
            .field("key", &self.back.as_ref().map(|(k, _)| k))
            .finish()
    }
}

impl<B: Send + 'static> Checkin<B> {
    /// The answer's body ended: the connection is given back now rather
    /// than when the body is dropped.
    pub fn done(self) {}
}

impl<B: Send + 'static> Drop for Checkin<B> {
    /// Idle at once when hyper is ready for another request; else once it
    /// is (a request body still being sent after an early answer, the rest
    /// of a dropped answer being drained); never if it closes meanwhile.
    fn drop(&mut self) {
        let Some((key, mut sender)) = self.back.take() else {
            return;
        };
        if sender.is_ready() {
            self.list.checkin(key, Sender::H1(sender));
        } else if let (false, Ok(rt)) = (sender.is_closed(), tokio::runtime::Handle::try_current())
        {
            let list = Arc::clone(&self.list);
            rt.spawn(async move {
                if sender.ready().await.is_ok() {
                    list.checkin(key, Sender::H1(sender));
                }
            });
        }
    }
}

/// Counts a connection open while its task runs.
struct Open(Arc<AtomicUsize>);

impl Open {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Open(Arc::clone(count))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether `err` or a cause of it is a failed connect.
pub fn is_connect(err: &(dyn StdError + 'static)) -> bool {
    err.downcast_ref::<ConnectError>().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent_as(uri: &str, host: Option<&str>) -> (String, String) {
        let uri: Uri = uri.parse().unwrap();
        let mut req = Request::get(uri.clone()).body(()).unwrap();
        if let Some(h) = host {
            req.headers_mut()
                .insert(http::header::HOST, HeaderValue::from_str(h).unwrap());
        }
        origin_form(&mut req, &uri);
        (
            req.uri().to_string(),
            req.headers()[http::header::HOST].to_str().unwrap().into(),
        )
    }

    #[test]
    fn http1_requests_go_in_origin_form_with_a_host() {
        assert_eq!(
            sent_as("http://a.test:8080/x?y=1", None),
            ("/x?y=1".into(), "a.test:8080".into())
        );
        assert_eq!(
            sent_as("http://a.test/", None),
            ("/".into(), "a.test".into())
        );
        assert_eq!(
            sent_as("https://a.test:443/p", None),
            ("/p".into(), "a.test".into())
        );
        assert_eq!(
            sent_as("http://a.test:80", None),
            ("/".into(), "a.test".into())
        );
        // The client's own Host stays.
        assert_eq!(
            sent_as("http://127.0.0.1:9/p", Some("named.test")),
            ("/p".into(), "named.test".into())
        );
    }
}
