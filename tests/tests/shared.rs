//! One budget across replicas (issue 13, R-DS1): real `redis-server`
//! processes on loopback, several real sluice processes sharing one
//! provider through it, naive Python clients per replica — judged at the
//! simulated provider.

use std::time::Duration;

use tokio::time::Instant;

use sluice_tests::clients::{curl, naive_clients, naive_clients_each};
use sluice_tests::harness::{Sluice, TempDir};
use sluice_tests::pki::TestCa;
use sluice_tests::redis::Redis;
use sluice_tests::sim::Sim;

fn config(ip: &str, redis: Option<&Redis>, replicas: u32) -> String {
    let shared = match redis {
        Some(r) => format!(
            "[shared]\nredis = \"{}\"\nreplicas = {replicas}\ncall_timeout = \"50ms\"\n",
            r.url()
        ),
        None => String::new(),
    };
    format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n{shared}[providers.p]\nhosts = [\"{ip}\"]\nceiling_rps = 50.0\nshared = {}\n",
        redis.is_some()
    )
}

fn replicas(n: u32, ip: &str, redis: Option<&Redis>) -> Vec<Sluice> {
    (0..n)
        .map(|_| Sluice::start(&config(ip, redis, n)))
        .collect()
}

/// Drives every replica with its own naive clients for `secs`, all at
/// once; what the clients saw, per replica.
async fn drive(replicas: &[Sluice], url: &str, clients: u32, secs: u32) -> Vec<String> {
    let tasks: Vec<_> = replicas
        .iter()
        .map(|s| {
            let (proxy, url) = (s.proxy_url(), url.to_string());
            tokio::spawn(async move { naive_clients(&proxy, &url, clients, secs, &[]).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// The `Retry-After` hold a replica wrote to Redis (ms since the epoch),
/// if any.
async fn shared_hold(redis: &Redis) -> Option<u64> {
    shared_field(redis, "hold").await.map(|h| h as u64)
}

/// A positive number a replica wrote to a shared budget's key in Redis.
async fn shared_field(redis: &Redis, field: &str) -> Option<f64> {
    let port = redis.port.to_string();
    let cli = |args: Vec<String>| {
        tokio::process::Command::new("redis-cli")
            .arg("-p")
            .arg(&port)
            .args(args)
            .output()
    };
    let keys = cli(vec!["--scan".into()]).await.ok()?;
    for key in String::from_utf8_lossy(&keys.stdout).lines() {
        let out = cli(vec!["HGET".into(), key.into(), field.into()])
            .await
            .ok()?;
        let value = String::from_utf8_lossy(&out.stdout).trim().parse::<f64>();
        if let Some(v) = value.ok().filter(|v| *v > 0.0) {
            return Some(v);
        }
    }
    None
}

async fn metric(s: &Sluice, prefix: &str) -> Option<String> {
    let (_, body) = s.admin_get("/metrics").await;
    body.lines()
        .find(|l| l.starts_with(prefix))
        .map(str::to_string)
}

/// Eight replicas, 16 naive clients, a hidden 20 req/s limit answered with
/// `Retry-After`: shared, the provider sees what one sluice would show it
/// (issue 21: ≥ 95 % of the limit, ≤ 0.5 % 429s over the second half; the
/// first 60 s from a cold start printed); not shared, several times the
/// 429s. Both run side by side and print.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_replicas_pace_like_one() {
    let redis = Redis::start();
    let (shared_sim, alone_sim) = (
        Sim::start("127.0.0.81").await,
        Sim::start("127.0.0.82").await,
    );
    shared_sim.set_limit(20.0, 10.0);
    alone_sim.set_limit(20.0, 10.0);
    let shared = replicas(8, "127.0.0.81", Some(&redis));
    let alone = replicas(8, "127.0.0.82", None);
    let path = "/limited-ra/1";
    let (a, b) = (shared_sim.url("http", path), alone_sim.url("http", path));
    let (seen_shared, seen_alone) =
        tokio::join!(drive(&shared, &a, 2, 60), drive(&alone, &b, 2, 60));
    let f_shared = shared_sim.figures(path, 30, 60, 20.0);
    let f_alone = alone_sim.figures(path, 30, 60, 20.0);
    let (w_shared, w_alone) = (
        shared_sim.figures(path, 0, 60, 20.0),
        alone_sim.figures(path, 0, 60, 20.0),
    );
    println!(
        "shared, second half: {f_shared}\n  first 60 s from a cold start: {w_shared}\n  \
         clients {seen_shared:?}\n  refusals over 30–60 s: {:?}",
        shared_sim.refusals(path, 30, 60)
    );
    println!(
        "not shared, second half: {f_alone}\n  first 60 s: {w_alone}\n  clients {seen_alone:?}"
    );
    // Each shared replica's view: where the fleet's rate came from.
    for (i, r) in shared.iter().enumerate() {
        let (_, v) = r.api("GET", "/v1/providers/p", None).await;
        println!(
            "replica {i}: rate {} limit {} last cut {}",
            v["rate_rps"], v["throttle_point_rps"], v["last_backoff"]
        );
    }
    let (_, readout) = shared[0].admin_get("/v1/providers/p").await;
    println!("replica 0: {readout}");
    assert!(
        f_shared.throttled_share <= 0.005,
        "shared: ≤ 0.5 % 429s over the second half: {f_shared}"
    );
    assert!(f_shared.goodput >= 0.95, "shared goodput: {f_shared}");
    // Eight replicas learning alone each discover the limit, each hold
    // and each probe by themselves: the provider pays for every discovery.
    assert!(
        w_alone.throttled >= 3 * w_shared.throttled.max(1),
        "not shared shows several times more 429s: {w_alone:?} vs {w_shared:?}"
    );
    let v: serde_json::Value = serde_json::from_str(&readout).unwrap();
    assert_eq!(v["shared"]["state"], "shared", "{readout}");
    let share = v["shared"]["share"].as_f64().expect("a measured share");
    assert!(share > 0.02 && share < 0.4, "one replica's share: {share}");
    let state = metric(
        &shared[0],
        "sluice_shared_budget_state{provider=\"p\",state=\"shared\"}",
    )
    .await;
    assert_eq!(
        state.as_deref().map(|l| l.ends_with(" 1")),
        Some(true),
        "{state:?}"
    );
}

/// Issue 21 (R-DS1): with fewer clients too — eight replicas sharing the
/// budget, one naive client each (8 in all), a hidden 20 req/s limit
/// answered with `Retry-After`, 60 s: over the second half ≥ 95 % of the
/// limit with ≤ 0.5 % 429s; the first 60 s from a cold start printed.
/// (Like every minute-long fleet here, run by `scripts/test` in the
/// fleets' phase, two at a time on their own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_with_one_client_per_replica_paces_like_one() {
    let redis = Redis::start();
    let sim = Sim::start("127.0.0.88").await;
    sim.set_limit(20.0, 10.0);
    let fleet = replicas(8, "127.0.0.88", Some(&redis));
    let path = "/limited-ra/1";
    let seen = drive(&fleet, &sim.url("http", path), 1, 60).await;
    let (half, whole) = (
        sim.figures(path, 30, 60, 20.0),
        sim.figures(path, 0, 60, 20.0),
    );
    println!(
        "8 replicas × 1 client, shared; second half: {half}\n  first 60 s from a cold start: \
         {whole}\n  clients {seen:?}"
    );
    assert!(
        half.throttled_share <= 0.005,
        "≤ 0.5 % 429s over the second half: {half}"
    );
    assert!(half.goodput >= 0.95, "goodput over the second half: {half}");
}

/// A `Retry-After` answered to one replica holds all of them: the provider
/// sees nothing from any replica until the hold ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_to_one_replica_holds_every_replica() {
    let redis = Redis::start();
    let sim = Sim::start("127.0.0.83").await;
    let reps = replicas(3, "127.0.0.83", Some(&redis));
    // Every replica joins the shared budget first.
    for r in &reps {
        let reply = curl(
            &r.proxy_url(),
            &[],
            &sim.url("http", "/ok"),
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(reply.status, 200);
    }
    // Replica 0 meets a 429 with Retry-After: 3 (and waits it out itself).
    let (proxy0, ra) = (reps[0].proxy_url(), sim.url("http", "/ra/3/x"));
    let held = curl(&proxy0, &[], &ra, Duration::from_secs(20));
    let ok = sim.url("http", "/ok");
    let others = async {
        // Once replica 0 has written the hold to Redis (polled, bounded).
        let started = Instant::now();
        while shared_hold(&redis).await.is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "no hold in Redis"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (p1, p2) = (reps[1].proxy_url(), reps[2].proxy_url());
        let (a, b) = tokio::join!(
            curl(&p1, &[], &ok, Duration::from_secs(20)),
            curl(&p2, &[], &ok, Duration::from_secs(20))
        );
        vec![a.status, b.status]
    };
    let (first, statuses) = tokio::join!(held, others);
    assert_eq!(first.status, 200, "replica 0 waited out its hold");
    assert_eq!(statuses, vec![200, 200]);
    let hits = sim.hits("/");
    let throttled = hits.iter().find(|h| h.status == 429).expect("the 429");
    let during: Vec<_> = hits
        .iter()
        .filter(|h| h.at > throttled.at && h.at < throttled.at + Duration::from_millis(2950))
        .collect();
    assert!(
        during.is_empty(),
        "nothing from any replica during the hold: {during:?}"
    );
    let after = hits.iter().filter(|h| h.at > throttled.at).count();
    assert_eq!(
        after, 3,
        "the held request and the two others, after the hold"
    );
}

/// A replica joining a warm shared provider starts at the learned rate
/// (its share of it through the one schedule), not cold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_replica_starts_warm() {
    let redis = Redis::start();
    let sim = Sim::start("127.0.0.84").await;
    sim.set_limit(20.0, 10.0);
    let first = replicas(2, "127.0.0.84", Some(&redis));
    drive(&first, &sim.url("http", "/limited-ra/1"), 2, 20).await;
    let (_, warm) = first[0].admin_get("/v1/providers/p").await;
    let warm: serde_json::Value = serde_json::from_str(&warm).unwrap();
    let learned = warm["shared"]["rate_rps"].as_f64().expect("a shared rate");
    assert!(
        learned > 10.0,
        "learned well past the 5 req/s cold start: {warm}"
    );
    let late = Sluice::start(&config("127.0.0.84", Some(&redis), 3));
    let reply = curl(
        &late.proxy_url(),
        &[],
        &sim.url("http", "/ok"),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(reply.status, 200);
    let (_, readout) = late.admin_get("/v1/providers/p").await;
    println!("warm {learned:.1} req/s; the new replica: {readout}");
    let v: serde_json::Value = serde_json::from_str(&readout).unwrap();
    assert_eq!(v["shared"]["state"], "shared");
    let rate = v["rate_rps"].as_f64().unwrap();
    assert!(
        (rate - learned).abs() <= learned * 0.3,
        "the new replica paces by the learned {learned:.1} req/s, not cold: {rate}"
    );
}

/// Redis killed mid-run: nothing fails, each replica paces alone at its
/// share (together within the limit × 1.1) and says it is degraded; Redis
/// back: shared again within a few seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_degrades_and_rejoins() {
    const WARM: Duration = Duration::from_secs(10);
    let mut redis = Redis::start();
    let sim = Sim::start("127.0.0.85").await;
    sim.set_limit(20.0, 10.0);
    let reps = replicas(4, "127.0.0.85", Some(&redis));
    let url = sim.url("http", "/limited-ra/1");
    let state_line = "sluice_shared_budget_state{provider=\"p\",state=";
    // 10 s shared, Redis down for 8 s, then back; the clients run 35 s.
    let script = async {
        tokio::time::sleep(WARM).await;
        redis.kill();
        let killed = Instant::now();
        // Every replica says it is degraded (polled, bounded).
        let mut states = Vec::new();
        while killed.elapsed() < Duration::from_secs(6) {
            states.clear();
            for r in &reps {
                states.push(metric(r, &format!("{state_line}\"degraded\"}}")).await);
            }
            if states
                .iter()
                .all(|s| s.as_deref().is_some_and(|l| l.ends_with(" 1")))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(8).saturating_sub(killed.elapsed())).await;
        let down = killed.elapsed();
        redis.restart();
        let back = Instant::now();
        let mut rejoined = None;
        while back.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let mut all = true;
            for r in &reps {
                let l = metric(r, &format!("{state_line}\"shared\"}}")).await;
                all &= l.is_some_and(|l| l.ends_with(" 1"));
            }
            if all {
                rejoined = Some(back.elapsed());
                break;
            }
        }
        (states, down, rejoined)
    };
    let (seen, (states, down, rejoined)) = tokio::join!(drive(&reps, &url, 2, 35), script);
    println!("clients: {seen:?}; degraded metrics: {states:?}; down {down:?}; rejoined after {rejoined:?}");
    for s in &seen {
        let words: Vec<&str> = s.split_whitespace().collect();
        assert!(
            words.iter().all(|w| w.starts_with("200=")),
            "no request failed because Redis was down: {seen:?}"
        );
    }
    for s in &states {
        assert!(
            s.as_deref().is_some_and(|l| l.ends_with(" 1")),
            "degraded: {states:?}"
        );
    }
    assert!(
        rejoined.is_some(),
        "shared again within 10 s of Redis' return"
    );
    // While Redis was down (from 2 s after the kill to the restart): the
    // replicas together within the limit × 1.1.
    let hits = sim.hits("/limited-ra");
    let start = hits.first().unwrap().at;
    let (a, b) = (start + WARM + Duration::from_secs(2), start + WARM + down);
    let n = hits.iter().filter(|h| h.at >= a && h.at < b).count();
    let rate = n as f64 / (b - a).as_secs_f64();
    println!("while Redis was down: {rate:.1} req/s at the provider");
    assert!(
        rate <= 22.0,
        "together within the limit × 1.1: {rate:.1} req/s"
    );
    assert!(rate >= 10.0, "and still working: {rate:.1} req/s");
}

/// A Redis that answers slowly (`DEBUG SLEEP`) does not stall requests
/// beyond the call timeout (50 ms): they go on, paced alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_does_not_stall_requests() {
    let redis = Redis::start();
    let sim = Sim::start("127.0.0.86").await;
    let s = Sluice::start(&config("127.0.0.86", Some(&redis), 2));
    let url = sim.url("http", "/ok");
    assert_eq!(
        curl(&s.proxy_url(), &[], &url, Duration::from_secs(10))
            .await
            .status,
        200
    );
    let port = redis.port.to_string();
    let sleeper = tokio::process::Command::new("redis-cli")
        .args(["-p", &port, "DEBUG", "SLEEP", "4"])
        .output();
    let requests = async {
        // Once Redis is asleep: a PING from another connection goes
        // unanswered (polled, bounded).
        let started = Instant::now();
        loop {
            let ping = tokio::process::Command::new("redis-cli")
                .args(["-p", &port, "PING"])
                .kill_on_drop(true)
                .output();
            if tokio::time::timeout(Duration::from_millis(200), ping)
                .await
                .is_err()
            {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "Redis never slept"
            );
        }
        let mut took = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            let r = curl(&s.proxy_url(), &[], &url, Duration::from_secs(10)).await;
            took.push((r.status, t.elapsed()));
        }
        took
    };
    let (slept, took) = tokio::join!(sleeper, requests);
    assert!(slept.unwrap().status.success());
    println!("requests while Redis slept 4 s: {took:?}");
    for (status, t) in &took {
        assert_eq!(*status, 200);
        assert!(
            *t < Duration::from_secs(2),
            "not stalled by Redis: {took:?}"
        );
    }
    let degraded = metric(
        &s,
        "sluice_shared_budget_state{provider=\"p\",state=\"degraded\"}",
    )
    .await;
    assert!(
        degraded.as_deref().is_some_and(|l| l.ends_with(" 1")),
        "says it paces alone while Redis does not answer: {degraded:?}"
    );
}

/// Issue 20: a shared budget over TLS (`rediss://`) against a real
/// `redis-server` serving TLS only, its certificate from a CA sluice is
/// given as `upstream.extra_ca`: shared. Given another CA, sluice refuses
/// the server (never shares through an untrusted Redis) and paces alone,
/// degraded — its requests still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_trusts_only_its_ca() {
    let ca = TestCa::new("redis CA");
    let redis = Redis::start_tls(&ca);
    let sim = Sim::start("127.0.0.87").await;
    let dir = TempDir::new("shared-tls");
    std::fs::write(dir.join("redis-ca.pem"), &ca.pem).unwrap();
    std::fs::write(dir.join("other-ca.pem"), &TestCa::new("another CA").pem).unwrap();
    let url = sim.url("http", "/ok");
    let mut states = Vec::new();
    for ca_file in ["redis-ca.pem", "other-ca.pem"] {
        let config = format!(
            "{}[upstream]\nextra_ca = \"{}\"\n",
            config("127.0.0.87", Some(&redis), 1),
            dir.join(ca_file).display()
        );
        let s = Sluice::start(&config);
        assert!(config.contains("rediss://"), "{config}");
        for _ in 0..5 {
            let r = curl(&s.proxy_url(), &[], &url, Duration::from_secs(10)).await;
            assert_eq!(r.status, 200, "requests are served either way");
        }
        // The budget's state, once it has tried Redis (polled, bounded).
        let started = Instant::now();
        let state = loop {
            let (_, readout) = s.admin_get("/v1/providers/p").await;
            let v: serde_json::Value = serde_json::from_str(&readout).unwrap();
            let state = v["shared"]["state"].as_str().unwrap_or("").to_string();
            if state == "shared"
                || state == "degraded"
                || started.elapsed() > Duration::from_secs(10)
            {
                break state;
            }
            curl(&s.proxy_url(), &[], &url, Duration::from_secs(10)).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if state == "degraded" {
            // And stays so while requests go on (the trusted one was
            // shared within milliseconds): refused, not merely not yet tried.
            for _ in 0..10 {
                curl(&s.proxy_url(), &[], &url, Duration::from_secs(10)).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let (_, readout) = s.admin_get("/v1/providers/p").await;
            let v: serde_json::Value = serde_json::from_str(&readout).unwrap();
            assert_eq!(v["shared"]["state"], "degraded", "{readout}");
        }
        states.push(state);
    }
    assert_eq!(
        states,
        ["shared", "degraded"],
        "its CA trusted, another refused"
    );
}

/// R-FS2 through Redis: a request that costs 10 units takes ten of the
/// shared schedule's slots. One replica of a shared provider whose cost
/// table prices `POST /graphql` at 10, paced at 20 units a second: four
/// posts one after another reach the provider at least ten slots apart
/// (0.5 s), four gets do not wait for that, and the shared schedule counts
/// 4 × 10 + 4 = 44 units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_costly_request_takes_as_many_shared_slots() {
    let redis = Redis::start();
    let sim = Sim::start("127.0.0.89").await;
    let sluice = Sluice::start(&format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n[shared]\nredis = \"{}\"\nreplicas = 2\n\
         [providers.p]\nhosts = [\"127.0.0.89\"]\nceiling_rps = 50.0\nstart_rps = 20.0\nshared = true\n\
         costs = {{ \"POST /graphql\" = 10 }}\n",
        redis.url()
    ));
    let url = sim.url("http", "/graphql");
    let t = Duration::from_secs(20);
    for _ in 0..4 {
        let r = curl(&sluice.proxy_url(), &["-X", "POST", "-d", "{}"], &url, t).await;
        assert_eq!(r.status, 200, "{r:?}");
    }
    for _ in 0..4 {
        let r = curl(&sluice.proxy_url(), &[], &url, t).await;
        assert_eq!(r.status, 200, "{r:?}");
    }
    let posts: Vec<Instant> = sim.hits("/graphql#POST").iter().map(|h| h.at).collect();
    assert_eq!(posts.len(), 4);
    let gaps: Vec<f64> = posts
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    println!("posts {gaps:?} s apart");
    assert!(
        gaps.iter().all(|g| *g >= 0.45),
        "each post takes ten 50 ms slots: {gaps:?}"
    );
    let port = redis.port.to_string();
    let keys = tokio::process::Command::new("redis-cli")
        .args(["-p", &port, "--scan"])
        .output()
        .await
        .unwrap();
    let key = String::from_utf8_lossy(&keys.stdout)
        .lines()
        .next()
        .expect("the provider's key")
        .to_string();
    let admitted = tokio::process::Command::new("redis-cli")
        .args(["-p", &port, "HGET", &key, "admitted"])
        .output()
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&admitted.stdout).trim(),
        "44",
        "units counted in the shared schedule"
    );
}

/// R-FS2 through Redis: replicas sharing a provider spend one allowance.
/// Two replicas, 4 naive clients each, for 12 s, on a provider allowed
/// 600 units a minute (ceiling 50, cold start 20: either replica alone
/// would send 10 a second): together they send about 10 a second, the
/// allowance's even rate — never the 20 two separate allowances would let
/// through — and each replica's readout shows what both spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_allowance() {
    let redis = Redis::start();
    let sim = Sim::start("127.0.0.90").await;
    let config = format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n[shared]\nredis = \"{}\"\nreplicas = 2\n\
         [providers.p]\nhosts = [\"127.0.0.90\"]\nceiling_rps = 50.0\nstart_rps = 20.0\nshared = true\n\
         allowance = {{ units = 600, per = \"60s\" }}\n",
        redis.url()
    );
    let fleet: Vec<Sluice> = (0..2).map(|_| Sluice::start(&config)).collect();
    let t0 = Instant::now();
    let seen = drive(&fleet, &sim.url("http", "/ok"), 4, 12).await;
    let secs = t0.elapsed().as_secs_f64();
    let sent = sim.hits("/ok").len();
    let mut spent = Vec::new();
    for s in &fleet {
        let (_, text) = s.admin_get("/v1/providers/p").await;
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        spent.push(v["allowance"]["spent"].as_f64().unwrap_or(-1.0));
    }
    println!(
        "two replicas, one allowance of 600/min: {sent} sent in {secs:.1} s ({:.1}/s); \
         the replicas read {spent:?} spent; clients saw {seen:?}",
        sent as f64 / secs
    );
    assert!(
        sent as f64 <= 10.0 * secs + 5.0,
        "never faster than the allowance's 10/s together: {sent} in {secs:.1} s"
    );
    assert!(
        sent as f64 >= 0.7 * 10.0 * 12.0,
        "the allowance is used, not starved: {sent}"
    );
    for s in &spent {
        assert!(
            *s >= 0.9 * sent as f64 && *s <= sent as f64 + 2.0,
            "each replica reads what both spent: {spent:?} of {sent}"
        );
    }
}

/// Issue 34 (R-AI1, R-SG2, R-DS1): the commonest API limiter — a 20 req/s
/// token bucket with a small burst answering `429` with `Retry-After: 1` —
/// met from a cold start by 16 naive clients through one sluice and,
/// beside it, through 8 replicas sharing a budget in Redis (each on its own
/// provider). Slow start's overshoot is refused once on a small burst; the
/// one sluice probes soon after, the fleet places its limit at the rate met
/// and fits the bucket from its refusals as Redis counted them: over
/// 30–60 s both get ≥ 95 % of the limit with ≤ 0.5 % 429s. Printed side by
/// side.
///
/// One test a burst (2, 5, 10): the three side by side in one test were 27
/// debug sluices and 96 clients on two cores, and a burst of 2 tolerates
/// only 100 ms of bunched arrivals — the machine's own scheduling, not the
/// pacing, then decided the figure (the fleet at 0.83–0.93 with the three
/// together, 0.967 three times of three alone, on the same code).
///
/// Each refusal in the window is printed with what the provider saw before
/// it. Fifteen fleets on 2026-12-06 (the CI phase, five times): every
/// refusal came in an even stream (5 arrivals in its 250 ms, no gap over
/// 52 ms) — the pacing's, not a stalled machine's; the one failure (0.93)
/// was two overshoots 27.3 s apart — the fleet's settle point, still over
/// the limit, refused at 30.4 s and the probe 25 holds later — where each
/// other run had one (each costs a 1 s hold: 0.967 with one). A probe
/// spaced 28 s from the last refusal would keep one to a window, but then
/// the model's limit raised a tenth at 30 s is found after 60 s
/// (`a_dwell_finds_a_limit_raised_a_tenth`, found at 59.5 s today): the two
/// bars meet at the margin of issue 34's (blocked) trade-off. Both failures
/// seen on 2026-12-07 (one in CI, one in three runs alone, each replica's
/// cuts logged) ran one ladder: slow start's guess 25.3 (`unconfirmed`),
/// its recovery refused at 22.465 — under 0.9 of the guess, placed as a
/// limit that dropped: cut 30 %, four windows back, no steady point for
/// the fit — then 21.342 and 20.275, met at 31 s. Settling under the rate
/// met at once there meets it ~2.5 s sooner; it was reverted when the
/// fleet on a stated quota failed in its CI run (a refusal far under a
/// guess can be far over a window's limit too) — a failure seen since on
/// the code without it (two of five runs of CI's phase red), so it was
/// put back (2026-12-07): four runs of the phase since, 15 of 16 tests
/// passed, the stated quota four of four; the miss a burst-5 fleet at
/// 0.940 with one refusal (57.3 s) that took the new ladder (25.3, 22.5,
/// 21.3, 20.3): its 20.275 step, over the bucket, refused just before
/// 30 s (its hold ran into the window) and the probe 27 s later — the
/// two overshoots again. Reverted the same day once more, for the Cluster
/// fleet of `redis_ha.rs` at 0.745 of its limit in a CI run — a window
/// read before it was whole (`Sim::wait_past` since), not the fix's doing.
/// Put back once more (2026-12-07, later), restricted to providers that
/// hold after their refusals (a moving window's keep the 30 % cut): the
/// fleets' phase with it, 7 of 7 twice (one run alone, one in CI).
async fn small_bursts_through_one_sluice_and_a_fleet(burst: u32, one_ip: &str, fleet_ip: &str) {
    let path = "/limited-ra/1";
    let (one_sim, fleet_sim) = (Sim::start(one_ip).await, Sim::start(fleet_ip).await);
    one_sim.set_limit(20.0, f64::from(burst));
    fleet_sim.set_limit(20.0, f64::from(burst));
    let redis = Redis::start();
    let one = replicas(1, one_ip, None);
    let fleet = replicas(8, fleet_ip, Some(&redis));
    let (a, b) = (one_sim.url("http", path), fleet_sim.url("http", path));
    let (seen_one, seen_fleet) = tokio::join!(drive(&one, &a, 16, 60), drive(&fleet, &b, 2, 60));
    let mut failures = Vec::new();
    // The fleet's last refusal after a hold, as Redis counted it (what
    // every replica's token-bucket fit reads): the fleet's sends from the
    // hold's end to the refusal, at about the bucket's rate.
    let (after, sent) = (
        shared_field(&redis, "rafter").await,
        shared_field(&redis, "rsent").await,
    );
    match after.zip(sent) {
        Some((ms, n)) if (15.0..=40.0).contains(&(n / (ms / 1000.0))) => {}
        other => failures.push(format!(
            "burst {burst}: the fleet's refusal in Redis (ms after the hold, sent): {other:?}"
        )),
    }
    for (who, s) in [("one sluice", &one[0]), ("replica 0", &fleet[0])] {
        let (_, v) = s.api("GET", "/v1/providers/p", None).await;
        println!("burst {burst}, {who}: {v}");
        let (_, h) = s.api("GET", "/v1/history", None).await;
        let h = &h["providers"]["p"];
        println!(
            "  every 5 s: rate {}\n  throttle point {}\n  refused {}",
            h["rate_rps"], h["throttle_point_rps"], h["refused"]
        );
    }
    let (one, fleet) = (
        one_sim.figures(path, 30, 60, 20.0),
        fleet_sim.figures(path, 30, 60, 20.0),
    );
    println!(
        "burst {burst}, 30-60 s: one sluice {one}\n          8 replicas {fleet}\n  \
         clients {seen_one:?} | {seen_fleet:?}\n  refusals: one sluice {:?}\n            \
         8 replicas {:?}",
        one_sim.refusals(path, 30, 60),
        fleet_sim.refusals(path, 30, 60)
    );
    for (who, f) in [("one sluice", one), ("8 replicas", fleet)] {
        if f.goodput < 0.95 || f.throttled_share > 0.005 {
            failures.push(format!("burst {burst}, {who}: {f}"));
        }
    }
    assert!(
        failures.is_empty(),
        "≥ 95 % of the limit with ≤ 0.5 % 429s over 30-60 s: {failures:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_2_through_one_sluice_and_a_fleet() {
    small_bursts_through_one_sluice_and_a_fleet(2, "127.0.4.1", "127.0.4.2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_5_through_one_sluice_and_a_fleet() {
    small_bursts_through_one_sluice_and_a_fleet(5, "127.0.4.3", "127.0.4.4").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_10_through_one_sluice_and_a_fleet() {
    small_bursts_through_one_sluice_and_a_fleet(10, "127.0.4.5", "127.0.4.6").await;
}

/// R-SG2, R-DS1 (issue 34): a `Retry-After: 1` bucket of burst 5 raised
/// from 20 to 22 req/s at 30 s, met by 16 naive clients through one sluice
/// and through 8 replicas side by side: each finds the raise by 60 s — the
/// provider accepts ≥ 95 % of 22 req/s over some 5 s that begin by 55 s,
/// as `bench_pacers converge` judges it — and pays for its probes with
/// ≤ 1 % 429s over 30–75 s. (Before, a fleet counted each replica's own
/// admissions before a probe and did not probe within the minute.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_limit_is_found_by_one_sluice_and_a_fleet() {
    let path = "/limited-ra/1";
    let (one_ip, fleet_ip) = ("127.0.4.11", "127.0.4.12");
    let (one_sim, fleet_sim) = (Sim::start(one_ip).await, Sim::start(fleet_ip).await);
    one_sim.set_limit(20.0, 5.0);
    fleet_sim.set_limit(20.0, 5.0);
    let redis = Redis::start();
    let one = replicas(1, one_ip, None);
    let fleet = replicas(8, fleet_ip, Some(&redis));
    let (a, b) = (one_sim.url("http", path), fleet_sim.url("http", path));
    let raise = async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        one_sim.set_limit(22.0, 5.0);
        fleet_sim.set_limit(22.0, 5.0);
    };
    let ((seen_one, seen_fleet), ()) = tokio::join!(
        async { tokio::join!(drive(&one, &a, 16, 75), drive(&fleet, &b, 2, 75)) },
        raise
    );
    let mut failures = Vec::new();
    for (who, sim, s, seen) in [
        ("one sluice", &one_sim, &one[0], seen_one),
        ("8 replicas", &fleet_sim, &fleet[0], seen_fleet),
    ] {
        let (_, h) = s.api("GET", "/v1/history", None).await;
        let h = &h["providers"]["p"];
        let found = (30..=55).find(|&t| sim.figures(path, t, t + 5, 22.0).goodput >= 0.95);
        let paid = sim.figures(path, 30, 75, 22.0);
        println!(
            "{who}: found {} s after the raise; 30-75 s {paid}\n  every 5 s: rate {}\n  \
             refused {}\n  clients {seen:?}",
            found.map_or("not within 25".into(), |t| (t - 30).to_string()),
            h["rate_rps"],
            h["refused"]
        );
        if found.is_none() {
            failures.push(format!("{who}: raise not found by 60 s"));
        }
        if paid.throttled_share > 0.01 {
            failures.push(format!("{who}: probes cost {paid}"));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// A fleet sharing a provider that states its quota (R-DS1, R-SG1): four
/// replicas sharing through one Redis, two naive clients each, a real
/// Flask-Limiter (20 a second, its `X-RateLimit-*` headers on) in a moving
/// and in a fixed window, 60 s, judged over 30–60 s. Every replica reads
/// the quota on its own answers, a sample of the fleet's: its waits for a
/// reset it does not trust or for a rolling quota's next refill are its
/// own pacing — reported to the fleet (and counted as refusals), they held
/// every replica at each send, and the fleet used the moving window at
/// 0.60–0.79 (a 4-replica run through a Cluster) and 0.727 (here).
///
/// Two more ways a replica's reading was the fleet's undoing (2026-12-05,
/// nine runs: the moving window refused 0.5–1.4 % in four, one request
/// refused three times in CI): a replica that read the moving window as a
/// fixed one followed its even rate to 20 a second and raised every
/// replica to it — now a fleet is raised no further than `limit /
/// (window + 50 ms)`; and, the fleet then refused nothing, replicas that
/// all read it as fixed held each other to its misleading resets (0.62,
/// 0.69, 0.64 used) — now a replica judges what the resets delivered as
/// its share of the fleet's slots. Since: moving 0.952–0.953 used, fixed
/// 0.90–0.93, nothing refused, in four runs of four. Bars: moving ≥ 0.8
/// (0.830 once in CI, where four replicas, sixteen clients and two Flask
/// apps share two cores with other tests), fixed ≥ 0.75 (it was 0.555
/// once in CI: the fleet's schedule knows nothing of a window's edges, as
/// one sluice's does), ≤ 1 % refused both, and no refusal reaching a
/// client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_uses_a_stated_quota_like_one_sluice() {
    use sluice_tests::flask_limiter::{judge, FlaskLimiter, Strategy};
    let redis = Redis::start();
    let cases = [
        ("moving window", "127.0.0.131", Strategy::Moving),
        ("fixed window", "127.0.0.132", Strategy::Fixed),
    ];
    let providers: Vec<FlaskLimiter> = cases
        .iter()
        .map(|(_, ip, strategy)| FlaskLimiter::start(ip, *strategy, true))
        .collect();
    let names = ["moving", "fixed"];
    let mut c = format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n\
         [shared]\nredis = \"{}\"\nreplicas = 4\ncall_timeout = \"50ms\"\n",
        redis.url()
    );
    for (name, (_, ip, _)) in names.iter().zip(&cases) {
        c +=
            &format!("[providers.{name}]\nhosts = [\"{ip}\"]\nceiling_rps = 50.0\nshared = true\n");
    }
    let fleet: Vec<Sluice> = (0..4).map(|_| Sluice::start(&c)).collect();
    let urls: Vec<String> = providers.iter().map(FlaskLimiter::url).collect();
    let clients: Vec<_> = fleet
        .iter()
        .map(|s| {
            let (proxy, urls) = (s.proxy_url(), urls.clone());
            tokio::spawn(async move { naive_clients_each(&proxy, &urls, 2, 60).await })
        })
        .collect();
    let mut seen = Vec::new();
    for c in clients {
        seen.push(c.await.unwrap());
    }
    let mut failed = Vec::new();
    // Used at least, refused at most (see above).
    let bars = [(0.8, 0.01), (0.75, 0.01)];
    for (i, ((name, ..), p)) in cases.iter().zip(&providers).enumerate() {
        let (used, refused) = judge(&p.seen(), 30.0, 60.0, 20.0);
        let clients: Vec<&str> = seen.iter().map(|r| r[i].as_str()).collect();
        let (_, v) = fleet[0]
            .api("GET", &format!("/v1/providers/{}", names[i]), None)
            .await;
        println!(
            "{name}: 30–60 s {used:.3} of 20/s used, {:.2} % refused; clients saw {clients:?}; \
             shared rate {}, quota {}",
            refused * 100.0,
            v["shared"]["rate_rps"],
            v["quota"],
        );
        let (least, most) = bars[i];
        if used < least || refused > most {
            failed.push(format!(
                "{name}: {used:.3} used (≥ {least}), {:.2} % refused (≤ {:.1} %)",
                refused * 100.0,
                most * 100.0
            ));
        }
        if !clients
            .iter()
            .all(|c| c.split_whitespace().all(|w| w.starts_with("200=")))
        {
            // Why a refusal reached a client: each replica's final outcomes
            // and retries for this provider, and what it logged of them.
            let mut why = Vec::new();
            for s in &fleet {
                let (_, body) = s.admin_get("/metrics").await;
                why.extend(
                    body.lines()
                        .filter(|l| {
                            l.contains(&format!("provider=\"{}\"", names[i]))
                                && (l.starts_with("sluice_requests_total")
                                    || l.starts_with("sluice_retries_total"))
                        })
                        .map(String::from),
                );
                why.extend(
                    s.log()
                        .lines()
                        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                        .take(20)
                        .map(String::from),
                );
            }
            panic!(
                "every request answered 200: {clients:?}\n{}",
                why.join("\n")
            );
        }
    }
    assert!(failed.is_empty(), "{failed:?}");
}
