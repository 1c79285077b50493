//! A bound on idle pooled upstream connections (R-PF1, R-HU2).
//!
//! hyper-util's pool keeps every connection it made until its idle
//! timeout, per destination and with no total: one `GET` to each of
//! 10,000 hosts left 10,000 idle connections behind, 25.6 KiB per host
//! (issue 38). Here every connection the pooled client makes is
//! registered under its pool key (scheme and authority), and every
//! request is *in flight* on its key from the call until its answer's
//! body ends or is dropped. A key with nothing in flight holds only idle
//! connections. Beyond [`IdleCap`]'s bound on open connections, the keys
//! that went idle longest ago lose theirs first: a closed connection's
//! reads end (EOF), so hyper drops it from its pool and its buffers and
//! socket are given back at once.
//!
//! Keys with a request in flight are never touched: a connection waiting
//! for a slow answer has no traffic either, and only the key's count
//! tells the two apart. A request that checks out a connection in the
//! instant it is closed meets what every client meets when a server
//! closes an idle connection: hyper retries a request it had not begun
//! to send on a new connection.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;
use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use tower::Service;

/// Open upstream connections kept by default: a sidecar's few providers,
/// each with a busy pool, stay under it; a broad crawl's thousands of
/// hosts are cut to it (at ~20 KiB each, 5 MiB at most).
pub const DEFAULT_MAX_IDLE: usize = 256;

/// The registry of open pooled connections and in-flight requests, by
/// pool key. Shared by the connector (connections) and the client
/// (requests).
#[derive(Debug)]
pub struct IdleCap {
    max: usize,
    state: Mutex<State>,
    /// Connections closed for the bound, since start.
    closed: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    keys: HashMap<u64, Key>,
    /// Keys with connections and nothing in flight, by when they went
    /// idle (a sequence number): the first is the least recently used.
    idle: BTreeMap<u64, u64>,
    seq: u64,
    /// Connections registered and neither closed nor dropped.
    open: usize,
}

#[derive(Debug, Default)]
struct Key {
    in_flight: u32,
    /// Its place in `idle`, when it is there.
    idle_since: Option<u64>,
    conns: Vec<Arc<Mark>>,
}

/// One connection's switch: set, its reads end.
#[derive(Debug, Default)]
struct Mark {
    closed: AtomicBool,
    reader: AtomicWaker,
}

impl Mark {
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.reader.wake();
    }
}

/// The pool key of a request or a connector's destination: a hash of
/// scheme and authority, as hyper-util keys its pool. Two keys that
/// collide only share a count (fewer closes, never a wrong one).
pub fn key_of(uri: &Uri) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    uri.scheme_str().unwrap_or("").hash(&mut h);
    uri.authority().map_or("", |a| a.as_str()).hash(&mut h);
    h.finish()
}

impl IdleCap {
    /// At most `max` open connections once their keys are idle.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(IdleCap {
            max,
            state: Mutex::default(),
            closed: AtomicU64::new(0),
        })
    }

    /// Open connections now (idle or in use).
    pub fn open(&self) -> usize {
        self.lock().open
    }

    /// Connections closed for the bound since start.
    pub fn closed(&self) -> u64 {
        self.closed.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding it leaves counts, never broken memory.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request on `key` begins; it ends when the token drops.
    pub fn begin(self: &Arc<Self>, key: u64) -> InUse {
        let mut s = self.lock();
        let k = s.keys.entry(key).or_default();
        k.in_flight += 1;
        if let Some(seq) = k.idle_since.take() {
            s.idle.remove(&seq);
        }
        InUse {
            cap: Arc::clone(self),
            key,
        }
    }

    fn end(&self, key: u64) {
        let mut s = self.lock();
        let State {
            keys, idle, seq, ..
        } = &mut *s;
        let Some(k) = keys.get_mut(&key) else { return };
        k.in_flight = k.in_flight.saturating_sub(1);
        if k.in_flight > 0 {
            return;
        }
        if k.conns.is_empty() {
            keys.remove(&key);
            return;
        }
        *seq += 1;
        k.idle_since = Some(*seq);
        idle.insert(*seq, key);
        self.trim(&mut s);
    }

    fn opened(&self, key: u64) -> Arc<Mark> {
        let mark = Arc::new(Mark::default());
        let mut s = self.lock();
        let State {
            keys,
            idle,
            seq,
            open,
        } = &mut *s;
        let k = keys.entry(key).or_default();
        k.conns.push(Arc::clone(&mark));
        *open += 1;
        // A connection made while nothing is in flight (hyper finishes a
        // connect its request no longer waits for) is idle from the start.
        if k.in_flight == 0 && k.idle_since.is_none() {
            *seq += 1;
            k.idle_since = Some(*seq);
            idle.insert(*seq, key);
        }
        self.trim(&mut s);
        mark
    }

    fn dropped(&self, key: u64, mark: &Arc<Mark>) {
        let mut s = self.lock();
        let State {
            keys, idle, open, ..
        } = &mut *s;
        let Some(k) = keys.get_mut(&key) else { return };
        let Some(at) = k.conns.iter().position(|m| Arc::ptr_eq(m, mark)) else {
            return; // closed for the bound: already uncounted
        };
        k.conns.swap_remove(at);
        *open -= 1;
        if k.conns.is_empty() && k.in_flight == 0 {
            if let Some(seq) = k.idle_since {
                idle.remove(&seq);
            }
            keys.remove(&key);
        }
    }

    /// Closes the least recently used idle keys' connections while more
    /// than `max` are open.
    fn trim(&self, s: &mut State) {
        while s.open > self.max {
            let Some((_, key)) = s.idle.pop_first() else {
                return; // everything left is in use
            };
            if let Some(k) = s.keys.remove(&key) {
                s.open -= k.conns.len();
                self.closed
                    .fetch_add(k.conns.len() as u64, Ordering::Relaxed);
                for m in &k.conns {
                    m.close();
                }
            }
        }
    }
}

/// A request in flight on its pool key; its drop ends it.
#[derive(Debug)]
pub struct InUse {
    cap: Arc<IdleCap>,
    key: u64,
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.cap.end(self.key);
    }
}

/// A connector whose connections are registered with an [`IdleCap`].
#[derive(Debug, Clone)]
pub struct Tracking<C> {
    inner: C,
    cap: Arc<IdleCap>,
}

impl<C> Tracking<C> {
    /// `inner`'s connections, registered with `cap`.
    pub fn new(inner: C, cap: Arc<IdleCap>) -> Self {
        Tracking { inner, cap }
    }
}

impl<C> Service<Uri> for Tracking<C>
where
    C: Service<Uri>,
    C::Future: Send + 'static,
{
    type Response = Tracked<C::Response>;
    type Error = C::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, C::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), C::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let key = key_of(&uri);
        let cap = Arc::clone(&self.cap);
        let fut = self.inner.call(uri);
        Box::pin(async move {
            let io = fut.await?;
            let mark = cap.opened(key);
            Ok(Tracked { io, cap, key, mark })
        })
    }
}

/// A registered connection: its reads end once it is closed for the
/// bound; its drop unregisters it.
#[derive(Debug)]
pub struct Tracked<T> {
    io: T,
    cap: Arc<IdleCap>,
    key: u64,
    mark: Arc<Mark>,
}

impl<T> Drop for Tracked<T> {
    fn drop(&mut self) {
        self.cap.dropped(self.key, &self.mark);
    }
}

impl<T: Connection> Connection for Tracked<T> {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

impl<T: Read + Unpin> Read for Tracked<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.mark.closed.load(Ordering::Acquire) {
            return Poll::Ready(Ok(())); // EOF: nothing read
        }
        this.mark.reader.register(cx.waker());
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending if this.mark.closed.load(Ordering::Acquire) => Poll::Ready(Ok(())),
            other => other,
        }
    }
}

impl<T: Write + Unpin> Write for Tracked<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn the_least_recently_idle_keys_lose_their_connections_first() {
        let cap = IdleCap::new(2);
        let (a, b, c) = (
            key_of(&uri("http://a.test")),
            key_of(&uri("http://b.test")),
            key_of(&uri("https://a.test")),
        );
        assert_ne!(a, c, "the scheme is part of the key");
        let ra = cap.begin(a);
        let ma = cap.opened(a);
        let rb = cap.begin(b);
        let mb = cap.opened(b);
        drop(ra); // a idle first
        drop(rb);
        assert_eq!(cap.open(), 2);
        let rc = cap.begin(c);
        let mc = cap.opened(c);
        assert!(ma.closed.load(Ordering::Relaxed), "a went idle first");
        assert!(!mb.closed.load(Ordering::Relaxed));
        assert!(!mc.closed.load(Ordering::Relaxed), "c is in use");
        assert_eq!((cap.open(), cap.closed()), (2, 1));
        // A closed connection's drop is not counted twice.
        cap.dropped(a, &ma);
        assert_eq!(cap.open(), 2);
        drop(rc);
        cap.dropped(c, &mc);
        cap.dropped(b, &mb);
        assert_eq!(cap.open(), 0);
        assert!(cap.lock().keys.is_empty() && cap.lock().idle.is_empty());
    }

    #[test]
    fn keys_in_use_are_never_closed() {
        let cap = IdleCap::new(1);
        let a = key_of(&uri("http://a.test"));
        let b = key_of(&uri("http://b.test"));
        let _ra = cap.begin(a);
        let ma = cap.opened(a);
        let rb = cap.begin(b);
        let mb = cap.opened(b);
        assert_eq!(cap.open(), 2, "over the bound while both are in use");
        assert!(!ma.closed.load(Ordering::Relaxed) && !mb.closed.load(Ordering::Relaxed));
        drop(rb); // b goes idle: the bound applies to it at once
        assert!(mb.closed.load(Ordering::Relaxed));
        assert!(!ma.closed.load(Ordering::Relaxed));
        assert_eq!(cap.open(), 1);
    }
}
