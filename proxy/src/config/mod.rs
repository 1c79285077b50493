//! The TOML config, checked at start into validated settings (R-OP4).
//!
//! One file, every key documented in `sluice.example.toml`. Unknown keys
//! are errors (a misspelt `ceilng_rps` must not silently fall back to a
//! default), and every error names the key it is about. With no file at
//! all sluice runs on safe defaults: loopback listeners, no private
//! destinations, CONNECT to 443 and 80.
//!
//! # Adding a setting
//!
//! A provider setting is one entry in `sluice_policy::provider_settings!`
//! (`policy/src/settings.rs`): its doc, name, type and default, e.g.
//!
//! ```text
//! /// Largest request body kept for replay; bigger bodies are not retried.
//! replay_limit: usize = 64 * 1024,
//! ```
//!
//! That entry makes the `ProviderSettings` field and its default, and here
//! the `[defaults]` / `[providers.NAME]` key, its inheritance and its
//! errors (which name the key). Add a check to
//! `ProviderSettings::validated` if some values make no sense, and the key
//! to `sluice.example.toml` (a test fails until it is there). A type not
//! yet used by a setting needs a [`FromToml`] impl saying how TOML writes
//! it.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;
use sluice_policy::{ProviderSettings, ValidSettings};

/// A config that could not be accepted, naming the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("config error: {key}: {reason}")]
pub struct ConfigError {
    /// The key, dotted (`providers.example.ceiling_rps`).
    pub key: String,
    /// What is wrong.
    pub reason: String,
}

fn err(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.into(),
        reason: reason.into(),
    }
}

/// A duration in the config: `"250ms"`, `"15s"`, `"2m"`, `"1h"`, or a
/// number of seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(f64),
            Text(String),
        }
        let parsed = match Raw::deserialize(d)? {
            Raw::Secs(s) => secs(s),
            Raw::Text(t) => parse_duration(&t),
        };
        parsed.map(Dur).map_err(serde::de::Error::custom)
    }
}

/// Text or a number that is not a duration sluice accepts; says why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct BadDuration(String);

fn secs(s: f64) -> Result<Duration, BadDuration> {
    if s.is_finite() && (0.0..=1e9).contains(&s) {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(BadDuration(format!(
            "{s} is not a duration (0 to 1e9 seconds)"
        )))
    }
}

/// Parses `"250ms"`, `"15s"`, `"2m"`, `"1h"`, `"1.5s"`.
pub fn parse_duration(text: &str) -> Result<Duration, BadDuration> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| {
        BadDuration(format!(
            "{text:?} is not a duration like \"250ms\", \"15s\", \"2m\""
        ))
    })?;
    let scale = match unit.trim() {
        "ms" => 0.001,
        "s" | "" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(BadDuration(format!(
                "unknown duration unit {other:?} (ms, s, m, h)"
            )))
        }
    };
    secs(n * scale)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<SocketAddr>,
    admin: Option<SocketAddr>,
    state_dir: Option<PathBuf>,
    #[serde(default)]
    destinations: RawDestinations,
    #[serde(default)]
    upstream: RawUpstream,
    #[serde(default)]
    defaults: RawProvider,
    #[serde(default)]
    providers: BTreeMap<String, RawProvider>,
    #[serde(default)]
    auth: RawAuth,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    tls: RawTls,
    #[serde(default)]
    collectors: BTreeMap<String, RawCollector>,
    #[serde(default)]
    runs: RawRuns,
    #[serde(default)]
    shared: RawShared,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShared {
    redis: Option<String>,
    key_prefix: Option<String>,
    replicas: Option<u32>,
    call_timeout: Option<Dur>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCollector {
    token_file: Option<PathBuf>,
    weight: Option<f64>,
    catchup_floor: Option<f64>,
    allow: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRuns {
    lease_ttl: Option<Dur>,
    max_cooldown_waits: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    ca_cert: Option<PathBuf>,
    ca_key: Option<PathBuf>,
    leaf_cache: Option<usize>,
    trust_dir: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDestinations {
    #[serde(default)]
    allow: Vec<String>,
    connect_ports: Option<Vec<u16>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstream {
    extra_ca: Option<PathBuf>,
    connect_timeout: Option<Dur>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    /// `"user:token"` pairs.
    #[serde(default)]
    credentials: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_providers: Option<usize>,
    provider_idle: Option<Dur>,
    state_max_age: Option<Dur>,
    header_read_timeout: Option<Dur>,
    max_header_bytes: Option<usize>,
    body_idle_timeout: Option<Dur>,
    shutdown_grace: Option<Dur>,
    save_interval: Option<Dur>,
    max_metric_providers: Option<usize>,
    workers: Option<usize>,
}

/// How a provider setting's type is written in TOML.
trait FromToml: Sized {
    /// What TOML holds for it.
    type Raw: serde::de::DeserializeOwned + Clone + std::fmt::Debug;
    /// The setting from what TOML held, or why not.
    fn from_toml(raw: &Self::Raw) -> Result<Self, String>;
}

macro_rules! plain_toml {
    ($($t:ty),*) => {$(
        impl FromToml for $t {
            type Raw = $t;
            fn from_toml(raw: &$t) -> Result<$t, String> {
                Ok(raw.clone())
            }
        }
    )*};
}

plain_toml!(f64, u32, usize, bool);

impl FromToml for Option<f64> {
    type Raw = f64;
    fn from_toml(raw: &f64) -> Result<Self, String> {
        Ok(Some(*raw))
    }
}

impl FromToml for Duration {
    type Raw = Dur;
    fn from_toml(raw: &Dur) -> Result<Self, String> {
        Ok(raw.0)
    }
}

impl FromToml for Vec<http::Method> {
    type Raw = Vec<String>;
    fn from_toml(raw: &Vec<String>) -> Result<Self, String> {
        raw.iter()
            .map(|m| {
                http::Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .map_err(|_| format!("{m:?} is not a method"))
            })
            .collect()
    }
}

impl FromToml for sluice_policy::cost::Costs {
    type Raw = BTreeMap<String, u32>;
    fn from_toml(raw: &BTreeMap<String, u32>) -> Result<Self, String> {
        sluice_policy::cost::Costs::parse(raw.iter().map(|(k, v)| (k.as_str(), *v)))
    }
}

impl FromToml for Option<http::HeaderName> {
    type Raw = String;
    fn from_toml(raw: &String) -> Result<Self, String> {
        http::HeaderName::from_bytes(raw.trim().to_ascii_lowercase().as_bytes())
            .map(Some)
            .map_err(|_| format!("{raw:?} is not a header name"))
    }
}

/// How TOML writes an allowance: `{ units = 100000, per = "24h" }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAllowance {
    units: u64,
    per: Dur,
}

impl FromToml for Option<sluice_policy::pacer::Allowance> {
    type Raw = RawAllowance;
    fn from_toml(raw: &RawAllowance) -> Result<Self, String> {
        if raw.units == 0 {
            return Err("units: at least 1".into());
        }
        if raw.per.0 < Duration::from_secs(1) {
            return Err("per: at least 1s".into());
        }
        Ok(Some(sluice_policy::pacer::Allowance {
            units: raw.units,
            per: raw.per.0,
        }))
    }
}

/// Makes [`RawProvider`] from the list of provider settings.
macro_rules! raw_provider {
    ($( $(#[$doc:meta])* $name:ident : $ty:ty = $default:expr ),* $(,)?) => {
        /// Every per-provider key. All optional: a named provider takes
        /// `[defaults]` first, then its own. Besides `hosts` and
        /// `intercept`, one key per entry of
        /// [`sluice_policy::provider_settings!`].
        #[derive(Debug, Default, Clone, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct RawProvider {
            hosts: Option<Vec<String>>,
            intercept: Option<bool>,
            $( $name: Option<<$ty as FromToml>::Raw>, )*
        }

        impl RawProvider {
            /// Writes the keys given here over `s`.
            fn lay_over(&self, s: &mut ProviderSettings, key: &str) -> Result<(), ConfigError> {
                $(
                    if let Some(v) = &self.$name {
                        s.$name = <$ty as FromToml>::from_toml(v)
                            .map_err(|r| err(format!("{key}.{}", stringify!($name)), r))?;
                    }
                )*
                Ok(())
            }
        }
    };
}

sluice_policy::provider_settings!(raw_provider);

impl RawProvider {
    /// Lays these keys over `base`.
    fn apply(&self, base: &ProviderSettings, key: &str) -> Result<ValidSettings, ConfigError> {
        let mut s = base.clone();
        self.lay_over(&mut s, key)?;
        if self.start_rps.is_none()
            && self.ceiling_rps.is_some()
            && base.start_rps.is_some_and(|st| st >= s.ceiling_rps)
        {
            // A start inherited from [defaults] that is not below this
            // provider's own ceiling falls back to the derived one.
            s.start_rps = None;
        }
        s.validated()
            .map_err(|e| err(format!("{key}.{}", e.key), e.reason))
    }
}

/// A host pattern: `api.example.com` or `*.example.com` (any subdomain,
/// not the apex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// This host exactly.
    Exact(String),
    /// Any host ending in `.suffix`.
    Suffix(String),
}

impl HostPattern {
    fn parse(p: &str) -> Result<Self, String> {
        let p = normalise_host(p).into_owned();
        if p.is_empty() {
            return Err("an empty host pattern".into());
        }
        if let Some(rest) = p.strip_prefix("*.") {
            if rest.is_empty() || rest.contains('*') {
                return Err(format!(
                    "{p:?}: a wildcard is only allowed as a leading \"*.\""
                ));
            }
            return Ok(HostPattern::Suffix(rest.to_string()));
        }
        if p.contains('*') || p.contains('/') || p.contains(' ') {
            return Err(format!("{p:?} is not a host name"));
        }
        Ok(HostPattern::Exact(p))
    }

    /// Whether a normalised host matches.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(h) => h == host,
            HostPattern::Suffix(s) => {
                host.len() > s.len() + 1
                    && host.ends_with(s.as_str())
                    && host.as_bytes()[host.len() - s.len() - 1] == b'.'
            }
        }
    }
}

/// Lower case, no trailing dot, no IPv6 brackets. Borrowed when the host
/// already is (almost every request: issue 24 counted two copies a
/// request).
pub fn normalise_host(host: &str) -> Cow<'_, str> {
    let bare = host
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.');
    if bare.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(bare.to_ascii_lowercase())
    } else {
        Cow::Borrowed(bare)
    }
}

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
    /// `redis://` or `rediss://` URL (trusted like upstream servers: the
    /// bundled web roots, or `upstream.extra_ca` when set).
    pub redis: String,
    /// Every key starts with it (`{prefix}:{provider}`).
    pub key_prefix: String,
    /// The replicas expected to share a budget: a replica that cannot reach
    /// Redis paces at this share of the last shared rate.
    pub replicas: u32,
    /// The longest any Redis call may take before the replica paces alone.
    pub call_timeout: Duration,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password.
        f.debug_struct("Shared")
            .field("redis", &redact_url(&self.redis))
            .field("key_prefix", &self.key_prefix)
            .field("replicas", &self.replicas)
            .field("call_timeout", &self.call_timeout)
            .finish()
    }
}

/// A URL with any `user:password@` removed.
pub fn redact_url(url: &str) -> String {
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, _)), Some(at)) => format!("{scheme}://…@{}", &url[at + 1..]),
        _ => url.to_string(),
    }
}

/// The validated config.
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

impl Config {
    /// Reads and checks a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err("config", format!("cannot read {}: {e}", path.display())))?;
        Config::from_toml(&text)
    }

    /// Parses and checks config text.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let key = e
                .span()
                .and_then(|span| key_at(text, span.start))
                .unwrap_or_else(|| "config".into());
            err(key, e.message().to_string())
        })?;
        Config::from_raw(raw)
    }

    fn from_raw(raw: RawConfig) -> Result<Config, ConfigError> {
        if raw.defaults.hosts.is_some() {
            return Err(err("defaults.hosts", "hosts belong to named providers"));
        }
        let defaults = raw
            .defaults
            .apply(&ProviderSettings::default(), "defaults")?;
        let mut providers = Vec::new();
        for (name, p) in &raw.providers {
            let key = format!("providers.{name}");
            if name.is_empty() || name.starts_with('_') {
                return Err(err(
                    key,
                    "provider names must not be empty or start with '_'",
                ));
            }
            let hosts = p
                .hosts
                .as_ref()
                .filter(|h| !h.is_empty())
                .ok_or_else(|| {
                    err(
                        format!("{key}.hosts"),
                        "a named provider needs at least one host",
                    )
                })?
                .iter()
                .map(|h| HostPattern::parse(h).map_err(|r| err(format!("{key}.hosts"), r)))
                .collect::<Result<Vec<_>, _>>()?;
            providers.push(NamedProvider {
                name: name.clone(),
                hosts,
                settings: p.apply(&defaults, &key)?,
                intercept: p.intercept.or(raw.defaults.intercept).unwrap_or(true),
            });
        }
        let allow = raw
            .destinations
            .allow
            .iter()
            .map(|c| {
                c.parse::<IpNet>()
                    .or_else(|_| c.parse::<std::net::IpAddr>().map(IpNet::from))
                    .map_err(|_| {
                        err(
                            "destinations.allow",
                            format!("{c:?} is not a CIDR like \"127.0.0.0/8\""),
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // 80 too: Node's undici tunnels even `http://` targets with
        // `CONNECT host:80`, and plain HTTP inside a tunnel goes through the
        // provider's stack like any request (R-SF2).
        let connect_ports = raw
            .destinations
            .connect_ports
            .unwrap_or_else(|| vec![443, 80]);
        if connect_ports.contains(&0) {
            return Err(err("destinations.connect_ports", "0 is not a port"));
        }
        let mut credentials = HashMap::new();
        for c in &raw.auth.credentials {
            let (user, token) = c
                .split_once(':')
                .filter(|(u, t)| !u.is_empty() && !t.is_empty())
                .ok_or_else(|| err("auth.credentials", "each entry is \"user:token\""))?;
            credentials.insert(user.to_string(), token.to_string());
        }
        let mut collectors = BTreeMap::new();
        for (name, c) in &raw.collectors {
            let key = format!("collectors.{name}");
            let valid = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            if !valid {
                return Err(err(
                    key,
                    "a collector name is letters, digits, '-', '_' or '.' (it is a proxy user name)",
                ));
            }
            let path = c.token_file.clone().ok_or_else(|| {
                err(
                    format!("{key}.token_file"),
                    "a collector needs a token_file",
                )
            })?;
            let token = read_token(&path).map_err(|r| err(format!("{key}.token_file"), r))?;
            if credentials.contains_key(name) {
                return Err(err(
                    key,
                    "the name is also an [auth] credentials user; use one or the other",
                ));
            }
            let weight = c.weight.unwrap_or(1.0);
            if !(weight.is_finite() && (0.01..=1000.0).contains(&weight)) {
                return Err(err(
                    format!("{key}.weight"),
                    "a weight is a number from 0.01 to 1000",
                ));
            }
            let catchup_floor = c
                .catchup_floor
                .unwrap_or(sluice_policy::pacer::fair::CATCHUP_FLOOR);
            if !(catchup_floor.is_finite() && (0.0..=1.0).contains(&catchup_floor)) {
                return Err(err(
                    format!("{key}.catchup_floor"),
                    "a share from 0 to 1 (0.1: a tenth of the collector's admissions)",
                ));
            }
            let allow = match &c.allow {
                None => None,
                Some(hosts) if hosts.is_empty() => {
                    return Err(err(
                        format!("{key}.allow"),
                        "an empty allowlist would refuse everything; leave it out to allow what [destinations] allows",
                    ))
                }
                Some(hosts) => Some(
                    hosts
                        .iter()
                        .map(|h| HostPattern::parse(h).map_err(|r| err(format!("{key}.allow"), r)))
                        .collect::<Result<Vec<_>, _>>()?,
                ),
            };
            credentials.insert(name.clone(), token.clone());
            collectors.insert(
                name.clone(),
                Collector {
                    name: Arc::from(name.as_str()),
                    token_file: path,
                    token,
                    weight,
                    catchup_floor,
                    allow,
                },
            );
        }
        let runs = Runs {
            lease_ttl: raw.runs.lease_ttl.map_or(Duration::from_secs(60), |d| d.0),
            max_cooldown_waits: raw.runs.max_cooldown_waits.unwrap_or(3),
        };
        if runs.lease_ttl < Duration::from_secs(1) {
            return Err(err("runs.lease_ttl", "must be at least 1s"));
        }
        let shared = match raw.shared.redis {
            Some(url) => {
                let scheme_ok = url.starts_with("redis://") || url.starts_with("rediss://");
                if !scheme_ok || url.contains(char::is_whitespace) {
                    return Err(err(
                        "shared.redis",
                        "a URL like \"redis://host:6379/0\" or \"rediss://host:6380/0\"",
                    ));
                }
                let key_prefix = raw.shared.key_prefix.unwrap_or_else(|| "sluice".into());
                if key_prefix.is_empty() || key_prefix.contains(['{', '}']) {
                    return Err(err(
                        "shared.key_prefix",
                        "must be non-empty, without '{' or '}' (the provider is the key's hash tag)",
                    ));
                }
                let replicas = raw.shared.replicas.unwrap_or(1);
                if replicas == 0 {
                    return Err(err("shared.replicas", "must be at least 1"));
                }
                let call_timeout = raw
                    .shared
                    .call_timeout
                    .map_or(Duration::from_millis(50), |d| d.0);
                if call_timeout.is_zero() {
                    return Err(err("shared.call_timeout", "must be greater than zero"));
                }
                Some(Shared {
                    redis: url,
                    key_prefix,
                    replicas,
                    call_timeout,
                })
            }
            None if raw.shared.key_prefix.is_some()
                || raw.shared.replicas.is_some()
                || raw.shared.call_timeout.is_some() =>
            {
                return Err(err("shared.redis", "required by the other [shared] keys"));
            }
            None => None,
        };
        let l = raw.limits;
        let limits = Limits {
            max_providers: l.max_providers.unwrap_or(1024),
            provider_idle: l.provider_idle.map_or(Duration::from_secs(600), |d| d.0),
            state_max_age: l.state_max_age.map_or(Duration::from_secs(3600), |d| d.0),
            header_read_timeout: l
                .header_read_timeout
                .map_or(Duration::from_secs(10), |d| d.0),
            max_header_bytes: l.max_header_bytes.unwrap_or(64 * 1024),
            body_idle_timeout: l.body_idle_timeout.map_or(Duration::from_secs(60), |d| d.0),
            shutdown_grace: l.shutdown_grace.map_or(Duration::from_secs(10), |d| d.0),
            save_interval: l.save_interval.map_or(Duration::from_secs(2), |d| d.0),
            max_metric_providers: l.max_metric_providers.unwrap_or(256),
            workers: l.workers.unwrap_or(1),
        };
        if limits.workers == 0 || limits.workers > 256 {
            return Err(err("limits.workers", "must be 1 to 256"));
        }
        if limits.save_interval < Duration::from_millis(100) {
            return Err(err("limits.save_interval", "must be at least 100ms"));
        }
        if limits.max_metric_providers == 0 {
            return Err(err("limits.max_metric_providers", "must be at least 1"));
        }
        if limits.max_providers == 0 {
            return Err(err("limits.max_providers", "must be at least 1"));
        }
        if limits.max_header_bytes < 8192 {
            return Err(err("limits.max_header_bytes", "must be at least 8192"));
        }
        if limits.header_read_timeout.is_zero() {
            return Err(err(
                "limits.header_read_timeout",
                "must be greater than zero",
            ));
        }
        if limits.body_idle_timeout.is_zero() {
            return Err(err("limits.body_idle_timeout", "must be greater than zero"));
        }
        let tls = Tls {
            ca_cert: raw.tls.ca_cert,
            ca_key: raw.tls.ca_key,
            leaf_cache: raw.tls.leaf_cache.unwrap_or(1024),
            trust_dir: raw.tls.trust_dir,
        };
        if tls.ca_cert.is_some() != tls.ca_key.is_some() {
            return Err(err("tls.ca_key", "tls.ca_cert and tls.ca_key go together"));
        }
        if tls.leaf_cache == 0 {
            return Err(err("tls.leaf_cache", "must be at least 1"));
        }
        let config = Config {
            defaults_intercept: raw.defaults.intercept.unwrap_or(true),
            tls,
            listen: raw
                .listen
                .unwrap_or_else(|| "127.0.0.1:3128".parse().unwrap()),
            admin: raw
                .admin
                .unwrap_or_else(|| "127.0.0.1:9901".parse().unwrap()),
            state_dir: raw
                .state_dir
                .unwrap_or_else(|| PathBuf::from("./sluice-state")),
            destinations: Destinations {
                allow,
                connect_ports,
            },
            extra_ca: raw.upstream.extra_ca,
            connect_timeout: raw
                .upstream
                .connect_timeout
                .map_or(Duration::from_secs(10), |d| d.0),
            defaults,
            providers,
            credentials: Credentials(credentials),
            collectors,
            runs,
            shared,
            limits,
        };
        config.check()?;
        Ok(config)
    }

    /// Checks that hold across keys; run again after CLI overrides.
    pub fn check(&self) -> Result<(), ConfigError> {
        // R-SF1: not an open proxy.
        if !self.listen.ip().is_loopback() && self.credentials.is_empty() {
            return Err(err(
                "auth.credentials",
                format!(
                    "required when listening beyond loopback (listen = {}): sluice is not an open proxy",
                    self.listen
                ),
            ));
        }
        if self.shared.is_none() {
            if self.defaults.shared {
                return Err(err("defaults.shared", "needs [shared] redis"));
            }
            if let Some(p) = self.providers.iter().find(|p| p.settings.shared) {
                return Err(err(
                    format!("providers.{}.shared", p.name),
                    "needs [shared] redis",
                ));
            }
        }
        if self.listen == self.admin && self.listen.port() != 0 {
            return Err(err("admin", "must differ from listen"));
        }
        if let Some(ca) = &self.extra_ca {
            let pem = std::fs::read(ca).map_err(|e| {
                err(
                    "upstream.extra_ca",
                    format!("cannot read {}: {e}", ca.display()),
                )
            })?;
            let certs = rustls_pemfile::certs(&mut pem.as_slice())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| err("upstream.extra_ca", format!("{}: {e}", ca.display())))?;
            if certs.is_empty() {
                return Err(err(
                    "upstream.extra_ca",
                    format!("{} holds no PEM certificate", ca.display()),
                ));
            }
        }
        let mut seen: HashMap<String, &str> = HashMap::new();
        for p in &self.providers {
            for h in &p.hosts {
                let k = format!("{h:?}");
                if let Some(other) = seen.insert(k, &p.name) {
                    return Err(err(
                        format!("providers.{}.hosts", p.name),
                        format!("{h:?} is already a host of provider {other:?}"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A collector's token from its file: the file's text without surrounding
/// whitespace (a trailing newline is usual); never empty, never with a
/// `:` (it travels in a proxy URL's user info).
fn read_token(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    if token.contains(':') || token.chars().any(char::is_whitespace) {
        return Err(format!(
            "{}: a token has no ':' and no whitespace",
            path.display()
        ));
    }
    Ok(token.to_string())
}

/// The dotted key at a byte offset of the TOML text: the last `[table]`
/// header before it, plus the `key =` on its line.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let before = text.get(..offset.min(text.len()))?;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[line_start..]
        .find('\n')
        .map_or(text.len(), |i| line_start + i);
    let line = text[line_start..line_end].trim();
    let table = before[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && l.ends_with(']'))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string())
        // `[]` names no table (found by fuzzing: an error keyed "").
        .filter(|t| !t.is_empty());
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"').to_string())
        .filter(|k| !k.is_empty() && !k.starts_with('['));
    match (table, key) {
        (Some(t), Some(k)) => Some(format!("{t}.{k}")),
        (None, Some(k)) => Some(k),
        (Some(t), None) => Some(t),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Found by fuzzing (`fuzz/fuzz_targets/config_toml.rs`): after an
    /// empty table header `[]`, a syntax error was keyed "" — every error
    /// names a key (or `config`).
    #[test]
    fn an_error_after_an_empty_table_header_still_names_a_key() {
        for text in [
            "\"\"\"co\"\"!\u{0}\"e-dir)\n\n[]\n# a\r\r\r\r\".",
            "[]\nx\n",
        ] {
            let e = Config::from_toml(text).unwrap_err();
            assert!(!e.key.is_empty(), "{e}");
        }
    }

    #[test]
    fn empty_config_is_safe_defaults() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:3128");
        assert_eq!(c.admin.to_string(), "127.0.0.1:9901");
        assert_eq!(c.state_dir, PathBuf::from("./sluice-state"));
        assert!(c.destinations.allow.is_empty());
        assert_eq!(c.destinations.connect_ports, [443, 80]);
        assert_eq!(c.defaults.ceiling_rps, 50.0);
    }

    macro_rules! setting_names {
        ($( $(#[$doc:meta])* $name:ident : $ty:ty = $default:expr ),* $(,)?) => {
            [$( stringify!($name) ),*]
        };
    }

    #[test]
    fn every_provider_setting_is_a_documented_key() {
        let text = include_str!("../../../sluice.example.toml");
        let names = sluice_policy::provider_settings!(setting_names);
        assert!(names.len() >= 20);
        for name in names {
            let written = text
                .lines()
                .map(|l| l.trim_start_matches(['#', ' ']))
                .any(|l| l.starts_with(&format!("{name} =")));
            assert!(written, "{name} is not in sluice.example.toml");
            // And it is a key of its own in [defaults].
            let toml = format!("[defaults]\n{name} = \"not a value\"\n");
            let e = Config::from_toml(&toml).unwrap_err();
            assert_eq!(e.key, format!("defaults.{name}"), "{e}");
        }
    }

    #[test]
    fn the_documented_example_parses() {
        let text = include_str!("../../../sluice.example.toml");
        let c = Config::from_toml(text).unwrap();
        let ex = c.providers.iter().find(|p| p.name == "example").unwrap();
        assert_eq!(ex.settings.ceiling_rps, 10.0);
        assert!(ex.hosts.iter().any(|h| h.matches("eu.example.com")));
    }

    #[test]
    fn providers_inherit_defaults() {
        let c = Config::from_toml(
            "[defaults]\nceiling_rps = 20.0\nmax_queue_wait = \"3s\"\n[providers.a]\nhosts = [\"a.test\"]\nburst = 2\n",
        )
        .unwrap();
        let a = &c.providers[0].settings;
        assert_eq!(a.ceiling_rps, 20.0);
        assert_eq!(a.max_queue_wait, Duration::from_secs(3));
        assert_eq!(a.burst, 2);
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            (
                "[providers.x]\nhosts = [\"x.test\"]\nceiling_rps = -1.0\n",
                "providers.x.ceiling_rps",
            ),
            (
                "[providers.x]\nhosts = [\"x.test\"]\nceilng_rps = 1.0\n",
                "providers.x.ceilng_rps",
            ),
            (
                "[defaults]\nceiling_rps = \"fast\"\n",
                "defaults.ceiling_rps",
            ),
            (
                "[defaults]\nmax_queue_wait = \"3 fortnights\"\n",
                "defaults.max_queue_wait",
            ),
            ("[providers.x]\nceiling_rps = 1.0\n", "providers.x.hosts"),
            (
                "[destinations]\nallow = [\"10.0.0.0/33\"]\n",
                "destinations.allow",
            ),
            ("listen = \"0.0.0.0:3128\"\n", "auth.credentials"),
            ("listen = \"nonsense\"\n", "listen"),
            ("[limits]\nworkers = 0\n", "limits.workers"),
            ("[auth]\ncredentials = [\"nocolon\"]\n", "auth.credentials"),
            (
                "[providers.a]\nhosts = [\"a.test\"]\n[providers.b]\nhosts = [\"A.test\"]\n",
                "providers.b.hosts",
            ),
            (
                "[upstream]\nextra_ca = \"/nonexistent/ca.pem\"\n",
                "upstream.extra_ca",
            ),
            (
                "[upstream]\nextra_ca = \"/etc/hostname\"\n",
                "upstream.extra_ca",
            ),
            ("[tls]\nca_cert = \"/x.crt\"\n", "tls.ca_key"),
        ];
        for (text, key) in cases {
            let e = Config::from_toml(text).unwrap_err();
            assert_eq!(e.key, key, "{text:?} gave {e}");
        }
    }

    /// R-RN4: collectors are proxy users whose token comes from a file;
    /// every problem names the key.
    #[test]
    fn collectors_read_their_token_files() {
        let dir = std::env::temp_dir().join(format!("sluice-collectors-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("a.token");
        std::fs::write(&good, "s3cret-token\n").unwrap();
        let empty = dir.join("empty.token");
        std::fs::write(&empty, "\n").unwrap();
        let config = Config::from_toml(&format!(
            "[collectors.collector-a]\ntoken_file = \"{}\"\n[runs]\nlease_ttl = \"5s\"\n",
            good.display()
        ))
        .unwrap();
        assert_eq!(config.collectors["collector-a"].token, "s3cret-token");
        assert_eq!(config.collectors["collector-a"].weight, 1.0);
        assert_eq!(config.collectors["collector-a"].catchup_floor, 0.1);
        assert_eq!(config.credentials["collector-a"], "s3cret-token");
        assert_eq!(config.runs.lease_ttl, Duration::from_secs(5));
        assert_eq!(config.runs.max_cooldown_waits, 3);
        let cases = [
            ("[collectors.a]\n".to_string(), "collectors.a.token_file"),
            (
                "[collectors.a]\ntoken_file = \"/nonexistent/token\"\n".to_string(),
                "collectors.a.token_file",
            ),
            (
                format!("[collectors.a]\ntoken_file = \"{}\"\n", empty.display()),
                "collectors.a.token_file",
            ),
            (
                format!(
                    "[collectors.\"a b\"]\ntoken_file = \"{}\"\n",
                    good.display()
                ),
                "collectors.a b",
            ),
            (
                format!(
                    "[auth]\ncredentials = [\"a:x\"]\n[collectors.a]\ntoken_file = \"{}\"\n",
                    good.display()
                ),
                "collectors.a",
            ),
            (
                "[runs]\nlease_ttl = \"10ms\"\n".to_string(),
                "runs.lease_ttl",
            ),
            (
                format!(
                    "[collectors.a]\ntoken_file = \"{}\"\nweight = 0\n",
                    good.display()
                ),
                "collectors.a.weight",
            ),
            (
                format!(
                    "[collectors.a]\ntoken_file = \"{}\"\ncatchup_floor = 1.5\n",
                    good.display()
                ),
                "collectors.a.catchup_floor",
            ),
            (
                format!(
                    "[collectors.a]\ntoken_file = \"{}\"\nallow = [\"a.*.com\"]\n",
                    good.display()
                ),
                "collectors.a.allow",
            ),
            (
                format!(
                    "[collectors.a]\ntoken_file = \"{}\"\nallow = []\n",
                    good.display()
                ),
                "collectors.a.allow",
            ),
            (
                "[collectors.a]\ntoken = \"x\"\n".to_string(),
                "collectors.a.token",
            ),
        ];
        for (text, key) in cases {
            let e = Config::from_toml(&text).unwrap_err();
            assert_eq!(e.key, key, "{text:?} gave {e}");
        }
        assert!(
            !format!("{config:?}").contains("s3cret"),
            "tokens never in Debug"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn hosts_are_normalised_without_a_copy_when_already_normal() {
        assert!(matches!(
            normalise_host("api.test"),
            Cow::Borrowed("api.test")
        ));
        assert!(matches!(normalise_host("[::1]"), Cow::Borrowed("::1")));
        assert!(matches!(
            normalise_host("api.test."),
            Cow::Borrowed("api.test")
        ));
        assert_eq!(normalise_host("API.Test."), "api.test");
        assert!(matches!(normalise_host("API.test"), Cow::Owned(_)));
    }

    #[test]
    fn host_patterns() {
        let p = HostPattern::parse("*.Example.com.").unwrap();
        assert!(p.matches("api.example.com"));
        assert!(p.matches("a.b.example.com"));
        assert!(!p.matches("example.com"));
        assert!(!p.matches("badexample.com"));
        assert!(HostPattern::parse("a.*.com").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("s").is_err());
    }

    proptest::proptest! {
        /// Bad input gets an error naming a key, never a panic (R-SF3).
        #[test]
        fn any_text_is_a_config_or_an_error(text in ".{0,200}") {
            if let Err(e) = Config::from_toml(&text) {
                proptest::prop_assert!(!e.key.is_empty());
            }
        }

        #[test]
        fn any_value_for_a_known_key_is_handled(
            key in proptest::sample::select(vec![
                "ceiling_rps", "start_rps", "floor_rps", "burst", "max_queue_wait",
                "max_queue_len", "attempt_timeout", "request_timeout", "breaker_failure_ratio", "retry_ratio",
                "retry_base", "retry_cap", "decrease_factor", "soft_throttle_factor",
            ]),
            value in prop_oneof![
                proptest::num::f64::ANY.prop_map(|f| format!("{f:?}")),
                proptest::num::i64::ANY.prop_map(|i| i.to_string()),
                "[a-z0-9. ]{0,12}".prop_map(|s| format!("{s:?}")),
            ],
        ) {
            let text = format!("[defaults]\n{key} = {value}\n");
            if let Err(e) = Config::from_toml(&text) {
                proptest::prop_assert!(e.key.starts_with("defaults") || e.key == "config", "{e}");
            }
        }
    }
}
