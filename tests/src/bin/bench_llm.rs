//! An LLM provider's budgets three ways, in one run (issue 35): the real
//! `openai` Python SDK against three copies of the OpenAI-like simulator
//! (`sluice_tests::openai`, 1,200 requests and 120,000 tokens a minute),
//! side by side on the same machine at the same time:
//!
//! 1. **naive** — the SDK alone, its own retries (`max_retries=2`);
//! 2. **configured** — the SDK behind a limiter configured by hand as
//!    LiteLLM's router, Kong's or APISIX's token limits are (`rpm = 1200`,
//!    `tpm = 120000`), counting each answer's `usage.total_tokens` into the
//!    current minute after the fact and waiting for the next minute when
//!    either count is reached;
//! 3. **sluice** — the SDK configured only by `HTTP_PROXY`.
//!
//! Each with 8 threads, prompts of 200–2,000 characters asking for
//! 64–1,024 tokens. Prints, per way: the tokens budget used from the
//! second minute on, the provider's refusals, and what the SDK raised.
//!
//! `cargo build --release -p sluice && cargo run --release -p sluice-tests
//! --bin bench_llm [SECS]` (default 180; needs `pip install openai`).

use std::time::Duration;

use serde_json::Value;
use sluice_tests::clients::python_within;
use sluice_tests::harness::Sluice;
use sluice_tests::openai::OpenAi;
use sluice_tests::sim::Sim;

const SCRIPT: &str = r#"
import json, os, random, sys, threading, time
import openai
base, clients, secs, mode = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
client = openai.OpenAI(base_url=base, api_key="sk-test", max_retries=2, timeout=120)
start = time.monotonic()
deadline = start + secs
lock = threading.Lock()
seen = {}
# The configured limiter: counts of the current minute, as LiteLLM's
# router keeps them (requests at send, tokens from usage after the answer).
RPM, TPM = 1200, 120000
window = {"minute": -1, "requests": 0, "tokens": 0}
def admit():
    while True:
        with lock:
            minute = int((time.monotonic() - start) // 60)
            if window["minute"] != minute:
                window.update(minute=minute, requests=0, tokens=0)
            if window["requests"] < RPM and window["tokens"] < TPM:
                window["requests"] += 1
                return
            wait = start + (minute + 1) * 60 - time.monotonic()
        time.sleep(max(wait, 0.01))
def run(seed):
    rnd = random.Random(seed)
    while time.monotonic() < deadline:
        prompt = "y" * rnd.randint(200, 2000)
        if mode == "configured":
            admit()
        try:
            r = client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=rnd.randint(64, 1024),
            )
            kind = "ok"
            if mode == "configured":
                with lock:
                    window["tokens"] += r.usage.total_tokens
        except openai.RateLimitError:
            kind = "RateLimitError"
        except openai.APIStatusError as e:
            kind = "status %d" % e.status_code
        except Exception as e:
            kind = type(e).__name__
        with lock:
            seen[kind] = seen.get(kind, 0) + 1
threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(seen))
"#;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(180);
    let ways = [
        ("naive", "127.0.8.1"),
        ("configured", "127.0.8.2"),
        ("sluice", "127.0.8.3"),
    ];
    let mut sims = Vec::new();
    for (_, ip) in ways {
        sims.push(Sim::start_model(ip, OpenAi::new(1_200, 120_000)).await);
    }
    let sluice = Sluice::start(&format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n\
         [providers.llm]\nhosts = [\"{}\"]\ndialect = \"openai\"\n",
        ways[2].1
    ));
    // The direct ways get no proxy at all (an empty one is none).
    let run = |i: usize| {
        let (way, _) = ways[i];
        let base = sims[i].url("http", "/v1");
        let proxy = if way == "sluice" {
            sluice.proxy_url()
        } else {
            String::new()
        };
        let secs = secs.to_string();
        async move {
            let limit = Duration::from_secs(secs.parse::<u64>().unwrap_or(180) + 180);
            let out = python_within(limit, &proxy, SCRIPT, &[&base, "8", &secs, way], &[]).await;
            serde_json::from_str::<Value>(out.trim()).expect("the script's JSON")
        }
    };
    let (a, b, c) = tokio::join!(run(0), run(1), run(2));
    let got = [a, b, c];
    println!(
        "an OpenAI-like provider, 1,200 requests and 120,000 tokens a minute; the openai SDK, \
         8 threads, {secs} s; the provider's figures from the second minute on"
    );
    println!(
        "{:<11} | {:>12} | {:>16} | what the SDK got",
        "way", "tokens used", "refused"
    );
    for (((way, _), sim), seen) in ways.iter().zip(&sims).zip(&got) {
        let (tokens, refused, all) =
            sim.model(|m: &OpenAi| m.served(Duration::from_secs(60), Duration::from_secs(secs)));
        let used = tokens as f64 / (120_000.0 * (secs - 60) as f64 / 60.0);
        println!(
            "{way:<11} | {:>10.1} % | {refused:>5} of {all:>5} ({:>4.1} %) | {seen}",
            used * 100.0,
            refused as f64 * 100.0 / all.max(1) as f64
        );
    }
}
