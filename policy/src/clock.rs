//! The layers' clock: tokio's, read once in each poll of a request.
//!
//! A request's way through its provider's stack reads the time at every
//! layer — its arrival, the request's and the attempt's bounds, parking's
//! and the breaker's admission, the pacer's slot, the bulkhead's stamp —
//! and again at every layer its answer passes: fifteen readings for one
//! request, all within a microsecond of each other, each a call into the
//! vDSO (R-PF1, issue 38: 17.5 ns and some 70 instructions each, where
//! the HTTP stack itself reads the clock four times a request).
//!
//! Wrapped in [`ReadOnce`], a request's future is polled with one reading
//! for the whole poll: taken when a layer first asks ([`now`]), given to
//! every layer after it in that poll, forgotten when the poll returns. A
//! poll is one synchronous run of code — nothing in it waits — so every
//! reading it would have made falls within it; a layer that waits reads
//! afresh when it is polled again. Outside a [`ReadOnce`] (a unit test, a
//! body's end, a background sweep) [`now`] is `Instant::now()`, so tokio's
//! paused clock drives everything in tests as before.

use std::cell::Cell;
use std::future::Future;
use std::num::NonZeroU64;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

/// This thread's reading for the poll under way.
#[derive(Debug, Clone, Copy)]
enum Reading {
    /// No poll of a [`ReadOnce`] under way: every call reads the clock.
    Off,
    /// In a poll, not read yet.
    Due,
    /// In a poll, read at this instant.
    At(Instant),
}

thread_local! {
    static READING: Cell<Reading> = const { Cell::new(Reading::Off) };
}

/// The time: the poll's one reading inside a [`ReadOnce`], the clock
/// otherwise.
pub fn now() -> Instant {
    READING.with(|r| match r.get() {
        Reading::Off => Instant::now(),
        Reading::Due => {
            let at = Instant::now();
            r.set(Reading::At(at));
            at
        }
        Reading::At(at) => at,
    })
}

/// The time since `since`, by [`now`] (none if `since` is later).
pub fn elapsed(since: Instant) -> std::time::Duration {
    now().saturating_duration_since(since)
}

pin_project_lite::pin_project! {
    /// A future polled with one clock reading a poll (see the module's
    /// doc).
    #[derive(Debug)]
    pub struct ReadOnce<F> {
        #[pin]
        inner: F,
    }
}

impl<F> ReadOnce<F> {
    /// `inner`, read once a poll.
    pub fn new(inner: F) -> Self {
        ReadOnce { inner }
    }
}

/// Ends the poll's reading when the poll returns — or unwinds.
struct Ends;

impl Drop for Ends {
    fn drop(&mut self) {
        READING.with(|r| r.set(Reading::Off));
    }
}

impl<F: Future> Future for ReadOnce<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        // Nested in another's poll: that poll's reading serves this one.
        let outer = READING.with(|r| {
            matches!(r.get(), Reading::Off) && {
                r.set(Reading::Due);
                true
            }
        });
        let _ends = outer.then_some(Ends);
        this.inner.poll(cx)
    }
}

/// An instant in one word (R-PF1, issue 38): `Instant` takes two (seconds
/// and nanoseconds), and a taught provider keeps a dozen. Nanoseconds from
/// the process's epoch (its first stamp), offset by 2⁶² so that instants
/// before the epoch fit too (tokio's paused clock starts where it likes)
/// and none is zero: `Option<Stamp>` is one word as well. Exact both ways
/// for 146 years either side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp(NonZeroU64);

/// `d` in nanoseconds, saturating: a `Duration` in one word.
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The epoch's stamp.
const STAMP_EPOCH: u64 = 1 << 62;

/// The process's epoch: the instant of its first stamp.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Stamp {
    /// `at`'s stamp.
    pub fn of(at: Instant) -> Stamp {
        let epoch = epoch();
        let n = if at >= epoch {
            STAMP_EPOCH.saturating_add(nanos(at - epoch))
        } else {
            STAMP_EPOCH.saturating_sub(nanos(epoch - at))
        };
        Stamp(NonZeroU64::new(n).unwrap_or(NonZeroU64::MIN))
    }

    /// The instant stamped.
    pub fn at(self) -> Instant {
        let n = self.0.get();
        if n >= STAMP_EPOCH {
            epoch() + Duration::from_nanos(n - STAMP_EPOCH)
        } else {
            epoch() - Duration::from_nanos(STAMP_EPOCH - n)
        }
    }
}

impl From<Instant> for Stamp {
    fn from(at: Instant) -> Stamp {
        Stamp::of(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Inside a poll every layer reads the same instant, and the clock is
    /// read only if one asks; the next poll reads afresh; outside, each
    /// call reads the clock.
    #[tokio::test(start_paused = true)]
    async fn one_reading_a_poll_and_a_fresh_one_after_a_wait() {
        let outside = now();
        tokio::time::advance(Duration::from_millis(5)).await;
        assert_eq!(
            now() - outside,
            Duration::from_millis(5),
            "outside: the clock"
        );
        let (first, second) = ReadOnce::new(async {
            let a = now();
            // Nested: the outer poll's reading.
            let b = ReadOnce::new(async { now() }).await;
            assert_eq!(a, b);
            tokio::time::sleep(Duration::from_millis(40)).await;
            let c = now();
            assert_eq!(c, now(), "one reading for the whole poll");
            (a, c)
        })
        .await;
        assert_eq!(
            second - first,
            Duration::from_millis(40),
            "read again after the wait"
        );
        assert!(
            matches!(READING.with(Cell::get), Reading::Off),
            "the reading ends with the poll"
        );
    }

    /// A stamp is one word, `None` included, and gives back the instant it
    /// stamped to the nanosecond, before the epoch or after, in order.
    #[test]
    fn a_stamp_is_a_word_and_exact() {
        assert_eq!(std::mem::size_of::<Option<Stamp>>(), 8);
        let t = Instant::now();
        let _ = Stamp::of(t);
        for at in [
            t,
            t + Duration::from_nanos(1),
            t + Duration::from_secs(86_400 * 365),
            t - Duration::from_nanos(7),
            t.checked_sub(Duration::from_secs(3)).unwrap_or(t),
        ] {
            assert_eq!(Stamp::of(at).at(), at);
        }
        let (a, b) = (t - Duration::from_nanos(7), t + Duration::from_nanos(3));
        assert!(Stamp::of(a) < Stamp::of(t) && Stamp::of(t) < Stamp::of(b));
    }
}
