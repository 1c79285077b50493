//! Request framing the proxy refuses to guess at (RFC 9112 §6.1, R-SF3).
//!
//! A request that carries both `Content-Length` and `Transfer-Encoding`
//! is how request smuggling starts: two parsers that pick different
//! lengths see different requests in the same bytes. hyper frames such a
//! request by `Transfer-Encoding`, drops the `Content-Length` while parsing
//! and closes the connection afterwards — so by the time a request reaches
//! sluice's service nothing in it says both were sent. sluice refuses it
//! instead (`400`, then the connection closes), as Envoy and nginx do.
//!
//! [`watch`] wraps a client connection's stream and reads the framing of
//! every HTTP/1 message head as its bytes pass to hyper: the request line
//! and the header names that decide a body's length, then the body's
//! length itself (bytes counted, chunks walked) to find the next head. It
//! keeps one short line at a time, never a body. Anything it does not
//! follow — an upgrade, a `CONNECT`, HTTP/2, a line it cannot read — ends
//! the watch for that connection: hyper, which parses for real, refuses a
//! malformed head itself, and a watch that stopped only ever lets hyper's
//! own handling (frame by `Transfer-Encoding`, then close) stand.
//!
//! The service asks [`Verdicts::next_is_ambiguous`] once per request, in
//! order; hyper serves an HTTP/1 connection's requests one after another,
//! and a head has passed through the watch before hyper can parse it.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The longest line kept while reading a head; longer lines are kept only
/// in part (enough for a header's name) and, for a framing header, end the
/// watch.
const LINE_KEPT: usize = 256;

/// Wraps `io`; the [`Verdicts`] go to the connection's service.
pub fn watch<T>(io: T) -> (Watched<T>, Verdicts) {
    let verdicts = Verdicts(Arc::new(Shared {
        first_ambiguous: AtomicU64::new(u64::MAX),
        asked: AtomicU64::new(0),
    }));
    let watched = Watched {
        inner: io,
        scan: Scan::default(),
        verdicts: verdicts.clone(),
    };
    (watched, verdicts)
}

/// What the watch found, for the connection's service.
#[derive(Clone, Debug)]
pub struct Verdicts(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    /// The index of the first head with both lengths (`u64::MAX`: none).
    first_ambiguous: AtomicU64,
    /// How many requests the service has asked about.
    asked: AtomicU64,
}

impl Verdicts {
    /// Whether the connection's next request (in order) carried both
    /// `Content-Length` and `Transfer-Encoding`. Requests after such a one
    /// are refused as well (hyper closes the connection after it, so none
    /// should come).
    pub fn next_is_ambiguous(&self) -> bool {
        let index = self.0.asked.fetch_add(1, Ordering::Relaxed);
        index >= self.0.first_ambiguous.load(Ordering::Acquire)
    }
}

/// A client stream whose reads are watched for ambiguous framing.
pub struct Watched<T> {
    inner: T,
    scan: Scan,
    verdicts: Verdicts,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if let Some(index) = this.scan.feed(&buf.filled()[before..]) {
                this.verdicts
                    .0
                    .first_ambiguous
                    .fetch_min(index, Ordering::Release);
            }
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Where the watch is in the byte stream.
#[derive(Debug, Default)]
enum State {
    /// Reading a head, line by line.
    #[default]
    Head,
    /// Skipping a body of this many more bytes.
    Body(u64),
    /// Reading a chunk-size line.
    ChunkSize,
    /// Skipping this many more bytes of chunk data.
    ChunkData(u64),
    /// Skipping the line end after a chunk's data.
    ChunkEnd,
    /// Reading trailer lines up to the empty one.
    Trailers,
    /// No longer following the connection.
    Done,
}

/// The framing headers seen so far in the head being read.
#[derive(Debug, Default)]
struct Head {
    started: bool,
    content_length: Option<u64>,
    transfer_encoding: bool,
    chunked_last: bool,
    /// An upgrade, `CONNECT` or HTTP/2: bytes after the head are not ours
    /// to follow.
    leaves_http1: bool,
}

#[derive(Debug, Default)]
struct Scan {
    state: State,
    head: Head,
    /// The current line, up to [`LINE_KEPT`] bytes.
    line: Vec<u8>,
    /// The current line was longer than what was kept.
    line_cut: bool,
    /// How many heads have been read whole.
    heads: u64,
}

impl Scan {
    /// Follows `bytes`; returns the index of a head read in them that had
    /// both lengths.
    fn feed(&mut self, mut bytes: &[u8]) -> Option<u64> {
        let mut found = None;
        while !bytes.is_empty() {
            match self.state {
                State::Done => break,
                State::Body(n) | State::ChunkData(n) => {
                    let take = n.min(bytes.len() as u64);
                    bytes = &bytes[take as usize..];
                    let left = n - take;
                    self.state = match (&self.state, left) {
                        (State::Body(_), 0) => State::Head,
                        (State::Body(_), _) => State::Body(left),
                        (_, 0) => State::ChunkEnd,
                        _ => State::ChunkData(left),
                    };
                }
                State::Head | State::ChunkSize | State::ChunkEnd | State::Trailers => {
                    let Some(end) = memchr::memchr(b'\n', bytes) else {
                        self.keep(bytes);
                        break;
                    };
                    let ended = if self.line.is_empty() && !self.line_cut {
                        // The whole line is in this read (the usual case):
                        // read where it lies, not copied.
                        let line = &bytes[..end];
                        let cut = line.len() > LINE_KEPT;
                        self.line_ended(&line[..line.len().min(LINE_KEPT)], cut)
                    } else {
                        self.keep(&bytes[..end]);
                        let line = std::mem::take(&mut self.line);
                        let ended = self.line_ended(&line, self.line_cut);
                        self.line = line;
                        self.line.clear();
                        ended
                    };
                    if let Some(index) = ended {
                        found.get_or_insert(index);
                    }
                    bytes = &bytes[end + 1..];
                    self.line_cut = false;
                }
            }
        }
        found
    }

    fn keep(&mut self, bytes: &[u8]) {
        let room = LINE_KEPT - self.line.len();
        if bytes.len() > room {
            self.line_cut = true;
        }
        self.line.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// Acts on a whole line (kept up to [`LINE_KEPT`] bytes; `cut` if it
    /// was longer); returns the head's index if it ended with both
    /// lengths.
    fn line_ended(&mut self, line: &[u8], cut: bool) -> Option<u64> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        match self.state {
            State::Head => return self.head_line(line, cut),
            State::ChunkSize => {
                let size = line
                    .split(|&b| b == b';' || b == b' ' || b == b'\t')
                    .next()
                    .and_then(|s| std::str::from_utf8(s).ok())
                    .and_then(|s| u64::from_str_radix(s, 16).ok());
                self.state = match size {
                    _ if cut => State::Done,
                    Some(0) => State::Trailers,
                    Some(n) => State::ChunkData(n),
                    None => State::Done,
                };
            }
            State::ChunkEnd => {
                self.state = if line.is_empty() {
                    State::ChunkSize
                } else {
                    State::Done
                };
            }
            State::Trailers => {
                if line.is_empty() {
                    self.state = State::Head;
                }
            }
            State::Body(_) | State::ChunkData(_) | State::Done => {}
        }
        None
    }

    fn head_line(&mut self, line: &[u8], cut: bool) -> Option<u64> {
        if !self.head.started {
            // Empty lines before a request line are allowed (RFC 9112 §2.2).
            if line.is_empty() {
                return None;
            }
            self.head.started = true;
            let connect = line.starts_with(b"CONNECT ");
            let http2 = line.ends_with(b" HTTP/2.0");
            if connect || http2 || cut {
                self.state = State::Done;
            }
            self.head.leaves_http1 = connect || http2;
            return None;
        }
        if line.is_empty() {
            return self.head_ended();
        }
        // Only `Content-Length`, `Transfer-Encoding` and `Upgrade` matter
        // here: any other line is passed at its first letter, unread (what
        // hyper makes of a malformed one is its own answer).
        if !matches!(line[0].to_ascii_lowercase(), b'c' | b't' | b'u') {
            return None;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            // hyper refuses it; nothing more to follow.
            self.state = State::Done;
            return None;
        };
        let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
        if name.eq_ignore_ascii_case(b"content-length") {
            match std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()) {
                Some(n) if !cut => self.head.content_length = Some(n),
                _ => self.state = State::Done,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if cut {
                self.state = State::Done;
            }
            self.head.transfer_encoding = true;
            let last = value.rsplit(|&b| b == b',').next().map(trim);
            self.head.chunked_last = last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            self.head.leaves_http1 = true;
        }
        None
    }

    fn head_ended(&mut self) -> Option<u64> {
        let head = std::mem::take(&mut self.head);
        let index = self.heads;
        self.heads += 1;
        if head.transfer_encoding && head.content_length.is_some() {
            // hyper closes the connection after this one.
            self.state = State::Done;
            return Some(index);
        }
        self.state = if head.leaves_http1 {
            State::Done
        } else if head.transfer_encoding {
            if head.chunked_last {
                State::ChunkSize
            } else {
                State::Done
            }
        } else {
            match head.content_length {
                Some(n) if n > 0 => State::Body(n),
                _ => State::Head,
            }
        };
        None
    }
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `stream` in pieces of `step` bytes; the heads found ambiguous.
    fn ambiguous(stream: &[u8], step: usize) -> Vec<u64> {
        let mut scan = Scan::default();
        let mut found = Vec::new();
        for piece in stream.chunks(step) {
            found.extend(scan.feed(piece));
        }
        found
    }

    fn every_split(stream: &[u8]) -> Vec<Vec<u64>> {
        (1..=stream.len()).map(|s| ambiguous(stream, s)).collect()
    }

    #[test]
    fn both_lengths_in_either_order_are_found_however_the_bytes_arrive() {
        for head in [
            "POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nTRANSFER-ENCODING:gzip, chunked\r\nContent-Length:0\r\n\r\n",
        ] {
            for found in every_split(head.as_bytes()) {
                assert_eq!(found, vec![0], "{head:?}");
            }
        }
    }

    #[test]
    fn bodies_are_skipped_so_later_heads_are_counted_right() {
        // A fixed body that looks like a head, a chunked body with a chunk
        // that looks like one, then the ambiguous third request.
        let inner = "GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: x\r\n\r\n";
        let chunk = "Transfer-Encoding: chunked\r\n\r\n";
        let stream = format!(
            "POST http://a/ HTTP/1.1\r\nContent-Length: {}\r\n\r\n{inner}\
POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
{:x};ext=1\r\n{chunk}\r\n0\r\nX-Trailer: 1\r\n\r\n\
GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n\
POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            inner.len(),
            chunk.len()
        );
        let stream = stream.as_bytes();
        for found in every_split(stream) {
            assert_eq!(found, vec![3]);
        }
    }

    #[test]
    fn ordinary_requests_are_never_found_ambiguous() {
        let stream = b"\r\nGET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n\
POST http://a/ HTTP/1.1\r\nContent-Length: 2\r\n\r\nok\
POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";
        for found in every_split(stream) {
            assert!(found.is_empty());
        }
    }

    /// A line longer than what is kept: a header that decides no length
    /// is passed over, whether the line arrives whole or in pieces; a
    /// framing header cut short ends the watch.
    #[test]
    fn long_lines_are_kept_in_part_however_they_arrive() {
        let long = "x".repeat(LINE_KEPT * 2);
        let stream = format!(
            "GET http://a/ HTTP/1.1\r\nX-Long: {long}\r\n\r\n\
POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        for found in every_split(stream.as_bytes()) {
            assert_eq!(found, vec![1]);
        }
        let cut = format!(
            "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: {long}, chunked\r\n\r\n\
POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        for found in every_split(cut.as_bytes()) {
            assert!(found.is_empty());
        }
    }

    #[test]
    fn what_the_watch_cannot_follow_ends_it() {
        for stream in [
            // HTTP/2's preface, a tunnel, an upgrade: not HTTP/1 after the head.
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "CONNECT a:443 HTTP/1.1\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            // A bad chunk size: hyper refuses it and closes.
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nPOST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            let mut scan = Scan::default();
            assert_eq!(scan.feed(stream.as_bytes()), None, "{stream:?}");
            assert!(matches!(scan.state, State::Done), "{stream:?}");
        }
    }

    #[test]
    fn verdicts_follow_the_order_of_requests() {
        let (_, verdicts) = watch(());
        verdicts.0.first_ambiguous.store(1, Ordering::Release);
        assert!(!verdicts.next_is_ambiguous());
        assert!(verdicts.next_is_ambiguous());
        assert!(verdicts.next_is_ambiguous());
    }
}
