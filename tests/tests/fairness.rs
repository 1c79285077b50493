//! Several collectors, one provider (issue 22): the provider's learned
//! budget is shared by weight, not taken by whoever sends most (R-FS1).
//! The real binary, naive Python clients configured by `HTTP_PROXY` only,
//! measured at the provider.

use std::time::Duration;

use serde_json::Value;
use sluice_tests::clients::naive_clients;
use sluice_tests::harness::{Sluice, TempDir};
use sluice_tests::sim::Sim;

/// A sluice with `collector-a` at weight 3 and `collector-b` at weight 1.
fn start() -> Sluice {
    let dir = TempDir::new("fairness");
    std::fs::write(dir.join("a.token"), "tok-a\n").unwrap();
    std::fs::write(dir.join("b.token"), "tok-b\n").unwrap();
    let config = format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n\
         [collectors.collector-a]\ntoken_file = \"{}\"\nweight = 3\n\
         [collectors.collector-b]\ntoken_file = \"{}\"\n",
        dir.join("a.token").display(),
        dir.join("b.token").display()
    );
    Sluice::start_in(dir, &config)
}

/// Accepted requests of `tag` at the provider in `[from, to)` seconds
/// after `t0`.
fn accepted(sim: &Sim, tag: &str, t0: tokio::time::Instant, from: f64, to: f64) -> usize {
    sim.hits(&format!("/limited/{tag}"))
        .iter()
        .filter(|h| {
            h.status == 200
                && h.at >= t0 + Duration::from_secs_f64(from)
                && h.at < t0 + Duration::from_secs_f64(to)
        })
        .count()
}

/// R-FS1: two collectors with weights 3 and 1, 16 naive clients each, on a
/// provider with a hidden 20 req/s limit (429 over it). Over 30–60 s the
/// admitted shares are within 10 % of 3:1 and together near the limit;
/// when the weight-3 collector stops at 60 s, the other takes ≥ 95 % of
/// the learned rate within 2 s (work-conserving: an idle collector's share
/// flows to the others at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_collectors_share_a_provider_by_weight() {
    let sim = Sim::start("127.0.0.62").await;
    sim.set_limit(20.0, 10.0);
    let sluice = start();
    let proxy = |user: &str, token: &str| format!("http://{user}:{token}@{}", sluice.proxy);
    let (pa, pb) = (proxy("collector-a", "tok-a"), proxy("collector-b", "tok-b"));
    let (ua, ub) = (sim.url("http", "/limited/a"), sim.url("http", "/limited/b"));
    let t0 = tokio::time::Instant::now();
    let (a, b) = tokio::join!(
        naive_clients(&pa, &ua, 16, 60, &[]),
        naive_clients(&pb, &ub, 16, 72, &[]),
    );
    let stopped = sim
        .hits("/limited/a")
        .last()
        .map(|h| h.at.duration_since(t0).as_secs_f64())
        .expect("collector-a was served");
    let (_, providers) = sluice.admin_get("/v1/providers/127.0.0.62").await;
    let p: Value = serde_json::from_str(&providers).unwrap();
    let rate = p["rate_rps"].as_f64().unwrap();
    let (na, nb) = (
        accepted(&sim, "a", t0, 30.0, 60.0),
        accepted(&sim, "b", t0, 30.0, 60.0),
    );
    let ratio = na as f64 / nb.max(1) as f64;
    let after = (stopped + 2.0, (stopped + 10.0).min(71.0));
    let alone = accepted(&sim, "b", t0, after.0, after.1) as f64 / (after.1 - after.0);
    let per_second: Vec<usize> = (0..72)
        .map(|s| accepted(&sim, "b", t0, f64::from(s), f64::from(s + 1)))
        .collect();
    println!(
        "weights 3:1, 16 clients each, hidden 20 req/s: 30–60 s accepted a {na}, b {nb} \
         (ratio {ratio:.2}, together {:.1} req/s); a stopped at {stopped:.1} s; b alone over \
         {:.0}–{:.0} s: {alone:.1} req/s against a learned rate of {rate:.1}; b per second: \
         {per_second:?}; clients saw: a {}, b {}; {providers}",
        (na + nb) as f64 / 30.0,
        after.0,
        after.1,
        a.trim(),
        b.trim()
    );
    assert!(
        (2.7..=3.3).contains(&ratio),
        "admitted 3:1 within 10 %: {na}:{nb} = {ratio:.2}"
    );
    assert!(
        (na + nb) as f64 / 30.0 >= 0.9 * 20.0,
        "together near the limit: {} req/s",
        (na + nb) as f64 / 30.0
    );
    assert!(
        alone >= 0.95 * rate,
        "alone, collector-b took {alone:.1} req/s of a learned {rate:.1}"
    );
}
