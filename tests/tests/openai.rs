//! An LLM provider's two budgets, requests and tokens (issue 35, R-PD1,
//! R-PD5, R-PD6), through the real binary: a simulator written from
//! OpenAI's documentation (`sluice_tests::openai`) and the real `openai`
//! Python SDK pointed at it by `base_url`, configured only by
//! `HTTP_PROXY`.

use std::time::Duration;

use serde_json::Value;
use sluice_tests::clients::python_within;
use sluice_tests::harness::{Sluice, TempDir};
use sluice_tests::openai::OpenAi;
use sluice_tests::pki::TestCa;
use sluice_tests::sim::Sim;

/// Eight threads of the `openai` SDK (its own retries on, `max_retries=2`),
/// chat completions of 200–2,000 characters asking for 64–1,024 tokens.
/// Prints what they got, in all and after the first minute.
const SDK: &str = r#"
import json, random, sys, threading, time
import openai
base, clients, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
client = openai.OpenAI(base_url=base, api_key="sk-test", max_retries=2, timeout=120)
start = time.monotonic()
deadline = start + secs
lock = threading.Lock()
seen, late = {}, {}
def run(seed):
    rnd = random.Random(seed)
    while time.monotonic() < deadline:
        prompt = "y" * rnd.randint(200, 2000)
        try:
            client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=rnd.randint(64, 1024),
            )
            kind = "ok"
        except openai.RateLimitError as e:
            kind = "RateLimitError"
        except openai.APIStatusError as e:
            kind = "status %d %s" % (e.status_code, e.response.headers.get("proxy-status", ""))
        except Exception as e:
            kind = type(e).__name__
        with lock:
            seen[kind] = seen.get(kind, 0) + 1
            if time.monotonic() - start >= 60:
                late[kind] = late.get(kind, 0) + 1
threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"all": seen, "after_first_minute": late}))
"#;

/// What the SDK got, and what the provider saw over `[60 s, secs)`: the
/// tokens served as a share of the budget, the requests refused and all.
async fn sdk_through_sluice(
    sim: &Sim,
    s: &Sluice,
    base: &str,
    secs: u64,
    env: &[(&str, &str)],
) -> (Value, f64, usize, usize) {
    let out = python_within(
        Duration::from_secs(secs + 120),
        &s.proxy_url(),
        SDK,
        &[base, "8", &secs.to_string()],
        env,
    )
    .await;
    let got: Value = serde_json::from_str(out.trim()).expect("the script's JSON");
    let (tokens, refused, all) =
        sim.model(|m: &OpenAi| m.served(Duration::from_secs(60), Duration::from_secs(secs)));
    let used = tokens as f64 / (120_000.0 * (secs - 60) as f64 / 60.0);
    let p = s.api("GET", "/v1/providers/llm", None).await.1;
    println!(
        "the SDK got {got}; from the second minute on: {tokens} tokens served ({used:.3} of \
         the budget), {refused} of {all} requests refused; readout tokens {}",
        p["tokens"]
    );
    assert_eq!(p["tokens"]["limit"], 120_000, "{p}");
    assert_eq!(
        p["pace_authority"], "tokens",
        "the tighter budget governs: {p}"
    );
    (got, used, refused, all)
}

/// The SDK's share of the bargain: after the first minute nothing but
/// completions, and no error made by sluice at all.
fn assert_clean(got: &Value) {
    let late = got["after_first_minute"].as_object().expect("late counts");
    assert!(
        late.keys().all(|k| k == "ok"),
        "after the first minute, nothing but completions: {got}"
    );
    assert!(
        got["all"]
            .as_object()
            .unwrap()
            .keys()
            .all(|k| !k.starts_with("status")),
        "no error made by sluice: {got}"
    );
}

fn config(ip: &str, extra: &str) -> String {
    format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n{extra}\
         [providers.llm]\nhosts = [\"{ip}\"]\ndialect = \"openai\"\n"
    )
}

/// An OpenAI-like provider, 1,200 requests and 120,000 tokens a minute
/// refilled continuously, requests varying 10× in tokens: over the second
/// and third minutes ≥ 0.95 of the tokens budget used and ≤ 0.5 % of the
/// requests refused — the tokens budget governs, learned from the
/// provider's own `x-ratelimit-remaining-tokens` — and the SDK gets no
/// `RateLimitError` after the first minute and no error from sluice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_spends_the_tokens_budget_without_refusals() {
    let ip = "127.0.7.8";
    let sim = Sim::start_model(ip, OpenAi::new(1_200, 120_000)).await;
    let s = Sluice::start(&config(ip, ""));
    let base = sim.url("http", "/v1");
    let (got, used, refused, all) = sdk_through_sluice(&sim, &s, &base, 180, &[]).await;
    assert!(used >= 0.95, "{used:.3} of the tokens budget used");
    assert!(
        refused as f64 <= 0.005 * all as f64,
        "{refused} of {all} refused"
    );
    assert_clean(&got);
}

/// The same over HTTPS, configured by `HTTPS_PROXY` and sluice's CA
/// (`SSL_CERT_FILE`, which the SDK's httpx reads): sluice intercepts and
/// sees every answer's budgets; a shorter run, judged over its second
/// minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_through_interception_spends_the_tokens_budget() {
    let ip = "127.0.7.9";
    let provider_ca = TestCa::new("provider CA");
    let dir = TempDir::new("openai-https");
    let ca_file = dir.join("provider-ca.pem");
    std::fs::write(&ca_file, &provider_ca.pem).unwrap();
    let sim = Sim::start_model_tls(
        ip,
        provider_ca.server_config(&[ip]),
        OpenAi::new(1_200, 120_000),
    )
    .await;
    let s = Sluice::start(&config(
        ip,
        &format!(
            "connect_ports = [{}]\n[upstream]\nextra_ca = \"{}\"\n",
            sim.addr.port(),
            ca_file.display()
        ),
    ));
    let sluice_ca = s.dir.join("state").join("ca.crt").display().to_string();
    let base = sim.url("https", "/v1");
    let (got, used, refused, all) =
        sdk_through_sluice(&sim, &s, &base, 120, &[("SSL_CERT_FILE", &sluice_ca)]).await;
    assert!(used >= 0.95, "{used:.3} of the tokens budget used");
    assert!(
        refused as f64 <= 0.005 * all as f64,
        "{refused} of {all} refused"
    );
    assert_clean(&got);
    let p = s.api("GET", "/v1/providers/llm", None).await.1;
    assert_eq!(p["intercept"], true, "{p}");
}
