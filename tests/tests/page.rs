//! The admin page and `sluice status` (issue 23, R-OP7, R-OP2): the real
//! binary with a throttled provider, a `Retry-After` hold and an open
//! breaker, a collector inside a run; the page loaded in Debian's headless
//! Chromium, driven over its DevTools protocol, with every address but
//! loopback cut off; `sluice status` read as plain text.

use std::time::Duration;

use serde_json::{json, Value};
use sluice_tests::clients::{curl, naive_clients};
use sluice_tests::harness::{binary, Sluice, TempDir};
use sluice_tests::sim::Sim;

/// Drives Chromium over the DevTools protocol: opens the page, waits for a
/// render, then — at the next render — reads every field the page shows
/// (`data-k`: the field, `data-v`: the value as served, the text as
/// drawn), the readout the page drew from and a fresh `/v1/providers`,
/// the page's load timing, its HTML and text; keeps a screenshot; lists
/// every request the page made. Non-loopback addresses resolve nowhere
/// and go to a dead proxy: the network is cut.
const DRIVER: &str = r#"
import base64, json, os, subprocess, sys, tempfile, time
from websockets.sync.client import connect

url, shot_path = sys.argv[1], sys.argv[2]
profile = tempfile.mkdtemp(prefix="sluice-chromium-")
chromium = subprocess.Popen([
    "chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--no-default-browser-check", "--disable-background-networking", "--disable-extensions",
    "--disable-sync", "--disable-component-update", "--remote-debugging-port=0",
    "--user-data-dir=" + profile, "--proxy-server=http://127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--window-size=1400,1100", "about:blank",
], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
events, counter = [], [0]
try:
    port_file = os.path.join(profile, "DevToolsActivePort")
    deadline = time.time() + 60
    while True:
        if os.path.exists(port_file):
            lines = open(port_file).read().split()
            if len(lines) >= 2:
                break
        if time.time() > deadline:
            raise SystemExit("chromium did not start")
        time.sleep(0.05)
    ws = connect(f"ws://127.0.0.1:{lines[0]}{lines[1]}", max_size=None, proxy=None, open_timeout=30).__enter__()

    def send(method, params=None, session=None):
        counter[0] += 1
        msg = {"id": counter[0], "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        ws.send(json.dumps(msg))
        while True:
            m = json.loads(ws.recv(timeout=60))
            if m.get("id") == counter[0]:
                if "error" in m:
                    raise SystemExit(f"{method}: {m['error']}")
                return m["result"]
            events.append(m)

    target = send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    send("Network.enable", session=session)
    send("Page.enable", session=session)
    send("Page.navigate", {"url": url}, session=session)

    def evaluate(expr):
        r = send("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True}, session)
        if "exceptionDetails" in r:
            raise SystemExit(f"page script: {r['exceptionDetails']}")
        return r["result"].get("value")

    deadline = time.time() + 60
    while not evaluate("!!(document.body && document.body.dataset.rendered)"):
        if time.time() > deadline:
            raise SystemExit("the page never rendered: " + str(evaluate("document.body && document.body.innerText")))
        time.sleep(0.05)
    seen = evaluate("""(async () => {
        const before = document.body.dataset.rendered;
        while (document.body.dataset.rendered === before) await new Promise(r => setTimeout(r, 10));
        const readout = await (await fetch('/v1/providers', { cache: 'no-store' })).json();
        const cards = {};
        for (const c of document.querySelectorAll('[data-provider]')) {
            const f = {};
            for (const e of c.querySelectorAll('[data-k]')) f[e.dataset.k] = { v: e.dataset.v === undefined ? null : JSON.parse(e.dataset.v), text: e.textContent };
            const svg = c.querySelector('svg.chart');
            f.points = { v: svg ? Number(svg.dataset.points) : 0 };
            f.evidence_lines = { v: c.querySelectorAll('[data-k=evidence]').length };
            cards[c.dataset.provider] = f;
        }
        const nav = performance.getEntriesByType('navigation')[0];
        return { cards, readout, drawn: window.sluice.providers, load_ms: nav.loadEventEnd - nav.startTime,
                 first_render_ms: window.sluice.firstRenderMs,
                 html: document.documentElement.outerHTML, text: document.body.innerText };
    })()""")
    shot = send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session)
    with open(shot_path, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
    seen["requests"] = [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]
    seen["failed"] = [e["params"] for e in events if e.get("method") == "Network.loadingFailed"]
    print(json.dumps(seen))
finally:
    chromium.kill()
    chromium.wait()
"#;

/// A number as the page and `sluice status` write it: three significant
/// digits, at most two decimals.
fn num(x: f64) -> String {
    let d = if x.abs() >= 100.0 {
        0
    } else if x.abs() >= 10.0 {
        1
    } else {
        2
    };
    let s = format!("{x:.d$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// R-OP7: traffic with a throttle, a hold and an open breaker, a collector
/// in a run; then the page in headless Chromium. What it shows equals the
/// readout of the same moment — numbers rounded for people, "unknown"
/// where nothing is known; the throttled provider's chart has points; the
/// page made no request beyond the admin port (the network cut, it still
/// drew everything); it loaded (the time printed); no token, URL path or
/// query is on it. A screenshot is kept in the test's temporary directory.
/// `sluice status` prints the same providers and the collector's run, and
/// no secret either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_page_shows_the_readout_for_people() {
    let throttled = Sim::start("127.0.0.71").await;
    throttled.set_limit(3.0, 1.0);
    let held = Sim::start("127.0.0.72").await;
    let dead = Sim::start("127.0.0.73").await;
    let dir = TempDir::new("page");
    std::fs::write(dir.join("a.token"), "tok-secret-a\n").unwrap();
    let config = format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n\
         [collectors.collector-a]\ntoken_file = \"{}\"\n\
         [providers.dead]\nhosts = [\"127.0.0.73\"]\nbreaker_min_calls = 5\nbreaker_open_for = \"5m\"\n\
         [providers.idle]\nhosts = [\"127.0.0.74\"]\n",
        dir.join("a.token").display()
    );
    let sluice = Sluice::start_in(dir, &config);
    let (s, run) = sluice
        .api(
            "POST",
            "/v1/collectors/collector-a/runs",
            Some(&json!({ "request_cap": 100000 })),
        )
        .await;
    assert_eq!(s, 201, "{run}");
    let as_a = format!("http://collector-a:tok-secret-a@{}", sluice.proxy);
    let t = Duration::from_secs(30);
    // A hold: 429 with Retry-After 120 s.
    let ra = curl(
        &as_a,
        &[],
        &held.url("http", "/ra/120/secret-hold-path?key=q1"),
        t,
    )
    .await;
    assert_eq!(ra.status, 429, "{ra:?}");
    // An open breaker: bare 503s until it opens.
    for _ in 0..12 {
        let r = curl(&as_a, &[], &dead.url("http", "/status/503?secret=q2"), t).await;
        if r.status != 503 {
            break;
        }
    }
    // A throttle, 12 s of naive clients inside the run: two history samples
    // at least.
    let out = naive_clients(
        &as_a,
        &throttled.url("http", "/limited/secret-path-123?token=abc"),
        4,
        12,
        &[],
    )
    .await;
    println!("throttled provider: clients saw {}", out.trim());

    let artifact = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("admin-page.png");
    let page_url = format!("http://{}/", sluice.admin);
    let driven = tokio::process::Command::new("python3")
        .args(["-c", DRIVER, &page_url])
        .arg(&artifact)
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .output();
    let driven = tokio::time::timeout(Duration::from_secs(120), driven)
        .await
        .expect("the browser run ended")
        .expect("python3 runs");
    assert!(
        driven.status.success(),
        "the DevTools driver: {}",
        String::from_utf8_lossy(&driven.stderr)
    );
    let seen: Value = serde_json::from_slice(&driven.stdout).expect("the driver's JSON");
    let (_, readout_now) = sluice.admin_get("/v1/providers").await;
    println!(
        "page: loaded in {:.1} ms, first drawn at {:.1} ms; {} requests; screenshot {}",
        seen["load_ms"].as_f64().unwrap_or(f64::NAN),
        seen["first_render_ms"].as_f64().unwrap_or(f64::NAN),
        seen["requests"].as_array().map_or(0, Vec::len),
        artifact.display()
    );
    // Every request the page made went to the admin port, and none failed.
    let origin = format!("http://{}/", sluice.admin);
    let requests: Vec<&str> = seen["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(requests.len() >= 4, "{requests:?}");
    assert!(
        requests.iter().all(|u| u.starts_with(&origin)),
        "only the admin port: {requests:?}"
    );
    assert_eq!(seen["failed"], json!([]), "no request failed");
    // It loaded (its load event fired); how fast is printed above, not
    // bounded here: a shared machine's timing is no test of the page.
    assert!(
        seen["load_ms"].as_f64().is_some_and(|ms| ms > 0.0),
        "the page's load event fired: {}",
        seen["load_ms"]
    );
    // The numbers on the page are the readout of the same moment, as the
    // page drew them and as /v1/providers served them at once after.
    let readout = &seen["readout"]["providers"];
    for name in ["127.0.0.71", "127.0.0.72", "dead"] {
        let p = readout
            .as_array()
            .and_then(|a| a.iter().find(|p| p["name"] == name))
            .unwrap_or_else(|| panic!("{name} in the readout: {readout}"));
        let card = &seen["cards"][name];
        for (k, served) in [
            ("rate_rps", &p["rate_rps"]),
            ("ceiling_rps", &p["ceiling_rps"]),
            ("throttle_point_rps", &p["throttle_point_rps"]),
            ("queue.waiting", &p["queue"]["waiting"]),
            ("breaker.state", &p["breaker"]["state"]),
            ("pace_authority", &p["pace_authority"]),
        ] {
            assert_eq!(&card[k]["v"], served, "{name} {k}: {card}");
            let text = card[k]["text"].as_str().unwrap_or_default();
            match served {
                Value::Number(n) if k.ends_with("_rps") => {
                    assert_eq!(
                        text,
                        format!("{} req/s", num(n.as_f64().unwrap())),
                        "{name} {k}"
                    );
                }
                Value::String(s) if s == "unknown" => assert_eq!(text, "unknown", "{name} {k}"),
                _ => {}
            }
        }
    }
    let card = |name: &str| &seen["cards"][name];
    assert!(
        card("127.0.0.71")["points"]["v"].as_u64().unwrap() >= 2,
        "the chart has points"
    );
    assert!(
        card("127.0.0.71")["throttle_point_rps"]["v"].is_number(),
        "the throttle was learned: {}",
        card("127.0.0.71")
    );
    // A configured provider with no traffic yet: unknown, never a zero.
    assert_eq!(
        card("idle")["rate_rps"],
        json!({ "v": "unknown", "text": "unknown" })
    );
    assert_eq!(card("idle")["breaker.state"]["text"], "unknown");
    assert_eq!(card("dead")["breaker.state"]["v"], "open");
    assert!(
        card("dead")["evidence_lines"]["v"].as_u64().unwrap() >= 1,
        "the breaker's transition with its evidence"
    );
    let text = seen["text"].as_str().unwrap();
    assert!(text.contains("hold (Retry-After)"), "{text}");
    assert!(text.contains("collector-a"), "{text}");
    assert!(
        text.contains(run["id"].as_str().unwrap()),
        "the active run: {text}"
    );
    // Nothing secret: no token, URL path or query, in the HTML or the text.
    let html = seen["html"].as_str().unwrap();
    for secret in [
        "tok-secret-a",
        "secret-path-123",
        "token=abc",
        "secret-hold-path",
        "secret=q2",
        "/limited",
        "/status/503",
    ] {
        assert!(!html.contains(secret), "{secret} on the page");
        assert!(!readout_now.contains(secret), "{secret} in the readout");
    }

    // sluice status, as plain text, against the same sluice.
    let out = tokio::process::Command::new(binary())
        .args(["status", "--admin", &format!("http://{}", sluice.admin)])
        .output()
        .await
        .expect("sluice status");
    let status = String::from_utf8_lossy(&out.stdout);
    println!("{status}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in sluice status:\n{status}"))
            .to_string()
    };
    let throttled_line = line("127.0.0.71");
    let p71 = readout
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "127.0.0.71")
        .unwrap();
    assert!(
        throttled_line.contains(&format!("{} req/s", num(p71["rate_rps"].as_f64().unwrap()))),
        "{throttled_line}"
    );
    assert!(line("127.0.0.72").contains("hold,"), "{status}");
    assert!(line("dead").contains("open"), "{status}");
    assert!(
        line("collector-a").contains(run["id"].as_str().unwrap()),
        "{status}"
    );
    for secret in [
        "tok-secret-a",
        "secret-path-123",
        "token=abc",
        "/limited",
        "secret=q2",
    ] {
        assert!(!status.contains(secret), "{secret} in sluice status");
    }
}

/// Issue 36, defect 11 (R-OP7, R-OP8): the page's first paint comes from
/// the server — fetched without a browser (`curl`), it shows the live
/// providers with the figures the script draws (pace, ceiling, what sets
/// the pace, the throttle point, the breaker), not "No provider has been
/// used yet." (Before: that sentence while providers were live.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_without_a_browser_shows_the_providers() {
    let sim = Sim::start("127.0.0.77").await;
    let s = Sluice::start("[destinations]\nallow = [\"127.0.0.0/8\"]\n");
    let (_, before) = s.admin_get("/").await;
    let none = "<p class=\"note\">No provider has been used yet.</p>";
    assert!(before.contains(none));
    let r = curl(
        &s.proxy_url(),
        &[],
        &sim.url("http", "/ok"),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    let (code, page) = s.admin_get("/").await;
    assert_eq!(code, 200);
    assert!(!page.contains(none), "the live provider is drawn");
    let (_, readout) = s.admin_get("/v1/providers/127.0.0.77").await;
    let p: Value = serde_json::from_str(&readout).unwrap();
    let card = page
        .split("data-provider=\"127.0.0.77\"")
        .nth(1)
        .expect("a card for the provider");
    let card = &card[..card.find("</dl>").expect("its figures")];
    assert!(card.contains("breaker closed"), "{card}");
    assert!(
        card.contains(" req/s</span>") && card.contains("ceiling"),
        "{card}"
    );
    assert!(
        card.contains(p["pace_authority"].as_str().unwrap()),
        "what sets the pace, as the readout says: {card}"
    );
}
