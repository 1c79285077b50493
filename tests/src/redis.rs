//! A real `redis-server` on loopback for the shared-budget tests (Debian's
//! package; `scripts/test` installs it when missing).

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use crate::harness::{free_port, TempDir};

/// A running `redis-server`, killed on drop.
#[derive(Debug)]
pub struct Redis {
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: TempDir,
    /// Serving TLS only, with this certificate and key (PEM files).
    tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl Redis {
    /// Starts one on a free port, waiting until it accepts connections.
    pub fn start() -> Redis {
        let port = free_port("127.0.0.1");
        let mut r = Redis {
            child: None,
            port,
            dir: TempDir::new("redis"),
            tls: None,
        };
        // The port was free when chosen; another test's listener may take
        // it before redis-server binds it: then another port.
        for _ in 0..5 {
            if r.try_restart() {
                return r;
            }
            r.port = free_port("127.0.0.1");
        }
        panic!("redis-server found no free port in five tries");
    }

    /// Starts one that speaks TLS only (Debian's build has it), with a
    /// leaf for 127.0.0.1 from `ca`.
    pub fn start_tls(ca: &crate::pki::TestCa) -> Redis {
        let port = free_port("127.0.0.1");
        let dir = TempDir::new("redis-tls");
        let (cert, key) = ca.leaf_pem(&["127.0.0.1"]);
        let (cert_file, key_file) = (dir.join("redis.crt"), dir.join("redis.key"));
        std::fs::write(&cert_file, cert).unwrap();
        std::fs::write(&key_file, key).unwrap();
        let mut r = Redis {
            child: None,
            port,
            dir,
            tls: Some((cert_file, key_file)),
        };
        r.restart();
        r
    }

    /// `redis://127.0.0.1:{port}/0`, or `rediss://` for a TLS one.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/0", self.port)
    }

    /// Kills it (`kill -9`: no goodbye to its clients).
    pub fn kill(&mut self) {
        stop(&mut self.child);
    }

    /// Starts it again on the same port, empty (no persistence).
    pub fn restart(&mut self) {
        assert!(
            self.try_restart(),
            "redis-server could not have port {} again: another process holds it",
            self.port
        );
    }

    /// [`Redis::restart`]: false if what answers on the port is not this
    /// redis-server (checked with `PING` on a plain one: a TCP connect
    /// alone took another process's listener for it).
    fn try_restart(&mut self) -> bool {
        self.kill();
        let mut cmd = Command::new("redis-server");
        match &self.tls {
            Some((cert, key)) => {
                cmd.args(["--port", "0", "--tls-port", &self.port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(cert)
                    .arg("--tls-key-file")
                    .arg(key)
                    .args(["--tls-auth-clients", "no"]);
            }
            None => {
                cmd.args(["--port", &self.port.to_string()]);
            }
        }
        let child = cmd
            .args([
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--enable-debug-command",
                "local",
                "--appendonly",
                "no",
                "--dir",
            ])
            .arg(&self.dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (apt-get install redis-server)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.tls.is_some() || self.cli(&["ping"]) == "PONG"
    }

    /// Runs `redis-cli` against it.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A free port on 127.0.0.1 whose cluster-bus port (`+ 10000`) is free
/// too.
fn cluster_port() -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// Starts `redis-server` with `args` in `dir`, waiting until it accepts
/// connections on `port`.
fn spawn_server(port: u16, dir: &std::path::Path, args: &[&str]) -> Child {
    let child = Command::new("redis-server")
        .args(args)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (apt-get install redis-server)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "redis-server did not start on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// `kill -9` of a node, if it runs; waited for.
fn stop(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// `127.0.0.1:p1,127.0.0.1:p2,…`.
fn hosts(ports: impl Iterator<Item = u16>) -> String {
    ports
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `redis-cli -p port args…`, its output trimmed.
pub fn cli_at(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A real Redis Cluster on loopback: three primaries and three replicas
/// (Debian's `redis-server --cluster-enabled yes`), created by
/// `redis-cli --cluster create --cluster-replicas 1`; a node that stops
/// answering for 2 s is failed over (`--cluster-node-timeout 2000`).
/// Every node is killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<(u16, Option<Child>)>,
    _dir: TempDir,
}

impl RedisCluster {
    /// Starts six nodes and creates the cluster, waiting until every node
    /// says it is `ok`.
    pub fn start() -> RedisCluster {
        let dir = TempDir::new("redis-cluster");
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let port = cluster_port();
            let d = dir.join(&port.to_string());
            std::fs::create_dir_all(&d).unwrap();
            let child = spawn_server(
                port,
                &d,
                &["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"],
            );
            nodes.push((port, Some(child)));
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cluster
            .nodes
            .iter()
            .all(|(p, _)| cli_at(*p, &["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        {
            assert!(Instant::now() < deadline, "the cluster did not come up");
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,…` — every node as a seed.
    pub fn url(&self) -> String {
        format!(
            "redis+cluster://{}",
            hosts(self.nodes.iter().map(|(p, _)| *p))
        )
    }

    /// The port of a node still running.
    fn live(&self) -> u16 {
        self.nodes
            .iter()
            .find(|(_, c)| c.is_some())
            .map(|(p, _)| *p)
            .expect("a running node")
    }

    /// The slot of `key`, as the cluster computes it.
    pub fn slot(&self, key: &str) -> u16 {
        cli_at(self.live(), &["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("a slot")
    }

    /// The port of the primary serving `slot` now, as a live node says.
    pub fn primary_of(&self, slot: u16) -> Option<u16> {
        // `CLUSTER SHARDS` would name roles; `CLUSTER NODES` lines are
        // `id ip:port@bus flags master - … slot-ranges`.
        let nodes = cli_at(self.live(), &["CLUSTER", "NODES"]);
        nodes.lines().find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let primary =
                f.get(2)?.split(',').any(|x| x == "master") && !f.get(2)?.contains("fail");
            let serves = f.iter().skip(8).any(|r| match r.split_once('-') {
                Some((a, b)) => match (a.parse::<u16>(), b.parse::<u16>()) {
                    (Ok(a), Ok(b)) => a <= slot && slot <= b,
                    _ => false,
                },
                None => r.parse::<u16>().ok() == Some(slot),
            });
            if !(primary && serves) {
                return None;
            }
            f.get(1)?
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()
        })
    }

    /// `kill -9` of the node on `port`.
    pub fn kill(&mut self, port: u16) {
        for (_, child) in self.nodes.iter_mut().filter(|(p, _)| *p == port) {
            stop(child);
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for (_, child) in &mut self.nodes {
            stop(child);
        }
    }
}

/// A primary, its replica and three sentinels watching it as `main`
/// (quorum 2, down after 1 s), all real `redis-server` processes on
/// loopback. Killed on drop.
#[derive(Debug)]
pub struct RedisSentinel {
    /// The data nodes' ports and processes: `[0]` starts as the primary.
    pub data: Vec<(u16, Option<Child>)>,
    sentinels: Vec<(u16, Child)>,
    dir: TempDir,
}

impl RedisSentinel {
    /// Starts them and waits until every sentinel knows the replica and
    /// the other sentinels (a failover needs both).
    pub fn start() -> RedisSentinel {
        let dir = TempDir::new("redis-sentinel");
        let primary = cluster_port();
        let replica = cluster_port();
        let data = vec![
            (primary, Some(spawn_server(primary, &dir.0, &[]))),
            (
                replica,
                Some(spawn_server(
                    replica,
                    &dir.0,
                    &["--replicaof", "127.0.0.1", &primary.to_string()],
                )),
            ),
        ];
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let port = cluster_port();
            let conf = dir.join(&format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor main 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds main 1000\n\
                     sentinel failover-timeout main 4000\n\
                     sentinel parallel-syncs main 1\n",
                    dir.0.display()
                ),
            )
            .unwrap();
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server --sentinel");
            sentinels.push((port, child));
        }
        let s = RedisSentinel {
            data,
            sentinels,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = s.sentinels.iter().all(|(p, _)| {
                let replicas = cli_at(*p, &["SENTINEL", "REPLICAS", "main"]);
                let others = cli_at(*p, &["SENTINEL", "SENTINELS", "main"]);
                replicas.contains(&replica.to_string()) && others.matches("runid").count() >= 2
            });
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not find each other"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        s
    }

    /// `redis+sentinel://127.0.0.1:s1,…/main`.
    pub fn url(&self) -> String {
        format!(
            "redis+sentinel://{}/main",
            hosts(self.sentinels.iter().map(|(p, _)| *p))
        )
    }

    /// The primary's port, as the first sentinel that answers names it.
    pub fn primary(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|(p, _)| {
            let out = cli_at(*p, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "main"]);
            out.lines().nth(1)?.trim().parse().ok()
        })
    }

    /// Stops the data node on `port` (`kill -9`).
    pub fn kill(&mut self, port: u16) {
        for (_, child) in self.data.iter_mut().filter(|(p, _)| *p == port) {
            stop(child);
        }
    }

    /// Starts the data node on `port` again, empty, as a replica of the
    /// current primary (the sentinels would make it one anyway).
    pub fn replace(&mut self, port: u16) {
        let primary = self.primary().expect("a primary").to_string();
        let i = self
            .data
            .iter()
            .position(|(p, _)| *p == port)
            .expect("one of its data nodes");
        let child = spawn_server(port, &self.dir.0, &["--replicaof", "127.0.0.1", &primary]);
        self.data[i].1 = Some(child);
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        for (_, child) in &mut self.data {
            stop(child);
        }
        for (_, c) in &mut self.sentinels {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
