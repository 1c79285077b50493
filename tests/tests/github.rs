//! Several budgets on one host, as GitHub keeps them (issue 35, R-PD1,
//! R-PD3, R-PD6), through the real binary: a simulator written from
//! GitHub's documentation (`sluice_tests::github`), naive Python clients
//! that know nothing of it, configured only by `HTTP_PROXY`.

use std::time::Duration;

use serde_json::Value;
use sluice_tests::clients::{curl, naive_clients};
use sluice_tests::discord::{Discord, Route};
use sluice_tests::github::{GitHub, Limits};
use sluice_tests::harness::Sluice;
use sluice_tests::sim::Sim;

fn config(ip: &str) -> String {
    format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n\
         [providers.gh]\nhosts = [\"{ip}\"]\ndialect = \"github\"\n"
    )
}

async fn readout(s: &Sluice, name: &str) -> Value {
    s.api("GET", &format!("/v1/providers/{name}"), None).await.1
}

/// R-PD1, R-PD3: `core` (600 a minute) and `search` (30 a minute) on one
/// host, each reset at a Unix time, throttled with `403`s (primary and
/// secondary). Naive clients hammer both at once: `search` runs dry every
/// window, and `core` is never slowed by it — each budget used ≥ 0.9 in
/// its second window, ≤ 1 % of its requests refused after the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_and_search_are_paced_apart() {
    let ip = "127.0.7.1";
    let gh = Sim::start_model(ip, GitHub::new(Limits::default())).await;
    let s = Sluice::start(&config(ip));
    let proxy = s.proxy_url();
    let secs = 125;
    let (core_url, search_url) = (
        gh.url("http", "/repos/o/r/issues"),
        gh.url("http", "/search/issues?q=x"),
    );
    let (core, search) = tokio::join!(
        naive_clients(&proxy, &core_url, 8, secs, &[]),
        naive_clients(&proxy, &search_url, 4, secs, &[]),
    );
    let lane = readout(&s, "search@gh").await;
    let main = readout(&s, "gh").await;
    println!("core clients saw {core}; search clients saw {search}");
    for (resource, limit) in [("core", 600.0), ("search", 30.0)] {
        let (served, refused, all) = gh.model(|g: &GitHub| g.window(resource, 1));
        let (refused_after, all_after) = gh.model(|g: &GitHub| g.refused_from(resource, 1));
        let (served0, refused0, all0) = gh.model(|g: &GitHub| g.window(resource, 0));
        println!(
            "{resource}: first window {served0} served, {refused0} of {all0} refused; \
             second window {served} served ({:.3} of {limit}), {refused} of {all} refused; \
             from the second on {refused_after} of {all_after} refused",
            served as f64 / limit
        );
        assert!(
            served as f64 >= 0.9 * limit,
            "{resource}: {served} of {limit} used in the second window"
        );
        assert!(
            refused_after as f64 <= 0.01 * all_after as f64,
            "{resource}: {refused_after} of {all_after} refused after the first window"
        );
    }
    assert_eq!(lane["lane_of"], "gh", "{lane}");
    assert_eq!(lane["dialect"], "github");
    assert_eq!(
        lane["quota"]["limit"], 30,
        "search paced to its own: {lane}"
    );
    assert_eq!(main["quota"]["limit"], 600, "core paced to its own: {main}");
}

/// R-PD3: GitHub GraphQL's primary limit answers `200` with
/// `RATE_LIMITED`: held like a `429` — the next query waits for the
/// window's reset instead of being refused again — and `core` beside it
/// is not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graphql_200_rate_limited_is_held_like_a_429() {
    let ip = "127.0.7.2";
    let limits = Limits {
        budgets: vec![("core", 600), ("graphql", 10)],
        window: Duration::from_secs(6),
        ..Limits::default()
    };
    let gh = Sim::start_model(ip, GitHub::new(limits)).await;
    let s = Sluice::start(&config(ip));
    let proxy = s.proxy_url();
    let max = Duration::from_secs(20);
    let query = ["-X", "POST", "-d", r#"{"query":"{viewer{login}}"}"#];
    // Ten points a window: a query of 2 leaves 8, one of 9 cannot be paid.
    let first = curl(&proxy, &query, &gh.url("http", "/graphql?points=2"), max).await;
    assert!(first.body.contains("viewer"), "served: {}", first.body);
    let refused = curl(&proxy, &query, &gh.url("http", "/graphql?points=9"), max).await;
    assert_eq!(refused.status, 200);
    assert!(
        refused.body.contains("RATE_LIMITED"),
        "the costly query was refused: {}",
        refused.body
    );
    let limited_at = gh.model(|g: &GitHub| g.judged.last().unwrap().at);
    let lane = readout(&s, "graphql@gh").await;
    assert_eq!(
        lane["last_backoff"]["reason"], "throttled",
        "a 200 RATE_LIMITED is a throttle: {lane}"
    );
    // `core` is not held by GraphQL's hold.
    let r = curl(&proxy, &[], &gh.url("http", "/user"), max).await;
    assert_eq!(r.status, 200);
    let core_at = gh.model(|g: &GitHub| g.judged.last().unwrap().at);
    // The next query waits for the reset, and is served.
    let r = curl(&proxy, &query, &gh.url("http", "/graphql?points=2"), max).await;
    assert_eq!(r.status, 200);
    assert!(
        r.body.contains("viewer"),
        "served after the reset: {}",
        r.body
    );
    let judged = gh.model(|g: &GitHub| g.judged.clone());
    let graphql: Vec<_> = judged.iter().filter(|j| j.resource == "graphql").collect();
    assert_eq!(graphql.len(), 3, "no query refused twice: {judged:?}");
    assert_eq!(graphql[2].window, 1, "sent in the next window: {judged:?}");
    assert!(
        core_at.duration_since(limited_at) < Duration::from_secs(2),
        "core went on at once"
    );
}

/// R-PD1, R-PD6, Discord: two routes' buckets on one host (each counted
/// for its major parameter, each window reset after milliseconds-precise
/// `X-RateLimit-Reset-After`) are paced apart — no refusal after each
/// bucket's first answer (Discord bans clients for too many: no probing
/// above a told limit) — and each is used ≥ 0.9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discord_buckets_are_paced_apart_without_a_refusal() {
    let ip = "127.0.7.3";
    let routes = vec![
        Route {
            route: "GET /channels/{major}/messages",
            limit: 5,
            per: Duration::from_secs(1),
        },
        Route {
            route: "GET /guilds/{major}/members",
            limit: 10,
            per: Duration::from_secs(2),
        },
    ];
    let dc = Sim::start_model(ip, Discord::new(routes)).await;
    let s = Sluice::start(&format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n\
         [providers.dc]\nhosts = [\"{ip}\"]\ndialect = \"discord\"\n"
    ));
    let proxy = s.proxy_url();
    let (messages, members) = (
        dc.url("http", "/api/v10/channels/111111/messages"),
        dc.url("http", "/api/v10/guilds/222222/members"),
    );
    let (a, b) = tokio::join!(
        naive_clients(&proxy, &messages, 4, 30, &[]),
        naive_clients(&proxy, &members, 4, 30, &[]),
    );
    println!("messages clients saw {a}; members clients saw {b}");
    for (bucket, rate) in [
        ("GET /channels/111111/messages", 5.0),
        ("GET /guilds/222222/members", 5.0),
    ] {
        let (first, last) = dc.model(|d: &Discord| {
            let first = d.first(bucket).expect("the bucket was used");
            let last = d
                .judged
                .iter()
                .rev()
                .find(|j| j.bucket == bucket)
                .unwrap()
                .at;
            (first, last)
        });
        // After its first answer (5 ms of service, and the way back).
        let (_, refused) =
            dc.model(|d: &Discord| d.seen_from(bucket, first + Duration::from_millis(100)));
        let from = first + Duration::from_secs(2);
        let (served, _) = dc.model(|d: &Discord| d.seen_from(bucket, from));
        let used = served as f64 / (last - from).as_secs_f64() / rate;
        println!("{bucket}: {refused} refused after the first answer; {used:.3} of the limit used");
        assert_eq!(refused, 0, "{bucket}: refused after its first answer");
        assert!(used >= 0.9, "{bucket}: {used:.3} of the limit used");
    }
}

/// Names `host` as `ip` in `/etc/hosts` (once): a collector's request to
/// a real provider's name stays on this machine's loopback (the tests run
/// as root, as CI does).
fn name_in_etc_hosts(host: &str, ip: &str) {
    let line = format!("{ip} {host}");
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    if hosts
        .lines()
        .any(|l| l.split_whitespace().eq(line.split_whitespace()))
    {
        return;
    }
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open("/etc/hosts")
        .expect("/etc/hosts is writable (the tests run as root)");
    writeln!(f, "{line}").expect("write /etc/hosts");
}

/// R-PD1, R-PD2 on the default config: nothing configured but the
/// loopback destination, a collector calls `api.github.com` by its name
/// (named here in `/etc/hosts`); sluice knows GitHub's dialect by the host
/// and paces `search` in a lane of its own while `core` beside it goes at
/// its own budget: each window after the first ≥ 0.9 used, ≤ 1 % refused
/// (the issue's bound; windows of 10 s, whole-second resets — at 5 s, one
/// request in ~300 met a spent window and the next window was 0.85 used).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_github_com_by_name_on_the_default_config() {
    let ip = "127.0.7.10";
    name_in_etc_hosts("api.github.com", ip);
    let limits = Limits {
        budgets: vec![("core", 200), ("search", 10)],
        window: Duration::from_secs(10),
        ..Limits::default()
    };
    let gh = Sim::start_model(ip, GitHub::new(limits)).await;
    let s = Sluice::start("[destinations]\nallow = [\"127.0.0.0/8\"]\n");
    let port = gh.addr.port();
    let (search, core) = (
        format!("http://api.github.com:{port}/search/issues?q=x"),
        format!("http://api.github.com:{port}/repos/o/r/issues"),
    );
    let proxy = s.proxy_url();
    let (a, b) = tokio::join!(
        naive_clients(&proxy, &search, 4, 32, &[]),
        naive_clients(&proxy, &core, 4, 32, &[]),
    );
    println!("search clients saw {a}; core clients saw {b}");
    let lane = readout(&s, "search@api.github.com").await;
    assert_eq!(lane["dialect"], "github", "by its host: {lane}");
    assert_eq!(lane["lane_of"], "api.github.com");
    assert_eq!(lane["quota"]["limit"], 10, "{lane}");
    for (resource, limit) in [("search", 10.0), ("core", 200.0)] {
        let (refused, all) = gh.model(|g: &GitHub| g.refused_from(resource, 1));
        let windows: Vec<_> = (1..3)
            .map(|w| gh.model(|g: &GitHub| g.window(resource, w)).0)
            .collect();
        let at = gh.model(|g: &GitHub| g.refusals_from(resource, 1));
        println!("{resource}: served in windows 2–3 {windows:?} of {limit}; {refused} of {all} refused after the first, at (window, place, verdict) {at:?}");
        assert!(
            refused as f64 <= 0.01 * all as f64,
            "{resource}: {refused} of {all} refused after its first window, at {at:?}"
        );
        assert!(
            windows.iter().all(|&n| n as f64 >= 0.9 * limit),
            "{resource}: {windows:?} of {limit}"
        );
    }
}
