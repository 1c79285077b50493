//! What the controller's tests share: saturated windows of answers on a
//! hand-advanced clock.

use super::*;

/// The increase window the tests use.
pub(super) const W: Duration = Duration::from_secs(1);

/// Runs `secs` saturated windows whose answers are clean, except every
/// `error_every`-th, which is a bare 503 (0 = none).
pub(super) fn run(a: &mut Aimd, t: &mut Instant, secs: u32, error_every: u32) -> u32 {
    let mut cuts = 0;
    let mut i = 0u32;
    for _ in 0..secs {
        let n = a.rate().ceil() as u32 + 1;
        for j in 0..n {
            let at = *t + W * j / n;
            a.on_admit(at);
            i += 1;
            if error_every > 0 && i % error_every == 0 {
                cuts += u32::from(a.on_ambiguous(at, at, BackoffReason::Unavailable).is_some());
            } else {
                a.on_clean(at, at, Some(Duration::from_millis(40)));
            }
        }
        *t += W;
        a.on_clean(*t, *t, Some(Duration::from_millis(40)));
    }
    cuts
}

pub(super) fn saturate(a: &mut Aimd, t: &mut Instant, secs: u32) {
    run(a, t, secs, 0);
}

/// A replica sharing a budget: saturated windows until it raises its rate
/// past where it stands (at most 1,000), and how many it took; with
/// `taken`, the store then shows the raise taken, as it would.
pub(super) fn replica_windows_to_probe(a: &mut Aimd, t: &mut Instant, taken: bool) -> u32 {
    let settle = a.rate();
    let mut windows = 0;
    while a.rate() <= settle + 1e-9 && windows < 1000 {
        saturate(a, t, 1);
        windows += 1;
    }
    if taken {
        a.adopt(*t, a.rate(), a.limit());
    }
    windows
}

/// Sends at the rate for `ms` milliseconds, each answer given by
/// `answer`.
pub(super) fn fail_for(
    a: &mut Aimd,
    t: &mut Instant,
    ms: u64,
    answer: impl Fn(&mut Aimd, Instant),
) {
    let end = *t + Duration::from_millis(ms);
    while *t < end {
        let step = Duration::from_secs_f64(1.0 / a.rate());
        a.on_admit(*t);
        answer(a, *t);
        *t += step;
    }
}

pub(super) fn bare_503(a: &mut Aimd, at: Instant) {
    a.on_ambiguous(at, at, BackoffReason::Unavailable);
}

/// A token bucket (20/s, burst 10) answering `429` with
/// `Retry-After: 1` to saturated demand from `a`, for `secs`: when it
/// refused, in seconds from the start.
pub(super) fn bucket_refusals(a: &mut Aimd, secs: u64) -> Vec<f64> {
    bucket(a, secs, 10.0).1
}

/// A token bucket (20/s, `burst`) answering `429` with `Retry-After: 1`
/// to saturated demand from `a`, for `secs`: when it accepted and when it
/// refused, in seconds from the start.
pub(super) fn bucket(a: &mut Aimd, secs: u64, burst: f64) -> (Vec<f64>, Vec<f64>) {
    bucket_moving(a, secs, burst, |_| 20.0)
}

/// [`bucket`] whose refill rate at `t` seconds from the start is
/// `limit(t)`.
pub(super) fn bucket_moving(
    a: &mut Aimd,
    secs: u64,
    burst: f64,
    limit: impl Fn(f64) -> f64,
) -> (Vec<f64>, Vec<f64>) {
    let start = Instant::now();
    let (mut t, mut filled, mut held_until) = (start, start, start);
    let mut tokens: f64 = burst;
    let (mut accepted, mut refusals) = (Vec::new(), Vec::new());
    while t < start + Duration::from_secs(secs) {
        t = (t + Duration::from_secs_f64(1.0 / a.rate())).max(held_until);
        let refill = limit((t - start).as_secs_f64());
        tokens = (tokens + (t - filled).as_secs_f64() * refill).min(burst);
        filled = t;
        a.on_admit(t);
        if tokens >= 1.0 {
            tokens -= 1.0;
            a.on_clean(t, t, Some(Duration::from_millis(20)));
            accepted.push((t - start).as_secs_f64());
        } else {
            a.on_hold(Duration::from_secs(1));
            a.on_throttle(t, t, BackoffReason::Throttled);
            held_until = t + Duration::from_secs(1);
            refusals.push((t - start).as_secs_f64());
        }
    }
    (accepted, refusals)
}

/// A moving window (the `limits` library's: at most 20 accepted requests
/// in any second; refusals not counted) answering a bare `429` over it to
/// saturated demand from `a`, for `secs` with 20 ms answers: the times it
/// accepted and refused, in seconds from the start.
pub(super) fn moving_window(a: &mut Aimd, secs: u64) -> (Vec<f64>, Vec<f64>) {
    let start = Instant::now();
    let rtt = Duration::from_millis(20);
    let mut t = start;
    let mut log: VecDeque<Instant> = VecDeque::new();
    let (mut accepted, mut refused) = (Vec::new(), Vec::new());
    while t < start + Duration::from_secs(secs) {
        t += Duration::from_secs_f64(1.0 / a.rate());
        a.on_admit(t);
        while log
            .front()
            .is_some_and(|&at| at + Duration::from_secs(1) <= t)
        {
            log.pop_front();
        }
        let at = (t - start).as_secs_f64();
        if log.len() < 20 {
            log.push_back(t);
            a.on_clean(t, t + rtt, Some(rtt));
            accepted.push(at);
        } else {
            a.on_throttle(t, t + rtt, BackoffReason::Throttled);
            refused.push(at);
        }
    }
    (accepted, refused)
}

/// nginx's `limit_req` (20 r/s, `burst=5 nodelay`) answering a bare 503
/// over its limit to saturated demand from `a`, for `secs` with 40 ms
/// answers: the times it accepted and refused, in seconds from the start.
pub(super) fn limit_req(a: &mut Aimd, secs: u64) -> (Vec<f64>, Vec<f64>) {
    let (limit, burst) = (20.0, 5.0);
    let start = Instant::now();
    let rtt = Duration::from_millis(40);
    let (mut t, mut excess, mut last) = (start, 0.0f64, start);
    let (mut accepted, mut refused) = (Vec::new(), Vec::new());
    while t < start + Duration::from_secs(secs) {
        t += Duration::from_secs_f64(1.0 / a.rate());
        a.on_admit(t);
        let drained = (excess - (t - last).as_secs_f64() * limit).max(0.0);
        let at = (t - start).as_secs_f64();
        last = t;
        if drained > burst {
            excess = drained;
            a.on_ambiguous(t, t + rtt, BackoffReason::Unavailable);
            refused.push(at);
        } else {
            excess = drained + 1.0;
            a.on_clean(t, t + rtt, Some(rtt));
            accepted.push(at);
        }
    }
    (accepted, refused)
}
