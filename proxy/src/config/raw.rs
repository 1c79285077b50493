//! The config as TOML writes it: every table and key, unchecked, and how
//! each setting's TOML form becomes its value ([`FromToml`]).

use super::*;

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

pub(super) fn secs(s: f64) -> Result<Duration, BadDuration> {
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

/// A listener's address as the config writes it (see [`parse_listener`]).
fn listener<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    let text = String::deserialize(d)?;
    parse_listener(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// `IP:PORT`, or `localhost:PORT` (the IPv4 loopback); what is wrong
/// otherwise, with examples.
pub fn parse_listener(text: &str) -> Result<SocketAddr, String> {
    if let Some(port) = text.strip_prefix("localhost:") {
        if let Ok(port) = port.parse::<u16>() {
            return Ok(SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)));
        }
    }
    text.parse().map_err(|_| {
        format!(
            "{text:?} is not IP:PORT: write e.g. \"127.0.0.1:3128\" (\"localhost:3128\", \
             \"[::1]:3128\", or \"0.0.0.0:3128\" for every interface)"
        )
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default, deserialize_with = "listener")]
    pub(super) listen: Option<SocketAddr>,
    #[serde(default, deserialize_with = "listener")]
    pub(super) admin: Option<SocketAddr>,
    pub(super) state_dir: Option<PathBuf>,
    #[serde(default)]
    pub(super) destinations: RawDestinations,
    #[serde(default)]
    pub(super) upstream: RawUpstream,
    #[serde(default)]
    pub(super) defaults: RawProvider,
    #[serde(default)]
    pub(super) providers: BTreeMap<String, RawProvider>,
    #[serde(default)]
    pub(super) auth: RawAuth,
    #[serde(default)]
    pub(super) limits: RawLimits,
    #[serde(default)]
    pub(super) tls: RawTls,
    #[serde(default)]
    pub(super) collectors: BTreeMap<String, RawCollector>,
    #[serde(default)]
    pub(super) runs: RawRuns,
    #[serde(default)]
    pub(super) shared: RawShared,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShared {
    pub(super) redis: Option<RawRedis>,
    pub(super) key_prefix: Option<String>,
    pub(super) replicas: Option<u32>,
    pub(super) call_timeout: Option<Dur>,
}

/// `[shared] redis`: one URL, or a Cluster's seed nodes as a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawRedis {
    One(String),
    Nodes(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCollector {
    pub(super) token_file: Option<PathBuf>,
    pub(super) weight: Option<f64>,
    pub(super) catchup_floor: Option<f64>,
    pub(super) allow: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRuns {
    pub(super) lease_ttl: Option<Dur>,
    pub(super) max_cooldown_waits: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) ca_cert: Option<PathBuf>,
    pub(super) ca_key: Option<PathBuf>,
    pub(super) leaf_cache: Option<usize>,
    pub(super) trust_dir: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDestinations {
    #[serde(default)]
    pub(super) allow: Vec<String>,
    pub(super) connect_ports: Option<Vec<u16>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstream {
    pub(super) extra_ca: Option<PathBuf>,
    pub(super) connect_timeout: Option<Dur>,
    pub(super) max_idle_connections: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAuth {
    /// `"user:token"` pairs.
    #[serde(default)]
    pub(super) credentials: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    pub(super) max_providers: Option<usize>,
    pub(super) provider_idle: Option<Dur>,
    pub(super) state_max_age: Option<Dur>,
    pub(super) header_read_timeout: Option<Dur>,
    pub(super) max_header_bytes: Option<usize>,
    pub(super) body_idle_timeout: Option<Dur>,
    pub(super) shutdown_grace: Option<Dur>,
    pub(super) save_interval: Option<Dur>,
    pub(super) max_metric_providers: Option<usize>,
    pub(super) workers: Option<usize>,
}

/// How a provider setting's type is written in TOML.
pub(super) trait FromToml: Sized {
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

impl FromToml for Option<sluice_policy::classify::Dialect> {
    type Raw = String;
    fn from_toml(raw: &String) -> Result<Self, String> {
        sluice_policy::classify::Dialect::named(raw)
            .map(Some)
            .ok_or_else(|| {
                let known: Vec<_> = sluice_policy::classify::Dialect::ALL
                    .iter()
                    .map(|(n, _)| *n)
                    .collect();
                format!("{raw:?} is not a dialect (one of {})", known.join(", "))
            })
    }
}

/// How TOML writes an allowance: `{ units = 100000, per = "24h" }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAllowance {
    pub(super) units: u64,
    pub(super) per: Dur,
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
        pub(super) struct RawProvider {
            pub(super) hosts: Option<Vec<String>>,
            pub(super) intercept: Option<bool>,
            $( pub(super) $name: Option<<$ty as FromToml>::Raw>, )*
        }

        impl RawProvider {
            /// Writes the keys given here over `s`.
            pub(super) fn lay_over(&self, s: &mut ProviderSettings, key: &str) -> Result<(), ConfigError> {
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
    pub(super) fn apply(
        &self,
        base: &ProviderSettings,
        key: &str,
    ) -> Result<ValidSettings, ConfigError> {
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
