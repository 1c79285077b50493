//! Invariants that must hold for every input (STYLE: property tests).
//!
//! R-AI2: the rate never exceeds the ceiling, whatever the outcomes.
//! R-AI3: a cold start is below the ceiling.
//! R-AI4: no error outcome ever shortens the delay. (A client error such as
//! a 404 is not one: it is the provider answering normally, a clean answer
//! for the rate — issue 8 — and it is held to its own property: it never
//! cuts the rate.)
//! (R-GC1, no burst after idle, is proven in `pacer::gcra`; R-RN3, a budget
//! stop never touching pacer or breaker, in `layers.rs`.)

use std::time::Duration;

use proptest::prelude::*;
use sluice_policy::pacer::PacerCore;
use sluice_policy::{Outcome, ProviderSettings};
use tokio::time::Instant;

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        4 => Just(Outcome::Success),
        1 => (prop_oneof![Just(429u16), Just(503)], proptest::option::of(0u64..120))
            .prop_map(|(status, ra)| Outcome::Throttled {
                status,
                retry_after: ra.map(Duration::from_secs),
            }),
        1 => (500u16..600).prop_filter("not 503", |s| *s != 503)
            .prop_map(|status| Outcome::ServerError { status }),
        1 => (400u16..500).prop_filter("not 408/429", |s| *s != 408 && *s != 429)
            .prop_map(|status| Outcome::ClientError { status }),
        1 => Just(Outcome::Timeout),
        1 => Just(Outcome::ConnectError { retryable: true }),
    ]
}

fn error_outcome() -> impl Strategy<Value = Outcome> {
    outcome().prop_filter("an error", |o| {
        !matches!(o, Outcome::Success | Outcome::ClientError { .. })
    })
}

/// One step of history: time passes, a request is admitted (if it may go),
/// and an outcome for a request sent `lag` ago arrives.
#[derive(Debug, Clone)]
struct Step {
    gap_ms: u64,
    lag_ms: u64,
    ttfb_ms: u64,
    outcome: Outcome,
}

fn step() -> impl Strategy<Value = Step> {
    (0u64..3_000, 0u64..2_000, 1u64..5_000, outcome()).prop_map(
        |(gap_ms, lag_ms, ttfb_ms, outcome)| Step {
            gap_ms,
            lag_ms,
            ttfb_ms,
            outcome,
        },
    )
}

fn settings() -> impl Strategy<Value = ProviderSettings> {
    (0.01f64..1_000.0, 1u32..10, 0.1f64..0.95).prop_map(|(ceiling, burst, beta)| {
        let mut s = ProviderSettings::with_ceiling(ceiling);
        s.burst = burst;
        s.decrease_factor = beta;
        s.max_queue_len = 1_000_000;
        s.max_queue_wait = Duration::from_secs(100_000);
        s
    })
}

/// Drives a core through `history`, returning it and the time reached.
fn replay(settings: &ProviderSettings, history: &[Step]) -> (PacerCore, Instant) {
    let mut core = PacerCore::new(settings);
    let mut now = Instant::now();
    for s in history {
        now += Duration::from_millis(s.gap_ms);
        if let Ok(ticket) = core.enqueue(now) {
            let deadline = core.deadline(now);
            let _ = core.poll(ticket, deadline, now);
            core.cancel(ticket);
        }
        let sent_at = now
            .checked_sub(Duration::from_millis(s.lag_ms))
            .unwrap_or(now);
        core.on_outcome(
            &s.outcome,
            sent_at,
            Some(Duration::from_millis(s.ttfb_ms)),
            now,
        );
    }
    (core, now)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// R-AI2, R-AI3.
    #[test]
    fn rate_never_above_ceiling(
        settings in settings(),
        history in proptest::collection::vec(step(), 0..300),
        restored in proptest::option::of(0.0f64..1e7),
    ) {
        prop_assert!(settings.start_rate() < settings.ceiling_rps);
        let (mut core, now) = replay(&settings, &history);
        let snap = core.snapshot(now);
        prop_assert!(snap.rate_rps <= settings.ceiling_rps, "{} > {}", snap.rate_rps, settings.ceiling_rps);
        prop_assert!(snap.rate_rps >= settings.floor_rate());
        if let Some(r) = restored {
            core.restore(r, Some(r), None);
            prop_assert!(core.rate() <= settings.ceiling_rps);
        }
    }

    /// R-AI3 for any ceiling and the default start.
    #[test]
    fn cold_start_is_below_the_ceiling(ceiling in 0.001f64..1e6) {
        let s = ProviderSettings::with_ceiling(ceiling);
        prop_assert!(s.clone().validated().is_ok());
        let core = PacerCore::new(&s);
        prop_assert!(core.rate() < ceiling);
        prop_assert!(core.rate() <= ceiling / 10.0 + 1e-12);
    }

    /// R-AI4: after any history, an error outcome — fast or slow, any
    /// status, any lag — never makes the interval shorter nor the next slot
    /// earlier.
    #[test]
    fn errors_never_shorten_the_delay(
        settings in settings(),
        history in proptest::collection::vec(step(), 0..200),
        error in error_outcome(),
        lag_ms in 0u64..5_000,
        ttfb_ms in 0u64..5_000,
    ) {
        let (mut core, now) = replay(&settings, &history);
        let before = core.snapshot(now);
        let slot_before = core.next_slot(now);
        let sent_at = now.checked_sub(Duration::from_millis(lag_ms)).unwrap_or(now);
        core.on_outcome(&error, sent_at, Some(Duration::from_millis(ttfb_ms)), now);
        let after = core.snapshot(now);
        prop_assert!(after.interval >= before.interval, "{error:?}: {:?} < {:?}", after.interval, before.interval);
        prop_assert!(after.rate_rps <= before.rate_rps);
        prop_assert!(core.next_slot(now) >= slot_before, "{error:?} moved the next slot earlier");
    }

    /// A client error (404, 400…) never cuts the rate: it says nothing
    /// about the provider's capacity.
    #[test]
    fn client_errors_never_cut_the_rate(
        settings in settings(),
        history in proptest::collection::vec(step(), 0..200),
        status in (400u16..500).prop_filter("not 408/429", |s| *s != 408 && *s != 429),
        lag_ms in 0u64..5_000,
        ttfb_ms in 0u64..5_000,
    ) {
        let (mut core, now) = replay(&settings, &history);
        let before = core.snapshot(now);
        let sent_at = now.checked_sub(Duration::from_millis(lag_ms)).unwrap_or(now);
        let fb = core.on_outcome(&Outcome::ClientError { status }, sent_at, Some(Duration::from_millis(ttfb_ms)), now);
        let after = core.snapshot(now);
        // Only a latency shift judged as a window closes may cut on a clean
        // answer; a 404 alone never does.
        if fb.backoff.is_none() {
            prop_assert!(after.rate_rps >= before.rate_rps);
        } else {
            prop_assert_eq!(fb.backoff.unwrap().reason, sluice_policy::pacer::BackoffReason::Latency);
        }
    }
}
