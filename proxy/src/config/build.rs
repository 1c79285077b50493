//! From the TOML text to the checked config, one section at a time; each
//! error names the key.

use super::*;

/// The keys a reload leaves as they are (a reload names each one it
/// finds changed): they hold what the running process was built on — its
/// listeners, its store, its upstream client and TLS material, its Redis
/// connection, its runtime. A table's name stands for all its keys.
pub const RESTART_ONLY: [&str; 12] = [
    "listen",
    "admin",
    "state_dir",
    "upstream.extra_ca",
    "upstream.connect_timeout",
    "upstream.max_idle_connections",
    "tls.ca_cert",
    "tls.ca_key",
    "tls.leaf_cache",
    "tls.trust_dir",
    "shared",
    "limits.workers",
];

/// A collector's weight in fair shares when its table sets none.
pub const DEFAULT_WEIGHT: f64 = 1.0;

impl Config {
    /// Reads and checks a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err("config", format!("cannot read {}: {e}", path.display())))?;
        Config::parse(&text, path.parent())
    }

    /// Parses and checks config text (relative paths in it are the
    /// working directory's).
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, None)
    }

    /// Parses and checks config text; relative paths written in it resolve
    /// against `base`, the file's directory (issue 36: `sluice ca` run from
    /// another directory made a second CA beside the first). A default
    /// left unwritten (`./sluice-state`) stays the working directory's.
    fn parse(text: &str, base: Option<&Path>) -> Result<Config, ConfigError> {
        let mut raw: RawConfig = toml::from_str(text).map_err(|e| {
            let key = e
                .span()
                .and_then(|span| key_at(text, span.start))
                .unwrap_or_else(|| "config".into());
            let reason = suggest_key(e.message());
            match e.span().map(|span| line_column(text, span.start)) {
                Some((line, column)) => {
                    err(key, format!("{reason} (line {line}, column {column})"))
                }
                None => err(key, reason),
            }
        })?;
        if let Some(base) = base.filter(|b| !b.as_os_str().is_empty()) {
            let resolve = |p: &mut Option<PathBuf>| {
                if let Some(path) = p.as_mut().filter(|p| p.is_relative()) {
                    *path = base.join(&*path);
                }
            };
            resolve(&mut raw.state_dir);
            resolve(&mut raw.upstream.extra_ca);
            resolve(&mut raw.tls.ca_cert);
            resolve(&mut raw.tls.ca_key);
            resolve(&mut raw.tls.trust_dir);
            for c in raw.collectors.values_mut() {
                resolve(&mut c.token_file);
            }
        }
        Config::from_raw(raw)
    }

    fn from_raw(raw: RawConfig) -> Result<Config, ConfigError> {
        if raw.defaults.hosts.is_some() {
            return Err(err("defaults.hosts", "hosts belong to named providers"));
        }
        let defaults = raw
            .defaults
            .apply(&ProviderSettings::default(), "defaults")?;
        let providers = providers(&raw, &defaults)?;
        let destinations = destinations(&raw.destinations)?;
        let mut credentials = credentials(&raw.auth)?;
        let collectors = collectors(&raw.collectors, &mut credentials)?;
        let runs = runs(&raw.runs)?;
        let shared = shared(raw.shared)?;
        let limits = limits(raw.limits)?;
        let tls = tls(raw.tls)?;
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
            destinations,
            extra_ca: raw.upstream.extra_ca,
            connect_timeout: raw
                .upstream
                .connect_timeout
                .map_or(Duration::from_secs(10), |d| d.0),
            max_idle_connections: raw
                .upstream
                .max_idle_connections
                .unwrap_or(crate::upstream::pool::DEFAULT_MAX_IDLE),
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

    /// Keys only a restart applies — listeners, the state directory, what
    /// the upstream client, the interception CA and the Redis connection
    /// were built from at start, the worker threads — that differ in
    /// `new`; each set back to this config's value there, so that what
    /// the running config says is what runs (a reload leaves them
    /// unapplied, and says so). A listener given port 0 (the system's
    /// choice) counts as unchanged.
    pub fn keep_restart_only(&self, new: &mut Config) -> Vec<&'static str> {
        let mut changed = Vec::new();
        let mut keep = |key: &'static str, differs: bool| {
            debug_assert!(RESTART_ONLY.contains(&key), "{key} is not in RESTART_ONLY");
            if differs {
                changed.push(key);
            }
        };
        keep(
            "listen",
            new.listen != self.listen && new.listen.port() != 0,
        );
        keep("admin", new.admin != self.admin && new.admin.port() != 0);
        keep("state_dir", new.state_dir != self.state_dir);
        keep("upstream.extra_ca", new.extra_ca != self.extra_ca);
        keep(
            "upstream.connect_timeout",
            new.connect_timeout != self.connect_timeout,
        );
        keep(
            "upstream.max_idle_connections",
            new.max_idle_connections != self.max_idle_connections,
        );
        keep("tls.ca_cert", new.tls.ca_cert != self.tls.ca_cert);
        keep("tls.ca_key", new.tls.ca_key != self.tls.ca_key);
        keep("tls.leaf_cache", new.tls.leaf_cache != self.tls.leaf_cache);
        keep("tls.trust_dir", new.tls.trust_dir != self.tls.trust_dir);
        keep("shared", new.shared != self.shared);
        keep("limits.workers", new.limits.workers != self.limits.workers);
        new.listen = self.listen;
        new.admin = self.admin;
        new.state_dir = self.state_dir.clone();
        new.extra_ca = self.extra_ca.clone();
        new.connect_timeout = self.connect_timeout;
        new.max_idle_connections = self.max_idle_connections;
        new.tls = self.tls.clone();
        new.shared = self.shared.clone();
        new.limits.workers = self.limits.workers;
        changed
    }

    /// That the state directory exists, or can be made, and takes a file:
    /// checked by `--check-config` and before sluice starts serving
    /// (before, `state_dir = "/proc/nope"` passed the check, and sluice
    /// then ran with no store and no CA). Not part of loading: a reload
    /// keeps the directory it runs with.
    pub fn check_state_dir(&self) -> Result<(), ConfigError> {
        let dir = &self.state_dir;
        std::fs::create_dir_all(dir)
            .map_err(|e| err("state_dir", format!("cannot create {}: {e}", dir.display())))?;
        let probe = dir.join(".sluice-write-check");
        std::fs::write(&probe, b"")
            .and_then(|()| std::fs::remove_file(&probe))
            .map_err(|e| {
                err(
                    "state_dir",
                    format!("cannot write in {}: {e}", dir.display()),
                )
            })
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
                if let Some(other) = seen.insert(h.to_string(), &p.name) {
                    return Err(err(
                        format!("providers.{}.hosts", p.name),
                        format!("\"{h}\" is already a host of provider {other}: a host belongs to one provider"),
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
pub(super) fn read_token(path: &Path) -> Result<String, String> {
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
/// The 1-based line and column of a byte offset in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// serde's "unknown field `ceiling`, expected one of `a`, `b`…" as a
/// user reads it: the nearest key suggested, the keys listed.
fn suggest_key(message: &str) -> String {
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return message.to_string();
    };
    let Some((unknown, rest)) = rest.split_once('`') else {
        return message.to_string();
    };
    let known: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
    let nearest = known
        .iter()
        .map(|k| (edit_distance(unknown, k), *k))
        .filter(|(d, k)| *d <= unknown.len().max(k.len()) / 2 || k.starts_with(unknown))
        .min();
    let keys = known.join(", ");
    match nearest {
        Some((_, k)) => format!("unknown key `{unknown}`; did you mean `{k}`? (keys here: {keys})"),
        None => format!("unknown key `{unknown}` (keys here: {keys})"),
    }
}

/// Levenshtein distance, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

pub(super) fn key_at(text: &str, offset: usize) -> Option<String> {
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

/// `[providers.NAME]`: each named provider's hosts and settings, over
/// `[defaults]`.
fn providers(raw: &RawConfig, defaults: &ValidSettings) -> Result<Vec<NamedProvider>, ConfigError> {
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
            settings: p.apply(defaults, &key)?,
            intercept: p.intercept.or(raw.defaults.intercept).unwrap_or(true),
        });
    }
    Ok(providers)
}

/// `[destinations]`: the private ranges allowed, the CONNECT ports.
fn destinations(raw: &RawDestinations) -> Result<Destinations, ConfigError> {
    let allow = raw
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
    let connect_ports = raw.connect_ports.clone().unwrap_or_else(|| vec![443, 80]);
    if connect_ports.contains(&0) {
        return Err(err("destinations.connect_ports", "0 is not a port"));
    }
    Ok(Destinations {
        allow,
        connect_ports,
    })
}

/// `[auth] credentials`: `user:token` pairs.
fn credentials(raw: &RawAuth) -> Result<HashMap<String, String>, ConfigError> {
    let mut credentials = HashMap::new();
    for c in &raw.credentials {
        let (user, token) = c
            .split_once(':')
            .filter(|(u, t)| !u.is_empty() && !t.is_empty())
            .ok_or_else(|| err("auth.credentials", "each entry is \"user:token\""))?;
        credentials.insert(user.to_string(), token.to_string());
    }
    Ok(credentials)
}

/// `[collectors.NAME]`: each collector's token (read from its file, and
/// added to `credentials`), weight, catch-up floor and allowlist.
fn collectors(
    raw: &BTreeMap<String, RawCollector>,
    credentials: &mut HashMap<String, String>,
) -> Result<BTreeMap<String, Collector>, ConfigError> {
    let mut collectors = BTreeMap::new();
    for (name, c) in raw {
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
        let weight = c.weight.unwrap_or(DEFAULT_WEIGHT);
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
    Ok(collectors)
}

/// `[runs]`: the lease and the cycle guard.
fn runs(raw: &RawRuns) -> Result<Runs, ConfigError> {
    let runs = Runs {
        lease_ttl: raw.lease_ttl.map_or(Duration::from_secs(60), |d| d.0),
        max_cooldown_waits: raw.max_cooldown_waits.unwrap_or(3),
    };
    if runs.lease_ttl < Duration::from_secs(1) {
        return Err(err("runs.lease_ttl", "must be at least 1s"));
    }
    Ok(runs)
}

/// `[shared]`: the Redis a fleet shares its budgets through, if any.
fn shared(raw: RawShared) -> Result<Option<Shared>, ConfigError> {
    let shared = match raw.redis {
        Some(written) => {
            let (url, target) = redis_target(written)?;
            let key_prefix = raw.key_prefix.unwrap_or_else(|| "sluice".into());
            if key_prefix.is_empty() || key_prefix.contains(['{', '}']) {
                return Err(err(
                    "shared.key_prefix",
                    "must be non-empty, without '{' or '}' (the provider is the key's hash tag)",
                ));
            }
            let replicas = raw.replicas.unwrap_or(1);
            if replicas == 0 {
                return Err(err("shared.replicas", "must be at least 1"));
            }
            let call_timeout = raw.call_timeout.map_or(Duration::from_millis(50), |d| d.0);
            if call_timeout.is_zero() {
                return Err(err("shared.call_timeout", "must be greater than zero"));
            }
            Some(Shared {
                redis: url,
                target,
                key_prefix,
                replicas,
                call_timeout,
            })
        }
        None if raw.key_prefix.is_some()
            || raw.replicas.is_some()
            || raw.call_timeout.is_some() =>
        {
            return Err(err("shared.redis", "required by the other [shared] keys"));
        }
        None => None,
    };
    Ok(shared)
}

/// What `[shared] redis` may be (R-DS2).
const REDIS_FORMS: &str = "\"redis://host:6379/0\" (or rediss://), \
    \"redis+cluster://host1:port1,host2:port2\" or a list of node URLs (a Redis Cluster), \
    or \"redis+sentinel://host1:26379,host2:26379/mastername\" (the primary Sentinel names)";

/// `[shared] redis` as written, and the deployment it names: one server, a
/// Cluster (`redis+cluster://`, `rediss+cluster://`, or a list of node
/// URLs) or Sentinel (`redis+sentinel://`, `rediss+sentinel://`).
fn redis_target(raw: RawRedis) -> Result<(String, RedisTarget), ConfigError> {
    let bad = |why: &str| err("shared.redis", format!("{why}: expected {REDIS_FORMS}"));
    let plain = |url: &str| {
        (url.starts_with("redis://") || url.starts_with("rediss://"))
            && url
                .split_once("://")
                .is_some_and(|(_, rest)| !rest.is_empty())
    };
    let url = match raw {
        RawRedis::Nodes(nodes) => {
            if nodes.is_empty() {
                return Err(bad("an empty list"));
            }
            if let Some(n) = nodes
                .iter()
                .find(|n| !plain(n) || n.contains(char::is_whitespace))
            {
                return Err(bad(&format!("{:?} is not a node URL", redact_url(n))));
            }
            return Ok((nodes.join(", "), RedisTarget::Cluster(nodes)));
        }
        RawRedis::One(url) => url,
    };
    if url.contains(char::is_whitespace) {
        return Err(bad("whitespace in the URL"));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad("no scheme"));
    };
    let (creds, rest) = match rest.rsplit_once('@') {
        Some((c, r)) => (Some(c), r),
        None => (None, rest),
    };
    let (hosts, path) = match rest.split_once('/') {
        Some((h, p)) => (h, p),
        None => (rest, ""),
    };
    let list = |scheme: &str, creds: Option<&str>| -> Result<Vec<String>, ConfigError> {
        let at = creds.map_or_else(String::new, |c| format!("{c}@"));
        hosts
            .split(',')
            .map(|h| {
                let ok = h.rsplit_once(':').is_some_and(|(host, port)| {
                    !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
                });
                if ok {
                    Ok(format!("{scheme}://{at}{h}"))
                } else {
                    Err(bad(&format!("{h:?} is not host:port")))
                }
            })
            .collect()
    };
    let target = match scheme {
        "redis" | "rediss" => {
            if hosts.is_empty() {
                return Err(bad("no host"));
            }
            RedisTarget::Single(url.clone())
        }
        "redis+cluster" | "rediss+cluster" => {
            if !path.is_empty() && path != "0" {
                return Err(bad("a Cluster has database 0 only"));
            }
            let base = scheme.trim_end_matches("+cluster");
            RedisTarget::Cluster(list(base, creds)?)
        }
        "redis+sentinel" | "rediss+sentinel" => {
            let (master, db) = match path.split_once('/') {
                Some((m, d)) => (m, d),
                None => (path, ""),
            };
            if master.is_empty() {
                return Err(bad("no primary name after the sentinels (…/mastername)"));
            }
            let db = match db {
                "" => 0,
                d => d
                    .parse::<i64>()
                    .ok()
                    .filter(|d| *d >= 0)
                    .ok_or_else(|| bad(&format!("database {d:?} is not a number")))?,
            };
            let tls = scheme == "rediss+sentinel";
            let (username, password) = match creds {
                None => (None, None),
                Some(c) => match c.split_once(':') {
                    Some((u, p)) => ((!u.is_empty()).then(|| u.to_string()), Some(p.to_string())),
                    None => (Some(c.to_string()), None),
                },
            };
            RedisTarget::Sentinel {
                sentinels: list(if tls { "rediss" } else { "redis" }, None)?,
                master: master.to_string(),
                tls,
                username,
                password,
                db,
            }
        }
        _ => return Err(bad(&format!("unknown scheme {scheme:?}"))),
    };
    Ok((url, target))
}

/// `[limits]`: the process's bounds.
fn limits(l: RawLimits) -> Result<Limits, ConfigError> {
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
    Ok(limits)
}

/// `[tls]`: the interception CA and the leaf cache.
fn tls(raw: RawTls) -> Result<Tls, ConfigError> {
    let tls = Tls {
        ca_cert: raw.ca_cert,
        ca_key: raw.ca_key,
        leaf_cache: raw.leaf_cache.unwrap_or(1024),
        trust_dir: raw.trust_dir,
    };
    if tls.ca_cert.is_some() != tls.ca_key.is_some() {
        return Err(err("tls.ca_key", "tls.ca_cert and tls.ca_key go together"));
    }
    if tls.leaf_cache == 0 {
        return Err(err("tls.leaf_cache", "must be at least 1"));
    }
    Ok(tls)
}
