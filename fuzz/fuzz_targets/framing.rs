//! The HTTP/1 framing watcher (Content-Length with Transfer-Encoding) over
//! arbitrary client bytes, delivered in arbitrary pieces: never panics,
//! and what it finds does not depend on how the bytes were split across
//! reads.
#![no_main]

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, ReadBuf};

/// Bytes handed out `sizes` at a time (cycling).
struct Pieces<'a> {
    bytes: &'a [u8],
    sizes: &'a [u8],
    n: usize,
}

impl AsyncRead for Pieces<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let size = match self.sizes.len() {
            0 => self.bytes.len(),
            k => usize::from(self.sizes[self.n % k]).max(1),
        };
        let take = size.min(self.bytes.len()).min(buf.remaining());
        buf.put_slice(&self.bytes[..take]);
        self.bytes = &self.bytes[take..];
        self.n += 1;
        Poll::Ready(Ok(()))
    }
}

/// Reads everything through the watcher; the verdicts of the first heads.
fn verdicts(bytes: &[u8], sizes: &[u8]) -> Vec<bool> {
    let (mut watched, verdicts) = sluice::http::framing::watch(Pieces { bytes, sizes, n: 0 });
    let mut cx = Context::from_waker(Waker::noop());
    let mut space = [0u8; 4096];
    loop {
        let mut buf = ReadBuf::new(&mut space);
        match Pin::new(&mut watched).poll_read(&mut cx, &mut buf) {
            Poll::Ready(Ok(())) if buf.filled().is_empty() => break,
            Poll::Ready(Ok(())) => {}
            _ => break,
        }
    }
    (0..8).map(|_| verdicts.next_is_ambiguous()).collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let cut = usize::from(split).min(rest.len()).min(16);
    let (sizes, bytes) = rest.split_at(cut);
    assert_eq!(
        verdicts(bytes, &[]),
        verdicts(bytes, sizes),
        "split: {sizes:?}"
    );
});
