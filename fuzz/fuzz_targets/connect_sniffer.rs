//! The plaintext-in-CONNECT sniffer: a tunnel's first read is classified
//! (TLS or plain HTTP) and then replayed ahead of the rest through
//! `Prefixed`. Whatever the bytes and however the reads are sized, the
//! classification follows the first byte only and the bytes that come out
//! are exactly the bytes that went in, in order.
#![no_main]

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use libfuzzer_sys::fuzz_target;
use sluice::tunnel::{sniff, Prefixed, Sniffed};
use tokio::io::{AsyncRead, ReadBuf};

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    // The first read's length (≥ 1, as the tunnel only sniffs a read that
    // brought something) and the reader's buffer size.
    let first_len = (usize::from(control & 0x0f) + 1).min(rest.len());
    let buf_len = usize::from(control >> 4) + 1;
    if rest.is_empty() {
        return;
    }
    let (first, tail) = rest.split_at(first_len);
    let verdict = sniff(first);
    assert_eq!(verdict == Sniffed::Tls, first[0] == 0x16);
    assert_eq!(verdict, sniff(&rest[..1]), "decided by the first byte alone");

    let mut replay = Prefixed::new(first.to_vec(), tail);
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = Vec::with_capacity(rest.len());
    let mut space = vec![0u8; buf_len];
    loop {
        let mut buf = ReadBuf::new(&mut space);
        match Pin::new(&mut replay).poll_read(&mut cx, &mut buf) {
            Poll::Ready(Ok(())) if buf.filled().is_empty() => break,
            Poll::Ready(Ok(())) => out.extend_from_slice(buf.filled()),
            other => panic!("a slice reader returned {other:?}"),
        }
    }
    assert_eq!(out, rest);
});
