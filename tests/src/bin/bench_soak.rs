//! A long soak (issue 20, R-HU1): mixed traffic for `MINUTES` (30) through
//! the real binary, with a config reload (SIGHUP) every minute.
//!
//! `cargo build --release -p sluice -p sluice-tests --bins && \
//!  SLUICE_BIN=target/release/sluice target/release/bench_soak [MINUTES]`
//!
//! Every minute, naive Python clients for 55 s: plain HTTP to a fast
//! provider, to a throttling one (a hidden 20 req/s limit, `429`s) and to
//! a noisy one (10 % `503`s); intercepted HTTPS to a throttling TLS
//! provider; a WebSocket echo session (`ws://`) through a tunnel. Printed
//! each minute: sluice's resident set, open descriptors, tasks alive,
//! every provider's queue and in-flight count, and what the clients got.
//! At the end, after a rest: the same, and the resident set against its
//! value at minute 5 (flat after warm-up: within 10 %), queues at zero and
//! tasks back to where they were at rest.

use std::time::Duration;

use serde_json::Value;
use sluice_tests::clients::{naive_clients, python};
use sluice_tests::harness::{Sluice, TempDir};
use sluice_tests::pki::TestCa;
use sluice_tests::procfs::{open_fds, status_kib};
use sluice_tests::sim::Sim;
use tokio::time::Instant;

/// The WebSocket echo server (Python `websockets`), on `ip`.
const ECHO: &str = r#"
import asyncio, sys
from websockets.asyncio.server import serve
async def echo(ws):
    async for m in ws:
        await ws.send(m)
async def main():
    async with serve(echo, sys.argv[1], 0) as server:
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.get_running_loop().create_future()
asyncio.run(main())
"#;

/// A WebSocket session through the proxy: `n` messages echoed.
const WS_CLIENT: &str = r#"
import sys
from websockets.sync.client import connect
n = 0
with connect(sys.argv[1], open_timeout=20, close_timeout=5) as ws:
    for i in range(int(sys.argv[2])):
        ws.send(f"m{i}")
        if ws.recv(timeout=20) == f"m{i}":
            n += 1
print(n)
"#;

struct Reading {
    rss: u64,
    fds: usize,
    tasks: i64,
    queues: String,
}

async fn read(sluice: &Sluice) -> Reading {
    let pid = sluice.pid();
    let (_, metrics) = sluice.admin_get("/metrics").await;
    let tasks = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sluice_runtime_tasks_alive "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1);
    let (_, providers) = sluice.admin_get("/v1/providers").await;
    let v: Value = serde_json::from_str(&providers).unwrap_or_default();
    let queues = v["providers"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    format!(
                        "{} {}+{}",
                        p["name"].as_str().unwrap_or("?"),
                        p["queue"]["waiting"],
                        p["queue"]["in_flight"]
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    Reading {
        rss: status_kib(pid, "VmRSS"),
        fds: open_fds(pid),
        tasks,
        queues,
    }
}

#[tokio::main]
async fn main() {
    let minutes: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(30);
    let fast = Sim::start("127.0.3.31").await;
    let throttling = Sim::start("127.0.3.32").await;
    throttling.set_limit(20.0, 10.0);
    let noisy = Sim::start("127.0.3.33").await;
    let ca = TestCa::new("soak provider CA");
    let secure = Sim::start_tls("127.0.3.34", ca.server_config(&["127.0.3.34"])).await;
    secure.set_limit(20.0, 10.0);
    let mut echo = tokio::process::Command::new("python3")
        .args(["-c", ECHO, "127.0.3.35"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 with websockets");
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(
        &mut tokio::io::BufReader::new(echo.stdout.take().unwrap()),
        &mut line,
    )
    .await
    .unwrap();
    let ws_port: u16 = line.trim().parse().expect("the echo server's port");
    let dir = TempDir::new("soak");
    std::fs::write(dir.join("provider-ca.pem"), &ca.pem).unwrap();
    let config = format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\nconnect_ports = [443, 80, {}, {ws_port}]\n\
         [upstream]\nextra_ca = \"{}\"\n",
        secure.addr.port(),
        dir.join("provider-ca.pem").display()
    );
    let sluice = Sluice::start_in(dir, &config);
    let proxy = sluice.proxy_url();
    let cafile = sluice
        .dir
        .join("state")
        .join("ca.crt")
        .display()
        .to_string();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rest = read(&sluice).await;
    println!(
        "bench_soak: {minutes} min; at rest: RSS {} KiB, {} descriptors, {} tasks",
        rest.rss, rest.fds, rest.tasks
    );
    let started = Instant::now();
    let mut at_5 = None;
    for minute in 1..=minutes {
        let slice = Instant::now();
        let env = [("REQUESTS_CA_BUNDLE", cafile.as_str())];
        let (fast_url, throttling_url, noisy_url, secure_url, ws_url) = (
            fast.url("http", "/ok"),
            throttling.url("http", "/limited"),
            noisy.url("http", "/noise/100"),
            secure.url("https", "/limited"),
            format!("ws://127.0.3.35:{ws_port}/echo"),
        );
        let ws_args = [ws_url.as_str(), "200"];
        let (a, b, c, d, ws) = tokio::join!(
            naive_clients(&proxy, &fast_url, 2, 55, &[]),
            naive_clients(&proxy, &throttling_url, 4, 55, &[]),
            naive_clients(&proxy, &noisy_url, 2, 55, &[]),
            naive_clients(&proxy, &secure_url, 2, 55, &env),
            python(&proxy, WS_CLIENT, &ws_args),
        );
        sluice.signal("HUP");
        let r = read(&sluice).await;
        if minute == 5 {
            at_5 = Some(r.rss);
        }
        println!(
            "min {minute:>2}: RSS {} KiB, {} descriptors, {} tasks; queue+in flight: {}; \
             fast {} | throttling {} | noisy {} | https {} | ws echoed {}/200",
            r.rss,
            r.fds,
            r.tasks,
            r.queues,
            a.trim(),
            b.trim(),
            c.trim(),
            d.trim(),
            ws.trim()
        );
        let left = Duration::from_secs(60).saturating_sub(slice.elapsed());
        tokio::time::sleep(left).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let end = read(&sluice).await;
    let reloads = sluice.log().matches("config reloaded").count();
    println!(
        "after {:.0} min and a 10 s rest: RSS {} KiB ({} at minute 5: {:+.1} %), {} descriptors \
         (at rest {}), {} tasks (at rest {}); queues: {}; {reloads} reloads logged",
        started.elapsed().as_secs_f64() / 60.0,
        end.rss,
        at_5.map_or("-".to_string(), |k| k.to_string()),
        at_5.map_or(0.0, |k| (end.rss as f64 / k as f64 - 1.0) * 100.0),
        end.fds,
        rest.fds,
        end.tasks,
        rest.tasks,
        end.queues
    );
}
