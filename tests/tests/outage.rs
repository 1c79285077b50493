//! Outages are not throttles, end to end (issue 18; R-SG4, R-RN8, R-SG3,
//! R-CB1): the real binary on the default config plus a collector, naive
//! Python clients configured only by their proxy variables, providers on
//! loopback that can take far more than the default ceiling and go down
//! the ways real ones do — a deploy's bare `503`s, the process gone
//! (connections refused, then back on the same port), connections reset
//! before an answer.
//!
//! One timeline, side by side for a plain proxy user and for a collector
//! under `sluice run` (budget to spare), each with its own three
//! providers:
//!
//! ```text
//! 0 ── ramp ── 8 ── 20 s before ── 28 ─ 3 s down ─ 31 ── 20 s after ── 51
//!      ── 10 s down ── 61 ── breaker_open_for + 5 s ── 71 ── 5 s measured ── 76
//! ```
//!
//! Measured at the provider: successes over the 20 s after the short
//! outage against the 20 s before it (≥ 0.9), and successes per second
//! over the 5 s after `breaker_open_for` + 5 s of the long outage's end
//! against the 20 s before it (≥ 0.9). Afterwards no throttle point below
//! the pre-outage rate, the rate back at the ceiling, two outages found
//! and said so; the run never stopped and its collector never got a
//! `run stopped` refusal; the provider readouts of the two sides agree.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use sluice_tests::harness::{Sluice, TempDir};
use sluice_tests::sim::{Outage, Sim};
use tokio::time::Instant;

const TOKEN: &str = "tok-outage";
const SHORT: (f64, f64) = (28.0, 31.0);
const LONG: (f64, f64) = (51.0, 61.0);
/// `breaker_open_for` (the default, 5 s) + 5 s.
const BACK_WITHIN: f64 = 10.0;
const END: f64 = 76.0;

/// How a provider goes down.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// Every request answered with a bare `503`.
    Unavailable,
    /// The process stops: connections refused until it is back.
    Refused,
    /// Every connection reset before an answer.
    Reset,
}

const KINDS: [Kind; 3] = [Kind::Unavailable, Kind::Refused, Kind::Reset];

/// The collector's naive clients: `clients` threads per URL, each sending
/// GETs back to back until `secs` have passed, no backoff of their own —
/// or, with `stop`, until it meets a planned stop (`403 run stopped`), as
/// a collector that defers the rest to its next run. Prints per URL the
/// statuses seen, and the wall-clock time of the first planned stop with
/// its `Proxy-Status`, as JSON.
const CLIENTS: &str = r#"
import json, signal, sys, threading, time, requests
clients, secs, stop, urls = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "stop", sys.argv[4:]
deadline = time.monotonic() + secs
# `sluice run` stops the command with SIGTERM when the run stops: finish up.
signal.signal(signal.SIGTERM, lambda *_: globals().update(deadline=0))
out = {u: {"statuses": {}, "stopped_at": None, "proxy_status": None} for u in urls}
lock = threading.Lock()
def run(url):
    s = requests.Session()
    while time.monotonic() < deadline:
        try:
            r = s.get(url, timeout=30)
            code = str(r.status_code)
        except Exception as e:
            r, code = None, type(e).__name__
        with lock:
            o = out[url]
            o["statuses"][code] = o["statuses"].get(code, 0) + 1
            ps = r.headers.get("proxy-status", "") if r is not None else ""
            if code == "403" and "run stopped" in ps:
                if o["stopped_at"] is None:
                    o["stopped_at"], o["proxy_status"] = time.time(), ps
                if stop:
                    return
threads = [threading.Thread(target=run, args=(u,)) for u in urls for _ in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(out))
"#;

struct Side {
    name: &'static str,
    sluice: Sluice,
    sims: Vec<(Kind, Sim)>,
}

/// A sluice on the default config, plus loopback providers allowed and
/// the collector `collector-a`.
fn start(tag: &str) -> Sluice {
    let dir = TempDir::new(&format!("outage-{tag}"));
    std::fs::write(dir.join("a.token"), format!("{TOKEN}\n")).unwrap();
    let config = format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n\
         [collectors.collector-a]\ntoken_file = \"{}\"\n",
        dir.join("a.token").display()
    );
    Sluice::start_in(dir, &config)
}

async fn side(name: &'static str, ips: [&str; 3]) -> Side {
    let sluice = start(name);
    let mut sims = Vec::new();
    for (kind, ip) in KINDS.into_iter().zip(ips) {
        sims.push((kind, Sim::start(ip).await));
    }
    Side { name, sluice, sims }
}

fn urls(side: &Side) -> Vec<String> {
    side.sims
        .iter()
        .map(|(_, sim)| sim.url("http", "/ok"))
        .collect()
}

/// Starts the clients: the collector with no run open, or under `sluice
/// run` with budget to spare.
fn clients(side: &Side, per_url: u32, under_run: bool) -> tokio::process::Child {
    let mut cmd = if under_run {
        side.sluice.run_command(
            &["--request-cap", "1000000", "--deadline", "300s"],
            &["python3", "-c", CLIENTS],
        )
    } else {
        // The same collector, with no run open: a proxy user like any
        // (its proxy set below).
        let mut c = tokio::process::Command::new("python3");
        c.args(["-c", CLIENTS]);
        c
    };
    // `sluice run` hands its environment on to the clients.
    sluice_tests::clients::client_env(&mut cmd);
    if !under_run {
        let proxy = format!("http://collector-a:{TOKEN}@{}", side.sluice.proxy);
        sluice_tests::clients::with_proxy(&mut cmd, &proxy);
    }
    cmd.arg(per_url.to_string())
        .arg(format!("{END}"))
        .arg("go")
        .args(urls(side))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    cmd.spawn().expect("start the clients")
}

async fn at(t0: Instant, secs: f64) {
    tokio::time::sleep_until(t0 + Duration::from_secs_f64(secs)).await;
}

async fn down(sims: &mut [(Kind, Sim)]) {
    for (kind, sim) in sims.iter_mut() {
        match kind {
            Kind::Unavailable => sim.set_outage(Some(Outage::Status(503))),
            Kind::Refused => sim.stop(),
            Kind::Reset => sim.set_outage(Some(Outage::Reset)),
        }
    }
}

async fn up(sims: &mut [(Kind, Sim)]) {
    for (kind, sim) in sims.iter_mut() {
        match kind {
            Kind::Refused => sim.restart().await,
            _ => sim.set_outage(None),
        }
    }
}

/// Successes the provider answered between `from` and `to` seconds.
fn ok(sim: &Sim, t0: Instant, from: f64, to: f64) -> usize {
    let (a, b) = (
        t0 + Duration::from_secs_f64(from),
        t0 + Duration::from_secs_f64(to),
    );
    sim.hits("/")
        .iter()
        .filter(|h| h.status == 200 && h.at >= a && h.at < b)
        .count()
}

/// The readout of the provider at `sim`.
async fn readout(sluice: &Sluice, sim: &Sim) -> Value {
    let (status, body) = sluice.admin_get("/v1/providers").await;
    assert_eq!(status, 200, "{body}");
    let all: Value = serde_json::from_str(&body).unwrap();
    let host = sim.addr.ip().to_string();
    all["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"].as_str() == Some(host.as_str()))
        .cloned()
        .unwrap_or_else(|| {
            // What sluice said of that host, for the reader of the failure.
            let log = sluice.log();
            let said: Vec<&str> = log.lines().filter(|l| l.contains(&host)).collect();
            let tail = &said[said.len().saturating_sub(40)..];
            panic!(
                "no readout for {host}: {all}\nits last {} log lines of {}:\n{}\nlog tail:\n{}",
                tail.len(),
                said.len(),
                tail.join("\n"),
                log.lines().rev().take(40).collect::<Vec<_>>().join("\n")
            )
        })
}

/// What the provider's readout says it learned, for comparing the sides.
fn learned(p: &Value) -> Value {
    serde_json::json!({
        "rate_rps": p["rate_rps"],
        "throttle_point_rps": p["throttle_point_rps"],
        "condition": p["condition"]["state"],
        "outages": p["outages"],
        "breaker": p["breaker"]["state"],
    })
}

/// The breaker's evidence, as (from, to, reason).
async fn evidence(sluice: &Sluice, sim: &Sim) -> Vec<String> {
    let host = sim.addr.ip().to_string();
    let (_, body) = sluice.admin_get(&format!("/v1/providers/{host}")).await;
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    v["breaker"]["evidence"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|t| format!("{}>{}:{}", t["from"], t["to"], t["reason"]).replace('"', ""))
                .collect()
        })
        .unwrap_or_default()
}

/// One timeline for both sides at `per_url` clients per provider.
async fn ride_out(per_url: u32, plain_ips: [&str; 3], run_ips: [&str; 3]) {
    let mut plain = side("plain", plain_ips).await;
    let mut run = side("run", run_ips).await;
    let t0 = Instant::now();
    let plain_clients = clients(&plain, per_url, false);
    let run_clients = clients(&run, per_url, true);
    at(t0, SHORT.0).await;
    down(&mut plain.sims).await;
    down(&mut run.sims).await;
    at(t0, SHORT.1).await;
    up(&mut plain.sims).await;
    up(&mut run.sims).await;
    at(t0, LONG.0).await;
    down(&mut plain.sims).await;
    down(&mut run.sims).await;
    at(t0, LONG.1).await;
    up(&mut plain.sims).await;
    up(&mut run.sims).await;
    let plain_out =
        tokio::time::timeout(Duration::from_secs(120), plain_clients.wait_with_output())
            .await
            .expect("the plain clients finished")
            .unwrap();
    let run_out = tokio::time::timeout(Duration::from_secs(120), run_clients.wait_with_output())
        .await
        .expect("the run's clients finished")
        .unwrap();
    let run_stderr = String::from_utf8_lossy(&run_out.stderr);
    assert!(
        plain_out.status.success(),
        "{}",
        String::from_utf8_lossy(&plain_out.stderr)
    );
    assert_eq!(run_out.status.code(), Some(0), "sluice run: {run_stderr}");

    let mut failures = Vec::new();
    let mut learned_by_side: BTreeMap<(&str, String), Value> = BTreeMap::new();
    for (side, out) in [(&plain, &plain_out), (&run, &run_out)] {
        let seen: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!("clients printed {:?}", String::from_utf8_lossy(&out.stdout))
        });
        for (kind, sim) in &side.sims {
            let label = format!("{} {kind:?} ({per_url} clients)", side.name);
            let before = ok(sim, t0, SHORT.0 - 20.0, SHORT.0);
            let after = ok(sim, t0, SHORT.1, SHORT.1 + 20.0);
            let long_before = ok(sim, t0, LONG.0 - 20.0, LONG.0) as f64 / 20.0;
            let back = ok(sim, t0, LONG.1 + BACK_WITHIN, LONG.1 + BACK_WITHIN + 5.0) as f64 / 5.0;
            // The first second after the return at 0.9 of the rate before.
            let recovered = (0..15)
                .find(|s| {
                    let from = LONG.1 + f64::from(*s);
                    ok(sim, t0, from, from + 1.0) as f64 >= 0.9 * long_before
                })
                .map_or("never".to_string(), |s| format!("{s} s"));
            let p = readout(&side.sluice, sim).await;
            let seen = &seen[sim.url("http", "/ok")];
            let statuses = &seen["statuses"];
            println!(
                "{label}: 3 s outage: {after} successes in the 20 s after / {before} before = {:.3}; \
                 10 s outage: {back:.1}/s at +{BACK_WITHIN}..+{} s / {long_before:.1}/s before = {:.3} \
                 (0.9 reached {recovered} after the return); clients saw {statuses}; readout {}; evidence {:?}",
                after as f64 / before.max(1) as f64,
                BACK_WITHIN + 5.0,
                back / long_before.max(0.1),
                learned(&p),
                evidence(&side.sluice, sim).await,
            );
            if (after as f64) < 0.9 * before as f64 {
                failures.push(format!("{label}: 3 s outage cost more than 10 %"));
            }
            if back < 0.9 * long_before {
                failures.push(format!("{label}: not back within breaker_open_for + 5 s"));
            }
            let pre_rate = before as f64 / 20.0;
            let tp = &p["throttle_point_rps"];
            if tp.as_f64().is_some_and(|tp| tp < pre_rate) {
                failures.push(format!("{label}: a throttle point {tp} below {pre_rate}"));
            }
            if p["rate_rps"] != p["ceiling_rps"] {
                failures.push(format!("{label}: rate {} after", p["rate_rps"]));
            }
            if p["outages"] != 2 {
                failures.push(format!("{label}: {} outages found, not 2", p["outages"]));
            }
            if !seen["stopped_at"].is_null() {
                failures.push(format!("{label}: the collector got run-stopped refusals"));
            }
            learned_by_side.insert((side.name, format!("{kind:?}")), learned(&p));
        }
    }
    // The run never stopped, for any provider.
    assert!(run_stderr.contains("finished"), "{run_stderr}");
    let (_, runs) = run
        .sluice
        .api("GET", "/v1/collectors/collector-a/runs", None)
        .await;
    let last = &runs["runs"][0];
    println!("run: {last}");
    if last["stop_reason"] != Value::Null || last["provider_stops"] != serde_json::json!({}) {
        failures.push(format!("the run stopped: {last}"));
    }
    if last["refusals"].get("circuit_open").is_some() {
        failures.push(format!(
            "the run's requests were refused at an open circuit: {last}"
        ));
    }
    // The provider readouts are as without the run.
    for kind in KINDS {
        let k = format!("{kind:?}");
        let (a, b) = (
            &learned_by_side[&("plain", k.clone())],
            &learned_by_side[&("run", k.clone())],
        );
        if a != b {
            failures.push(format!("{k}: with the run {b}, without {a}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Issue 18's Done-when, first two lines, at 8 and then 32 clients per
/// provider (one after the other: the machine has two cores).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outages_are_ridden_out_at_full_speed_with_and_without_a_run() {
    ride_out(
        8,
        ["127.0.1.1", "127.0.1.2", "127.0.1.3"],
        ["127.0.1.4", "127.0.1.5", "127.0.1.6"],
    )
    .await;
    ride_out(
        32,
        ["127.0.1.7", "127.0.1.8", "127.0.1.9"],
        ["127.0.1.10", "127.0.1.11", "127.0.1.12"],
    )
    .await;
}

/// Issue 18's Done-when, third line (R-RN8), as parking made it (issue
/// 32): a provider down for good under `sluice run`, with a second,
/// healthy provider in the same run. Eight threads on each. The dead
/// provider's requests are parked, only probes reach it (at most two a
/// second), and its part stops with `circuit_open` after
/// `max_cooldown_waits` (3) cycles of `breaker_open_for` — each cycle one
/// wait, whatever the concurrency — 15 s after the outage was told, with a
/// gap record naming it; the healthy provider's requests keep succeeding
/// until the run's own budget (its request cap) ends, run-wide; `sluice
/// run` exits 69, naming the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_provider_stops_only_its_part_of_the_run() {
    let sluice = start("dead");
    let mut dead = Sim::start("127.0.1.31").await;
    dead.stop();
    let healthy = Sim::start("127.0.1.32").await;
    let (dead_url, healthy_url) = (dead.url("http", "/ok"), healthy.url("http", "/ok"));
    const CAP: u64 = 1500;
    let out = sluice
        .run_command(
            &["--request-cap", &CAP.to_string()],
            &[
                "python3",
                "-c",
                CLIENTS,
                "8",
                "120",
                "stop",
                &dead_url,
                &healthy_url,
            ],
        )
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), out)
        .await
        .expect("the collector finished")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let seen: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}\n{stderr}", String::from_utf8_lossy(&out.stdout)));
    println!("collector saw {seen}\n{stderr}");
    // A provider's part stopped on source pressure: 69, naming it.
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("127.0.1.31 (circuit_open)"), "{stderr}");

    let d = &seen[&dead_url];
    let ps = d["proxy_status"].as_str().unwrap_or_default();
    assert!(
        ps.contains("run stopped: circuit_open (provider 127.0.1.31)"),
        "{d}"
    );
    let h = &seen[&healthy_url];
    assert!(
        h["proxy_status"]
            .as_str()
            .unwrap_or_default()
            .contains("run stopped: request_cap"),
        "{h}"
    );
    assert_eq!(h["statuses"].get("503"), None, "{h}");

    let (_, runs) = sluice
        .api("GET", "/v1/collectors/collector-a/runs", None)
        .await;
    let run = &runs["runs"][0];
    println!("run: {run}");
    assert_eq!(run["stop_reason"], "request_cap", "{run}");
    assert_eq!(
        run["provider_stops"],
        serde_json::json!({ "127.0.1.31": "circuit_open" }),
        "{run}"
    );
    assert_eq!(run["cooldown_waits"], 3, "one wait per cycle: {run}");
    assert_eq!(run["attempts"], CAP, "{run}");
    // Every attempt the healthy provider saw succeeded, and it saw the
    // rest of the cap once the dead provider's part stopped.
    let healthy_ok = healthy.hits("/").iter().filter(|h| h.status == 200).count() as u64;
    let dead_attempts = CAP - healthy_ok;
    println!(
        "the healthy provider answered {healthy_ok}; the dead one took {dead_attempts} attempts"
    );
    assert_eq!(h["statuses"]["200"].as_u64(), Some(healthy_ok), "{h}");

    // Evidence: the breaker opened (its streak: the probes' failures).
    let (_, body) = sluice.admin_get("/v1/providers/127.0.1.31").await;
    let p: Value = serde_json::from_str(&body).unwrap();
    let ev = p["breaker"]["evidence"].as_array().unwrap();
    assert!(ev.iter().any(|t| t["to"] == "open"), "{ev:?}");
    // Dead from the start: told within a second of the run's start, then
    // three cycles of 5 s, and only probes meanwhile.
    let started_s = run["started_unix_ms"].as_f64().unwrap() / 1000.0;
    let stopped_s = d["stopped_at"].as_f64().unwrap();
    println!(
        "the dead provider's part stopped {:.1} s after the run began; it took {dead_attempts} attempts; readout {}",
        stopped_s - started_s,
        p["outage"]
    );
    assert!(
        stopped_s - started_s >= 3.0 * 5.0 && stopped_s - started_s <= 3.0 * 5.0 + 3.0,
        "waited the cycles out"
    );
    assert!(
        dead_attempts as f64 <= 2.0 * (stopped_s - started_s),
        "probes only: {dead_attempts}"
    );

    // The gap record names the provider.
    let (_, page) = sluice
        .api("GET", "/v1/collectors/collector-a/gaps", None)
        .await;
    let gaps = page["gaps"].as_array().unwrap();
    assert!(
        gaps.iter()
            .any(|g| g["reason"] == "circuit_open" && g["provider"] == "127.0.1.31"),
        "{page}"
    );
    assert!(
        gaps.iter()
            .any(|g| g["reason"] == "request_cap" && g["provider"].is_null()),
        "{page}"
    );
}
