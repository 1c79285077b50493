//! Runs end to end (issue 10; R-RN1–R-RN6, R-RN8): the real binary, the
//! provider simulator, collectors as real curl processes configured only
//! by their proxy URL (`http://NAME:TOKEN@…`), and the admin API over real
//! HTTP.

use std::time::Duration;

use serde_json::{json, Value};
use sluice_tests::clients::curl;
use sluice_tests::harness::{api_call, Sluice, TempDir};
use sluice_tests::sim::Sim;
use tokio::time::Instant;

const T: Duration = Duration::from_secs(30);
const TOKEN: &str = "tok-collector-a";

/// A sluice with collector `collector-a` (and `collector-b`) whose
/// providers are loopback simulators, plus `extra` config.
fn start(extra: &str) -> Sluice {
    let dir = TempDir::new("runs");
    start_in(dir, extra)
}

fn start_in(dir: TempDir, extra: &str) -> Sluice {
    start_full(dir, "", extra)
}

/// `top`: top-level keys (before any table).
fn start_full(dir: TempDir, top: &str, extra: &str) -> Sluice {
    std::fs::write(dir.join("a.token"), format!("{TOKEN}\n")).unwrap();
    std::fs::write(dir.join("b.token"), "tok-collector-b\n").unwrap();
    let config = format!(
        "{top}[destinations]\nallow = [\"127.0.0.0/8\"]\n\
         [collectors.collector-a]\ntoken_file = \"{}\"\n\
         [collectors.collector-b]\ntoken_file = \"{}\"\n{extra}",
        dir.join("a.token").display(),
        dir.join("b.token").display()
    );
    Sluice::start_in(dir, &config)
}

/// The proxy URL a collector puts in `HTTP_PROXY`.
fn proxy_as(sluice: &Sluice, user: &str, token: &str) -> String {
    format!("http://{user}:{token}@{}", sluice.proxy)
}

async fn open(sluice: &Sluice, collector: &str, body: Value) -> (u16, Value) {
    sluice
        .api(
            "POST",
            &format!("/v1/collectors/{collector}/runs"),
            Some(&body),
        )
        .await
}

/// Fields of a provider's readout that only the provider's answers move.
fn provider_state(sluice_readout: &Value) -> Value {
    let p = &sluice_readout["providers"][0];
    let mut backoff = p["last_backoff"].clone();
    // How long ago is a clock, not state.
    if let Some(b) = backoff.as_object_mut() {
        b.remove("ago_ms");
    }
    json!({
        "rate_rps": p["rate_rps"],
        "interval_ms": p["interval_ms"],
        "throttle_point_rps": p["throttle_point_rps"],
        "error_baseline": p["error_baseline"],
        "last_backoff": backoff,
        "hold": p["hold"],
        "breaker_state": p["breaker"]["state"],
        "breaker_open_remaining_ms": p["breaker"]["open_remaining_ms"],
    })
}

/// Issue 10, first Done-when line (R-RN1–R-RN3, R-RN6): a run with
/// `request_cap = 50` against a provider answering some requests 503 —
/// exactly 50 attempts (retries counted) reach the provider; the next
/// request is refused at once with the budget reason; the provider's
/// readout is the same before and after the stop; a gap record with
/// reason `request_cap` and the last committed cursor exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cap_is_a_planned_stop_that_leaves_the_provider_alone() {
    let sim = Sim::start("127.0.0.57").await;
    let sluice = start("[providers.sim]\nhosts = [\"127.0.0.57\"]\nceiling_rps = 200.0\n");
    let (status, run) = open(&sluice, "collector-a", json!({ "request_cap": 50 })).await;
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_str().unwrap().to_string();
    let fence = run["lease"]["fencing_token"].as_u64().unwrap();
    assert!(
        run["lease"]["expires_at"].as_str().unwrap().ends_with('Z'),
        "{run}"
    );
    assert_eq!(run["pending_gaps"], 0);
    let (status, c) = sluice
        .api(
            "PUT",
            &format!("/v1/runs/{id}/checkpoints/orders"),
            Some(&json!({ "mode": "steady", "slice": 1, "cursor": "page-7", "fencing_token": fence })),
        )
        .await;
    assert_eq!(status, 200, "{c}");

    let proxy = proxy_as(&sluice, "collector-a", TOKEN);
    let url = sim.url("http", "/noise/150");
    let mut answers = Vec::new();
    let mut refused = None;
    let mut before = None;
    for _ in 0..120 {
        if sim.hits("/noise").len() == 50 && before.is_none() {
            before = Some(sluice.admin_get("/v1/providers").await.1);
        }
        let r = curl(&proxy, &[], &url, T).await;
        if r.status == 403 {
            refused = Some(r);
            break;
        }
        answers.push(r.status);
    }
    let refused = refused.expect("the run stopped within 120 requests");
    let proxy_status = refused.header("proxy-status").unwrap_or_default();
    assert!(
        proxy_status.contains("error=http_request_denied"),
        "{proxy_status}"
    );
    assert!(
        proxy_status.contains("run stopped: request_cap"),
        "{proxy_status}"
    );
    assert_eq!(
        sim.hits("/noise").len(),
        50,
        "exactly the cap reached the provider"
    );
    assert!(
        answers.iter().all(|s| *s == 200 || *s == 503),
        "{answers:?}"
    );

    // Refused at once, every time, and the provider does not notice.
    let t = Instant::now();
    for _ in 0..5 {
        let r = curl(&proxy, &[], &url, T).await;
        assert_eq!(r.status, 403);
    }
    assert!(t.elapsed() < Duration::from_secs(10));
    let after = sluice.admin_get("/v1/providers").await.1;
    let before: Value = serde_json::from_str(&before.expect("read at 50")).unwrap();
    let after: Value = serde_json::from_str(&after).unwrap();
    assert_eq!(provider_state(&before), provider_state(&after));
    assert_eq!(sim.hits("/noise").len(), 50);

    // Counted as run_stopped, never as a provider error.
    let (_, metrics) = sluice.admin_get("/metrics").await;
    assert!(
        metrics.contains("sluice_requests_total{outcome=\"run_stopped\",provider=\"sim\"} 6"),
        "{metrics}"
    );

    // The remainder is deferred: a gap with the last committed cursor.
    let (status, page) = sluice
        .api("GET", "/v1/collectors/collector-a/gaps", None)
        .await;
    assert_eq!(status, 200, "{page}");
    let gaps = page["gaps"].as_array().unwrap();
    assert_eq!(gaps.len(), 1, "{page}");
    assert_eq!(gaps[0]["stream"], "orders");
    assert_eq!(gaps[0]["cursor"], "page-7");
    assert_eq!(gaps[0]["reason"], "request_cap");
    assert_eq!(gaps[0]["run"], id.as_str());
    assert_eq!(page["drained"], true);

    let (status, summary) = sluice
        .api("POST", &format!("/v1/runs/{id}/finish"), None)
        .await;
    assert_eq!(status, 200, "{summary}");
    assert_eq!(summary["attempts"], 50);
    assert_eq!(summary["stop_reason"], "request_cap");
    assert_eq!(summary["refusals"]["request_cap"], 6);
    assert_eq!(summary["gaps_recorded"], 1);
    assert_eq!(summary["phase"], "finished");

    // Per collector in /metrics (collectors come from the config).
    let (_, metrics) = sluice.admin_get("/metrics").await;
    for line in [
        "sluice_run_attempts_total{collector=\"collector-a\"} 50",
        "sluice_runs_total{collector=\"collector-a\",stop_reason=\"request_cap\"} 1",
        "sluice_runs_active{collector=\"collector-a\"} 0",
        "sluice_runs_active{collector=\"collector-b\"} 0",
        "sluice_gaps_pending{collector=\"collector-a\"} 1",
        "sluice_checkpoint_commits_total{collector=\"collector-a\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
}

/// R-RN2 (issue 19's budget edges): an attempt counts only when it leaves
/// for the provider. Under a cap of 3 at 1 req/s, two curls that give up
/// (`--max-time 0.3`) while queued for their pacing slots give their
/// attempts back: the run still sends three, and refuses the fourth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_client_left_while_queued_is_not_counted() {
    let sim = Sim::start("127.0.1.60").await;
    let sluice =
        start("[providers.slow]\nhosts = [\"127.0.1.60\"]\nceiling_rps = 2.0\nstart_rps = 1.0\n");
    let (status, run) = open(&sluice, "collector-a", json!({ "request_cap": 3 })).await;
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_str().unwrap().to_string();
    let proxy = proxy_as(&sluice, "collector-a", TOKEN);
    let url = sim.url("http", "/ok");
    assert_eq!(curl(&proxy, &[], &url, T).await.status, 200);
    let impatient: Vec<_> = (0..2)
        .map(|_| {
            let (proxy, url) = (proxy.clone(), url.clone());
            tokio::spawn(async move { curl(&proxy, &[], &url, Duration::from_millis(300)).await })
        })
        .collect();
    for c in impatient {
        let r = c.await.unwrap();
        assert_eq!(
            r.status,
            0,
            "curl gave up before its slot: {:?}",
            r.header("proxy-status")
        );
    }
    // sluice sees each client go; poll (bounded) until both are given back.
    let mut attempts = None;
    for _ in 0..100 {
        let (_, r) = sluice.api("GET", &format!("/v1/runs/{id}"), None).await;
        attempts = r["attempts"].as_u64();
        if attempts == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(attempts, Some(1), "only the request that left counts");
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(curl(&proxy, &[], &url, T).await.status);
    }
    assert_eq!(statuses, [200, 200, 403]);
    assert_eq!(
        sim.hits("/ok").len(),
        3,
        "exactly the cap reached the provider"
    );
}

/// R-RN2: a deadline that passes while a slow request is in flight lets
/// it finish with the provider's answer; the next is refused with
/// `deadline`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_lets_the_request_in_flight_finish() {
    let sim = Sim::start("127.0.0.58").await;
    let sluice = start("");
    let (status, _) = open(&sluice, "collector-a", json!({ "deadline_s": 1 })).await;
    assert_eq!(status, 201);
    let proxy = proxy_as(&sluice, "collector-a", TOKEN);
    let r = curl(&proxy, &[], &sim.url("http", "/slow/2500"), T).await;
    assert_eq!(r.status, 200, "the provider's answer: {r:?}");
    let r = curl(&proxy, &[], &sim.url("http", "/ok"), T).await;
    assert_eq!(r.status, 403, "{r:?}");
    assert!(
        r.header("proxy-status")
            .unwrap_or_default()
            .contains("run stopped: deadline"),
        "{r:?}"
    );
    assert!(sim.hits("/ok").is_empty());
    // Without a run (another proxy user, no run open) nothing changes.
    let other = proxy_as(&sluice, "collector-b", "tok-collector-b");
    assert_eq!(
        curl(&other, &[], &sim.url("http", "/ok"), T).await.status,
        200
    );
}

/// R-RN8 (issue 32): a provider's outage is waited out parked within the
/// run. A serial collector's first failure goes back (one request's
/// failure proves nothing); its next request is parked once the failures of
/// two requests have gone on for a second, only probes go, and the provider,
/// recovered, answers it — one cool-down wait. Against a provider that
/// stays down, after `max_cooldown_waits` (2) cycles of `breaker_open_for`
/// (5 s) the provider's part of the run stops with `circuit_open` (its
/// breaker opened meanwhile), and the gap record names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_circuit_is_waited_out_within_the_run() {
    let recovering = Sim::start("127.0.0.59").await;
    let dead = Sim::start("127.0.0.60").await;
    let breaker = "breaker_min_calls = 4\nbreaker_half_open_probes = 1\nretry_max_attempts = 1\n";
    let sluice = start(&format!(
        "[runs]\nmax_cooldown_waits = 2\n\
         [providers.recovering]\nhosts = [\"127.0.0.59\"]\n{breaker}\
         [providers.dead]\nhosts = [\"127.0.0.60\"]\n{breaker}"
    ));
    let proxy = proxy_as(&sluice, "collector-a", TOKEN);
    let (status, run) = open(&sluice, "collector-a", json!({ "deadline_s": 120 })).await;
    assert_eq!(status, 201);
    let id = run["id"].as_str().unwrap().to_string();

    let url = recovering.url("http", "/fail503/4/a");
    assert_eq!(
        curl(&proxy, &[], &url, T).await.status,
        503,
        "the lone first"
    );
    let t = Instant::now();
    let r = curl(&proxy, &[], &url, T).await;
    assert_eq!(r.status, 200, "parked through the outage: {r:?}");
    // The verdict after a second, then probes at 0.5 s and a second apart:
    // two more 503s, then the 200.
    assert!(
        t.elapsed() >= Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );
    let (_, view) = sluice.api("GET", &format!("/v1/runs/{id}"), None).await;
    assert_eq!(view["cooldown_waits"], 1, "{view}");
    assert_eq!(view["stop_reason"], Value::Null);
    // Run-scoped evidence (issue 19, R-CB2): the run's view shows the
    // provider it sent to, its attempts and wait there, and the breaker's
    // transitions while the run was on: opened by the four failures, and
    // closed by the parked probe that was answered.
    let p = &view["providers"]["recovering"];
    assert_eq!(
        (&p["attempts"], &p["cooldown_waits"]),
        (&json!(5), &json!(1)),
        "{view}"
    );
    let moves: Vec<String> = p["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| format!("{}>{}:{}", t["from"], t["to"], t["reason"]).replace('"', ""))
        .collect();
    assert_eq!(
        moves,
        ["closed>open:failure_rate", "open>closed:probes_succeeded"],
        "{view}"
    );

    let url = dead.url("http", "/status/503");
    let mut statuses = Vec::new();
    let t = Instant::now();
    for _ in 0..20 {
        let r = curl(&proxy, &[], &url, T).await;
        statuses.push(r.status);
        if r.status == 403 {
            assert!(
                r.header("proxy-status")
                    .unwrap_or_default()
                    .contains("run stopped: circuit_open (provider dead)"),
                "{r:?}"
            );
            break;
        }
    }
    let took = t.elapsed();
    // The lone first; the second parked until the third cycle.
    assert_eq!(statuses, [503, 403], "{statuses:?}");
    assert!(
        took >= Duration::from_secs(11) && took < Duration::from_secs(14),
        "the verdict at 1 s, two cycles of 5 s: {took:?}"
    );
    // Two failures, then one probe a second.
    let hits = dead.hits("/status").len();
    assert!((10..=13).contains(&hits), "{hits}");
    let (_, summary) = sluice
        .api("POST", &format!("/v1/runs/{id}/finish"), None)
        .await;
    // Only the dead provider's part of the run stopped (R-RN8): the run
    // itself did not, and the gap record names the provider.
    assert_eq!(summary["stop_reason"], Value::Null, "{summary}");
    assert_eq!(
        summary["provider_stops"],
        json!({ "dead": "circuit_open" }),
        "{summary}"
    );
    let (_, page) = sluice
        .api("GET", "/v1/collectors/collector-a/gaps", None)
        .await;
    assert_eq!(page["gaps"][0]["reason"], "circuit_open", "{page}");
    assert_eq!(page["gaps"][0]["provider"], "dead", "{page}");
    let (_, view) = sluice.api("GET", &format!("/v1/runs/{id}"), None).await;
    let dead = &view["providers"]["dead"];
    assert_eq!(dead["stopped"], "circuit_open", "{view}");
    assert_eq!(dead["cooldown_waits"], 2, "{view}");
    let first_open = dead["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["to"] == "open")
        .cloned()
        .unwrap_or_default();
    assert_eq!(first_open["reason"], "failure_rate", "{view}");
}

/// R-RN4: one run per collector — a second gets 409 naming the holder
/// (also after waiting `wait_s`), until the first finishes or its lease
/// lapses; a checkpoint with a stale fencing token gets 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_run_per_collector_fenced() {
    let sluice = start("[runs]\nlease_ttl = \"2s\"\n");
    let (s, first) = open(&sluice, "collector-a", json!({})).await;
    assert_eq!(s, 201, "{first}");
    let first_id = first["id"].as_str().unwrap().to_string();
    let (s, refused) = open(&sluice, "collector-a", json!({})).await;
    assert_eq!(s, 409);
    assert_eq!(refused["holder"], first_id.as_str());
    // Heartbeats keep the lease past its TTL while the second waits.
    let t = Instant::now();
    let waiter = {
        let admin = sluice.admin;
        tokio::spawn(async move {
            api_call(
                admin,
                "POST",
                "/v1/collectors/collector-a/runs",
                Some(&json!({ "wait_s": 2.5 })),
                None,
            )
            .await
        })
    };
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (s, _) = sluice
            .api("POST", &format!("/v1/runs/{first_id}/heartbeat"), None)
            .await;
        if t.elapsed() < Duration::from_millis(2400) {
            assert_eq!(s, 200);
        }
    }
    let (s, v) = waiter.await.unwrap();
    assert_eq!(s, 409, "the lease was renewed: {v}");
    assert!(t.elapsed() >= Duration::from_millis(2400));
    // Another collector is not held up.
    assert_eq!(open(&sluice, "collector-b", json!({})).await.0, 201);
    // Finished: the lease is free.
    let (s, _) = sluice
        .api("POST", &format!("/v1/runs/{first_id}/finish"), None)
        .await;
    assert_eq!(s, 200);
    let (s, second) = open(&sluice, "collector-a", json!({})).await;
    assert_eq!(s, 201);
    let second_id = second["id"].as_str().unwrap().to_string();
    let stale = first["lease"]["fencing_token"].as_u64().unwrap();
    assert!(second["lease"]["fencing_token"].as_u64().unwrap() > stale);
    let (s, e) = sluice
        .api(
            "PUT",
            &format!("/v1/runs/{second_id}/checkpoints/s"),
            Some(&json!({ "mode": "steady", "slice": 1, "cursor": "x", "fencing_token": stale })),
        )
        .await;
    assert_eq!(
        (s, e["field"].as_str()),
        (409, Some("fencing_token")),
        "{e}"
    );
    // A lease lapses without heartbeat or traffic: then another may open.
    let t = Instant::now();
    let (s, v) = open(&sluice, "collector-a", json!({ "wait_s": 10 })).await;
    assert_eq!(s, 201, "{v}");
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    let (_, old) = sluice
        .api("GET", &format!("/v1/runs/{second_id}"), None)
        .await;
    assert_eq!(old["phase"], "expired", "{old}");
}

/// R-RN5: checkpoints only move forward and keep the cursor byte for
/// byte; a catch-up run cannot touch the steady cursor; a `200` survives
/// `kill -9`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_are_forward_only_exact_and_durable() {
    let sluice = start("");
    let (_, run) = open(&sluice, "collector-a", json!({})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let fence = run["lease"]["fencing_token"].as_u64().unwrap();
    let cursor = format!(
        "ünïcødé ✓ \"quoted\" back\\slash\ttab {}",
        "x".repeat(10 * 1024)
    );
    let put = |slice: u64, cursor: &str, mode: &str| json!({ "mode": mode, "slice": slice, "cursor": cursor, "fencing_token": fence });
    let path = format!("/v1/runs/{id}/checkpoints/orders%2Feu");
    let (s, v) = sluice
        .api("PUT", &path, Some(&put(5, &cursor, "steady")))
        .await;
    assert_eq!(s, 200, "{v}");
    for slice in [5, 4] {
        let (s, e) = sluice
            .api("PUT", &path, Some(&put(slice, "other", "steady")))
            .await;
        assert_eq!((s, e["field"].as_str()), (409, Some("slice")), "{e}");
    }
    let (_, list) = sluice
        .api("GET", "/v1/collectors/collector-a/checkpoints", None)
        .await;
    assert_eq!(
        list["checkpoints"]["steady"]["orders/eu"]["cursor"],
        cursor.as_str()
    );
    assert_eq!(list["checkpoints"]["steady"]["orders/eu"]["slice"], 5);
    // An empty stream's checkpoint can be saved.
    let (s, _) = sluice
        .api(
            "PUT",
            &format!("/v1/runs/{id}/checkpoints/empty"),
            Some(&put(1, "", "steady")),
        )
        .await;
    assert_eq!(s, 200);
    sluice
        .api("POST", &format!("/v1/runs/{id}/finish"), None)
        .await;

    // A catch-up run writes only the catch-up cursor.
    let (_, catchup) = open(&sluice, "collector-a", json!({ "mode": "catchup" })).await;
    let cid = catchup["id"].as_str().unwrap().to_string();
    let cfence = catchup["lease"]["fencing_token"].as_u64().unwrap();
    let (s, e) = sluice
        .api(
            "PUT",
            &format!("/v1/runs/{cid}/checkpoints/orders%2Feu"),
            Some(&json!({ "mode": "steady", "slice": 9, "cursor": "c", "fencing_token": cfence })),
        )
        .await;
    assert_eq!((s, e["field"].as_str()), (409, Some("mode")), "{e}");
    let (s, _) = sluice
        .api(
            "PUT",
            &format!("/v1/runs/{cid}/checkpoints/orders%2Feu"),
            Some(&json!({ "mode": "catchup", "slice": 1, "cursor": "2019", "fencing_token": cfence })),
        )
        .await;
    assert_eq!(s, 200);
    // A steady run beside the catch-up run: one active run per collector
    // and mode (R-RN4, R-FS1). A second steady run is refused, naming the
    // holder.
    let (s, steady) = open(&sluice, "collector-a", json!({})).await;
    assert_eq!(s, 201, "{steady}");
    let sid = steady["id"].as_str().unwrap().to_string();
    let (s, held) = open(&sluice, "collector-a", json!({ "mode": "steady" })).await;
    assert_eq!(
        (s, held["holder"].as_str()),
        (409, Some(sid.as_str())),
        "{held}"
    );
    let (_, c) = sluice.api("GET", "/v1/collectors/collector-a", None).await;
    assert_eq!(c["active_runs"].as_array().map(Vec::len), Some(2), "{c}");
    assert_eq!(c["active_run"]["id"], sid.as_str(), "steady first: {c}");

    // kill -9, restart on the same state: everything answered 200 is there.
    let dir = sluice.kill9();
    let sluice = start_in(dir, "");
    let (_, list) = sluice
        .api("GET", "/v1/collectors/collector-a/checkpoints", None)
        .await;
    assert_eq!(
        list["checkpoints"]["steady"]["orders/eu"]["cursor"],
        cursor.as_str()
    );
    assert_eq!(list["checkpoints"]["steady"]["orders/eu"]["slice"], 5);
    assert_eq!(list["checkpoints"]["steady"]["empty"]["cursor"], "");
    assert_eq!(
        list["checkpoints"]["catchup"]["orders/eu"]["cursor"],
        "2019"
    );
    // The catch-up run was active at the kill and its lease has not
    // lapsed: it is still active (R-RN10), its token still good, a commit
    // after the restart accepted; once it finishes a new run gets a newer
    // fencing token.
    let (_, old) = sluice.api("GET", &format!("/v1/runs/{cid}"), None).await;
    assert_eq!(old["phase"], "active", "{old}");
    assert_eq!(old["lease"]["fencing_token"], cfence, "{old}");
    // So is the steady run beside it, with its own token.
    let (_, resumed) = sluice.api("GET", &format!("/v1/runs/{sid}"), None).await;
    assert_eq!(resumed["phase"], "active", "{resumed}");
    assert_eq!(
        resumed["lease"]["fencing_token"], steady["lease"]["fencing_token"],
        "{resumed}"
    );
    let (s, _) = sluice
        .api("POST", &format!("/v1/runs/{sid}/finish"), None)
        .await;
    assert_eq!(s, 200);
    let (s, e) = sluice
        .api(
            "PUT",
            &format!("/v1/runs/{cid}/checkpoints/orders%2Feu"),
            Some(&json!({ "mode": "catchup", "slice": 2, "cursor": "2020", "fencing_token": cfence })),
        )
        .await;
    assert_eq!(s, 200, "a commit after the restart: {e}");
    let (s, _) = sluice
        .api("POST", &format!("/v1/runs/{cid}/finish"), None)
        .await;
    assert_eq!(s, 200);
    let (s, next) = open(&sluice, "collector-a", json!({})).await;
    assert_eq!(s, 201);
    assert!(next["lease"]["fencing_token"].as_u64().unwrap() > cfence);
    // A reset removes one stream's checkpoint in one mode.
    let (s, _) = sluice
        .api(
            "DELETE",
            "/v1/collectors/collector-a/checkpoints/orders%2Feu?mode=catchup",
            None,
        )
        .await;
    assert_eq!(s, 200);
    let (_, list) = sluice
        .api("GET", "/v1/collectors/collector-a/checkpoints", None)
        .await;
    assert_eq!(list["checkpoints"]["catchup"], json!({}));
    assert_eq!(list["checkpoints"]["steady"]["orders/eu"]["slice"], 5);
}

/// R-RN6: 1,000 gaps with cursors of mixed sizes drained with
/// `max_bytes = 4096`: no page over the budget (but a lone oversize
/// record), nothing lost or repeated, the last page says drained; resolved
/// gaps are no longer pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gaps_drain_in_byte_bounded_pages() {
    let sluice = start("");
    let (_, run) = open(&sluice, "collector-a", json!({})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let mut sent = Vec::new();
    for i in 0..1000usize {
        let size = match i % 10 {
            0 => 6000, // larger than a page
            1..=3 => 900,
            _ => 20 + i % 50,
        };
        let cursor = format!("{i}:{}", "c".repeat(size));
        let (s, g) = sluice
            .api(
                "POST",
                &format!("/v1/runs/{id}/gaps"),
                Some(&json!({ "stream": format!("s{}", i % 7), "cursor": cursor, "reason": "upstream_error" })),
            )
            .await;
        assert_eq!(s, 201, "{g}");
        sent.push(cursor);
    }
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        pages += 1;
        assert!(pages <= 1000, "paging advances");
        let path = match &after {
            Some(a) => format!("/v1/collectors/collector-a/gaps?max_bytes=4096&after={a}"),
            None => "/v1/collectors/collector-a/gaps?max_bytes=4096".to_string(),
        };
        let (s, page) = sluice.api("GET", &path, None).await;
        assert_eq!(s, 200);
        let gaps = page["gaps"].as_array().unwrap();
        let bytes: usize = gaps
            .iter()
            .map(|g| serde_json::to_vec(g).unwrap().len())
            .sum();
        assert!(
            bytes <= 4096 || gaps.len() == 1,
            "page of {bytes} bytes, {} gaps",
            gaps.len()
        );
        seen.extend(
            gaps.iter()
                .map(|g| g["cursor"].as_str().unwrap().to_string()),
        );
        if page["drained"] == true {
            assert_eq!(page["next"], Value::Null);
            break;
        }
        after = Some(page["next"].as_str().unwrap().to_string());
    }
    assert_eq!(seen, sent, "nothing lost or repeated, in order");
    assert!(pages > 100);
    // Resolving takes a gap out of the pending set.
    let (_, first) = sluice
        .api("GET", "/v1/collectors/collector-a/gaps?max_bytes=1", None)
        .await;
    let gid = first["gaps"][0]["id"].as_str().unwrap().to_string();
    let (s, _) = sluice
        .api("POST", &format!("/v1/gaps/{gid}/resolve"), None)
        .await;
    assert_eq!(s, 200);
    let (s, _) = sluice
        .api("POST", &format!("/v1/gaps/{gid}/resolve"), None)
        .await;
    assert_eq!(s, 404);
    let (_, c) = sluice.api("GET", "/v1/collectors/collector-a", None).await;
    assert_eq!(c["pending_gaps"], 999, "{c}");
}

/// Bad input gets a 4xx naming the field, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_naming_the_field() {
    let sluice = start("");
    let raw = |body: &str| {
        let (admin, body) = (sluice.admin, body.to_string());
        async move {
            let out = tokio::process::Command::new("curl")
                .args(["-sS", "--noproxy", "*", "-X", "POST", "-d"])
                .arg(body)
                .arg(format!("http://{admin}/v1/collectors/collector-a/runs"))
                .output()
                .await
                .unwrap();
            serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null)
        }
    };
    assert_eq!(raw("{not json").await["field"], "body");
    assert_eq!(raw("[1]").await["field"], "body");
    for (body, field) in [
        (json!({ "request_cap": -1 }), "request_cap"),
        (json!({ "request_cap": "ten" }), "request_cap"),
        (json!({ "deadline_s": 0 }), "deadline_s"),
        (json!({ "mode": "fast" }), "mode"),
        (json!({ "retry_ratio": 11 }), "retry_ratio"),
        (json!({ "colour": "red" }), "colour"),
    ] {
        let (s, e) = open(&sluice, "collector-a", body.clone()).await;
        assert_eq!((s, e["field"].as_str()), (400, Some(field)), "{body}: {e}");
    }
    let (s, e) = open(&sluice, "nobody", json!({})).await;
    assert_eq!((s, e["field"].as_str()), (404, Some("collector")));
    let (_, runs) = sluice
        .api("GET", "/v1/collectors/collector-a/runs", None)
        .await;
    assert_eq!(runs["runs"], json!([]), "nothing stored");

    let (_, run) = open(&sluice, "collector-a", json!({})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let fence = run["lease"]["fencing_token"].as_u64().unwrap();
    let gap = |reason: &str| json!({ "stream": "s", "reason": reason });
    let (s, e) = sluice
        .api("POST", &format!("/v1/runs/{id}/gaps"), Some(&gap("bored")))
        .await;
    assert_eq!((s, e["field"].as_str()), (400, Some("reason")), "{e}");
    let (s, e) = sluice
        .api(
            "PUT",
            &format!("/v1/runs/{id}/checkpoints/s"),
            Some(&json!({ "mode": "steady", "slice": 1, "fencing_token": fence })),
        )
        .await;
    assert_eq!((s, e["field"].as_str()), (400, Some("cursor")), "{e}");
    for unknown in ["collector-a.999999", "nodot", "nobody.1"] {
        let (s, e) = sluice
            .api("POST", &format!("/v1/runs/{unknown}/heartbeat"), None)
            .await;
        assert_eq!(
            (s, e["field"].as_str()),
            (404, Some("id")),
            "{unknown}: {e}"
        );
    }
    // Another collector's run: its token is not this run's.
    let (s, e) = api_call(
        sluice.admin,
        "POST",
        &format!("/v1/runs/{id}/heartbeat"),
        None,
        Some("tok-collector-b"),
    )
    .await;
    assert_eq!((s, e["field"].as_str()), (403, Some("id")), "{e}");
    sluice
        .api("POST", &format!("/v1/runs/{id}/finish"), None)
        .await;
    let (s, e) = sluice
        .api(
            "POST",
            &format!("/v1/runs/{id}/gaps"),
            Some(&gap("deadline")),
        )
        .await;
    assert_eq!((s, e["field"].as_str()), (409, Some("id")), "finished: {e}");
    let (s, e) = sluice
        .api("POST", &format!("/v1/runs/{id}/finish"), None)
        .await;
    assert_eq!((s, e["field"].as_str()), (409, Some("id")), "{e}");
    let (_, page) = sluice
        .api("GET", "/v1/collectors/collector-a/gaps", None)
        .await;
    assert_eq!(page["gaps"], json!([]), "nothing stored");
}

/// R-SF1 with collectors: a wrong or missing token gets 407 and never
/// reaches the provider — loopback clients too: once the config names any
/// proxy user, every client sends a valid pair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collectors_authenticate_with_their_token() {
    let sim = Sim::start("127.0.0.61").await;
    let sluice = start("");
    let url = sim.url("http", "/echo");
    let wrong = curl(&proxy_as(&sluice, "collector-a", "nope"), &[], &url, T).await;
    assert_eq!(wrong.status, 407, "{wrong:?}");
    let none = curl(&sluice.proxy_url(), &[], &url, T).await;
    assert_eq!(none.status, 407);
    // Issue 36, defect 3: a missing token and a wrong one say different
    // things — the rule, where the pair goes; or that it was not accepted.
    let (wrong, none) = (
        wrong.header("proxy-status").unwrap_or_default(),
        none.header("proxy-status").unwrap_or_default(),
    );
    assert!(
        none.contains("proxy credentials required") && none.contains("[collectors]"),
        "{none}"
    );
    assert!(wrong.contains("proxy credentials not accepted"), "{wrong}");
    let ok = curl(&proxy_as(&sluice, "collector-a", TOKEN), &[], &url, T).await;
    assert_eq!(ok.status, 200);
    let seen = ok.header("x-seen-headers").unwrap_or_default();
    assert!(!seen.contains("proxy-authorization"), "{seen}");
    assert_eq!(sim.hits("/echo").len(), 1);
}

/// Issue 36, defect 10 (R-OP8): `sluice run`'s refusals say what to
/// change — a collector the running config lacks, a token that is another
/// collector's, a token file that cannot be read — through the real
/// binary. (Before: `(401): unknown token`, `(403): this belongs to
/// another collector`, `cannot read ./nope`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_runs_refusals_say_what_to_change() {
    let sluice = start("");
    std::fs::write(sluice.dir.join("nobody.token"), "tok-nobody\n").unwrap();
    let said = |out: std::process::Output| {
        assert_ne!(out.status.code(), Some(0));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let cases = [
        (
            "collector-c",
            "nobody.token",
            "no collector \"collector-c\"",
        ),
        ("collector-c", "nobody.token", "[collectors.collector-c]"),
        (
            "collector-b",
            "a.token",
            "collector \"collector-a\"'s, not \"collector-b\"'s",
        ),
        (
            "collector-a",
            "missing.token",
            "cannot read the token file (--token-file)",
        ),
    ];
    for (name, token_file, want) in cases {
        let out = sluice
            .run_command_as(name, token_file, &[], &["true"])
            .output()
            .await
            .unwrap();
        let stderr = said(out);
        assert!(stderr.contains(want), "{name} {token_file}: {stderr}");
    }
    // Its help sets the server's listener, state directory and log format
    // apart (accepted after `run` as everywhere, but no part of a run).
    let help = std::process::Command::new(sluice_tests::harness::binary())
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let (own, server) = help
        .split_once("Server options (not used by run or status):")
        .unwrap_or_else(|| panic!("a heading for the server's options: {help}"));
    assert!(own.contains("--token-file"), "{help}");
    for unused in ["--listen", "--state-dir", "--log-format"] {
        assert!(
            !own.contains(unused) && server.contains(unused),
            "{unused} in: {help}"
        );
    }
}

/// `sluice run [args] -- COMMAND…` against `sluice` as the collector
/// `collector-a`, with the machine's proxy variables removed; the output.
async fn sluice_run(sluice: &Sluice, args: &[&str], command: &[&str]) -> std::process::Output {
    let out = sluice.run_command(args, command).output();
    tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("sluice run finished")
        .unwrap()
}

/// R-RN9, R-RN11: `sluice run -- python3 …` gives an unmodified collector
/// a run, and a planned stop is the schedule's success. The collector
/// fetches with urllib through the environment and raises on the first
/// `403` (as ordinary clients do): with `--request-cap 50` the provider
/// sees exactly 50 attempts, the summary names the planned stop, and
/// `sluice run` exits 0. The same collector failing on its own
/// (`sys.exit(4)`) before any stop exits 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_stop_is_the_schedules_success() {
    let sim = Sim::start("127.0.0.62").await;
    let sluice = start("");
    // `sluice run` signals the command at its next heartbeat after the
    // stop, up to a second after the 403; the collector ignores SIGTERM so
    // that the signal cannot cut it off before it prints the error it met.
    let script = r#"
import signal, sys, urllib.request
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.argv[2] == "fail":
    sys.exit(4)
for i in range(1000):
    urllib.request.urlopen(sys.argv[1], timeout=20).read()
"#;
    let url = sim.url("http", "/ok");
    let out = sluice_run(
        &sluice,
        &["--request-cap", "50"],
        &["python3", "-c", script, &url, "go"],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("HTTP Error 403"),
        "the collector raised: {stderr}"
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("finished: 50 attempts"), "{stderr}");
    assert!(
        stderr.contains("planned stop: request_cap; remainder recorded as 1 gap records"),
        "{stderr}"
    );
    assert_eq!(sim.hits("/ok").len(), 50);
    let (_, runs) = sluice
        .api("GET", "/v1/collectors/collector-a/runs", None)
        .await;
    assert_eq!(runs["runs"][0]["phase"], "finished", "{runs}");
    assert_eq!(runs["runs"][0]["stop_reason"], "request_cap", "{runs}");
    assert_eq!(runs["runs"][0]["gaps_recorded"], 1);

    let out = sluice_run(
        &sluice,
        &["--request-cap", "50"],
        &["python3", "-c", script, &url, "fail"],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "its own failure: {stderr}");
    assert!(!stderr.contains("planned stop"), "{stderr}");
    assert_eq!(sim.hits("/ok").len(), 50, "nothing more was sent");
}

/// R-RN11: a run-aware collector that uses `requests` both for the
/// provider and for `SLUICE_ADMIN`, with no `NO_PROXY` of its own (and a
/// destination guard that would refuse the admin API through the proxy):
/// its commits reach the admin API; run twice with a cap that stops it
/// half-way, the second run starts from `SLUICE_CHECKPOINTS`, and every
/// item was fetched exactly once. `SLUICE_GAPS` hands it the first run's
/// gap record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_run_hands_the_command_what_it_resumes_from() {
    let sim = Sim::start("127.0.1.50").await;
    let dir = TempDir::new("runs-handoff");
    std::fs::write(dir.join("a.token"), format!("{TOKEN}\n")).unwrap();
    // Only the provider's address is allowed: the admin API (127.0.0.1)
    // through the proxy would be refused by the destination guard.
    let config = format!(
        "[destinations]\nallow = [\"127.0.1.50/32\"]\n\
         [collectors.collector-a]\ntoken_file = \"{}\"\n",
        dir.join("a.token").display()
    );
    let sluice = Sluice::start_in(dir, &config);
    // The run stops at its cap and `sluice run` then sends the command
    // SIGTERM (its next heartbeat, up to a second after the refusal): a
    // run-aware collector takes that as "finish now" — here it stops
    // fetching and still prints its summary, whichever of the 403 and the
    // signal comes first.
    let script = r#"
import json, os, signal, sys, requests
stopping = False
def stop(signum, frame):
    global stopping
    stopping = True
signal.signal(signal.SIGTERM, stop)
base, admin, run = sys.argv[1], os.environ["SLUICE_ADMIN"], os.environ["SLUICE_RUN_ID"]
fence = int(os.environ["SLUICE_FENCING_TOKEN"])
cursors = json.load(open(os.environ["SLUICE_CHECKPOINTS"]))
gaps = json.load(open(os.environ["SLUICE_GAPS"]))
start = int(cursors["items"]["cursor"]) if "items" in cursors else 0
s = requests.Session()
fetched = []
for i in range(start, 100):
    if stopping:
        break
    r = s.get(f"{base}/item/{i}", timeout=20)
    if r.status_code == 403:
        break
    r.raise_for_status()
    fetched.append(i)
    c = s.put(f"{admin}/v1/runs/{run}/checkpoints/items", timeout=20,
              json={"mode": "steady", "slice": i + 1, "cursor": str(i + 1), "fencing_token": fence})
    c.raise_for_status()
print(json.dumps({"start": start, "fetched": len(fetched), "gaps": gaps,
                  "cap": os.environ.get("SLUICE_REQUEST_CAP")}))
"#;
    let base = format!("http://{}", sim.addr);
    let mut seen = Vec::new();
    for _ in 0..2 {
        let out = sluice_run(
            &sluice,
            &["--request-cap", "60"],
            &["python3", "-c", script, &base],
        )
        .await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{}\n{stderr}", String::from_utf8_lossy(&out.stdout)));
        seen.push(v);
    }
    println!("{seen:?}");
    assert_eq!(seen[0]["start"], 0);
    assert_eq!(seen[0]["fetched"], 60);
    assert_eq!(seen[0]["cap"], "60");
    assert_eq!(seen[0]["gaps"], json!([]));
    assert_eq!(seen[1]["start"], 60, "resumed from SLUICE_CHECKPOINTS");
    assert_eq!(seen[1]["fetched"], 40);
    let gap = &seen[1]["gaps"][0];
    assert_eq!(
        (&gap["stream"], &gap["cursor"], &gap["reason"]),
        (&json!("items"), &json!("60"), &json!("request_cap")),
        "{gap}"
    );
    for i in 0..100 {
        assert_eq!(
            sim.hits(&format!("/item/{i}"))
                .iter()
                .filter(|h| h.path == format!("/item/{i}"))
                .count(),
            1,
            "item {i}"
        );
    }
    // The second run's commits past the first run's cursor resolved its
    // gap: no budget gap is left open (R-RN12).
    let (_, page) = sluice
        .api("GET", "/v1/collectors/collector-a/gaps", None)
        .await;
    assert_eq!(page["gaps"], json!([]), "{page}");
    let (_, c) = sluice.api("GET", "/v1/collectors/collector-a", None).await;
    assert_eq!(c["pending_gaps"], 0, "{c}");
}

/// The collector's pending gaps, every page drained.
async fn drain_gaps(sluice: &Sluice) -> Vec<Value> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!("/v1/collectors/collector-a/gaps?after={a}"),
            None => "/v1/collectors/collector-a/gaps".to_string(),
        };
        let (s, page) = sluice.api("GET", &path, None).await;
        assert_eq!(s, 200, "{page}");
        all.extend(page["gaps"].as_array().unwrap().iter().cloned());
        if page["drained"] == true {
            return all;
        }
        after = Some(page["next"].as_str().unwrap().to_string());
    }
}

/// R-RN12: ten runs of a collector that knows nothing of runs, each
/// stopped by its cap, leave one open `*` gap, not ten — each stop's gap
/// supersedes the last — while a gap the collector posted itself stays;
/// `sluice_gaps_pending` equals what the drain returns. `max_bytes` above
/// the page bound answers 400 naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_runs_leave_one_open_gap_per_stream() {
    let sim = Sim::start("127.0.1.51").await;
    let sluice = start("");
    let (_, run) = open(&sluice, "collector-a", json!({})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let (s, g) = sluice
        .api(
            "POST",
            &format!("/v1/runs/{id}/gaps"),
            Some(&json!({ "stream": "orders", "cursor": "p9", "reason": "upstream_error" })),
        )
        .await;
    assert_eq!(s, 201, "{g}");
    sluice
        .api("POST", &format!("/v1/runs/{id}/finish"), None)
        .await;
    let script = r#"
import sys, urllib.request
for i in range(20):
    urllib.request.urlopen(sys.argv[1], timeout=20).read()
"#;
    let url = sim.url("http", "/ok");
    for _ in 0..10 {
        let out = sluice_run(
            &sluice,
            &["--request-cap", "3"],
            &["python3", "-c", script, &url],
        )
        .await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
    }
    assert_eq!(sim.hits("/ok").len(), 30);
    let gaps = drain_gaps(&sluice).await;
    println!("{gaps:?}");
    assert_eq!(gaps.len(), 2, "{gaps:?}");
    assert_eq!(
        (&gaps[0]["stream"], &gaps[0]["reason"], &gaps[0]["stop"]),
        (&json!("orders"), &json!("upstream_error"), &json!(false)),
        "the collector's own gap stays"
    );
    let star = &gaps[1];
    assert_eq!(
        (
            &star["stream"],
            &star["reason"],
            &star["mode"],
            &star["stop"]
        ),
        (
            &json!("*"),
            &json!("request_cap"),
            &json!("steady"),
            &json!(true)
        ),
        "{star}"
    );
    let (_, runs) = sluice
        .api("GET", "/v1/collectors/collector-a/runs?limit=1", None)
        .await;
    assert_eq!(star["run"], runs["runs"][0]["id"], "the newest stop's");
    let (_, metrics) = sluice.admin_get("/metrics").await;
    let pending = metrics
        .lines()
        .find(|l| l.starts_with("sluice_gaps_pending{collector=\"collector-a\"}"))
        .unwrap_or_default();
    assert!(pending.ends_with(" 2"), "{pending}");

    let (s, page) = sluice
        .api(
            "GET",
            "/v1/collectors/collector-a/gaps?max_bytes=1048577",
            None,
        )
        .await;
    assert_eq!((s, &page["field"]), (400, &json!("max_bytes")), "{page}");
    let (s, page) = sluice
        .api(
            "GET",
            "/v1/collectors/collector-a/gaps?max_bytes=1048576",
            None,
        )
        .await;
    assert_eq!(s, 200, "{page}");
}

/// R-RN12: a stop's gap carries the cursor as of the end of the run — the
/// collector committed after the `403` — and a later run's commit past it
/// resolves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stops_gap_takes_the_runs_last_cursor_and_resolves_on_a_later_commit() {
    let sim = Sim::start("127.0.1.52").await;
    let sluice = start("");
    let proxy = proxy_as(&sluice, "collector-a", TOKEN);
    async fn commit(sluice: &Sluice, id: &str, fence: u64, slice: u64, cursor: &str) {
        let (s, c) = sluice
            .api(
                "PUT",
                &format!("/v1/runs/{id}/checkpoints/orders"),
                Some(&json!({ "mode": "steady", "slice": slice, "cursor": cursor, "fencing_token": fence })),
            )
            .await;
        assert_eq!(s, 200, "{c}");
    }
    let (_, run) = open(&sluice, "collector-a", json!({ "request_cap": 2 })).await;
    let id = run["id"].as_str().unwrap().to_string();
    let fence = run["lease"]["fencing_token"].as_u64().unwrap();
    commit(&sluice, &id, fence, 1, "page-1").await;
    let url = sim.url("http", "/ok");
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(curl(&proxy, &[], &url, T).await.status);
    }
    assert_eq!(statuses, [200, 200, 403]);
    let gaps = drain_gaps(&sluice).await;
    assert_eq!(gaps[0]["cursor"], "page-1", "{gaps:?}");
    // The collector wrote what it had fetched, after the 403.
    commit(&sluice, &id, fence, 2, "page-2").await;
    let (_, summary) = sluice
        .api("POST", &format!("/v1/runs/{id}/finish"), None)
        .await;
    assert_eq!(summary["gaps_recorded"], 1, "{summary}");
    let gaps = drain_gaps(&sluice).await;
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    assert_eq!(
        (&gaps[0]["stream"], &gaps[0]["cursor"], &gaps[0]["slice"]),
        (&json!("orders"), &json!("page-2"), &json!(2)),
        "the cursor as of the end of the run: {gaps:?}"
    );
    let (_, run) = open(&sluice, "collector-a", json!({})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let fence = run["lease"]["fencing_token"].as_u64().unwrap();
    commit(&sluice, &id, fence, 3, "page-3").await;
    assert_eq!(drain_gaps(&sluice).await, Vec::<Value>::new(), "resolved");
    let (_, c) = sluice.api("GET", "/v1/collectors/collector-a", None).await;
    assert_eq!(c["pending_gaps"], 0, "{c}");
}

/// R-RN9: `sluice run` forwards SIGTERM to the command, finishes the run
/// and exits with the command's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_run_forwards_sigterm_and_finishes_the_run() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let sluice = start("");
    let script = "import signal, sys, time\n\
                  signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n\
                  print('ready', flush=True)\n\
                  time.sleep(60)\n";
    let mut child = sluice
        .run_command(&[], &["python3", "-c", script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(T, lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.as_deref(), Some("ready"));
    let (_, c) = sluice.api("GET", "/v1/collectors/collector-a", None).await;
    assert_eq!(c["active_run"]["phase"], "active", "{c}");
    let pid = child.id().unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(T, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(7), "the command's own status");
    let (_, c) = sluice.api("GET", "/v1/collectors/collector-a", None).await;
    assert_eq!(c["active_run"], "unknown", "{c}");
    assert_eq!(c["last_run"]["phase"], "finished", "{c}");
}

/// The run API on an admin listener bound beyond loopback (as a sidecar's
/// is, for Prometheus): a token given must be a collector's, and that
/// collector's; a caller on loopback — the same pod — needs none, so a
/// run-aware collector under `sluice run` commits with only
/// `SLUICE_ADMIN`. (Callers from beyond loopback need a token: that
/// classification is unit-tested in `serve::collectors`, since tests never
/// leave loopback.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_loopback_a_token_given_must_be_the_collectors() {
    let sluice = start_full(TempDir::new("runs"), "admin = \"0.0.0.0:0\"\n", "");
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], sluice.admin.port()));
    let path = "/v1/collectors/collector-a/runs";
    let (s, e) = api_call(admin, "POST", path, Some(&json!({})), Some("nope")).await;
    assert_eq!(
        (s, e["field"].as_str()),
        (401, Some("authorization")),
        "{e}"
    );
    let (s, e) = api_call(
        admin,
        "POST",
        path,
        Some(&json!({})),
        Some("tok-collector-b"),
    )
    .await;
    assert_eq!((s, e["field"].as_str()), (403, Some("id")), "{e}");
    let (s, run) = api_call(admin, "POST", path, Some(&json!({})), Some(TOKEN)).await;
    assert_eq!(s, 201, "{run}");
    let id = run["id"].as_str().unwrap();
    let fence = &run["lease"]["fencing_token"];
    let (s, e) = api_call(
        admin,
        "PUT",
        &format!("/v1/runs/{id}/checkpoints/orders"),
        Some(&json!({"mode": "steady", "slice": 1, "cursor": "c1", "fencing_token": fence})),
        None,
    )
    .await;
    assert_eq!(s, 200, "a commit from loopback without a token: {e}");
}

/// R-RN10: runs survive sluice. A run-aware collector under `sluice run
/// --request-cap 300` that retries its failed requests; sluice is killed
/// with `kill -9` in the middle and restarted on the same ports and state.
/// The run is still active after the restart, a commit made after it is
/// accepted, and the provider sees at most 300 attempts in all — a crash
/// may lose part of the block of attempts reserved on disk, never give it
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_survives_kill_9_with_its_budget() {
    let sim = Sim::start("127.0.1.53").await;
    let sluice = start("");
    let (proxy, admin) = (sluice.proxy, sluice.admin);
    let script = r#"
import json, os, sys, time, requests
url, admin = sys.argv[1], os.environ["SLUICE_ADMIN"]
run, fence = os.environ["SLUICE_RUN_ID"], int(os.environ["SLUICE_FENCING_TOKEN"])
s, done, commits = requests.Session(), 0, {}
while True:
    try:
        r = s.get(url, timeout=10)
    except requests.exceptions.RequestException:
        time.sleep(0.1)
        s = requests.Session()
        continue
    if r.status_code == 403:
        break
    r.raise_for_status()
    done += 1
    if done % 10 == 0:
        try:
            c = s.put(f"{admin}/v1/runs/{run}/checkpoints/items", timeout=10,
                      json={"mode": "steady", "slice": done, "cursor": str(done), "fencing_token": fence})
            commits[c.status_code] = commits.get(c.status_code, 0) + 1
        except requests.exceptions.RequestException:
            commits["down"] = commits.get("down", 0) + 1
print(json.dumps({"done": done, "commits": commits}))
"#;
    let url = sim.url("http", "/ok");
    let collector = sluice
        .run_command(&["--request-cap", "300"], &["python3", "-c", script, &url])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Mid-run: a hundred attempts at the provider.
    let until = Instant::now() + Duration::from_secs(60);
    while sim.hits("/ok").len() < 100 {
        assert!(Instant::now() < until, "the collector did not get going");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dir = sluice.kill9();
    let at_kill = sim.hits("/ok").len();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sluice = start_full(
        dir,
        &format!("listen = \"{proxy}\"\nadmin = \"{admin}\"\n"),
        "",
    );
    let (_, c) = sluice.api("GET", "/v1/collectors/collector-a", None).await;
    assert_eq!(c["active_run"]["phase"], "active", "after the restart: {c}");
    let id = c["active_run"]["id"].as_str().unwrap().to_string();
    let out = tokio::time::timeout(Duration::from_secs(120), collector.wait_with_output())
        .await
        .expect("the collector finished")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let seen: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}\n{stderr}", String::from_utf8_lossy(&out.stdout)));
    let total = sim.hits("/ok").len();
    println!("{seen}; {at_kill} at the kill, {total} in all\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "a planned stop: {stderr}");
    assert!(total <= 300, "{total} attempts reached the provider");
    assert!(total >= 300 - 32, "at most a block lost: {total}");
    let (_, list) = sluice
        .api("GET", "/v1/collectors/collector-a/checkpoints", None)
        .await;
    let slice = list["checkpoints"]["steady"]["items"]["slice"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        slice > at_kill as u64,
        "a commit after the restart was accepted: slice {slice}, {at_kill} done at the kill"
    );
    let (_, run) = sluice.api("GET", &format!("/v1/runs/{id}"), None).await;
    assert_eq!(run["stop_reason"], "request_cap", "{run}");
    assert_eq!(run["phase"], "finished", "{run}");
}

/// Issue 19: every answer to a run's request says what the run has left
/// (`Sluice-Run-Remaining`), so a collector can stop at a slice boundary
/// rather than at a `403`; a request outside any run carries none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_to_a_run_says_what_is_left() {
    let sim = Sim::start("127.0.1.54").await;
    let sluice = start("");
    let proxy = proxy_as(&sluice, "collector-a", TOKEN);
    let url = sim.url("http", "/ok");
    let r = curl(&proxy, &[], &url, T).await;
    assert_eq!(r.header("sluice-run-remaining"), None, "no run yet: {r:?}");
    let (s, _) = open(
        &sluice,
        "collector-a",
        json!({ "request_cap": 2, "deadline_s": 600 }),
    )
    .await;
    assert_eq!(s, 201);
    let mut left = Vec::new();
    for _ in 0..3 {
        let r = curl(&proxy, &[], &url, T).await;
        left.push((
            r.status,
            r.header("sluice-run-remaining").unwrap_or_default(),
        ));
    }
    println!("{left:?}");
    assert_eq!(left[0].0, 200);
    assert!(
        left[0].1.starts_with("attempts=1, deadline_s=59"),
        "{left:?}"
    );
    assert!(left[1].1.starts_with("attempts=0, deadline_s="), "{left:?}");
    assert_eq!(left[2].0, 403);
    assert!(
        left[2].1.starts_with("attempts=0, ") && left[2].1.ends_with("stopped=request_cap"),
        "{left:?}"
    );
}

/// R-RN10: a run that ends without a stop leaves its remainder as gap
/// records like any stop — when its lease lapses while sluice runs
/// (`expired`), and when it lapses while sluice is down (`interrupted`,
/// found at the next start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_lapses_leaves_its_gaps() {
    let dir = TempDir::new("runs-lapse");
    let sluice = start_full(dir, "", "[runs]\nlease_ttl = \"1s\"\n");
    let (_, run) = open(&sluice, "collector-a", json!({})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let fence = run["lease"]["fencing_token"].as_u64().unwrap();
    let (s, c) = sluice
        .api(
            "PUT",
            &format!("/v1/runs/{id}/checkpoints/orders"),
            Some(&json!({ "mode": "steady", "slice": 3, "cursor": "p3", "fencing_token": fence })),
        )
        .await;
    assert_eq!(s, 200, "{c}");
    // No heartbeat, no traffic: the lease lapses while sluice runs.
    let until = Instant::now() + Duration::from_secs(20);
    let view = loop {
        let (_, view) = sluice.api("GET", &format!("/v1/runs/{id}"), None).await;
        if view["phase"] != "active" || Instant::now() > until {
            break view;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(view["phase"], "expired", "{view}");
    let gaps = drain_gaps(&sluice).await;
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    assert_eq!(
        (&gaps[0]["stream"], &gaps[0]["cursor"], &gaps[0]["reason"]),
        (&json!("orders"), &json!("p3"), &json!("expired")),
        "{gaps:?}"
    );

    // A run active when sluice is killed, whose lease lapses before the
    // restart: interrupted, and its remainder recorded.
    let (_, run) = open(&sluice, "collector-a", json!({})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let lapses = run["lease"]["expires_at_unix_ms"].as_u64().unwrap();
    let dir = sluice.kill9();
    // Down until the lease has lapsed.
    while sluice_tests::harness::unix_ms() <= lapses + 100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sluice = start_full(dir, "", "[runs]\nlease_ttl = \"1s\"\n");
    let (_, view) = sluice.api("GET", &format!("/v1/runs/{id}"), None).await;
    assert_eq!(view["phase"], "interrupted", "{view}");
    assert_eq!(view["gaps_recorded"], 1, "{view}");
    let gaps = drain_gaps(&sluice).await;
    let mine: Vec<&Value> = gaps.iter().filter(|g| g["run"] == json!(id)).collect();
    assert_eq!(mine.len(), 1, "{gaps:?}");
    assert_eq!(
        (&mine[0]["stream"], &mine[0]["reason"]),
        (&json!("*"), &json!("interrupted")),
        "this run checkpointed nothing: one '*' gap (R-RN12): {gaps:?}"
    );
    assert_eq!(gaps.len(), 2, "the expired run's gap stays: {gaps:?}");
}

/// R-FS2: a run's request cap counts units. A provider whose cost table
/// prices `POST /graphql` at 10: a run capped at 45 units makes four posts
/// (40 units); the fifth would pass the cap, so it is not made and the run
/// stops there, planned — a 1-unit `GET` after it is refused too, and the
/// run's last answer says 5 units were left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_cap_counts_units() {
    let sim = Sim::start("127.0.0.68").await;
    let sluice =
        start("[providers.gql]\nhosts = [\"127.0.0.68\"]\ncosts = { \"POST /graphql\" = 10 }\n");
    let (s, run) = open(&sluice, "collector-a", json!({ "request_cap": 45 })).await;
    assert_eq!(s, 201, "{run}");
    let id = run["id"].as_str().unwrap().to_string();
    let proxy = proxy_as(&sluice, "collector-a", TOKEN);
    let url = sim.url("http", "/graphql");
    let mut posts = Vec::new();
    for _ in 0..5 {
        posts.push(
            curl(&proxy, &["-X", "POST", "-d", "{}"], &url, T)
                .await
                .status,
        );
    }
    assert_eq!(
        posts,
        [200, 200, 200, 200, 403],
        "the fifth would pass the cap"
    );
    let get = curl(&proxy, &[], &url, T).await;
    assert_eq!(get.status, 403, "the run has stopped: {get:?}");
    let remaining = get.header("sluice-run-remaining").unwrap_or_default();
    assert_eq!(
        remaining, "attempts=5, deadline_s=unbounded, stopped=request_cap",
        "{get:?}"
    );
    let (_, view) = sluice.api("GET", &format!("/v1/runs/{id}"), None).await;
    assert_eq!(
        (&view["attempts"], &view["units"], &view["stop_reason"]),
        (&json!(4), &json!(40), &json!("request_cap")),
        "{view}"
    );
    assert_eq!(sim.hits("/graphql#POST").len(), 4);
    assert_eq!(sim.hits("/graphql#GET").len(), 0);
}
