//! sluice beside squid, in one run (issue 24): what each proxy costs per
//! request on the same origin, load generator and machine.
//!
//! `cargo build --release -p sluice && SLUICE_BIN=target/release/sluice
//! cargo run --release -p sluice-tests --bin bench_squid [ROUNDS] [HOSTS] [CRAWL]`
//!
//! Needs Debian's `nginx`, `wrk` and `squid-openssl`. Every proxy runs
//! with its defaults except what the comparison needs: sluice's pacing
//! is set far above what the machine can do (only the proxy's own work
//! is measured) and it may reach loopback; squid keeps no cache and no
//! access log. CPU per request is the proxy process's user + system time
//! from `/proc` over the measured seconds, divided by the requests
//! answered in them. The proxies take turns, `ROUNDS` times (default 3),
//! and the medians are compared:
//!
//! 1. plain HTTP, 32 kept-alive connections (wrk, absolute-form GETs):
//!    requests per second and CPU per request;
//! 2. one connection (wrk): the median latency, against the origin
//!    directly;
//!
//! and, in 1 and 2, the floor of sluice's HTTP stack beside them:
//! `hyper_floor`, a forward proxy of hyper's server and hyper-util's pooled
//! client with nothing else (no policy, no checks), so that what sluice
//! adds reads as its difference from the floor;
//! 3. intercepted HTTPS on 32 kept-alive connections (`CONNECT`, TLS to
//!    the proxy's CA, GETs back to back): sluice against squid's
//!    `ssl-bump`, and sluice's HTTPS CPU per request against its plain;
//! 4. `HOSTS` tracked hosts (default 10,000): one request to each of as
//!    many loopback addresses (nothing listens there: each is a refused
//!    connect, a `502`), and sluice's resident memory per host; 5. as
//!    many hosts each refused once (`429`) by one origin on `0.0.0.0`:
//!    each learns a cut rate, saved;
//! 6. as many hosts answered `200` by that origin, sluice on its
//!    defaults: memory per host with the idle upstream connections they
//!    leave (bounded), and 7. with the bound lifted: one idle
//!    connection's cost (`sluice_tests::hosts::report`, also
//!    `bench_hosts`); 8. a broad crawl over `CRAWL` hosts (default
//!    1,000,000; 0 skips it), `max_providers = 100000`.

use std::net::SocketAddr;
use std::process::{Child, Command};

use sluice_tests::harness::Sluice;
use sluice_tests::load::{load_tunnelled, wrk, Run};
use sluice_tests::nginx::Nginx;
use sluice_tests::pki::TestCa;
use sluice_tests::procfs::cpu_seconds;
use sluice_tests::squid::Squid;

const CONNS: usize = 32;
const SECS: u64 = 5;

/// sluice's config: pacing out of the way, loopback allowed.
const FAST: &str =
    "[destinations]\nallow = [\"127.0.0.0/8\", \"::1/128\"]\nconnect_ports = [{PORT}]\n\
    [defaults]\nceiling_rps = 1000000.0\nstart_rps = 999999.0\nburst = 1000\n\
    max_in_flight = 10000\nmax_queue_len = 10000\n";

/// One measured run: the load's figures, the proxy's CPU per request and,
/// where it counts them, its allocations per request.
struct Measured {
    run: Run,
    cpu_us: f64,
    allocs: Option<f64>,
}

/// Where a proxy's allocator count is read (jemalloc's, in both): sluice's
/// `sluice_allocations_total` on its admin listener, the floor's
/// `/allocations`. Reading allocates too (a few thousand, once before and
/// once after tens of thousands of requests: under 0.1 a request).
#[derive(Clone, Copy)]
enum Counted {
    Sluice(SocketAddr),
    Floor(SocketAddr),
    Not,
}

impl Counted {
    fn read(self) -> Option<u64> {
        let (addr, path) = match self {
            Counted::Sluice(admin) => (admin, "/metrics"),
            Counted::Floor(addr) => (addr, "/allocations"),
            Counted::Not => return None,
        };
        let body = http_get(addr, path)?;
        match self {
            Counted::Sluice(_) => body
                .lines()
                .find_map(|l| l.strip_prefix("sluice_allocations_total "))?
                .trim()
                .parse()
                .ok(),
            _ => body.trim().parse().ok(),
        }
    }
}

/// A plain `GET` over HTTP/1.0: the answer's body.
fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text.split_once("\r\n\r\n")?.1.to_string())
}

fn measure(pid: u32, counted: Counted, f: impl FnOnce() -> Run) -> Measured {
    let allocs = counted.read();
    let before = cpu_seconds(pid);
    let run = f();
    let cpu = cpu_seconds(pid) - before;
    let requests = run.requests.max(1) as f64;
    let allocs = allocs
        .zip(counted.read())
        .map(|(a, b)| b.saturating_sub(a) as f64 / requests);
    Measured {
        cpu_us: cpu / requests * 1e6,
        allocs,
        run,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn row(name: &str, m: &Measured) {
    println!(
        "  {name:<22} {:>8.0} req/s   p50 {:>8.1} µs   p99 {:>8.1} µs   CPU {:>6.1} µs/request{}",
        m.run.rps,
        m.run.p50.as_secs_f64() * 1e6,
        m.run.p99.as_secs_f64() * 1e6,
        m.cpu_us,
        m.allocs.map_or(String::new(), |a| format!(
            "   {a:>5.1} allocations/request"
        ))
    );
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let hosts: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let crawl: u32 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);

    // The same origin for everyone.
    let origin = Nginx::origin("127.0.0.80", None);
    let target: SocketAddr = format!("127.0.0.80:{}", origin.port).parse().unwrap();
    let url = format!("http://{target}/ok");
    let provider_ca = TestCa::new("provider CA");
    let tls_origin = Nginx::origin("127.0.0.1", Some(("localhost", &provider_ca)));
    let authority = format!("localhost:{}", tls_origin.port);

    let floor = Floor::start();
    let floor_addr = floor.addr;
    let squid = Squid::plain();
    let bump_ca = TestCa::new("squid bump CA");
    let bump = Squid::bump(&bump_ca.pem, &bump_ca.key_pem, &provider_ca.pem);
    let sluice = {
        let dir = sluice_tests::harness::TempDir::new("bench-squid");
        std::fs::write(dir.join("provider-ca.pem"), &provider_ca.pem).unwrap();
        let config = format!(
            "{}[upstream]\nextra_ca = \"{}\"\n[limits]\nmax_providers = {}\n",
            FAST.replace("{PORT}", &tls_origin.port.to_string()),
            dir.join("provider-ca.pem").display(),
            hosts + 100
        );
        Sluice::start_as_deployed(dir, &config)
    };
    let sluice_ca =
        std::fs::read_to_string(sluice.dir.join("state").join("ca.crt")).expect("sluice's CA");
    let (sluice_count, floor_count) = (Counted::Sluice(sluice.admin), Counted::Floor(floor_addr));
    let squid_addr: SocketAddr = format!("127.0.0.1:{}", squid.port).parse().unwrap();
    let bump_addr: SocketAddr = format!("127.0.0.1:{}", bump.port).parse().unwrap();

    // Warm every path once: connections pooled, leaves made.
    wrk(target, None, 4, 1, 1);
    wrk(squid_addr, Some(&url), 4, 1, 1);
    wrk(floor_addr, Some(&url), 4, 1, 1);
    wrk(sluice.proxy, Some(&url), 4, 1, 1);
    for (proxy, ca) in [(sluice.proxy, &sluice_ca), (bump_addr, &bump_ca.pem)] {
        load_tunnelled(proxy, &authority, "localhost", ca, "/ok", 4, 1).await;
    }

    println!(
        "sluice beside squid {}: {rounds} rounds, {SECS} s each, one 2-core machine shared with the load and the origin\n",
        squid_version()
    );
    let (mut direct, mut sq, mut sl, mut fl) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    println!("1. plain HTTP, {CONNS} kept-alive connections (wrk, 2 threads)");
    for _ in 0..rounds {
        let d = wrk(target, None, CONNS, 2, SECS);
        println!(
            "  {:<22} {:>8.0} req/s   p50 {:>8.1} µs",
            "direct",
            d.rps,
            d.p50.as_secs_f64() * 1e6
        );
        direct.push(d.rps);
        let f = measure(floor.pid(), floor_count, || {
            wrk(floor_addr, Some(&url), CONNS, 2, SECS)
        });
        row("hyper floor", &f);
        fl.push(f);
        let q = measure(squid.pid(), Counted::Not, || {
            wrk(squid_addr, Some(&url), CONNS, 2, SECS)
        });
        row("squid", &q);
        let s = measure(sluice.pid(), sluice_count, || {
            wrk(sluice.proxy, Some(&url), CONNS, 2, SECS)
        });
        row("sluice", &s);
        sq.push(q);
        sl.push(s);
    }
    let rps = |v: &[Measured]| median(v.iter().map(|m| m.run.rps).collect());
    let cpu = |v: &[Measured]| median(v.iter().map(|m| m.cpu_us).collect());
    let allocs = |v: &[Measured]| {
        let a: Vec<f64> = v.iter().filter_map(|m| m.allocs).collect();
        if a.is_empty() {
            "not counted".to_string()
        } else {
            format!("{:.1}", median(a))
        }
    };
    let plain_cpu = cpu(&sl);
    println!(
        "  medians: direct {:.0} req/s; squid {:.0} req/s, {:.1} µs/request; sluice {:.0} req/s, {:.1} µs/request\n  \
         sluice: {:.2}× squid's requests per second, {:.2}× its CPU per request\n  \
         hyper floor {:.0} req/s, {:.1} µs/request: sluice adds {:.1} µs/request to its HTTP stack's floor",
        median(direct),
        rps(&sq),
        cpu(&sq),
        rps(&sl),
        plain_cpu,
        rps(&sl) / rps(&sq),
        plain_cpu / cpu(&sq),
        rps(&fl),
        cpu(&fl),
        plain_cpu - cpu(&fl)
    );
    println!(
        "  allocations per request: sluice {}, hyper floor {}\n",
        allocs(&sl),
        allocs(&fl)
    );

    println!("2. one connection (wrk, 1 thread)");
    let (mut d50, mut f50, mut q50, mut s50) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut fcpu, mut scpu) = (Vec::new(), Vec::new());
    let (mut fone, mut sone) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let d = wrk(target, None, 1, 1, SECS);
        let f = measure(floor.pid(), floor_count, || {
            wrk(floor_addr, Some(&url), 1, 1, SECS)
        });
        let q = wrk(squid_addr, Some(&url), 1, 1, SECS);
        let s = measure(sluice.pid(), sluice_count, || {
            wrk(sluice.proxy, Some(&url), 1, 1, SECS)
        });
        println!(
            "  p50 direct {:>6.1} µs   hyper floor {:>6.1} µs   squid {:>6.1} µs   sluice {:>6.1} µs   \
             CPU per request: floor {:.1} µs, sluice {:.1} µs",
            d.p50.as_secs_f64() * 1e6,
            f.run.p50.as_secs_f64() * 1e6,
            q.p50.as_secs_f64() * 1e6,
            s.run.p50.as_secs_f64() * 1e6,
            f.cpu_us,
            s.cpu_us
        );
        d50.push(d.p50.as_secs_f64() * 1e6);
        f50.push(f.run.p50.as_secs_f64() * 1e6);
        q50.push(q.p50.as_secs_f64() * 1e6);
        s50.push(s.run.p50.as_secs_f64() * 1e6);
        fcpu.push(f.cpu_us);
        scpu.push(s.cpu_us);
        fone.push(f);
        sone.push(s);
    }
    let (d50, f50, q50, s50) = (median(d50), median(f50), median(q50), median(s50));
    println!(
        "  medians: sluice = direct + {:.1} µs; hyper floor = direct + {:.1} µs; squid = direct + {:.1} µs\n  \
         CPU per request on one connection: sluice {:.1} µs, hyper floor {:.1} µs\n  \
         allocations per request on one connection: sluice {}, hyper floor {}\n",
        s50 - d50,
        f50 - d50,
        q50 - d50,
        median(scpu),
        median(fcpu),
        allocs(&sone),
        allocs(&fone)
    );

    println!("3. intercepted HTTPS, {CONNS} kept-alive connections (CONNECT, TLS 1.3 to the proxy's CA, HTTP/1.1)");
    let (mut bq, mut bs) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let q = measure(bump.pid(), Counted::Not, || {
            block(load_tunnelled(
                bump_addr,
                &authority,
                "localhost",
                &bump_ca.pem,
                "/ok",
                CONNS,
                SECS,
            ))
        });
        row("squid ssl-bump", &q);
        let s = measure(sluice.pid(), sluice_count, || {
            block(load_tunnelled(
                sluice.proxy,
                &authority,
                "localhost",
                &sluice_ca,
                "/ok",
                CONNS,
                SECS,
            ))
        });
        row("sluice intercepting", &s);
        bq.push(q);
        bs.push(s);
    }
    println!(
        "  medians: squid ssl-bump {:.0} req/s, {:.1} µs/request; sluice {:.0} req/s, {:.1} µs/request\n  \
         sluice: {:.2}× squid ssl-bump's requests per second; its HTTPS costs {:.2}× its plain HTTP per request, \
         {} allocations\n",
        rps(&bq),
        cpu(&bq),
        rps(&bs),
        cpu(&bs),
        rps(&bs) / rps(&bq),
        cpu(&bs) / plain_cpu,
        allocs(&bs)
    );

    // Memory per host: sluice alone on the machine (the others stopped).
    drop((sluice, squid, bump, floor, origin, tls_origin));
    sluice_tests::hosts::report(hosts, 4).await;
    sluice_tests::hosts::report_crawl(crawl, 8).await;
}

/// Runs a future to completion from inside `measure`'s closure.
fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

fn squid_version() -> String {
    std::process::Command::new("/usr/sbin/squid")
        .arg("-v")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim_start_matches("Squid Cache: ").to_string())
        })
        .unwrap_or_else(|| "(version unknown)".into())
}

/// `hyper_floor`, from beside this binary, on a free loopback port.
struct Floor {
    child: Child,
    addr: SocketAddr,
}

impl Floor {
    fn start() -> Floor {
        let exe = std::env::current_exe().expect("this binary's path");
        let bin = exe.with_file_name("hyper_floor");
        let addr: SocketAddr = format!(
            "127.0.0.1:{}",
            sluice_tests::harness::free_port("127.0.0.1")
        )
        .parse()
        .unwrap();
        let child = Command::new(&bin)
            .arg(addr.to_string())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} (cargo build --release -p sluice-tests): {e}",
                    bin.display()
                )
            });
        // Up to 10 s for it to listen.
        let listening = (0..500).any(|_| {
            let up = std::net::TcpStream::connect(addr).is_ok();
            if !up {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            up
        });
        assert!(listening, "hyper_floor did not listen on {addr}");
        Floor { child, addr }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        sluice_tests::harness::stop(&mut self.child);
    }
}
