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
//! * the [`READY_IDLE`] most recently used idle HTTP/1.1 connections stay
//!   ready, hyper's dispatcher running; older ones *rest*: hyper lets go
//!   of the socket (`poll_without_shutdown`), and its buffers, channel
//!   and task go — the socket (with its TLS session) waits alone, and the
//!   request that takes it again starts a new dispatcher on it. 10,000
//!   idle connections held ~26 KiB each ready, ~1 KiB resting;
//! * HTTP/2 connections count among the ready ones: one pushed past the
//!   [`READY_IDLE`] most recently used is closed once its streams end
//!   (~60 KiB each open; a bare socket cannot answer the server's PINGs
//!   and SETTINGS, so none rests);
//! * one idle past `idle_timeout`, or closed by the server, is dropped
//!   when the pool is next touched (a resting one when it is taken);
//! * a request that met a reused connection closing before it was sent
//!   is sent again on another (what every client does when a server
//!   closes an idle connection).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::error::Error as StdError;
use std::future::poll_fn;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::time::Instant;

use http::uri::{Authority, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use http_body::Body;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper::rt::{Read, ReadBuf, Write};
use hyper_util::client::legacy::connect::Connection;
use hyper_util::rt::TokioExecutor;
use sluice_policy::BoxError;
use tower::{Service, ServiceExt};

/// Idle upstream connections kept by default: a sidecar's few providers,
/// each with a busy pool, stay under it; a broad crawl's thousands of
/// hosts are cut to it.
pub const DEFAULT_MAX_IDLE: usize = 256;

/// Connections kept ready (hyper's dispatcher running, its buffers and
/// channel held): the most recently used ones, what a busy provider's
/// next requests take. Beyond, an idle HTTP/1.1 one rests as its bare
/// socket; an HTTP/2 one is closed once its streams end.
pub const READY_IDLE: usize = 32;

/// Each destination's entries, most recent last: hashed with foldhash
/// (seeded per process), not SipHash — a request looks its key up three
/// times (R-PF1, issue 38).
type KeyMap = HashMap<Key, Vec<u64>, foldhash::fast::RandomState>;

/// What a pooled connection is reached by: scheme and authority.
#[derive(Debug, Clone)]
struct Key {
    scheme: Scheme,
    authority: Authority,
}

/// Compared as bytes — not letter by letter without case, as
/// `Authority`'s own equality: every key is lower case ([`Key::of`]), and
/// a request's checkout, return and look-up compare its key three times
/// (R-PF1, issue 38).
impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.authority.as_str() == other.authority.as_str() && self.scheme == other.scheme
    }
}

impl Eq for Key {}

/// Hashed as two writes of its bytes — not a write a byte, as
/// `Authority`'s own (case-folding) hash makes: a request's checkout,
/// return and look-up hash its key three times (R-PF1, issue 38). Every
/// key is lower case ([`Key::of`]), so equal keys hash alike.
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.scheme.as_str().as_bytes());
        state.write_u8(0xff);
        state.write(self.authority.as_str().as_bytes());
    }
}

impl Key {
    /// The key of a request to `uri`, if absolute: lower case (an upper
    /// case letter is rare, and folded here once).
    fn of(uri: &Uri) -> Option<Key> {
        let (scheme, authority) = (uri.scheme()?, uri.authority()?);
        let lower = |s: &str| !s.bytes().any(|b| b.is_ascii_uppercase());
        Some(Key {
            scheme: if lower(scheme.as_str()) {
                scheme.clone()
            } else {
                scheme.as_str().to_ascii_lowercase().parse().ok()?
            },
            authority: if lower(authority.as_str()) {
                authority.clone()
            } else {
                authority.as_str().to_ascii_lowercase().parse().ok()?
            },
        })
    }

    /// The key with its own bytes: a request's authority shares the
    /// buffer its head was read into (8 KiB), which a connection's key
    /// would keep for as long as the connection is pooled.
    fn owned(&self) -> Key {
        Key {
            scheme: self.scheme.clone(),
            authority: Authority::try_from(self.authority.as_str().as_bytes())
                .unwrap_or_else(|_| self.authority.clone()),
        }
    }
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

/// An open connection's handle for requests.
enum Sender<B> {
    H1(H1<B>),
    H2(http2::SendRequest<B>),
}

impl<B> Sender<B> {
    fn is_closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.send.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }
}

/// An HTTP/1.1 connection with its dispatcher running: hyper's handle, and
/// where the connection's task learns, once the handle is dropped, that
/// it is to rest (its place in the idle list and since when) rather than
/// close.
struct H1<B> {
    /// Its destination, with its own bytes ([`Key::owned`]).
    key: Key,
    send: http1::SendRequest<B>,
    rest: Arc<OnceLock<(u64, Instant)>>,
}

/// What a resting connection keeps: the socket (and TLS session) alone.
pub trait Io: Read + Write + Unpin + Send + 'static {}

impl<T: Read + Write + Unpin + Send + 'static> Io for T {}

/// A connector's connection, set to rest: boxed as the least that
/// carries it.
pub trait Rest: Io + Sized {
    /// The connection as a resting one keeps it.
    fn rest(self) -> Box<dyn Io> {
        Box::new(self)
    }
}

/// hyper-rustls' connection is an enum as large as its TLS variant
/// (~1.1 KB): a plain one rests as its socket alone.
impl<T: Io> Rest for hyper_rustls::MaybeHttpsStream<T> {
    fn rest(self) -> Box<dyn Io> {
        match self {
            hyper_rustls::MaybeHttpsStream::Http(io) => Box::new(io),
            hyper_rustls::MaybeHttpsStream::Https(tls) => Box::new(tls),
        }
    }
}

/// An idle HTTP/1.1 connection at rest: no dispatcher, no buffers.
struct Resting {
    io: Box<dyn Io>,
    open: Open,
}

/// A listed connection: ready to send on, or resting.
enum Entry<B> {
    Ready(Sender<B>),
    Resting(Resting),
}

impl<B> Entry<B> {
    /// Closed as far as can be seen without reading: a resting one is
    /// looked at when taken.
    fn is_closed(&self) -> bool {
        match self {
            Entry::Ready(s) => s.is_closed(),
            Entry::Resting(_) => false,
        }
    }
}

struct Idle<B> {
    key: Key,
    entry: Entry<B>,
    since: Instant,
}

struct State<B> {
    /// Idle connections (and open HTTP/2 ones) by when they were last
    /// used, a sequence number: the first is the least recently used.
    idle: BTreeMap<u64, Idle<B>>,
    /// Each destination's entries in `idle`, most recent last.
    by_key: KeyMap,
    /// The ready entries of `idle`, oldest first: beyond [`READY_IDLE`],
    /// the oldest rests (HTTP/1.1) or is closed (HTTP/2).
    ready: VecDeque<u64>,
    /// Resting entries in `idle`.
    resting: usize,
    /// Destinations in `by_key` with no entry now (see [`State::forget`]).
    emptied: usize,
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

/// What the pool holds, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connections {
    /// Open now: in use, idle or resting.
    pub open: usize,
    /// Idle HTTP/1.1 ones resting (their socket alone).
    pub resting: usize,
    /// Idle ones dropped for the bound, since start.
    pub idle_closed: u64,
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
    C::Response: Rest + Connection,
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
                    by_key: KeyMap::default(),
                    ready: VecDeque::new(),
                    resting: 0,
                    emptied: 0,
                    seq: 0,
                }),
                closed: AtomicU64::new(0),
            }),
            open: Arc::default(),
        })
    }

    /// Connections open now, resting, and dropped for the bound.
    pub fn connections(&self) -> Connections {
        Connections {
            open: self.open.load(Ordering::Relaxed),
            resting: self.list.lock().resting,
            idle_closed: self.list.closed.load(Ordering::Relaxed),
        }
    }

    /// Sends `req` (absolute-form) on an idle connection to its
    /// destination, or a new one. Its answer's body gives an HTTP/1.1
    /// connection back when it ends ([`Checkin`]).
    pub async fn send(
        self: &Arc<Self>,
        mut req: Request<B>,
    ) -> Result<(Response<Incoming>, Option<Checkin<B>>), BoxError> {
        let uri = req.uri().clone();
        let Some(key) = Key::of(&uri) else {
            return Err(NotAbsolute.into());
        };
        loop {
            // A new or resting connection's handshake is boxed: its
            // future is kilobytes (the connector's, TLS's), which every
            // request on a ready connection — the common case — would
            // otherwise carry and copy (R-PF1).
            let (sender, reused) = match self.list.checkout(&key) {
                Some((_, Entry::Ready(sender))) => (sender, true),
                Some((key, Entry::Resting(resting))) => {
                    match Box::pin(self.wake(key, resting)).await {
                        Some(sender) => (sender, true),
                        None => continue, // closed while resting: another
                    }
                }
                None => (Box::pin(self.connect(&key)).await?, false),
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
                    if let Err(e) = s.send.ready().await {
                        if reused {
                            continue;
                        }
                        return Err(e.into());
                    }
                    origin_form(&mut req, &uri);
                    match s.send.try_send_request(req).await {
                        Ok(resp) => {
                            let checkin = Checkin {
                                list: Arc::clone(&self.list),
                                back: Some(s),
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
        let key = &key.owned();
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
            let (send, conn) = self.h1.handshake(io).await?;
            Ok(Sender::H1(self.run_h1(
                key.clone(),
                send,
                conn,
                open,
                Rest::rest,
            )))
        }
    }

    /// A resting connection taken again: a new dispatcher on its socket —
    /// unless the server closed it meanwhile (or sent what nobody asked
    /// for), when it is dropped.
    async fn wake(&self, key: Key, mut resting: Resting) -> Option<Sender<B>> {
        if !still_open(&mut resting.io) {
            return None;
        }
        let (send, conn) = self.h1.handshake(resting.io).await.ok()?;
        Some(Sender::H1(self.run_h1(
            key,
            send,
            conn,
            resting.open,
            |io| io,
        )))
    }

    /// Spawns an HTTP/1.1 connection's task: it runs hyper's dispatcher
    /// until the connection closes or its handle is dropped; a handle
    /// dropped to rest ([`IdleList::rest_oldest`]) has its socket listed
    /// again, resting, in the place it had — once a look at it (with a
    /// waker that does nothing, so that the socket no longer holds this
    /// ended task's) finds it open.
    fn run_h1<T: Read + Write + Unpin + Send + 'static>(
        &self,
        key: Key,
        send: http1::SendRequest<B>,
        mut conn: http1::Connection<T, B>,
        open: Open,
        boxed: fn(T) -> Box<dyn Io>,
    ) -> H1<B> {
        let rest = Arc::new(OnceLock::new());
        let (list, told) = (Arc::downgrade(&self.list), Arc::clone(&rest));
        let listed = key.clone();
        tokio::spawn(async move {
            if poll_fn(|cx| conn.poll_without_shutdown(cx)).await.is_err() {
                return;
            }
            let parts = conn.into_parts();
            let mut io = boxed(parts.io);
            match (told.get(), list.upgrade()) {
                (Some(&(at, since)), Some(list))
                    if parts.read_buf.is_empty() && still_open(&mut io) =>
                {
                    list.lay_down(listed, at, since, Resting { io, open });
                }
                _ => {
                    let _ = poll_fn(|cx| Pin::new(&mut io).poll_shutdown(cx)).await;
                }
            }
        });
        H1 { key, send, rest }
    }
}

/// Whether a resting socket is still open: nothing to read yet. The
/// server's close (or bytes an idle HTTP/1.1 connection should never
/// get) makes it unusable.
fn still_open(io: &mut Box<dyn Io>) -> bool {
    let mut byte = [MaybeUninit::uninit(); 1];
    let mut buf = ReadBuf::uninit(&mut byte);
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(io).poll_read(&mut cx, buf.unfilled()).is_pending()
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
                s.idle.get(at).is_some_and(|e| {
                    matches!(e.entry, Entry::Ready(Sender::H2(_))) && !e.entry.is_closed()
                })
            })
        })
    }

    /// The most recently used open connection to `key`, if any: an
    /// HTTP/1.1 one (ready or resting) leaves the list; an HTTP/2 one
    /// stays, moved to the back.
    fn checkout(&self, key: &Key) -> Option<(Key, Entry<B>)> {
        let mut s = self.lock();
        let now = sluice_policy::clock::now();
        self.expire(&mut s, now);
        loop {
            let at = *s.by_key.get(key)?.last()?;
            let Some(idle) = s.take(at) else {
                s.forget(key, at);
                continue;
            };
            if idle.entry.is_closed() {
                continue;
            }
            return match idle.entry {
                Entry::Ready(Sender::H2(h2)) => {
                    let again = h2.clone();
                    s.seq += 1;
                    let at = s.seq;
                    let entry = Entry::Ready(Sender::H2(h2));
                    let key = idle.key.clone();
                    s.put(
                        at,
                        Idle {
                            key: idle.key,
                            entry,
                            since: now,
                        },
                    );
                    Some((key, Entry::Ready(Sender::H2(again))))
                }
                entry => Some((idle.key, entry)),
            };
        }
    }

    /// Lists a connection as idle (an HTTP/1.1 one whose answer ended, a
    /// new HTTP/2 one), then trims the list to `max_idle` and the ready
    /// ones to [`READY_IDLE`].
    fn checkin(&self, key: Key, sender: Sender<B>) {
        if sender.is_closed() {
            return;
        }
        let mut s = self.lock();
        let now = sluice_policy::clock::now();
        s.seq += 1;
        let at = s.seq;
        let entry = Entry::Ready(sender);
        s.put(
            at,
            Idle {
                key,
                entry,
                since: now,
            },
        );
        self.expire(&mut s, now);
        self.trim(&mut s);
        self.rest_oldest(&mut s);
    }

    /// Beyond [`READY_IDLE`] ready connections, the oldest rest: each
    /// leaves the list with its place and age told to its task, and its
    /// handle dropped — hyper's dispatcher ends, and the task lists the
    /// socket again ([`IdleList::lay_down`]). An HTTP/2 one cannot rest:
    /// the list's handle dropped, it closes once the requests still on it
    /// end (counted as closed for the bound).
    fn rest_oldest(&self, s: &mut State<B>) {
        while s.ready.len() > READY_IDLE {
            let Some(at) = s.ready.pop_front() else {
                return;
            };
            // Off `ready` already: `take` finds it there no more.
            if let Some(idle) = s.take(at) {
                match idle.entry {
                    Entry::Ready(Sender::H1(h1)) => {
                        let _ = h1.rest.set((at, idle.since));
                    }
                    Entry::Ready(Sender::H2(_)) => {
                        self.closed.fetch_add(1, Ordering::Relaxed);
                    }
                    Entry::Resting(_) => {}
                }
            }
        }
    }

    /// A connection sent to rest comes back as its socket alone, in the
    /// place (and with the age) it had.
    fn lay_down(&self, key: Key, at: u64, since: Instant, resting: Resting) {
        let mut s = self.lock();
        let entry = Entry::Resting(resting);
        s.put(at, Idle { key, entry, since });
        self.expire(&mut s, Instant::now());
        self.trim(&mut s);
    }

    /// Beyond `max_idle`, the one idle longest is dropped.
    fn trim(&self, s: &mut State<B>) {
        while s.idle.len() > self.max_idle {
            let Some(&at) = s.idle.keys().next() else {
                return;
            };
            s.take(at);
            self.closed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drops the idle connections past `idle_timeout` (the oldest come
    /// first) and closed ones met on the way.
    fn expire(&self, s: &mut State<B>, now: Instant) {
        while let Some((&at, first)) = s.idle.first_key_value() {
            let stale = now.saturating_duration_since(first.since) > self.idle_timeout;
            if !stale && !first.entry.is_closed() {
                return;
            }
            s.take(at);
        }
    }
}

impl<B> State<B> {
    /// Lists `idle` at `at`, in order among its destination's entries
    /// (and the ready ones).
    fn put(&mut self, at: u64, idle: Idle<B>) {
        // Its destination's list is usually there (kept empty while its
        // one connection is in use): found without a copy of the key.
        let seqs = match self.by_key.get_mut(&idle.key) {
            Some(seqs) => {
                if seqs.is_empty() {
                    self.emptied -= 1;
                }
                seqs
            }
            None => self.by_key.entry(idle.key.clone()).or_default(),
        };
        seqs.insert(seqs.partition_point(|s| *s < at), at);
        match idle.entry {
            Entry::Ready(_) => {
                let ready = &mut self.ready;
                ready.insert(ready.partition_point(|s| *s < at), at);
            }
            Entry::Resting(_) => self.resting += 1,
        }
        self.idle.insert(at, idle);
    }

    /// Removes `at` from `key`'s list (in order, most recent last). An
    /// emptied list stays, for the connection's return (a request on one
    /// connection would otherwise drop and make its destination's list
    /// each time: R-PF1, issue 38) — until emptied lists are most of
    /// them, when they all go: a broad crawl's destinations leave at most
    /// as many behind as are listed, and the sweep's cost is shared by
    /// the lists it drops.
    fn forget(&mut self, key: &Key, at: u64) {
        let Some(seqs) = self.by_key.get_mut(key) else {
            return;
        };
        if let Ok(i) = seqs.binary_search(&at) {
            seqs.remove(i);
            if seqs.is_empty() {
                self.emptied += 1;
            }
        }
        if self.emptied > EMPTY_KEPT && 2 * self.emptied > self.by_key.len() {
            self.by_key.retain(|_, s| !s.is_empty());
            self.emptied = 0;
        }
    }

    /// Takes the entry at `at` out of the list.
    fn take(&mut self, at: u64) -> Option<Idle<B>> {
        let idle = self.idle.remove(&at)?;
        self.forget(&idle.key, at);
        match idle.entry {
            Entry::Ready(_) => {
                if let Ok(i) = self.ready.binary_search(&at) {
                    self.ready.remove(i);
                }
            }
            Entry::Resting(_) => self.resting -= 1,
        }
        Some(idle)
    }
}

/// Emptied destinations' lists kept at least (see [`State::forget`]).
const EMPTY_KEPT: usize = 64;

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
    default
        .and_then(|port| crate::config::without_port(a.as_str(), port))
        .unwrap_or(a.as_str())
}

/// An HTTP/1.1 connection in use by one answer: listed idle again once
/// hyper is done with the exchange — whether the answer's body was read
/// to its end or dropped before it (an answer sluice retried or parked:
/// hyper drains a short rest and keeps the connection, or closes it), as
/// hyper-util's pool does.
pub struct Checkin<B: Send + 'static> {
    list: Arc<IdleList<B>>,
    back: Option<H1<B>>,
}

impl<B: Send + 'static> std::fmt::Debug for Checkin<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkin")
            .field("key", &self.back.as_ref().map(|h1| &h1.key))
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
        let Some(mut h1) = self.back.take() else {
            return;
        };
        if h1.send.is_ready() {
            self.list.checkin(h1.key.clone(), Sender::H1(h1));
        } else if let (false, Ok(rt)) = (h1.send.is_closed(), tokio::runtime::Handle::try_current())
        {
            let list = Arc::clone(&self.list);
            rt.spawn(async move {
                if h1.send.ready().await.is_ok() {
                    list.checkin(h1.key.clone(), Sender::H1(h1));
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

    /// A request's key is folded to lower case, so that keys compared and
    /// hashed as bytes still meet in any case: `HOST.test` and
    /// `host.test` reach one pooled connection.
    #[test]
    fn keys_equal_in_any_case_hash_alike() {
        use std::hash::BuildHasher;
        let key = |scheme: &str, authority: &str| {
            Key::of(&format!("{scheme}://{authority}/").parse().unwrap()).unwrap()
        };
        let hasher = std::collections::hash_map::RandomState::new();
        let (a, b) = (key("HTTP", "Host.TEST:8080"), key("http", "host.test:8080"));
        assert_eq!(a, b);
        assert_eq!(hasher.hash_one(&a), hasher.hash_one(&b));
        let c = key("https", "host.test:8080");
        assert_ne!(a, c);
        assert_ne!(hasher.hash_one(&a), hasher.hash_one(&c));
    }

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
