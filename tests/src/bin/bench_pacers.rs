//! sluice's pacer against the in-client pacers users compare it with, on
//! the same simulated providers, side by side in one run.
//!
//! `cargo run --release -p sluice-tests --bin bench_pacers`
//!
//! The providers and contenders are `sluice_tests::model` (paused clock:
//! exact and repeatable, no sockets): sluice's pacer, a re-implementation
//! of the AWS SDKs' adaptive retry limiter and one of Scrapy's
//! AutoThrottle, each gating 24 naive clients. Measured at the provider.
//!
//! 1. Hidden limits (token bucket, burst = limit / 2, 429 over it), steady,
//!    halving and doubling: goodput and 429 share over the last half of
//!    240 s phases; for the doublings also goodput over 15–45 s after the
//!    change (R-SG2).
//! 2. The same with a bare 503 over the limit (R-SG3).
//! 3. Noise (R-SG3): a fast provider answering 1, 3 or 5 % bare 503s at
//!    random, or 10 / 30 % of requests 300–500 ms heavier: successes over
//!    60 s from a cold start, as a share of the same contender's clean run.
//!    The owner's ceiling is 200 req/s; the provider takes 1,000.
//! 4. A provider that never refuses but queues past 20 req/s: goodput and
//!    median latency over the last half of 240 s.
//! 5. Quotas in fixed windows (R-SG1): per second, per 30 s and per hour,
//!    advertised in `RateLimit` headers (truthfully or twice over) or not
//!    at all (429 with `Retry-After` to the window's end): goodput and 429
//!    share over the last half of 240 s.
//!
//! `bench_pacers converge` (issue 21): goodput over the first 60 s and
//! over 30–60 s from a cold start against every limiter shape (token
//! bucket with 429, bare 503 or `Retry-After`, nginx `limit_req` with and
//! without `nodelay`, HAProxy's sliding window), a shared fleet of 8
//! replicas, and costly requests at ceilings of 100, 200 and 500 req/s;
//! then (issue 34) a `Retry-After` bucket raised from 20 to 22 req/s at
//! 30 s, and one that does not move, counted in overshoots per 30 s.
//! `ONLY=<text>` runs only the converge rows whose name holds it.
//! `bench_pacers trace`, `sweep` and `quota` are described at each.

use std::sync::Arc;
use std::time::Duration;

use sluice_policy::ProviderSettings;
use sluice_tests::model::{
    paused_runtime, run, run_fleet, AutoThrottle, Aws, Behaviour, Figures, Gate, Provider,
    Scenario, SharedMemory, Sluice,
};
use tokio::time::Instant;

const CLIENTS: usize = 24;
/// Clients in the noise scenarios: enough that the owner's ceiling, not the
/// clients' own latency, bounds the clean run (30 % of requests 400 ms
/// slower would otherwise cap 24 clients below it).
const NOISE_CLIENTS: usize = 64;
const PHASE: Duration = Duration::from_secs(240);

fn scenario(behaviour: Behaviour, phases: &[f64], phase: Duration) -> Scenario {
    Scenario {
        behaviour,
        phases: phases.to_vec(),
        phase,
        clients: CLIENTS,
        seed: 0,
        jitter: false,
    }
}

/// Runs one contender, returning the provider and the start instant.
fn play(who: usize, s: &Scenario, ceiling: f64) -> (Provider, Instant) {
    // Each contender is made inside the paused runtime, so that the clocks
    // they start from are the paused clock's: a limiter whose epoch came
    // from the real clock could compute a wait of zero forever and spin.
    fn go<G: Gate>(make: impl FnOnce() -> Arc<G>, s: &Scenario) -> (Provider, Instant) {
        paused_runtime().block_on(async { run(make(), s).await })
    }
    match who {
        0 => go(|| Sluice::new(&ProviderSettings::with_ceiling(ceiling)), s),
        1 => go(Aws::new, s),
        _ => go(AutoThrottle::new, s),
    }
}

/// Runs one contender as `replicas` replicas in front of the provider,
/// the clients spread over them: sluice's share one budget (in memory, as
/// in Redis); the in-client pacers, which have no such thing, each pace
/// alone.
fn play_fleet(who: usize, s: &Scenario, ceiling: f64, replicas: u32) -> (Provider, Instant) {
    fn go<G: Gate>(make: impl FnOnce() -> Vec<Arc<G>>, s: &Scenario) -> (Provider, Instant) {
        paused_runtime().block_on(async { run_fleet(&make(), s).await })
    }
    match who {
        0 => go(
            || SharedMemory::fleet(replicas, &ProviderSettings::with_ceiling(ceiling), s.seed),
            s,
        ),
        1 => go(|| (0..replicas).map(|_| Aws::new()).collect(), s),
        _ => go(|| (0..replicas).map(|_| AutoThrottle::new()).collect(), s),
    }
}

/// Figures of each contender over the last half of the last phase, and
/// (for more than one phase) over 15–45 s after the last change.
fn limits(s: &Scenario, ceiling: f64) -> Vec<(Figures, Figures)> {
    let last = *s.phases.last().unwrap();
    (0..3)
        .map(|who| {
            let (p, start) = play(who, s, ceiling);
            let end = start + s.phase * s.phases.len() as u32;
            let change = end - s.phase;
            (
                p.figures(end - s.phase / 2, end, last),
                p.figures(
                    change + Duration::from_secs(15),
                    change + Duration::from_secs(45),
                    last,
                ),
            )
        })
        .collect()
}

fn cell(f: &Figures) -> String {
    format!(
        "{:6.1} % / {:6.2} %",
        f.goodput * 100.0,
        f.refused_share * 100.0
    )
}

const NAMES: [&str; 3] = ["sluice", "AWS adaptive", "AutoThrottle"];

/// Runs every contender on a hidden limit answering `over` beyond it and
/// prints their last-half figures as one row.
fn limit_row(name: &str, over: u16, phases: &[f64]) -> Vec<(Figures, Figures)> {
    let max = phases.iter().cloned().fold(0.0, f64::max);
    // sluice gets the owner's ceiling an operator would set: well above
    // the limit (4×), since the limit is what it must discover.
    let figs = limits(
        &scenario(Behaviour::Bucket { over }, phases, PHASE),
        max * 4.0,
    );
    println!(
        "{name:<16} | {:>22} | {:>22} | {:>22}",
        cell(&figs[0].0),
        cell(&figs[1].0),
        cell(&figs[2].0)
    );
    figs
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("trace") {
        return trace(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("sweep") {
        return sweep();
    }
    if args.first().map(String::as_str) == Some("quota") {
        return quotas();
    }
    if args.first().map(String::as_str) == Some("converge") {
        return converge();
    }
    println!(
        "1. hidden token-bucket limit, 429 over it; {CLIENTS} naive clients, 40 ms latency; \
         goodput / 429 share over the last half of {} s phases",
        PHASE.as_secs()
    );
    println!(
        "{:<16} | {:>22} | {:>22} | {:>22}",
        "limit", NAMES[0], NAMES[1], NAMES[2]
    );
    let table: [(&str, &[f64]); 9] = [
        ("5 req/s", &[5.0]),
        ("20 req/s", &[20.0]),
        ("100 req/s", &[100.0]),
        ("5 → 2.5 req/s", &[5.0, 2.5]),
        ("20 → 10 req/s", &[20.0, 10.0]),
        ("100 → 50 req/s", &[100.0, 50.0]),
        ("5 → 10 req/s", &[5.0, 10.0]),
        ("20 → 40 req/s", &[20.0, 40.0]),
        ("100 → 200 req/s", &[100.0, 200.0]),
    ];
    let mut sums = [(0.0, 0.0); 3];
    let mut doublings = Vec::new();
    for (name, phases) in table {
        let figs = limit_row(name, 429, phases);
        for (s, f) in sums.iter_mut().zip(&figs) {
            s.0 += f.0.goodput / 9.0;
            s.1 += f.0.refused_share / 9.0;
        }
        if phases.len() == 2 && phases[1] > phases[0] {
            doublings.push((name, figs));
        }
    }
    println!();
    for (n, (g, t)) in NAMES.iter().zip(sums) {
        println!(
            "{n:<13} mean goodput {:5.1} %, mean 429 share {:6.2} %",
            g * 100.0,
            t * 100.0
        );
    }
    let (sg, st) = sums[0];
    for (n, (g, t)) in NAMES.iter().zip(sums).skip(1) {
        println!(
            "sluice vs {n}: goodput × {:.2}, 429 share ÷ {:.1}",
            sg / g,
            t / st.max(1e-9)
        );
    }
    println!("\nfinding a raised limit: goodput / 429 share over 15–45 s after the limit doubled");
    for (name, figs) in doublings {
        println!(
            "{name:<16} | {:>22} | {:>22} | {:>22}",
            cell(&figs[0].1),
            cell(&figs[1].1),
            cell(&figs[2].1)
        );
    }

    println!("\n2. the same limit answered with a bare 503 (no Retry-After): goodput / 503 share");
    for (name, phases) in [
        ("5 req/s", &[5.0][..]),
        ("20 req/s", &[20.0]),
        ("100 req/s", &[100.0]),
        ("20 → 10 req/s", &[20.0, 10.0]),
        ("20 → 40 req/s", &[20.0, 40.0]),
    ] {
        limit_row(name, 503, phases);
    }

    const NOISE_RUN: Duration = Duration::from_secs(60);
    const CEILING: f64 = 200.0;
    println!(
        "\n3. noise unrelated to load: successes/s over {} s from a cold start, and the share of \
         the same contender's clean run ({NOISE_CLIENTS} clients, ceiling {CEILING} req/s, \
         provider takes 1000)",
        NOISE_RUN.as_secs()
    );
    let clean: Vec<f64> = (0..3)
        .map(|who| {
            let mut s = scenario(Behaviour::Noise { share: 0.0 }, &[1000.0], NOISE_RUN);
            s.clients = NOISE_CLIENTS;
            let (p, start) = play(who, &s, CEILING);
            p.figures(start, start + NOISE_RUN, 1000.0).ok_per_sec
        })
        .collect();
    println!(
        "{:<22} | {:>16} | {:>16} | {:>16}",
        "provider", NAMES[0], NAMES[1], NAMES[2]
    );
    println!(
        "{:<22} | {:>9.1} (1.00) | {:>9.1} (1.00) | {:>9.1} (1.00)",
        "clean", clean[0], clean[1], clean[2]
    );
    let noisy: [(&str, Behaviour); 5] = [
        ("1 % random 503", Behaviour::Noise { share: 0.01 }),
        ("3 % random 503", Behaviour::Noise { share: 0.03 }),
        ("5 % random 503", Behaviour::Noise { share: 0.05 }),
        (
            "10 % +300–500 ms",
            Behaviour::Heavy {
                share: 0.10,
                min_ms: 300,
                max_ms: 500,
            },
        ),
        (
            "30 % +300–500 ms",
            Behaviour::Heavy {
                share: 0.30,
                min_ms: 300,
                max_ms: 500,
            },
        ),
    ];
    for (name, behaviour) in noisy {
        let mut s = scenario(behaviour, &[1000.0], NOISE_RUN);
        s.clients = NOISE_CLIENTS;
        let cells: Vec<String> = (0..3)
            .map(|who| {
                let (p, start) = play(who, &s, CEILING);
                let ok = p.figures(start, start + NOISE_RUN, 1000.0).ok_per_sec;
                format!("{ok:>9.1} ({:.2})", ok / clean[who])
            })
            .collect();
        println!(
            "{name:<22} | {:>16} | {:>16} | {:>16}",
            cells[0], cells[1], cells[2]
        );
    }

    println!(
        "\n4. a provider that queues past 20 req/s and never refuses: goodput / median latency \
         over the last half of {} s",
        PHASE.as_secs()
    );
    let s = scenario(Behaviour::Queue, &[20.0], PHASE);
    let cells: Vec<String> = (0..3)
        .map(|who| {
            let (p, start) = play(who, &s, 80.0);
            let end = start + PHASE;
            let f = p.figures(end - PHASE / 2, end, 20.0);
            format!(
                "{:5.1} % / {:>7.0} ms",
                f.goodput * 100.0,
                f.median_latency.as_secs_f64() * 1000.0
            )
        })
        .collect();
    println!(
        "{:<16} | {:>22} | {:>22} | {:>22}",
        "20 req/s", cells[0], cells[1], cells[2]
    );

    quotas();
}

/// 5. Quotas in fixed windows (`bench_pacers quota` runs only these).
fn quotas() {
    println!(
        "\n5. quotas in windows (issue 12), advertised in RateLimit headers or not: goodput / 429 \
         share over the last half of {} s, ceiling 50 req/s",
        PHASE.as_secs()
    );
    let window = |secs: u64, advertise: bool, lie: u32| Behaviour::Window {
        window: Duration::from_secs(secs),
        advertise,
        lie,
    };
    for (name, behaviour, limit) in [
        ("20 per 1 s, advertised", window(1, true, 1), 20.0),
        ("300 per 30 s, advertised", window(30, true, 1), 10.0),
        ("36,000 per hour, advertised", window(3600, true, 1), 10.0),
        ("20 per 1 s, advertised 2×", window(1, true, 2), 20.0),
        ("300 per 30 s, no headers", window(30, false, 1), 10.0),
    ] {
        let s = scenario(behaviour, &[limit], PHASE);
        let cells: Vec<String> = (0..3)
            .map(|who| {
                let (p, start) = play(who, &s, 50.0);
                let end = start + PHASE;
                cell(&p.figures(end - PHASE / 2, end, limit))
            })
            .collect();
        println!(
            "{name:<28} | {:>22} | {:>22} | {:>22}",
            cells[0], cells[1], cells[2]
        );
    }
}

/// `bench_pacers trace BEHAVIOUR LIMIT [LIMIT…]`: sluice alone, one line per
/// second (rate, remembered limit, answers) — to see how it got there.
fn trace(args: &[String]) {
    let behaviour = match args[0].as_str() {
        "429" => Behaviour::Bucket { over: 429 },
        "503" => Behaviour::Bucket { over: 503 },
        "ra" => Behaviour::Named {
            secs: 1,
            burst: None,
        },
        // A `Retry-After: 1` bucket of this burst: `ra-b5`.
        s if s.starts_with("ra-b") => Behaviour::Named {
            secs: 1,
            burst: Some(s[4..].parse().expect("ra-bN: a burst")),
        },
        // A 1 s quota that advertises twice what it allows.
        "quota-lie" => Behaviour::Window {
            window: Duration::from_secs(1),
            advertise: true,
            lie: 2,
        },
        "nginx" => Behaviour::LimitReq { burst: 5 },
        "nginx-delay" => Behaviour::LimitReqDelay { burst: 5 },
        "sliding" => Behaviour::Sliding,
        "moving" => Behaviour::MovingLog,
        "lazy" => Behaviour::LazyWindow,
        s if s.starts_with("b") => Behaviour::SmallBurst {
            burst: s[1..].parse().expect("bN: a burst"),
        },
        "queue" => Behaviour::Queue,
        s if s.starts_with("noise") => Behaviour::Noise {
            share: s[5..].parse::<f64>().unwrap() / 100.0,
        },
        s if s.starts_with("heavy") => Behaviour::Heavy {
            share: s[5..].parse::<f64>().unwrap() / 100.0,
            min_ms: 300,
            max_ms: 500,
        },
        other => panic!("unknown behaviour {other}"),
    };
    let phases: Vec<f64> = args[1..].iter().map(|a| a.parse().unwrap()).collect();
    let secs: u64 = std::env::var("PHASE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let ceiling: f64 = std::env::var("CEILING")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(phases.iter().cloned().fold(0.0, f64::max) * 4.0);
    let mut s = scenario(behaviour, &phases, Duration::from_secs(secs));
    s.clients = std::env::var("CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CLIENTS);
    s.seed = std::env::var("SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    s.jitter = s.seed > 0;
    // REPLICAS=8: a fleet sharing one budget, seen from its first replica.
    let replicas: u32 = std::env::var("REPLICAS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    paused_runtime().block_on(async {
        let gates = if replicas > 1 {
            SharedMemory::fleet(replicas, &ProviderSettings::with_ceiling(ceiling), s.seed)
        } else {
            vec![Sluice::new(&ProviderSettings::with_ceiling(ceiling))]
        };
        let g = gates[0].clone();
        let start = Instant::now();
        let total = secs * phases.len() as u64;
        let watcher = tokio::spawn(async move {
            for t in 0..total {
                tokio::time::sleep_until(start + Duration::from_secs(t + 1)).await;
                let snap = g.0.snapshot(Instant::now());
                println!(
                    "t={:>4}s rate {:>8.2} limit {:>8} backoff {:>24} err_base {:>6} lat_base {:>8} trial {}",
                    t + 1,
                    snap.rate_rps,
                    snap.limit_rps.map_or("-".into(), |l| format!("{l:.2}")),
                    snap.last_backoff.map_or("-".into(), |b| format!("{}@{:.1}", b.reason.label(), (b.at - start).as_secs_f64())),
                    snap.error_baseline.map_or("-".into(), |e| format!("{:.3}", e)),
                    snap.baseline_ttfb.map_or("-".into(), |b| format!("{:?}", b)),
                    snap.on_trial,
                );
            }
        });
        let (p, start) = run_fleet(&gates, &s).await;
        watcher.await.unwrap();
        for t in 0..total {
            let f = p.figures(
                start + Duration::from_secs(t),
                start + Duration::from_secs(t + 1),
                1.0,
            );
            print!("{}:{}/{} ", t + 1, f.ok_per_sec, f.attempts);
        }
        println!();
    });
}

/// `bench_pacers sweep`: sluice alone over 20 seeds of the random
/// scenarios — the spread behind the single-seed table.
fn sweep() {
    const SEEDS: u64 = 20;
    let cases: [(&str, Behaviour, &[f64], u64, f64); 7] = [
        (
            "noise 1 %",
            Behaviour::Noise { share: 0.01 },
            &[1000.0],
            60,
            200.0,
        ),
        (
            "noise 3 %",
            Behaviour::Noise { share: 0.03 },
            &[1000.0],
            60,
            200.0,
        ),
        (
            "noise 5 %",
            Behaviour::Noise { share: 0.05 },
            &[1000.0],
            60,
            200.0,
        ),
        (
            "heavy 10 %",
            Behaviour::Heavy {
                share: 0.1,
                min_ms: 300,
                max_ms: 500,
            },
            &[1000.0],
            60,
            200.0,
        ),
        (
            "heavy 30 %",
            Behaviour::Heavy {
                share: 0.3,
                min_ms: 300,
                max_ms: 500,
            },
            &[1000.0],
            60,
            200.0,
        ),
        (
            "noise 3 % 30 s",
            Behaviour::Noise { share: 0.03 },
            &[1000.0],
            30,
            200.0,
        ),
        (
            "clean 30 s",
            Behaviour::Noise { share: 0.0 },
            &[1000.0],
            30,
            200.0,
        ),
    ];
    let clean60 = {
        let mut s = scenario(
            Behaviour::Noise { share: 0.0 },
            &[1000.0],
            Duration::from_secs(60),
        );
        s.clients = NOISE_CLIENTS;
        let (p, start) = play(0, &s, 200.0);
        p.figures(start, start + Duration::from_secs(60), 1.0)
            .ok_per_sec
    };
    for (name, behaviour, phases, secs, ceiling) in cases {
        let mut v = Vec::new();
        for seed in 0..SEEDS {
            let mut s = scenario(behaviour, phases, Duration::from_secs(secs));
            s.seed = seed;
            s.clients = NOISE_CLIENTS;
            let (p, start) = play(0, &s, ceiling);
            v.push(
                p.figures(start, start + Duration::from_secs(secs), 1.0)
                    .ok_per_sec
                    / clean60,
            );
            if std::env::var("SWEEP_SEEDS").is_ok() {
                println!("  seed {seed}: {:.2}", v[v.len() - 1]);
            }
        }
        v.sort_by(f64::total_cmp);
        println!(
            "{name:<16} share of clean (60 s): min {:.2} median {:.2} max {:.2}",
            v[0],
            v[v.len() / 2],
            v[v.len() - 1]
        );
    }
    for (from, to) in [(5.0, 10.0), (20.0, 40.0), (100.0, 200.0)] {
        // The change at ten different points of the probe cycle.
        let mut v = Vec::new();
        for k in 0..10u64 {
            let phase = Duration::from_secs(200 + 7 * k);
            let s = scenario(Behaviour::Bucket { over: 429 }, &[from, to], phase);
            let (p, start) = play(0, &s, to * 4.0);
            let change = start + phase;
            v.push(
                p.figures(
                    change + Duration::from_secs(15),
                    change + Duration::from_secs(45),
                    to,
                )
                .goodput,
            );
        }
        v.sort_by(f64::total_cmp);
        println!(
            "doubling {from} → {to}: goodput 15–45 s after the change, 10 phases: \
             min {:.2} median {:.2} max {:.2}",
            v[0],
            v[v.len() / 2],
            v[v.len() - 1]
        );
    }
    for (name, over, limit) in [
        ("503 over 5", 503, 5.0),
        ("503 over 20", 503, 20.0),
        ("503 over 100", 503, 100.0),
        ("429 over 5", 429, 5.0),
        ("429 over 20", 429, 20.0),
    ] {
        let mut worst: (f64, f64) = (f64::MAX, 0.0);
        for seed in 0..5 {
            let mut s = scenario(Behaviour::Bucket { over }, &[limit], PHASE);
            s.seed = seed;
            s.clients = 20 + seed as usize;
            let (p, start) = play(0, &s, limit * 4.0);
            let end = start + PHASE;
            let f = p.figures(end - PHASE / 2, end, limit);
            worst = (worst.0.min(f.goodput), worst.1.max(f.refused_share));
        }
        println!(
            "{name:<16} worst of 5: goodput {:.1} %, refused {:.2} %",
            worst.0 * 100.0,
            worst.1 * 100.0
        );
    }
}

/// Time to converge (issue 21, R-SG5): every contender from a cold start
/// against each limiter shape, 8 naive clients, latency jittered around
/// 40 ms; over `SEEDS` seeds, the median and worst goodput over the first
/// 60 s and over 30–60 s, and the refused share over 30–60 s. Then the
/// `Retry-After` bucket behind 8 replicas with 8 or 16 clients (R-DS1:
/// sluice's replicas share one budget, the in-client pacers each pace
/// alone), and costly requests (see `costly`).
fn converge() {
    const SEEDS: u64 = 10;
    let cases: [(&str, Behaviour, f64); 12] = [
        ("bucket 20, 429", Behaviour::Bucket { over: 429 }, 20.0),
        ("bucket 20, 503", Behaviour::Bucket { over: 503 }, 20.0),
        (
            "bucket 20 b=5, 429",
            Behaviour::SmallBurst { burst: 5 },
            20.0,
        ),
        (
            "nginx 20 b=5 nodelay",
            Behaviour::LimitReq { burst: 5 },
            20.0,
        ),
        (
            "nginx 20 b=5 delay",
            Behaviour::LimitReqDelay { burst: 5 },
            20.0,
        ),
        (
            "bucket 20, 429 + RA 1",
            Behaviour::Named {
                secs: 1,
                burst: None,
            },
            20.0,
        ),
        ("sliding 1 s 20, 429", Behaviour::Sliding, 20.0),
        ("moving log 20, 429", Behaviour::MovingLog, 20.0),
        ("lazy window 20, 429", Behaviour::LazyWindow, 20.0),
        ("bucket 5, 429", Behaviour::Bucket { over: 429 }, 5.0),
        ("bucket 100, 429", Behaviour::Bucket { over: 429 }, 100.0),
        ("sliding 1 s 100, 429", Behaviour::Sliding, 100.0),
    ];
    println!(
        "time to converge: 8 naive clients from a cold start, {SEEDS} seeds; \
         goodput 0–60 s (median, worst) | goodput 30–60 s (median, worst) | refused 30–60 s (median, worst)\n\
         (\"16 cl\": 16 clients; \"×8\": 8 replicas sharing one budget)"
    );
    // (name, behaviour, limit, clients, replicas sharing a budget)
    let mut rows: Vec<(String, Behaviour, f64, usize, u32)> = cases
        .iter()
        .map(|(n, b, l)| (n.to_string(), *b, *l, 8, 1))
        .collect();
    for clients in [8, 16] {
        rows.push((
            format!("8 replicas ×{}, RA 20", clients / 8),
            Behaviour::Named {
                secs: 1,
                burst: None,
            },
            20.0,
            clients,
            8,
        ));
    }
    // The commonest API limiter (issue 34): a small burst, `Retry-After:
    // 1`, 16 clients; one sluice beside a fleet of 8 sharing a budget.
    for burst in [2, 5, 10] {
        for replicas in [1, 8] {
            rows.push((
                format!("RA 1 b={burst} 16 cl ×{replicas}"),
                Behaviour::Named {
                    secs: 1,
                    burst: Some(burst),
                },
                20.0,
                16,
                replicas,
            ));
        }
    }
    for (name, behaviour, limit, clients, replicas) in rows {
        if std::env::var("ONLY").is_ok_and(|o| !name.contains(&o)) {
            continue;
        }
        for (who, contender) in NAMES.iter().enumerate() {
            let mut first = Vec::new();
            let mut second = Vec::new();
            let mut refused = Vec::new();
            for seed in 1..=SEEDS {
                let s = Scenario {
                    behaviour,
                    phases: vec![limit],
                    phase: Duration::from_secs(60),
                    clients,
                    seed,
                    jitter: true,
                };
                let (p, start) = if replicas > 1 {
                    play_fleet(who, &s, limit * 4.0, replicas)
                } else {
                    play(who, &s, limit * 4.0)
                };
                let at = |secs: u64| start + Duration::from_secs(secs);
                first.push(p.figures(at(0), at(60), limit).goodput);
                let f = p.figures(at(30), at(60), limit);
                second.push(f.goodput);
                refused.push(f.refused_share);
            }
            let sorted = |mut v: Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v
            };
            let (first, second, refused) = (sorted(first), sorted(second), sorted(refused));
            let mid = (SEEDS / 2) as usize;
            println!(
                "{name:<22} {contender:<13} | {:>5.1} % {:>5.1} % | {:>5.1} % {:>5.1} % | {:>5.2} % {:>5.2} %",
                first[mid] * 100.0,
                first[0] * 100.0,
                second[mid] * 100.0,
                second[0] * 100.0,
                refused[mid] * 100.0,
                refused[refused.len() - 1] * 100.0,
            );
        }
    }

    raised();
    costly();
}

/// Issue 34: the Retry-After bucket of the converge table (20 req/s,
/// `Retry-After: 1`, 16 clients) for one sluice and for 8 replicas: a
/// limit raised to 22 at 30 s is found by 60 s (the first 5 s in which
/// the provider took 0.95 of 22 ends within 30 s of the raise), and a limit that does not move costs at most one overshoot (a run
/// of refusals) per 30 s once learned (30–180 s).
fn raised() {
    const SEEDS: u64 = 10;
    println!(
        "\nraised and unmoved: RA 1 bucket, 16 clients, {SEEDS} seeds, sluice; \
         20 → 22 at 30 s: found after (the first 5 s at 0.95 of 22; median, worst) | \
         goodput 60–90 s / 22 (median, worst) | \
         20 unmoved: overshoots per 30 s over 30–180 s (median, worst)"
    );
    for burst in [2, 5, 10] {
        for replicas in [1, 8] {
            let behaviour = Behaviour::Named {
                secs: 1,
                burst: Some(burst),
            };
            let mut found = Vec::new();
            let mut goodput = Vec::new();
            let mut overshoots = Vec::new();
            for seed in 1..=SEEDS {
                let scenario = |phases: Vec<f64>, secs: u64| Scenario {
                    behaviour,
                    phases,
                    phase: Duration::from_secs(secs),
                    clients: 16,
                    seed,
                    jitter: true,
                };
                let go = |s: &Scenario| {
                    if replicas > 1 {
                        play_fleet(0, s, 80.0, replicas)
                    } else {
                        play(0, s, 80.0)
                    }
                };
                let (p, start) = go(&scenario(vec![20.0, 22.0, 22.0], 30));
                let at = |secs: u64| start + Duration::from_secs(secs);
                // Found: the first 5 s after the raise the provider took
                // 0.95 of the new limit in (60 s after it if never).
                let after = (35..=90)
                    .find(|t| p.figures(at(t - 5), at(*t), 22.0).goodput >= 0.95)
                    .map_or(60.0, |t| (t - 30) as f64);
                found.push(after);
                goodput.push(p.figures(at(60), at(90), 22.0).goodput);
                // Three minutes: a fleet's replicas each wait for their own
                // admissions, and probe in the second minute.
                let (p, start) = go(&scenario(vec![20.0], 180));
                let at = |secs: u64| start + Duration::from_secs(secs);
                let runs = p.overshoots(at(30), at(180), Duration::from_secs(2));
                overshoots.push(runs as f64 / 5.0);
            }
            found.sort_by(f64::total_cmp);
            goodput.sort_by(f64::total_cmp);
            overshoots.sort_by(f64::total_cmp);
            let mid = (SEEDS / 2) as usize;
            println!(
                "RA 1 b={burst:<2} 16 cl ×{replicas}    | {:>4.0} s {:>4.0} s | {:>5.1} % {:>5.1} % | {:>4.1} {:>4.1}",
                found[mid],
                found[found.len() - 1],
                goodput[mid] * 100.0,
                goodput[0] * 100.0,
                overshoots[mid],
                overshoots[overshoots.len() - 1],
            );
        }
    }
}

/// Costly requests (issue 21, R-SG3): a provider that takes 1,000 req/s,
/// with 10 % or 30 % of requests 300–400 ms heavier, at owner's ceilings
/// of 100, 200 and 500 req/s, a quarter of the ceiling in naive clients:
/// successes over the first 60 s from a cold start as a share of the same
/// contender's clean run at the same ceiling (median of `SEEDS`).
fn costly() {
    const SEEDS: u64 = 3;
    println!(
        "\ncostly requests: 1,000 req/s provider, clients = ceiling / 4; successes 0–60 s \
         from a cold start / the same contender's clean run (median of {SEEDS} seeds)"
    );
    for share in [0.1, 0.3] {
        for ceiling in [100.0, 200.0, 500.0] {
            let mut cells = Vec::new();
            for who in 0..NAMES.len() {
                let mut ratios = Vec::new();
                for seed in 1..=SEEDS {
                    let ok = |behaviour| {
                        let s = Scenario {
                            behaviour,
                            phases: vec![1000.0],
                            phase: Duration::from_secs(60),
                            clients: (ceiling / 4.0) as usize,
                            seed,
                            jitter: true,
                        };
                        let (p, start) = play(who, &s, ceiling);
                        p.figures(start, start + Duration::from_secs(60), 1.0)
                            .ok_per_sec
                    };
                    let heavy = ok(Behaviour::Heavy {
                        share,
                        min_ms: 300,
                        max_ms: 400,
                    });
                    let clean = ok(Behaviour::Noise { share: 0.0 });
                    ratios.push(heavy / clean.max(1e-9));
                }
                ratios.sort_by(f64::total_cmp);
                cells.push(format!("{:>5.2}", ratios[ratios.len() / 2]));
            }
            println!(
                "{:>3.0} % heavy, ceiling {ceiling:>3.0}  | {}",
                share * 100.0,
                NAMES
                    .iter()
                    .zip(&cells)
                    .map(|(n, c)| format!("{n} {c}"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
        }
    }
}
