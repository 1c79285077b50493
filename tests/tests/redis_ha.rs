//! Redis as it is deployed (issue 37, R-DS1, R-DS2): a fleet sharing its
//! budgets through a real Redis Cluster (three primaries, three replicas)
//! and through a primary that Sentinel names — beside one Redis, and
//! through a failover: the primary of a busy provider's slot killed, the
//! replica promoted, the provider judged second by second.

use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use sluice_tests::clients::naive_clients_each;
use sluice_tests::harness::Sluice;
use sluice_tests::redis::{Redis, RedisCluster, RedisSentinel};
use sluice_tests::sim::{Hit, Sim};

/// Every provider's hidden limit (req/s), answered `429` with
/// `Retry-After: 1` beyond it.
const LIMIT: f64 = 10.0;
const PATH: &str = "/limited-ra/1";
const REPLICAS: u32 = 8;

/// A replica's config: the providers at `ips` named `names`, shared
/// through `redis`.
fn config(redis: &str, names: &[&str], ips: &[&str]) -> String {
    let mut c = format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n\
         [shared]\nredis = \"{redis}\"\nreplicas = {REPLICAS}\ncall_timeout = \"50ms\"\n"
    );
    for (name, ip) in names.iter().zip(ips) {
        c +=
            &format!("[providers.{name}]\nhosts = [\"{ip}\"]\nceiling_rps = 50.0\nshared = true\n");
    }
    c
}

/// Each replica's readout of `provider`.
async fn readouts(fleet: &[Sluice], provider: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for r in fleet {
        let (_, v) = r
            .api("GET", &format!("/v1/providers/{provider}"), None)
            .await;
        out.push(v);
    }
    out
}

/// Whether every replica paces `provider` by the shared schedule, kept on
/// `node` (when given).
async fn all_shared(fleet: &[Sluice], provider: &str, node: Option<&str>) -> bool {
    readouts(fleet, provider)
        .await
        .iter()
        .all(|v| v["shared"]["state"] == "shared" && node.is_none_or(|n| v["shared"]["node"] == n))
}

/// The replicas' learned rates for `provider`, their median.
async fn learned(fleet: &[Sluice], provider: &str) -> f64 {
    let mut rates: Vec<f64> = readouts(fleet, provider)
        .await
        .iter()
        .filter_map(|v| v["shared"]["rate_rps"].as_f64())
        .collect();
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied().unwrap_or(0.0)
}

/// Sends the provider saw in each second from `from` to `to`.
fn per_second(hits: &[Hit], from: Instant, to: Instant) -> Vec<usize> {
    let secs = (to - from).as_secs() as usize;
    let mut n = vec![0; secs];
    for h in hits.iter().filter(|h| h.at >= from && h.at < to) {
        let i = (h.at - from).as_secs() as usize;
        if i < secs {
            n[i] += 1;
        }
    }
    n
}

/// What every client saw, by status, summed over the replicas.
fn statuses(seen: &[Vec<String>], provider: usize) -> Vec<(String, u64)> {
    let mut all: std::collections::BTreeMap<String, u64> = Default::default();
    for replica in seen {
        for word in replica[provider].split_whitespace() {
            if let Some((k, v)) = word.split_once('=') {
                *all.entry(k.to_string()).or_default() += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
    all.into_iter().collect()
}

fn drive(
    fleet: &[Sluice],
    urls: &[String],
    secs: u32,
) -> Vec<tokio::task::JoinHandle<Vec<String>>> {
    fleet
        .iter()
        .map(|s| {
            let (proxy, urls) = (s.proxy_url(), urls.to_vec());
            tokio::spawn(async move { naive_clients_each(&proxy, &urls, 1, secs).await })
        })
        .collect()
}

/// Judges a failover of the primary keeping `provider`'s budget: the
/// switch second by second at its simulator, the fleet back on the shared
/// schedule, the learned rate kept. `failover` kills the primary and
/// returns when a replica is promoted, with the new primary's port.
async fn judge_failover(
    fleet: &[Sluice],
    provider: &str,
    sim: &Sim,
    old_node: &str,
    failover: impl std::future::Future<Output = (Instant, u16)>,
) -> (Instant, Instant) {
    let before = learned(fleet, provider).await;
    let killed = Instant::now();
    let (promoted, new_port) = failover.await;
    let new_node = format!("127.0.0.1:{new_port}");
    assert_ne!(new_node, old_node, "a replica was promoted");
    let mut back = None;
    while promoted.elapsed() < Duration::from_secs(15) {
        if all_shared(fleet, provider, Some(&new_node)).await {
            back = Some(promoted.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let Some(back) = back else {
        panic!(
            "the fleet back on the shared schedule on {new_node}: {:?}",
            readouts(fleet, provider).await
        )
    };
    // Settled on the new primary: the rate the fleet paces by.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = learned(fleet, provider).await;
    let hits = sim.hits(PATH);
    let window = (
        killed - Duration::from_secs(2),
        promoted + back + Duration::from_secs(3),
    );
    let switch = per_second(&hits, window.0, window.1);
    if std::env::var("SLUICE_DEBUG_SWITCH").is_ok() {
        let near: Vec<i64> = hits
            .iter()
            .filter(|h| {
                h.at >= killed - Duration::from_millis(500)
                    && h.at < killed + Duration::from_secs(3)
            })
            .map(|h| (h.at - (killed - Duration::from_millis(500))).as_millis() as i64 - 500)
            .collect();
        println!("sends around the kill (ms): {near:?}");
    }
    println!(
        "{provider}: killed {old_node}; promoted {new_node} after {:.1} s; fleet back on it {:.1} s later; \
         sends per second from 2 s before the kill: {switch:?}; learned {before:.2} → {after:.2} req/s",
        (promoted - killed).as_secs_f64(),
        back.as_secs_f64()
    );
    let worst = switch.iter().copied().max().unwrap_or(0);
    assert!(
        worst as f64 <= LIMIT * 1.1,
        "≤ 1.1 × the limit in every second of the switch: {switch:?}"
    );
    assert!(
        switch.iter().all(|n| *n > 0),
        "requests kept being sent throughout: {switch:?}"
    );
    assert!(
        back <= Duration::from_secs(10),
        "back within 10 s: {back:?}"
    );
    assert!(
        (after - before).abs() <= 0.1 * before,
        "the learned rate after within 10 % of before: {before:.2} → {after:.2}"
    );
    window
}

/// Eight replicas × four providers on a Redis Cluster, beside the same on
/// one Redis: the same goodput and refusals, side by side. Then the
/// primary holding the busiest providers' slot is killed (`kill -9`) and
/// the cluster promotes its replica: the clients keep being answered, the
/// provider sees ≤ 1.1 × its limit in every second, the fleet is back on
/// the shared schedule (on the promoted node) within 10 s, and the
/// learned rate is within 10 % of before; the providers on the other
/// primaries see ≤ 1.1 × their limits in the same seconds and are shared
/// again within 10 s (the cluster refuses every slot while it lacks one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_carries_a_fleet_like_one_redis_and_rides_a_failover() {
    const SECS: u32 = 85;
    // Their keys' slots: p1 and p4 on one primary, p2 and p3 on the others.
    let names = ["p1", "p2", "p3", "p4"];
    let mut cluster = RedisCluster::start();
    let single = Redis::start();
    let cluster_ips = ["127.0.0.121", "127.0.0.122", "127.0.0.123", "127.0.0.124"];
    let single_ips = ["127.0.0.125", "127.0.0.126", "127.0.0.127", "127.0.0.128"];
    let mut sims = Vec::new();
    for ip in cluster_ips.iter().chain(&single_ips) {
        let sim = Sim::start(ip).await;
        sim.set_limit(LIMIT, LIMIT / 2.0);
        sims.push(sim);
    }
    let slots: Vec<u16> = names
        .iter()
        .map(|n| cluster.slot(&format!("sluice:{{{n}}}")))
        .collect();
    let primaries: Vec<u16> = slots
        .iter()
        .map(|s| cluster.primary_of(*s).unwrap())
        .collect();
    println!("slots {slots:?} on primaries {primaries:?}");
    let distinct: std::collections::BTreeSet<_> = primaries.iter().collect();
    assert_eq!(distinct.len(), 3, "the providers span the three primaries");
    assert_eq!(primaries[0], primaries[3]);
    let on_cluster: Vec<Sluice> = (0..REPLICAS)
        .map(|_| Sluice::start(&config(&cluster.url(), &names, &cluster_ips)))
        .collect();
    let on_single: Vec<Sluice> = (0..REPLICAS)
        .map(|_| Sluice::start(&config(&single.url(), &names, &single_ips)))
        .collect();
    let urls = |sims: &[Sim]| sims.iter().map(|s| s.url("http", PATH)).collect::<Vec<_>>();
    let started = Instant::now();
    let clients_cluster = drive(&on_cluster, &urls(&sims[..4]), SECS);
    let clients_single = drive(&on_single, &urls(&sims[4..]), SECS);

    // Side by side over 35–55 s (the fleets reach the limits from a cold
    // start in 30–40 s), before anything fails: read once 55 s have passed
    // at every provider (the clients start seconds after `started`).
    for sim in &sims {
        sim.wait_past(PATH, 55).await;
    }
    let mut rows = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let c = sims[i].figures(PATH, 35, 55, LIMIT);
        let s = sims[4 + i].figures(PATH, 35, 55, LIMIT);
        println!("{name}: cluster {c}\n    one Redis {s}");
        rows.push((c, s));
    }
    let sum = |f: &dyn Fn(&sluice_tests::sim::Figures) -> f64, cluster: bool| {
        rows.iter()
            .map(|(c, s)| f(if cluster { c } else { s }))
            .sum::<f64>()
            / rows.len() as f64
    };
    let (gc, gs) = (sum(&|f| f.goodput, true), sum(&|f| f.goodput, false));
    let (tc, ts) = (
        sum(&|f| f.throttled_share, true),
        sum(&|f| f.throttled_share, false),
    );
    println!(
        "mean over the four providers, 35–55 s: goodput cluster {gc:.3} vs one Redis {gs:.3}; \
         refused {:.2} % vs {:.2} %",
        tc * 100.0,
        ts * 100.0
    );
    assert!(
        gc >= 0.8 && gc >= gs - 0.05,
        "cluster goodput {gc:.3} vs {gs:.3}"
    );
    assert!(
        tc <= 0.01 && tc <= ts + 0.005,
        "cluster refusals {tc:.4} vs {ts:.4}"
    );
    let node = format!("127.0.0.1:{}", primaries[0]);
    assert!(
        all_shared(&on_cluster, "p1", Some(&node)).await,
        "the readout names p1's node"
    );

    // The failover, while the clients run.
    let old = primaries[0];
    let failover = async {
        cluster.kill(old);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(p) = cluster.primary_of(slots[0]).filter(|p| *p != old) {
                return (Instant::now(), p);
            }
            assert!(Instant::now() < deadline, "the cluster promoted no replica");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let (from, to) = judge_failover(&on_cluster, "p1", &sims[0], &node, failover).await;
    // The other providers, through the same seconds: p4 on the same
    // primary; p2 and p3 on the others — which a cluster that requires
    // full coverage (the default) also stops serving until the promotion,
    // so they too may have paced alone for those seconds.
    for (i, name) in names.iter().enumerate().skip(1) {
        let seconds = per_second(&sims[i].hits(PATH), from, to);
        let alone: Vec<u64> = readouts(&on_cluster, name)
            .await
            .iter()
            .map(|v| v["shared"]["degraded_times"].as_u64().unwrap_or(0))
            .collect();
        println!(
            "{name} through the same seconds: {seconds:?}; times each replica went alone: {alone:?}"
        );
        assert!(
            seconds.iter().all(|n| *n as f64 <= LIMIT * 1.1),
            "{name}: {seconds:?}"
        );
        // Shared again within 10 s, as p1 on its promoted primary: a
        // replica may miss its store twice in a row at any time (two calls
        // 250 ms apart timed out under load once, 5 s after the
        // promotion) and pace alone for a second or two.
        let asked = Instant::now();
        while !all_shared(&on_cluster, name, None).await {
            assert!(
                asked.elapsed() < Duration::from_secs(10),
                "{name} shared again: {:?}",
                readouts(&on_cluster, name).await
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if asked.elapsed() > Duration::from_millis(500) {
            println!(
                "{name}: every replica shared again {:.1} s after asked",
                asked.elapsed().as_secs_f64()
            );
        }
    }

    let metrics = on_cluster[0].admin_get("/metrics").await.1;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("sluice_shared_budget_node{") && l.contains("provider=\"p1\""))
        .map(str::to_string);
    println!("{line:?}");
    assert!(line.is_some_and(|l| !l.contains(&node) && l.ends_with(" 1")));
    let (_, v) = on_cluster[0].api("GET", "/v1/providers/p1", None).await;
    assert_eq!(v["shared"]["redis"], "cluster");
    assert!(v["shared"]["degraded_times"].as_u64() >= Some(1), "{v}");

    for (name, clients) in [("cluster", clients_cluster), ("one Redis", clients_single)] {
        let mut seen = Vec::new();
        for c in clients {
            seen.push(c.await.unwrap());
        }
        for (i, p) in names.iter().enumerate() {
            let st = statuses(&seen, i);
            println!("{name} {p}: clients saw {st:?}");
            let total: u64 = st.iter().map(|(_, n)| n).sum();
            let bad: u64 = st
                .iter()
                .filter(|(k, _)| k != "200" && k != "429")
                .map(|(_, n)| n)
                .sum();
            let refused: u64 = st.iter().filter(|(k, _)| k == "429").map(|(_, n)| n).sum();
            assert_eq!(bad, 0, "every request answered: {name} {p} {st:?}");
            assert!(refused * 100 <= total, "{name} {p}: {st:?}");
        }
    }
    for (name, sim) in [("cluster p2", &sims[1]), ("one Redis p2", &sims[5])] {
        let by5: Vec<String> = (0..SECS as u64 / 5)
            .map(|i| format!("{:.2}", sim.figures(PATH, i * 5, i * 5 + 5, LIMIT).goodput))
            .collect();
        println!("{name}, goodput by 5 s: {}", by5.join(" "));
    }
    println!("{:.0} s in all", started.elapsed().as_secs_f64());
}

/// Eight replicas sharing a provider through the primary Sentinel names:
/// the primary stopped (`kill -9`), the sentinels promote the replica,
/// and the stopped one is replaced by an empty server that joins as a
/// replica. Each replica has a seat of its own (where it sends while
/// alone); the clients keep being answered, the provider sees ≤ 1.1 × its
/// limit in every second, the fleet is back on the shared schedule on the
/// new primary within 10 s, and the learned rate is within 10 % of before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_keeps_the_fleet_within_the_limit() {
    const SECS: u32 = 55;
    let mut redis = RedisSentinel::start();
    let sim = Sim::start("127.0.0.129").await;
    sim.set_limit(LIMIT, LIMIT / 2.0);
    let fleet: Vec<Sluice> = (0..REPLICAS)
        .map(|_| Sluice::start(&config(&redis.url(), &["p"], &["127.0.0.129"])))
        .collect();
    let clients = drive(&fleet, &[sim.url("http", PATH)], SECS);
    sim.wait_past(PATH, 30).await;
    let f = sim.figures(PATH, 15, 30, LIMIT);
    println!("before the failover, 15–30 s: {f}");
    let old = redis.primary().expect("a primary");
    let node = format!("127.0.0.1:{old}");
    assert!(
        all_shared(&fleet, "p", Some(&node)).await,
        "{:?}",
        readouts(&fleet, "p").await
    );
    // Each replica in a seat of its own: where it sends while alone.
    let mut seats: Vec<u64> = readouts(&fleet, "p")
        .await
        .iter()
        .filter_map(|v| v["shared"]["seat"].as_u64())
        .collect();
    seats.sort_unstable();
    assert_eq!(seats, (0..u64::from(REPLICAS)).collect::<Vec<_>>());
    let failover = async {
        redis.kill(old);
        let deadline = Instant::now() + Duration::from_secs(20);
        let new = loop {
            if let Some(p) = redis.primary().filter(|p| *p != old) {
                break p;
            }
            assert!(Instant::now() < deadline, "Sentinel promoted no replica");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let promoted = Instant::now();
        redis.replace(old);
        (promoted, new)
    };
    judge_failover(&fleet, "p", &sim, &node, failover).await;
    let (_, v) = fleet[0].api("GET", "/v1/providers/p", None).await;
    assert_eq!(v["shared"]["redis"], "sentinel");
    let mut seen = Vec::new();
    for c in clients {
        seen.push(c.await.unwrap());
    }
    let st = statuses(&seen, 0);
    println!("clients saw {st:?}");
    let total: u64 = st.iter().map(|(_, n)| n).sum();
    assert!(
        st.iter().all(|(k, _)| k == "200" || k == "429"),
        "every request answered: {st:?}"
    );
    let refused: u64 = st.iter().filter(|(k, _)| k == "429").map(|(_, n)| n).sum();
    assert!(refused * 100 <= total, "{st:?}");
}

/// A primary that lost the last writes (here: the budget's key deleted,
/// as a replica promoted before they reached it would lack it) is seeded
/// from the replicas' own state, never from zero: the rate the fleet
/// paced by, and a `Retry-After` hold a replica was told of — after which
/// a replica that never heard of the hold is held by it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_lost_the_budget_is_seeded_from_the_replicas() {
    let redis = Redis::start();
    let sim = Sim::start("127.0.0.130").await;
    let mut c = config(&redis.url(), &["p"], &["127.0.0.130"]);
    c += "max_queue_wait = \"1s\"\nmax_hold_wait = \"1s\"\n";
    let fleet: Vec<Sluice> = (0..2).map(|_| Sluice::start(&c)).collect();
    let get = |i: usize, path: &str| {
        let (proxy, url) = (fleet[i].proxy_url(), sim.url("http", path));
        async move { sluice_tests::clients::curl(&proxy, &[], &url, Duration::from_secs(10)).await }
    };
    let field = |redis: &Redis, f: &str| redis.cli(&["HGET", "sluice:{p}", f]).parse::<f64>().ok();
    assert_eq!(get(0, "/ok").await.status, 200);
    assert_eq!(get(1, "/ok").await.status, 200);
    // The fleet's rate, as if it had learned 12.5 req/s; both adopt it.
    redis.cli(&["HSET", "sluice:{p}", "rate", "12.5"]);
    assert_eq!(get(0, "/ok").await.status, 200);
    assert_eq!(get(1, "/ok").await.status, 200);
    // Replica 0 is told to wait 20 s (longer than its queue waits: its
    // client is answered at once); the hold is written to Redis.
    let refused = get(0, "/ra/20/x").await;
    println!("the 429's request: {}", refused.status);
    let hold = field(&redis, "hold").expect("the hold in Redis");
    // The fleet's rate now (12.5, cut once by the 429).
    let rate_before = field(&redis, "rate").expect("a shared rate");
    // The primary replaced by one without the budget.
    redis.cli(&["DEL", "sluice:{p}"]);
    assert_eq!(field(&redis, "rate"), None, "the new primary lost it");
    // Replica 0 asks again: refused, and the budget is seeded with its
    // rate and the hold it knows.
    let started = Instant::now();
    let seeded = loop {
        let r = get(0, "/ok").await;
        assert_ne!(r.status, 200, "held: not sent");
        if let Some(h) = field(&redis, "hold") {
            break h;
        }
        assert!(started.elapsed() < Duration::from_secs(8), "never seeded");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let rate = field(&redis, "rate");
    println!(
        "hold {hold:.0} → seeded {seeded:.0} (ms since the epoch); rate {rate_before} → seeded {rate:?}"
    );
    assert!(
        (seeded - hold).abs() <= 1000.0,
        "the same hold: {hold} vs {seeded}"
    );
    assert!(rate_before < 12.5 && rate_before > 5.0, "{rate_before}");
    assert_eq!(
        rate,
        Some(rate_before),
        "the fleet's rate, not a cold start"
    );
    // Replica 1 never heard of the hold: held by it all the same.
    let r = get(1, "/ok").await;
    assert_ne!(r.status, 200, "replica 1 held too");
    let hits = sim.hits("/");
    let throttled = hits.iter().find(|h| h.status == 429).expect("the 429").at;
    let during = hits.iter().filter(|h| h.at > throttled).count();
    assert_eq!(during, 0, "nothing sent during the hold");
}
