//! The pacer against simulated providers on tokio's paused clock (R-AI1,
//! R-GC1, R-SG2, R-SG3): does it find a hidden limit and stay just under
//! it, keep its throughput when errors and latency are noise, and still pace
//! a provider that throttles with bare 503s or by slowing down?
//!
//! Pure and exact: the providers and the naive clients are
//! `sluice_tests::model`, the same the bench `bench_pacers` runs, driving
//! the policy code the proxy runs; a seeded generator is the only
//! randomness, so the figures repeat on every machine. Measured at the
//! provider.

use std::time::Duration;

use sluice_policy::ProviderSettings;
use sluice_tests::model::{paused_runtime, run, Behaviour, Figures, Scenario, Sluice};

const PHASE: Duration = Duration::from_secs(240);

/// Runs sluice on `scenario` with this ceiling; the provider's figures over
/// `[from, to)` seconds from the start, against `limit`.
fn figures(scenario: &Scenario, ceiling: f64, from: u64, to: u64, limit: f64) -> Figures {
    let (p, start) = paused_runtime().block_on(run(
        Sluice::new(&ProviderSettings::with_ceiling(ceiling)),
        scenario,
    ));
    let at = |s: u64| start + Duration::from_secs(s);
    p.figures(at(from), at(to), limit)
}

fn limits(behaviour: Behaviour, phases: &[f64]) -> Scenario {
    Scenario {
        behaviour,
        phases: phases.to_vec(),
        phase: PHASE,
        clients: 24,
        seed: 0,
        jitter: false,
    }
}

/// The last half of the last phase.
fn last_half(s: &Scenario) -> Figures {
    let max = s.phases.iter().cloned().fold(0.0, f64::max);
    let end = s.phase.as_secs() * s.phases.len() as u64;
    figures(
        s,
        max * 4.0,
        end - s.phase.as_secs() / 2,
        end,
        *s.phases.last().unwrap(),
    )
}

fn check(name: &str, f: &Figures, goodput: f64, refused: f64) {
    println!(
        "{name:>24}: goodput {:>5.1} % of the limit, refused {:>4.2} % of {} attempts, median latency {:?}",
        f.goodput * 100.0,
        f.refused_share * 100.0,
        f.attempts,
        f.median_latency,
    );
    assert!(
        f.goodput >= goodput,
        "{name}: goodput {:.1} % < {:.0} %",
        f.goodput * 100.0,
        goodput * 100.0
    );
    assert!(
        f.refused_share <= refused,
        "{name}: refused {:.2} % > {:.1} %",
        f.refused_share * 100.0,
        refused * 100.0
    );
}

macro_rules! steady {
    ($($name:ident: $over:expr, $limit:expr;)*) => {$(
        /// Steady hidden limit: ≥ 95 % of it, ≤ 0.5 % refused (429) or
        /// ≤ 1 % (bare 503) over the last half.
        #[test]
        fn $name() {
            let s = limits(Behaviour::Bucket { over: $over }, &[$limit]);
            let bound = if $over == 429 { 0.005 } else { 0.01 };
            check(stringify!($name), &last_half(&s), 0.95, bound);
        }
    )*};
}

steady! {
    steady_5: 429, 5.0;
    steady_20: 429, 20.0;
    steady_100: 429, 100.0;
    bare_503_steady_5: 503, 5.0;
    bare_503_steady_20: 503, 20.0;
    bare_503_steady_100: 503, 100.0;
}

macro_rules! halving {
    ($($name:ident: $from:expr, $to:expr;)*) => {$(
        /// A halved limit is followed down: ≥ 85 % of the new one, ≤ 1 %
        /// refused over the last half.
        #[test]
        fn $name() {
            let s = limits(Behaviour::Bucket { over: 429 }, &[$from, $to]);
            check(stringify!($name), &last_half(&s), 0.85, 0.01);
        }
    )*};
}

halving! {
    halves_5: 5.0, 2.5;
    halves_20: 20.0, 10.0;
    halves_100: 100.0, 50.0;
}

macro_rules! doubling {
    ($($name:ident: $from:expr, $to:expr, $found:expr;)*) => {$(
        /// R-SG2: a doubled limit is found. Over the last half ≥ 95 % of the
        /// new limit; where `found`, also ≥ 95 % over 15–45 s after the
        /// change (see the README on the slow provider's trade-off).
        #[test]
        fn $name() {
            let s = limits(Behaviour::Bucket { over: 429 }, &[$from, $to]);
            check(stringify!($name), &last_half(&s), 0.95, 0.005);
            let change = PHASE.as_secs();
            let f = figures(&s, $to * 4.0, change + 15, change + 45, $to);
            println!(
                "{:>24}: 15–45 s after the change: goodput {:.1} %",
                stringify!($name),
                f.goodput * 100.0
            );
            if $found {
                assert!(f.goodput >= 0.95, "found too slowly: {:.1} %", f.goodput * 100.0);
            }
        }
    )*};
}

doubling! {
    doubles_5: 5.0, 10.0, false;
    doubles_20: 20.0, 40.0, true;
    doubles_100: 100.0, 200.0, true;
}

/// Successes over 60 s from a cold start with 64 clients and a 200 req/s
/// ceiling on a provider that takes 1,000.
fn noisy(behaviour: Behaviour) -> f64 {
    let s = Scenario {
        behaviour,
        phases: vec![1000.0],
        phase: Duration::from_secs(60),
        clients: 64,
        seed: 0,
        jitter: false,
    };
    figures(&s, 200.0, 0, 60, 1000.0).ok_per_sec
}

macro_rules! noise {
    ($($name:ident: $behaviour:expr;)*) => {$(
        /// R-SG3: errors and latency unrelated to load keep ≥ 80 % of the
        /// clean run's throughput.
        #[test]
        fn $name() {
            let clean = noisy(Behaviour::Noise { share: 0.0 });
            let noisy = noisy($behaviour);
            println!(
                "{:>24}: {:.1} successes/s against {:.1} clean ({:.2})",
                stringify!($name),
                noisy,
                clean,
                noisy / clean
            );
            assert!(noisy >= 0.8 * clean, "{:.2} of the clean run", noisy / clean);
        }
    )*};
}

noise! {
    random_503_1_percent: Behaviour::Noise { share: 0.01 };
    random_503_3_percent: Behaviour::Noise { share: 0.03 };
    random_503_5_percent: Behaviour::Noise { share: 0.05 };
    heavy_10_percent: Behaviour::Heavy { share: 0.10, min_ms: 300, max_ms: 500 };
    heavy_30_percent: Behaviour::Heavy { share: 0.30, min_ms: 300, max_ms: 500 };
}

/// R-SG3: a provider that never refuses but slows down past 20 req/s is
/// still paced to it: most of its capacity, and answers near its
/// unloaded latency (40 ms + 50 ms of service) rather than a growing queue.
#[test]
fn a_provider_that_slows_down_past_its_limit_is_paced() {
    let s = limits(Behaviour::Queue, &[20.0]);
    let f = last_half(&s);
    check("queue_20", &f, 0.8, 0.0);
    assert!(
        f.median_latency <= Duration::from_millis(270),
        "median latency {:?}: the queue was not kept short",
        f.median_latency
    );
}

/// Issue 18's relaxed R-SG2 line at low rates: a 5 → 10 req/s doubling
/// is found within 60 s — ≥ 90 % of the new limit over the 60–90 s after
/// the change — while a stable 5 req/s limit costs ≤ 0.5 % refusals over
/// five minutes once found (the five minutes after the first, which holds
/// the cold start's slow-start overshoot). (At ≥ 20 req/s the 15 s figure
/// of `doubles_20` and `doubles_100` stands.)
#[test]
fn a_slow_provider_finds_a_doubled_limit_within_a_minute() {
    let s = limits(Behaviour::Bucket { over: 429 }, &[5.0, 10.0]);
    let change = PHASE.as_secs();
    let f = figures(&s, 40.0, change + 60, change + 90, 10.0);
    check("doubles_5 at 60–90 s", &f, 0.9, 0.005);
    let steady = Scenario {
        phase: Duration::from_secs(360),
        ..limits(Behaviour::Bucket { over: 429 }, &[5.0])
    };
    let cold = figures(&steady, 20.0, 0, 60, 5.0);
    println!(
        "{:>24}: refused {:.2} % of {} attempts",
        "steady_5 first minute",
        cold.refused_share * 100.0,
        cold.attempts
    );
    let f = figures(&steady, 20.0, 60, 360, 5.0);
    check("steady_5 over 5 min", &f, 0.95, 0.005);
}

/// R-SG5 (issue 21): a token bucket that holds every request off after a
/// refusal (`429` + `Retry-After: 1`), 8 clients from a cold start: the time
/// each rate lasted after a hold tells the bucket's rate, so over 30–60 s
/// ≥ 97 % of the limit with ≤ 0.5 % refused, and over the last half of
/// four minutes (probes and all) the same.
#[test]
fn a_retry_after_bucket_is_read_from_its_holds() {
    let s = Scenario {
        behaviour: Behaviour::Named {
            secs: 1,
            burst: None,
        },
        phases: vec![20.0],
        phase: PHASE,
        clients: 8,
        seed: 1,
        jitter: true,
    };
    check(
        "retry-after 30–60 s",
        &figures(&s, 80.0, 30, 60, 20.0),
        0.97,
        0.005,
    );
    check("retry-after last half", &last_half(&s), 0.97, 0.005);
}

/// R-DS1, R-SG5 (issue 21): 8 replicas sharing one budget (in memory, as
/// the proxy's Redis scripts keep it), 8 and 16 clients spread over them,
/// the `Retry-After` bucket: over 30–60 s the fleet paces like one sluice,
/// ≥ 95 % of the limit with ≤ 0.5 % refused.
#[test]
fn a_fleet_sharing_a_budget_paces_like_one() {
    use sluice_tests::model::{run_fleet, SharedMemory};
    // Several seeds: a fleet's figures hang on which replica's wake-up
    // takes a slot (seeded, see `SharedMemory::fleet`), and one seed
    // proved little — unseeded, one run in 12 fell to 94 %.
    for clients in [8, 16] {
        for seed in 1..=4 {
            let s = Scenario {
                behaviour: Behaviour::Named {
                    secs: 1,
                    burst: None,
                },
                phases: vec![20.0],
                phase: Duration::from_secs(60),
                clients,
                seed,
                jitter: true,
            };
            let (p, start) = paused_runtime().block_on(async {
                run_fleet(
                    &SharedMemory::fleet(8, &ProviderSettings::with_ceiling(80.0), s.seed),
                    &s,
                )
                .await
            });
            let at = |secs: u64| start + Duration::from_secs(secs);
            check(
                &format!("8 replicas, {clients} clients, seed {seed}"),
                &p.figures(at(30), at(60), 20.0),
                0.95,
                0.005,
            );
        }
    }
}
