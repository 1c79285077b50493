//! The config sluice runs on, checked: what every other module reads.

use super::*;

/// A named provider from the config.
#[derive(Debug, Clone)]
pub struct NamedProvider {
    /// The name (the TOML table's key).
    pub name: String,
    /// Hosts that belong to it.
    pub hosts: Vec<HostPattern>,
    /// Its settings.
    pub settings: ValidSettings,
    /// Terminate TLS in its CONNECT tunnels to see each request.
    pub intercept: bool,
}

/// Interception CA settings.
#[derive(Debug, Clone)]
pub struct Tls {
    /// A CA certificate to use instead of `<state_dir>/ca.crt`.
    pub ca_cert: Option<PathBuf>,
    /// Its key, instead of `<state_dir>/ca.key`.
    pub ca_key: Option<PathBuf>,
    /// Leaf certificates kept.
    pub leaf_cache: usize,
    /// Where sluice writes, at start, the files that make collectors trust
    /// its CA (`ca.crt`, and `ca-bundle.pem`: the system's roots plus it) —
    /// a volume shared with the collector in a Kubernetes pod.
    pub trust_dir: Option<PathBuf>,
}

/// Where sluice may connect.
#[derive(Debug, Clone)]
pub struct Destinations {
    /// Exceptions to the SSRF guard.
    pub allow: Vec<IpNet>,
    /// Ports CONNECT may reach.
    pub connect_ports: Vec<u16>,
}

/// Limits of the process as a whole.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Providers tracked at once; beyond, unknown hosts share one.
    pub max_providers: usize,
    /// A provider unused this long is evicted (its learned state is kept).
    pub provider_idle: Duration,
    /// Learned state older than this is discarded: a cold start (R-PS1).
    pub state_max_age: Duration,
    /// A client must send its request head within this.
    pub header_read_timeout: Duration,
    /// Largest request head accepted.
    pub max_header_bytes: usize,
    /// A response body that sends nothing for this long is cut.
    pub body_idle_timeout: Duration,
    /// In-flight work gets this long to finish on SIGTERM.
    pub shutdown_grace: Duration,
    /// Learned state is saved this often (and on shutdown).
    pub save_interval: Duration,
    /// Distinct provider labels exported in metrics; the rest are `_other`.
    pub max_metric_providers: usize,
    /// Threads that serve connections. One by default, on tokio's
    /// current-thread scheduler: a paced proxy's traffic is bounded by its
    /// providers' budgets, a sidecar shares its node, and one thread spends
    /// far less CPU per request than two on the same load (issue 24: no
    /// work-stealing queues, no cross-thread wake-ups). More run on the
    /// multi-thread scheduler. Read at start; a reload does not change it.
    pub workers: usize,
}

/// Proxy credentials, user → token. Its `Debug` names the users only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials(pub HashMap<String, String>);

impl std::ops::Deref for Credentials {
    type Target = HashMap<String, String>;

    fn deref(&self) -> &HashMap<String, String> {
        &self.0
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// A collector: a proxy user that may open runs (R-RN4).
#[derive(Clone)]
pub struct Collector {
    /// Its name, shared by every request's fair-share class (R-FS1).
    pub name: Arc<str>,
    /// The file its token was read from (again on SIGHUP).
    pub token_file: PathBuf,
    /// The token.
    pub token: String,
    /// Its weight in each provider's fair share (R-FS1): while several
    /// collectors wait for one provider, admissions follow the weights.
    pub weight: f64,
    /// The least share of its admissions a catch-up run keeps while a
    /// steady run's requests wait too (R-FS1).
    pub catchup_floor: f64,
    /// The only destinations it may reach, if set (R-FS3): any other is
    /// refused before a connection is made.
    pub allow: Option<Vec<HostPattern>>,
}

impl Collector {
    /// Whether the collector may reach normalised `host`.
    pub fn allows(&self, host: &str) -> bool {
        self.allow
            .as_ref()
            .is_none_or(|patterns| patterns.iter().any(|p| p.matches(host)))
    }
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("token_file", &self.token_file)
            .field("weight", &self.weight)
            .field("catchup_floor", &self.catchup_floor)
            .finish_non_exhaustive()
    }
}

/// How runs behave.
#[derive(Debug, Clone)]
pub struct Runs {
    /// A run's lease lapses after this long without a heartbeat or traffic
    /// from its collector.
    pub lease_ttl: Duration,
    /// Consecutive waits for an open circuit or a long `Retry-After` a
    /// run's request may make before the run stops (R-RN8).
    pub max_cooldown_waits: u32,
}

/// Budgets shared by replicas through Redis (R-DS1).
#[derive(Clone, PartialEq, Eq)]
pub struct Shared {
    /// `[shared] redis` as written (logs show it through [`redact_url`]).
    pub redis: String,
    /// Where the budgets are kept: one server, a Cluster, or the primary
    /// Sentinel names (R-DS2).
    pub target: RedisTarget,
    /// Every key starts with it (`{prefix}:{provider}`).
    pub key_prefix: String,
    /// The replicas expected to share a budget: a replica that cannot reach
    /// Redis paces at this share of the last shared rate.
    pub replicas: u32,
    /// The longest any Redis call may take before the replica paces alone.
    pub call_timeout: Duration,
}

/// The Redis deployment a fleet's budgets live in (R-DS2). Every URL is
/// trusted like an upstream server: `rediss://` checks the bundled web
/// roots, or `upstream.extra_ca` when set.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (`redis://host:6379/0`); a managed service's endpoint
    /// that fails over behind one name is this too.
    Single(String),
    /// A Redis Cluster, from these seed nodes (`redis://host:port` each,
    /// with the credentials written): the client learns every primary and
    /// follows `MOVED`/`ASK`; each provider's key is in one slot.
    Cluster(Vec<String>),
    /// The primary that Sentinel names `master`, found through these
    /// sentinels (`redis://host:port` each, no credentials) and found again
    /// after a failover; `primary` is the URL template for it (scheme,
    /// credentials and database as written, the host left to Sentinel).
    Sentinel {
        /// The sentinels' URLs.
        sentinels: Vec<String>,
        /// The name the sentinels know the primary by.
        master: String,
        /// TLS to the sentinels and the primary.
        tls: bool,
        /// Credentials for the primary, if written.
        username: Option<String>,
        /// The password for the primary, if written.
        password: Option<String>,
        /// The database.
        db: i64,
    },
}

impl RedisTarget {
    /// `cluster`, `sentinel` or `single`: the readout's word for it.
    pub fn kind(&self) -> &'static str {
        match self {
            RedisTarget::Single(_) => "single",
            RedisTarget::Cluster(_) => "cluster",
            RedisTarget::Sentinel { .. } => "sentinel",
        }
    }

    /// Whether any of its URLs asks for TLS.
    pub fn tls(&self) -> bool {
        match self {
            RedisTarget::Single(url) => url.starts_with("rediss://"),
            RedisTarget::Cluster(nodes) => nodes.iter().any(|n| n.starts_with("rediss://")),
            RedisTarget::Sentinel { tls, .. } => *tls,
        }
    }
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // URLs may carry a password.
        match self {
            RedisTarget::Single(url) => f.debug_tuple("Single").field(&redact_url(url)).finish(),
            RedisTarget::Cluster(nodes) => f
                .debug_tuple("Cluster")
                .field(&nodes.iter().map(|n| redact_url(n)).collect::<Vec<_>>())
                .finish(),
            RedisTarget::Sentinel {
                sentinels,
                master,
                tls,
                username,
                password,
                db,
            } => f
                .debug_struct("Sentinel")
                .field("sentinels", sentinels)
                .field("master", master)
                .field("tls", tls)
                .field("username", &username.as_ref().map(|_| "…"))
                .field("password", &password.as_ref().map(|_| "…"))
                .field("db", db)
                .finish(),
        }
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password.
        f.debug_struct("Shared")
            .field("redis", &redact_url(&self.redis))
            .field("target", &self.target)
            .field("key_prefix", &self.key_prefix)
            .field("replicas", &self.replicas)
            .field("call_timeout", &self.call_timeout)
            .finish()
    }
}

/// A URL — or a comma-separated list of them — with any
/// `user:password@` removed.
pub fn redact_url(url: &str) -> String {
    if url.contains(", ") {
        return url
            .split(", ")
            .map(redact_url)
            .collect::<Vec<_>>()
            .join(", ");
    }
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, _)), Some(at)) => format!("{scheme}://…@{}", &url[at + 1..]),
        _ => url.to_string(),
    }
}

/// The validated config.
/// What the command line sets over the config file: applied at start and
/// again to every file a reload reads, so a reload does not take them for
/// changes.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen`.
    pub listen: Option<SocketAddr>,
    /// `--admin`.
    pub admin: Option<SocketAddr>,
    /// `--state-dir`.
    pub state_dir: Option<PathBuf>,
}

impl Overrides {
    /// Sets what the command line names.
    pub fn apply(&self, config: &mut Config) {
        if let Some(l) = self.listen {
            config.listen = l;
        }
        if let Some(a) = self.admin {
            config.admin = a;
        }
        if let Some(d) = &self.state_dir {
            config.state_dir = d.clone();
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    /// Proxy listener.
    pub listen: SocketAddr,
    /// Admin listener.
    pub admin: SocketAddr,
    /// Where state lives.
    pub state_dir: PathBuf,
    /// Destination policy.
    pub destinations: Destinations,
    /// Extra CA trusted upstream besides the bundled web roots.
    pub extra_ca: Option<PathBuf>,
    /// Upstream TCP connect timeout.
    pub connect_timeout: Duration,
    /// Open pooled upstream connections kept once their destinations are
    /// idle; beyond it the least recently used are closed.
    pub max_idle_connections: usize,
    /// Settings of every provider not named.
    pub defaults: ValidSettings,
    /// Whether providers not named are intercepted.
    pub defaults_intercept: bool,
    /// Interception CA.
    pub tls: Tls,
    /// Named providers.
    pub providers: Vec<NamedProvider>,
    /// Proxy credentials, user → token (the `[auth]` users and every
    /// collector); empty = none required.
    pub credentials: Credentials,
    /// Collectors by name.
    pub collectors: BTreeMap<String, Collector>,
    /// Runs.
    pub runs: Runs,
    /// Budgets shared through Redis, if configured.
    pub shared: Option<Shared>,
    /// Process limits.
    pub limits: Limits,
}

impl Default for Config {
    fn default() -> Self {
        Config::from_toml("").expect("the empty config is valid")
    }
}
