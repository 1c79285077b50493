//! What operators see (R-OP1, R-OP2, R-OP6, R-CB2, R-SF4): a live scrape
//! checked by promtool, a real Prometheus server scraping sluice, the
//! dashboard's every query checked against the scrape, the JSON readout,
//! JSON logs — and no secret anywhere.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use sluice_tests::clients::{curl, python};
use sluice_tests::harness::{walk, Sluice, TempDir};
use sluice_tests::pki::TestCa;
use sluice_tests::sim::Sim;
use tokio::process::Command;
use tokio::time::Instant;

const T: Duration = Duration::from_secs(20);

/// A sluice with traffic that makes every kind of series exist: a
/// throttle with `Retry-After` (hold, back-off, retry), a dead provider
/// (breaker transitions), an intercepted HTTPS provider and a client that
/// rejects the interception, a reload, a collector's run (finished).
struct Busy {
    sluice: Sluice,
    _sims: Vec<Sim>,
    _dir: TempDir,
}

async fn busy(args: &[&str]) -> Busy {
    let plain = Sim::start("127.0.0.50").await;
    let ca = TestCa::new("provider CA");
    let tls = Sim::start_tls("127.0.0.52", ca.server_config(&["127.0.0.52"])).await;
    let dir = TempDir::new("obs");
    std::fs::write(dir.join("provider-ca.pem"), &ca.pem).unwrap();
    std::fs::write(dir.join("collector.token"), "obs-token\n").unwrap();
    let dead_port = {
        let l = std::net::TcpListener::bind("127.0.0.51:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let config = format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\nconnect_ports = [{}]\n\
         [upstream]\nextra_ca = \"{}\"\n\
         [providers.plain]\nhosts = [\"127.0.0.50\"]\n\
         [providers.dead]\nhosts = [\"127.0.0.51\"]\nbreaker_min_calls = 4\nmax_outage_wait = \"0s\"\n\
         [providers.secure]\nhosts = [\"127.0.0.52\"]\n\
         allowance = {{ units = 1000000, per = \"24h\" }}\n\
         [providers.unused]\nhosts = [\"unused.test\"]\nceiling_rps = 7.0\n\
         [collectors.collector-a]\ntoken_file = \"{}\"\n",
        tls.addr.port(),
        dir.join("provider-ca.pem").display(),
        dir.join("collector.token").display()
    );
    let sluice = Sluice::start_with(TempDir::new("obs-proxy"), &config, args);
    let proxy = format!("http://collector-a:obs-token@{}", sluice.proxy);
    assert_eq!(
        curl(&proxy, &[], &plain.url("http", "/ra/1/a"), T)
            .await
            .status,
        200
    );
    for _ in 0..5 {
        assert_eq!(
            curl(&proxy, &[], &plain.url("http", "/ok"), T).await.status,
            200
        );
    }
    let dead = format!("http://127.0.0.51:{dead_port}/x");
    let mut seen = Vec::new();
    for _ in 0..30 {
        let r = curl(&proxy, &[], &dead, T).await;
        seen.push((r.status, r.header("proxy-status")));
        if r.status == 503 {
            break;
        }
    }
    // What opened the breaker: failures answered by sluice (a CI run once
    // saw the provider not live afterwards, in 3.5 s instead of 8).
    println!("the dead provider's answers: {seen:?}");
    assert_eq!(seen.last().map(|s| s.0), Some(503), "{seen:?}");
    let sluice_ca = sluice.dir.join("state").join("ca.crt");
    let r = curl(
        &proxy,
        &["--cacert", sluice_ca.to_str().unwrap()],
        &tls.url("https", "/ok"),
        T,
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    // A client that does not trust sluice: an interception failure.
    assert_eq!(
        curl(&proxy, &[], &tls.url("https", "/ok"), T).await.status,
        0
    );
    // A run: opened, one request, finished.
    let (status, run) = sluice
        .api(
            "POST",
            "/v1/collectors/collector-a/runs",
            Some(&serde_json::json!({ "request_cap": 10 })),
        )
        .await;
    assert_eq!(status, 201, "{run}");
    assert_eq!(
        curl(&proxy, &[], &plain.url("http", "/ok"), T).await.status,
        200
    );
    let id = run["id"].as_str().unwrap().to_string();
    assert_eq!(
        sluice
            .api("POST", &format!("/v1/runs/{id}/finish"), None)
            .await
            .0,
        200
    );
    sluice.rewrite_config(&config);
    sluice.signal("HUP");
    let started = Instant::now();
    while !sluice.log().contains("config reloaded") && started.elapsed() < T {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Busy {
        sluice,
        _sims: vec![plain, tls],
        _dir: dir,
    }
}

async fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.stdin(Stdio::null()).output().await.expect("run");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// R-OP1, R-OP6: `promtool check metrics` accepts a live scrape, and every
/// query of the dashboard parses and uses only metrics sluice exports — a
/// dashboard naming a metric sluice does not export fails the check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_passes_promtool_and_the_dashboard_matches_it() {
    let b = busy(&[]).await;
    let (code, scrape) = b.sluice.admin_get("/metrics").await;
    assert_eq!(code, 200);
    let dir = TempDir::new("scrape");
    let file = dir.join("metrics.txt");
    std::fs::write(&file, &scrape).unwrap();
    let (ok, out) = run(Command::new("sh")
        .arg("-c")
        .arg(format!("promtool check metrics < {}", file.display())))
    .await;
    assert!(ok, "promtool check metrics: {out}");
    for series in [
        "sluice_provider_rate_rps{provider=\"plain\"}",
        "sluice_provider_throttle_point_rps{provider=\"plain\"}",
        "sluice_retry_after_holds_total{provider=\"plain\"} 1",
        "sluice_retries_total{provider=\"plain\",reason=\"throttled\"} 1",
        "sluice_backoffs_total{provider=\"plain\",reason=\"throttled\"} 1",
        "sluice_provider_breaker_state{provider=\"dead\"} 2",
        "sluice_breaker_transitions_total{from=\"closed\",provider=\"dead\",reason=\"failure_rate\",to=\"open\"} 1",
        "sluice_tunnels_total{mode=\"intercepted\",provider=\"secure\"} 2",
        "sluice_interception_failures_total{provider=\"secure\"} 1",
        "sluice_requests_total{outcome=\"circuit_open\",provider=\"dead\"} 1",
        "sluice_config_reloads_total{result=\"ok\"} 1",
        "sluice_runs_total{collector=\"collector-a\",stop_reason=\"none\"} 1",
        "sluice_run_attempts_total{collector=\"collector-a\"} 1",
        "sluice_runs_active{collector=\"collector-a\"} 0",
        "sluice_build_info{version=",
        "sluice_collector_admitted_units_total{collector=\"collector-a\",provider=\"plain\"}",
        "sluice_collector_pacing_wait_seconds_bucket{collector=\"collector-a\"",
        "sluice_provider_allowance_units{provider=\"secure\"} 1000000",
        "sluice_provider_allowance_spent_units{provider=\"secure\"}",
    ] {
        assert!(scrape.contains(series), "missing {series}\n{scrape}");
    }
    let check = repo().join("scripts/check-dashboard");
    let dashboard = repo().join("grafana/sluice.json");
    let (ok, out) = run(Command::new(&check).arg(&dashboard).arg(&file)).await;
    println!("{out}");
    assert!(ok, "dashboard check: {out}");
    // The check can fail: a dashboard with a metric sluice does not export.
    let bogus = dir.join("bogus.json");
    let text = std::fs::read_to_string(&dashboard).unwrap().replace(
        "sluice_provider_queue_length",
        "sluice_provider_queue_depth",
    );
    std::fs::write(&bogus, text).unwrap();
    let (ok, out) = run(Command::new(&check).arg(&bogus).arg(&file)).await;
    assert!(!ok, "a bogus metric must fail the check: {out}");
    assert!(out.contains("sluice_provider_queue_depth"), "{out}");
}

/// R-OP2: the JSON readout — live numbers where there is state, an
/// explicit "unknown" where there is none, evidence for the breaker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_readout_is_live_and_honest() {
    let b = busy(&["--log-format", "json"]).await;
    let (code, body) = b.sluice.admin_get("/v1/providers").await;
    assert_eq!(code, 200);
    let all: Value = serde_json::from_str(&body).unwrap();
    let list = all["providers"].as_array().unwrap();
    let find = |name: &str| list.iter().find(|p| p["name"] == name).cloned().unwrap();
    let live = list.iter().filter(|p| p["live"] == true).count();
    assert_eq!(all["total"], live, "total: the live providers");
    // Issue 38: `?limit=` keeps the providers used last (the page asks
    // for a few hundred of a crawl's thousands); a bad one names the field.
    let (code, body) = b.sluice.admin_get("/v1/providers?limit=1").await;
    assert_eq!(code, 200, "{body}");
    let one: Value = serde_json::from_str(&body).unwrap();
    let shown = one["providers"].as_array().unwrap();
    assert_eq!(
        shown.iter().filter(|p| p["live"] == true).count(),
        1,
        "{one}"
    );
    assert_eq!(one["total"], live);
    assert!(
        shown.iter().any(|p| p["name"] == "unused"),
        "configured ones stay"
    );
    let (code, body) = b.sluice.admin_get("/v1/providers?limit=many").await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("\"field\":\"limit\""), "{body}");
    let unused = find("unused");
    assert_eq!(unused["live"], false);
    assert_eq!(unused["rate_rps"], "unknown");
    assert_eq!(unused["breaker"]["state"], "unknown");
    assert_eq!(unused["ceiling_rps"], 7.0);
    let plain = find("plain");
    assert!(plain["rate_rps"].as_f64().unwrap() > 0.0);
    assert_eq!(plain["ceiling_rps"], 50.0);
    assert_eq!(plain["last_backoff"]["reason"], "throttled");
    assert!(plain["throttle_point_rps"].is_f64());
    assert_eq!(
        plain["baseline_ttfb_ms"], "unknown",
        "too few samples for a baseline"
    );
    assert_eq!(plain["hold"], "none");
    let (code, body) = b.sluice.admin_get("/v1/providers/dead").await;
    assert_eq!(code, 200);
    let dead: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(dead["breaker"]["state"], "open", "{dead}");
    let remaining = dead["breaker"]["open_remaining_ms"].as_u64().unwrap();
    let read_at = Instant::now();
    assert!(remaining > 0 && remaining <= 5000, "{remaining}");
    let ev = dead["breaker"]["evidence"].as_array().unwrap();
    assert_eq!(ev[0]["from"], "closed");
    assert_eq!(ev[0]["to"], "open");
    // It stays open as long as it said, and no longer than it should
    // (polled, bounded): open_remaining_ms is the time to half-open.
    let half_open = loop {
        let (_, body) = b.sluice.admin_get("/v1/providers/dead").await;
        let v: Value = serde_json::from_str(&body).unwrap();
        if v["breaker"]["state"] != "open" {
            break read_at.elapsed();
        }
        assert!(read_at.elapsed() < Duration::from_secs(15), "{v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let said = Duration::from_millis(remaining);
    assert!(
        half_open + Duration::from_millis(100) >= said && half_open < said + Duration::from_secs(3),
        "said {said:?}, left open after {half_open:?}"
    );
    let (code, _) = b.sluice.admin_get("/v1/providers/nope.example").await;
    assert_eq!(code, 404);
    assert_eq!(b.sluice.admin_get("/readyz").await.0, 200);
    assert_eq!(b.sluice.admin_get("/healthz").await.0, 200);
    // --log-format json: every line is a JSON object; breaker transitions
    // and back-offs each have their line.
    let log = b.sluice.log();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let msg = |m: &str| lines.iter().filter(|l| l["fields"]["message"] == m).count();
    assert!(msg("breaker transition") >= 1);
    assert!(msg("rate cut") >= 1);
}

/// R-OP1: a real Prometheus server scrapes sluice while traffic flows, and
/// its query API returns the per-provider rate and breaker series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_sluice() {
    let b = busy(&[]).await;
    let dir = TempDir::new("prometheus");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: sluice\n    \
             static_configs:\n      - targets: ['{}']\n",
            b.sluice.admin
        ),
    )
    .unwrap();
    let mut prometheus = Command::new("prometheus")
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("prometheus (Debian's package) is installed");
    // Traffic while it scrapes.
    let traffic = {
        let proxy = b.sluice.proxy_url();
        let url = format!("http://127.0.0.50:{}/ok", b._sims[0].addr.port());
        tokio::spawn(async move {
            python(
                &proxy,
                "import sys, time, requests\nend = time.monotonic() + 6\n\
                 while time.monotonic() < end: requests.get(sys.argv[1], timeout=10)",
                &[&url],
            )
            .await
        })
    };
    let query = |q: &str| {
        let url = format!("http://127.0.0.1:{port}/api/v1/query?query={q}");
        async move {
            let out = Command::new("curl")
                .args(["-sS", "--noproxy", "*", "--max-time", "5"])
                .arg(url)
                .output()
                .await
                .unwrap();
            serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null)
        }
    };
    let started = Instant::now();
    let mut found = (Value::Null, Value::Null);
    while started.elapsed() < Duration::from_secs(60) {
        let rate = query("sluice_provider_rate_rps").await;
        let breaker = query("sluice_provider_breaker_state").await;
        let has = |v: &Value, provider: &str| {
            v["data"]["result"]
                .as_array()
                .is_some_and(|r| r.iter().any(|s| s["metric"]["provider"] == provider))
        };
        if has(&rate, "plain") && has(&breaker, "dead") {
            found = (rate, breaker);
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    traffic.await.unwrap();
    let _ = prometheus.kill().await;
    let (rate, breaker) = found;
    assert!(
        !rate.is_null(),
        "Prometheus never returned sluice_provider_rate_rps for plain"
    );
    let dead = breaker["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["metric"]["provider"] == "dead")
        .unwrap()
        .clone();
    // Open (2), or half-open (1) once its 5 s reset timeout has passed.
    let state = dead["value"][1].as_str().unwrap();
    assert!(
        state == "2" || state == "1",
        "the dead provider's breaker is not closed: {dead}"
    );
}

/// R-SF4: secrets in the path, the query, headers, the body and the proxy
/// credentials leave no trace in the logs (text and JSON, at debug level),
/// the metrics, the readout, the evidence or the store's files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_leave_no_trace() {
    let sim = Sim::start("127.0.0.53").await;
    let dead_port = {
        let l = std::net::TcpListener::bind("127.0.0.54:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let secrets = [
        "PathSecret7f3a",
        "QuerySecret91bd",
        "HeaderSecret55ce",
        "BodySecret0a2e",
        "CredSecret77d1",
    ];
    let config = "[destinations]\nallow = [\"127.0.0.0/8\"]\n\
                  [auth]\ncredentials = [\"collector-a:CredSecret77d1\"]\n\
                  [providers.dead]\nhosts = [\"127.0.0.54\"]\nbreaker_min_calls = 4\nmax_outage_wait = \"0s\"\n\
                  [limits]\nsave_interval = \"200ms\"\n";
    for (round, args) in [&[][..], &["--log-format", "json"][..]]
        .into_iter()
        .enumerate()
    {
        let s = Sluice::start_with(TempDir::new("secrets"), config, args);
        let proxy = format!("http://collector-a:CredSecret77d1@{}", s.proxy);
        let headers = [
            "-H",
            "Authorization: Bearer HeaderSecret55ce",
            "-H",
            "Cookie: c=HeaderSecret55ce",
        ];
        let body = ["--data", "password=BodySecret0a2e"];
        let mut statuses = Vec::new();
        // (A path of its own each round: the simulator's 429 is the
        // first answer to a path.)
        for path in [
            format!("/ra/1/PathSecret7f3a/{round}?token=QuerySecret91bd"),
            "/status/404/PathSecret7f3a?token=QuerySecret91bd".to_string(),
            "/reset?token=QuerySecret91bd".to_string(),
        ] {
            let mut a: Vec<&str> = headers.to_vec();
            a.extend(body);
            let r = curl(
                &proxy,
                &a,
                &format!("http://127.0.0.53:{}{path}", sim.addr.port()),
                T,
            )
            .await;
            statuses.push(r.status);
        }
        // Wrong credentials, and a dead provider's transitions, too.
        let r = curl(
            &format!("http://collector-a:CredSecret77d1x@{}", s.proxy),
            &[],
            &sim.url("http", "/ok"),
            T,
        )
        .await;
        statuses.push(r.status);
        // The secrets really went through sluice to the provider (and the
        // wrong credentials were refused): the check below means something.
        // (POSTs: the 429 is passed back, not retried.)
        assert_eq!(statuses, [429, 404, 502, 407], "{args:?}");
        for _ in 0..12 {
            curl(
                &proxy,
                &headers,
                &format!("http://127.0.0.54:{dead_port}/PathSecret7f3a?q=QuerySecret91bd"),
                T,
            )
            .await;
        }
        let mut seen = Vec::new();
        for path in [
            "/metrics",
            "/v1/providers",
            "/v1/providers/dead",
            "/v1/providers/127.0.0.53",
        ] {
            seen.push((path.to_string(), s.admin_get(path).await.1));
        }
        let (status, dir) = s.terminate().await;
        assert!(status.success());
        // The whole log, shutdown included; it has lines about the requests.
        let log = std::fs::read_to_string(dir.join("sluice.log")).unwrap();
        assert!(
            log.contains("127.0.0.53") && log.contains("provider=dead")
                || log.contains("\"provider\":\"dead\""),
            "{log}"
        );
        seen.push(("log".to_string(), log));
        for file in walk(&dir.join("state")) {
            let bytes = std::fs::read(&file).unwrap_or_default();
            seen.push((
                file.display().to_string(),
                String::from_utf8_lossy(&bytes).into_owned(),
            ));
        }
        assert!(seen
            .iter()
            .any(|(w, t)| w == "/v1/providers/dead" && t.contains("failure_rate")));
        for (where_, text) in &seen {
            for secret in secrets {
                assert!(
                    !text.contains(secret),
                    "{secret} found in {where_} ({args:?})"
                );
            }
        }
    }
}

/// Issue 36, defect 9 (R-OP4, R-OP8), through the real binary as a user
/// meets it: `--check-config` says where a file is wrong and what to
/// write, suggests the key a misspelt one meant, accepts
/// `localhost:PORT`, and fails — as the start does — on a state directory
/// it cannot write (before: `ok`, then a run with no store and no CA).
#[test]
fn config_errors_say_where_and_what_to_write() {
    let dir = TempDir::new("config-errors");
    let check = |text: &str, args: &[&str]| {
        let file = dir.join("sluice.toml");
        std::fs::write(&file, text).unwrap();
        let out = std::process::Command::new(sluice_tests::harness::binary())
            .arg("--check-config")
            .arg(&file)
            .args(args)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), said)
    };
    let state = format!("state_dir = \"{}\"\n", dir.join("state").display());
    let (code, said) = check(&format!("{state}[destinations\nallow = []\n"), &[]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("line 2, column"), "{said}");
    let (code, said) = check(&format!("{state}[defaults]\nceiling = 5.0\n"), &[]);
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains("defaults.ceiling") && said.contains("did you mean `ceiling_rps`?"),
        "{said}"
    );
    let (code, said) = check(&format!("{state}listen = \"localhost:13129\"\n"), &[]);
    assert_eq!(code, Some(0), "{said}");
    let (code, said) = check("state_dir = \"/proc/sluice-nope\"\n", &[]);
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains("state_dir: cannot create /proc/sluice-nope"),
        "{said}"
    );
    let (code, said) = check("", &["--state-dir", "/proc/sluice-nope"]);
    assert_eq!(
        code,
        Some(2),
        "the command line's state dir is checked too: {said}"
    );
    // The start refuses it too, before listening.
    let out = std::process::Command::new(sluice_tests::harness::binary())
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--state-dir", "/proc/sluice-nope"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("state_dir: cannot create /proc/sluice-nope"),
        "{said}"
    );
}

/// The allocator's counts (issue 38, R-PF1): `sluice_allocations_total`
/// grows with the requests forwarded — at least one allocation each, and
/// fewer than a thousand — and `sluice_allocated_bytes` reads the heap, a
/// part of the resident set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allocators_counts_are_scraped() {
    let sim = Sim::start("127.0.0.1").await;
    let s = Sluice::start("[destinations]\nallow = [\"127.0.0.0/8\"]\n");
    let before = s.metric("sluice_allocations_total").await;
    let before = before.expect("sluice_allocations_total is exported");
    let url = sim.url("http", "/ok");
    let script = "import sys, requests\ns = requests.Session()\n\
                  print(sum(s.get(sys.argv[1], timeout=10).status_code == 200 for _ in range(100)))\n";
    assert_eq!(python(&s.proxy_url(), script, &[&url]).await.trim(), "100");
    let after = s.metric("sluice_allocations_total").await.unwrap();
    let per_request = (after - before) / 100.0;
    assert!(
        (1.0..1000.0).contains(&per_request),
        "{per_request:.1} allocations per request"
    );
    let heap = s.metric("sluice_allocated_bytes").await.unwrap();
    let rss = sluice_tests::procfs::rss_kib(s.pid()) as f64 * 1024.0;
    assert!(heap > 0.0 && heap < rss, "heap {heap} of resident {rss}");
}

/// R-OP1, R-PF1: a provider that leaves the table takes its series out of
/// `/metrics` and frees its label. Four hosts, each answered once, in a
/// table whose labels are capped at four and whose providers are evicted
/// after 1 s idle; once they are gone, four other hosts each get a label
/// of their own — not `_other` — and the first four's series are gone.
/// (Before, labels stayed with the first providers ever seen: the live
/// ones of a crawl all counted under `_other`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_of_providers_that_left_go_to_the_live_ones() {
    let origin = Sim::start("0.0.0.0").await;
    let port = origin.addr.port();
    let s = Sluice::start(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n[limits]\nmax_metric_providers = 4\n\
         provider_idle = \"1s\"\n",
    );
    let get = |host: String| {
        let proxy = s.proxy_url();
        async move {
            let url = format!("http://{host}:{port}/ok");
            curl(&proxy, &[], &url, Duration::from_secs(10))
                .await
                .status
        }
    };
    let first: Vec<String> = (1..=4).map(|i| format!("127.6.1.{i}")).collect();
    let then: Vec<String> = (1..=4).map(|i| format!("127.6.2.{i}")).collect();
    for h in &first {
        assert_eq!(get(h.clone()).await, 200, "{h}");
    }
    let series = |body: &str, host: &str| {
        body.lines()
            .filter(|l| {
                l.starts_with("sluice_requests_total{")
                    && l.contains(&format!("provider=\"{host}\""))
            })
            .count()
    };
    let (_, body) = s.admin_get("/metrics").await;
    for h in &first {
        assert!(series(&body, h) > 0, "{h} has its own series:\n{body}");
    }
    // Evicted 1 s after its last use, at the next sweep (every 2 s).
    let started = Instant::now();
    let mut total = Value::Null;
    while started.elapsed() < Duration::from_secs(20) {
        total = s.api("GET", "/v1/providers", None).await.1["total"].clone();
        if total == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(total, 0, "the first hosts left the table");
    for h in &then {
        assert_eq!(get(h.clone()).await, 200, "{h}");
    }
    let (_, body) = s.admin_get("/metrics").await;
    for h in &first {
        assert_eq!(series(&body, h), 0, "{h} left, its series with it:\n{body}");
        assert!(
            !body.contains(&format!("provider=\"{h}\"")),
            "{h} in no family"
        );
    }
    for h in &then {
        assert!(series(&body, h) > 0, "{h} has a label of its own:\n{body}");
    }
    assert_eq!(
        series(&body, "_other"),
        0,
        "nothing counted under _other:\n{body}"
    );
}

/// R-OP7, R-PF1: in a table of more providers than keep a history (64),
/// the admin page's charts follow the ones used last. Before, every live
/// provider was sampled in name order and each sample past the 64th
/// pushed another's history out — a crawl's 100,000 providers made and
/// dropped a history each every 5 s, and the charts showed whichever 64
/// came last by name: here never the host used last, whose name sorts
/// first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_follows_the_providers_used_last() {
    let s = Sluice::start("[destinations]\nallow = [\"127.0.0.0/8\"]\n");
    // A hundred hosts where nothing listens (127.7.0.1–100), then one
    // more whose name sorts before all of them.
    sluice_tests::load::one_post_to_each_at(
        s.proxy,
        ("127.7.0.1".parse().unwrap(), 9, "/ok"),
        100,
        4,
        502,
    )
    .await;
    sluice_tests::load::one_post_to_each_at(
        s.proxy,
        ("127.7.0.0".parse().unwrap(), 9, "/ok"),
        1,
        1,
        502,
    )
    .await;
    let started = Instant::now();
    let sampled = loop {
        let (_, h) = s.api("GET", "/v1/history", None).await;
        let providers = h["providers"].as_object().cloned().unwrap_or_default();
        if providers.contains_key("127.7.0.0") {
            break providers;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the host used last has no history after 20 s (a sample every 5 s): {:?}",
            providers.keys().collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        sampled.len() <= 64,
        "{} providers with a history",
        sampled.len()
    );
}
