//! Every tunable of a provider's stack, with its default and the reason for
//! it — in one place, so that an operator reading one file knows what
//! sluice will do.
//!
//! Only one number is meant to be authored by the owner: the rate ceiling
//! (R-AI2). Everything else has a default that works without tuning; the
//! proxy's config may override any of them per provider.
//!
//! Each setting's default and the public reference it comes from are in
//! [`provider_settings!`](crate::provider_settings), the one list that both the settings type and the
//! proxy's config are made from.

use std::time::Duration;

/// A setting that does not make sense, naming the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct SettingsError {
    /// The setting's key, as in the TOML config.
    pub key: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

/// Every provider setting, once: what it is and why its default (the doc),
/// its name (the TOML key), its type and its default.
///
/// [`ProviderSettings`] and its `Default` are made from this list, and so
/// is the proxy's config table for a provider: `provider_settings!(m)`
/// passes the whole list to the macro `m`. Adding a setting is one entry
/// here (and a check in [`ProviderSettings::validated`] if some values make
/// no sense); the config key, its inheritance from `[defaults]` and its
/// error messages follow.
#[macro_export]
macro_rules! provider_settings {
    ($then:ident) => {
        $then! {
            /// The owner's one safety number: the learned rate never exceeds
            /// it (R-AI2). Unset, 50: set it to what the provider allows.
            ceiling_rps: f64 = 50.0,
            /// The cold-start rate; unset = ceiling / 10, at most 5 req/s, and
            /// always below the ceiling: a conservative cold start (R-AI3),
            /// after Scrapy AutoThrottle's `AUTOTHROTTLE_START_DELAY` (start
            /// slow, learn, then go faster).
            start_rps: Option<f64> = None,
            /// The lowest rate AIMD may fall to (or the start rate if lower):
            /// one request per 10 s still lets a throttling provider be probed.
            floor_rps: f64 = 0.1,
            /// GCRA burst, how many requests may go back to back: 1 = strict
            /// spacing, a request never rides on idle credit (R-GC1).
            burst: u32 = 1,
            /// Multiplicative decrease on a throttle: the AWS SDKs' adaptive
            /// retry mode (CUBIC β = 0.7).
            decrease_factor: f64 = 0.7,
            /// How often AIMD considers an increase: once per second, like the
            /// AWS SDK's per-second measured rate.
            increase_window: ::std::time::Duration = ::std::time::Duration::from_secs(1),
            /// A lower quartile of time-to-first-byte this many times its
            /// learned baseline is a provider slowing us down (Scrapy
            /// AutoThrottle adjusts on latency too); the quartile, not one
            /// answer, so heavy requests are not a throttle (R-SG3).
            soft_throttle_factor: f64 = 3.0,
            /// The longest a request may wait for its pacing slot or bulkhead
            /// permit; a request that would wait longer is refused at once with
            /// `Retry-After`. Shorter than common 30 s client timeouts.
            max_queue_wait: ::std::time::Duration = ::std::time::Duration::from_secs(15),
            /// While the provider holds us off (its `Retry-After`, or its
            /// advertised quota spent until the window resets), a request may
            /// wait this long for its slot instead of `max_queue_wait`: a
            /// windowed quota's wait is paced, not refused through. Below
            /// the 30 s timeout common in HTTP clients (Python requests with
            /// `timeout=30`, many SDKs), with 2 s for the request itself, so
            /// a waiter is sent before its client gives up.
            max_hold_wait: ::std::time::Duration = ::std::time::Duration::from_secs(28),
            /// How many requests may wait for a pacing slot: the per-provider
            /// waiting room; beyond it refuse, never grow memory. 1 to
            /// 1,000,000.
            max_queue_len: usize = 256,
            /// The longest `Retry-After` sluice absorbs for the client; a
            /// longer one goes back to the client instead of holding its
            /// connection.
            max_retry_after_wait: ::std::time::Duration = ::std::time::Duration::from_secs(10),
            /// While the provider is down (every request failing, R-SG4), a
            /// request outside a run waits parked this long in all for its
            /// return instead of getting the failure (R-RN13); then `503`
            /// with `Proxy-Status`. 10 s rides out a deploy or a load
            /// balancer swap and is below `max_retry_after_wait`'s order of
            /// a wait clients sit through; `0` passes failures at once. A
            /// run's requests always park, bounded by the run (R-RN8).
            max_outage_wait: ::std::time::Duration = ::std::time::Duration::from_secs(10),
            /// The bulkhead: attempts in flight to this provider
            /// (non-adaptive, R-BH1). 1 to 1,000,000.
            max_in_flight: usize = 64,
            /// Per-attempt timeout, connect and response head: twice Envoy's
            /// 15 s route timeout, since exports are slow.
            attempt_timeout: ::std::time::Duration = ::std::time::Duration::from_secs(30),
            /// The whole request's bound, up to its response head: pacing
            /// waits, every attempt, retries and their back-off (a run's
            /// wait for a cool-down excepted). Past it the client gets `504`
            /// (`Proxy-Status: connection_timeout`, attempts in `details`)
            /// instead of waiting on a provider that never answers. 45 s:
            /// one full attempt and a retry's start, under the 60 s read
            /// timeout of the AWS SDKs and botocore, so sluice answers
            /// before the client gives up.
            request_timeout: ::std::time::Duration = ::std::time::Duration::from_secs(45),
            /// The breaker's sliding window: Hystrix
            /// `metrics.rollingStats.timeInMilliseconds` = 10000.
            breaker_window: ::std::time::Duration = ::std::time::Duration::from_secs(10),
            /// Failure share over the window that opens the breaker: Hystrix
            /// `errorThresholdPercentage` = 50, resilience4j
            /// `failureRateThreshold` = 50.
            breaker_failure_ratio: f64 = 0.5,
            /// Calls the window must hold before the breaker may open: Hystrix
            /// `requestVolumeThreshold` = 20 (no false open on a cold start).
            breaker_min_calls: u32 = 20,
            /// How long the breaker stays open before half-open: Hystrix
            /// `sleepWindowInMilliseconds` = 5000, Polly `BreakDuration` = 5 s.
            breaker_open_for: ::std::time::Duration = ::std::time::Duration::from_secs(5),
            /// Probes let through while half-open; this many successes close
            /// it. resilience4j lets a bounded number through (10); fewer here
            /// because a proxy's probes are real client requests.
            breaker_half_open_probes: u32 = 3,
            /// While open, wait for the half-open probe (within
            /// `max_queue_wait`) instead of failing fast (R-CB1: fail fast by
            /// default).
            breaker_wait_for_probe: bool = false,
            /// Retries as a share of recent requests: Linkerd / tower
            /// `TpsBudget`, retries may add 20 % to the request volume.
            retry_ratio: f64 = 0.2,
            /// Retries always allowed per second, whatever the ratio: tower
            /// `TpsBudget`'s default floor, so a quiet provider can still retry.
            retry_min_per_sec: u32 = 10,
            /// How long a request's deposit counts in the retry budget: tower
            /// `TpsBudget`'s default, ten seconds.
            retry_budget_ttl: ::std::time::Duration = ::std::time::Duration::from_secs(10),
            /// Attempts per request, first included: the AWS SDKs' standard
            /// mode, three in all.
            retry_max_attempts: u32 = 3,
            /// Full-jitter base: `random(0, min(cap, base·2^n))` (AWS
            /// Architecture Blog); base and cap are smaller than the SDK's
            /// 1 s / 20 s because a proxy's client waits on its open request.
            retry_base: ::std::time::Duration = ::std::time::Duration::from_millis(250),
            /// Full-jitter cap; see `retry_base`.
            retry_cap: ::std::time::Duration = ::std::time::Duration::from_secs(5),
            /// Methods retried besides the idempotent ones (RFC 9110 §9.2.2).
            retry_methods: ::std::vec::Vec<::http::Method> = ::std::vec::Vec::new(),
            /// Largest request body kept for replay; bigger bodies are not
            /// retried.
            replay_limit: usize = 64 * 1024,
            /// Share this provider's budget — its pacing schedule, learned
            /// rate, throttle point and `Retry-After` hold — with every
            /// replica through `[shared] redis` (R-DS1): a provider's limit
            /// belongs to its credential, not to a pod. Off: each replica
            /// learns alone.
            shared: bool = false,
            /// What requests cost this provider, in its units, by method and
            /// path prefix (`"POST /graphql" = 10`): pacing, fair shares
            /// and quotas count units (R-FS2). Empty: every request costs 1.
            costs: $crate::cost::Costs = $crate::cost::Costs::default(),
            /// A response header in which the provider says what a request
            /// cost (e.g. `x-cost`): the pacer charges the difference from
            /// the table's price. Unset: the table's price stands.
            cost_header: ::std::option::Option<::http::HeaderName> = None,
            /// Units this provider allows per long period — a daily or
            /// monthly quota (`{ units = 100000, per = "24h" }`): paced so it
            /// lasts the period, what is left spread over what remains, with
            /// the learned rate and the ceiling still on top (R-FS2). Unset:
            /// none.
            allowance: ::std::option::Option<$crate::pacer::Allowance> = None,
            /// How the provider says "slow down" and "never": `"openai"`
            /// (and compatibles), `"anthropic"`, `"github"`, `"google"`,
            /// `"shopify"`, `"discord"`, `"reddit"`, `"salesforce"` or
            /// `"generic"` (R-PD2). Unset: chosen by the provider's host
            /// (`api.github.com` speaks GitHub's), generic for a host not
            /// known.
            dialect: ::std::option::Option<$crate::classify::Dialect> = None,
        }
    };
}

macro_rules! define_settings {
    ($( $(#[$doc:meta])* $name:ident : $ty:ty = $default:expr ),* $(,)?) => {
        /// The tunables of one provider's stack, made from
        /// [`provider_settings!`](crate::provider_settings). Build with `Default` or
        /// [`ProviderSettings::with_ceiling`], change fields, then
        /// [`validated`](ProviderSettings::validated).
        #[derive(Debug, Clone, PartialEq)]
        pub struct ProviderSettings {
            $( $(#[$doc])* pub $name: $ty, )*
        }

        impl Default for ProviderSettings {
            fn default() -> Self {
                ProviderSettings { $( $name: $default, )* }
            }
        }
    };
}

provider_settings!(define_settings);

/// The most attempts in flight, or requests waiting, a provider's settings
/// allow (`max_in_flight`, `max_queue_len`).
pub const MAX_COUNT: usize = 1_000_000;

/// Settings that passed [`ProviderSettings::validated`]: what a provider's
/// stack is built from, so no stack sees a value that makes no sense. The
/// defaults are valid (`defaults_are_valid_and_start_low`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValidSettings(ProviderSettings);

impl std::ops::Deref for ValidSettings {
    type Target = ProviderSettings;

    fn deref(&self) -> &ProviderSettings {
        &self.0
    }
}

impl ValidSettings {
    /// Settings as given, for a part built alone (a pacer in its own
    /// tests): a provider's parts share the validated settings it holds.
    pub(crate) fn as_given(settings: &ProviderSettings) -> std::sync::Arc<ValidSettings> {
        std::sync::Arc::new(ValidSettings(settings.clone()))
    }

    /// The settings, to change (and validate again).
    pub fn into_inner(self) -> ProviderSettings {
        self.0
    }

    /// The same settings, classifying answers by `dialect` where they name
    /// none (the dialect the provider's hosts speak, R-PD2). Still valid:
    /// any dialect is.
    pub fn or_dialect(&self, dialect: crate::classify::Dialect) -> ValidSettings {
        ValidSettings(ProviderSettings {
            dialect: self.dialect.or(Some(dialect)),
            ..self.0.clone()
        })
    }
}

impl ProviderSettings {
    /// Defaults with the given ceiling.
    pub fn with_ceiling(ceiling_rps: f64) -> Self {
        ProviderSettings {
            ceiling_rps,
            ..Default::default()
        }
    }

    /// The cold-start rate in force: the configured one, or ceiling / 10
    /// capped at 5 req/s — always below the ceiling (R-AI3).
    pub fn start_rate(&self) -> f64 {
        self.start_rps
            .unwrap_or_else(|| (self.ceiling_rps / 10.0).min(5.0))
            .min(self.ceiling_rps)
    }

    /// The floor in force: never above the start rate, so that a cold
    /// start is never forced up to the ceiling by a high floor.
    pub fn floor_rate(&self) -> f64 {
        self.floor_rps.min(self.start_rate())
    }

    /// Checks every value, naming the first bad key.
    pub fn validated(self) -> Result<ValidSettings, SettingsError> {
        self.check()?;
        Ok(ValidSettings(self))
    }

    /// One check per key, in the order of the settings (about 80 lines):
    /// a list to read down, not logic to follow.
    fn check(&self) -> Result<(), SettingsError> {
        fn bad(key: &'static str, reason: impl Into<String>) -> Result<(), SettingsError> {
            Err(SettingsError {
                key,
                reason: reason.into(),
            })
        }
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(self.ceiling_rps) || self.ceiling_rps > 1_000_000.0 {
            return bad("ceiling_rps", "must be a number > 0 and <= 1000000");
        }
        if let Some(s) = self.start_rps {
            if !positive(s) {
                return bad("start_rps", "must be a number > 0");
            }
            if s >= self.ceiling_rps {
                return bad(
                    "start_rps",
                    "must be below ceiling_rps: a cold start never goes at the ceiling",
                );
            }
        }
        if !positive(self.floor_rps) {
            return bad("floor_rps", "must be a number > 0");
        }
        if self.burst == 0 || self.burst > 10_000 {
            return bad("burst", "must be between 1 and 10000");
        }
        if !(self.decrease_factor > 0.0 && self.decrease_factor < 1.0) {
            return bad("decrease_factor", "must be between 0 and 1 (exclusive)");
        }
        if self.increase_window < Duration::from_millis(10) {
            return bad("increase_window", "must be at least 10ms");
        }
        if !(self.soft_throttle_factor.is_finite() && self.soft_throttle_factor > 1.0) {
            return bad("soft_throttle_factor", "must be a number > 1");
        }
        // Bounded above too: the bulkhead counts in 32 bits (R-PF1), and a
        // semaphore of more permits than tokio's would panic at start.
        if !(1..=MAX_COUNT).contains(&self.max_queue_len) {
            return bad("max_queue_len", "must be between 1 and 1000000");
        }
        if !(1..=MAX_COUNT).contains(&self.max_in_flight) {
            return bad("max_in_flight", "must be between 1 and 1000000");
        }
        if self.attempt_timeout.is_zero() {
            return bad("attempt_timeout", "must be greater than zero");
        }
        if self.request_timeout < self.attempt_timeout {
            return bad(
                "request_timeout",
                "must be at least attempt_timeout (one attempt must fit in it)",
            );
        }
        if self.breaker_window < Duration::from_millis(100) {
            return bad("breaker_window", "must be at least 100ms");
        }
        if !(self.breaker_failure_ratio > 0.0 && self.breaker_failure_ratio <= 1.0) {
            return bad("breaker_failure_ratio", "must be in (0, 1]");
        }
        if self.breaker_min_calls == 0 {
            return bad("breaker_min_calls", "must be at least 1");
        }
        if self.breaker_open_for.is_zero() {
            return bad("breaker_open_for", "must be greater than zero");
        }
        if self.breaker_half_open_probes == 0 {
            return bad("breaker_half_open_probes", "must be at least 1");
        }
        if !(self.retry_ratio.is_finite() && (0.0..=10.0).contains(&self.retry_ratio)) {
            return bad("retry_ratio", "must be between 0 and 10");
        }
        if self.retry_budget_ttl < Duration::from_secs(1)
            || self.retry_budget_ttl > Duration::from_secs(60)
        {
            return bad("retry_budget_ttl", "must be between 1s and 60s");
        }
        if self.retry_max_attempts == 0 {
            return bad("retry_max_attempts", "must be at least 1");
        }
        if self.retry_base.is_zero() || self.retry_cap < self.retry_base {
            return bad("retry_base", "must be > 0 and not above retry_cap");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_start_low() {
        let s = ProviderSettings::default().validated().unwrap();
        assert_eq!(s, ValidSettings::default());
        assert!(s.start_rate() < s.ceiling_rps);
        assert_eq!(s.start_rate(), 5.0);
        assert_eq!(ProviderSettings::with_ceiling(10.0).start_rate(), 1.0);
        assert_eq!(ProviderSettings::with_ceiling(0.5).start_rate(), 0.05);
        assert_eq!(ProviderSettings::with_ceiling(0.5).floor_rate(), 0.05);
    }

    #[test]
    fn errors_name_the_key() {
        let mut s = ProviderSettings::with_ceiling(-1.0);
        assert_eq!(s.clone().validated().unwrap_err().key, "ceiling_rps");
        s.ceiling_rps = f64::NAN;
        assert_eq!(s.clone().validated().unwrap_err().key, "ceiling_rps");
        s.ceiling_rps = 10.0;
        s.start_rps = Some(20.0);
        assert_eq!(s.clone().validated().unwrap_err().key, "start_rps");
        s.start_rps = None;
        s.decrease_factor = 1.0;
        assert_eq!(s.clone().validated().unwrap_err().key, "decrease_factor");
        s.decrease_factor = 0.7;
        s.burst = 0;
        assert_eq!(s.clone().validated().unwrap_err().key, "burst");
        s.burst = 1;
        s.request_timeout = s.attempt_timeout - Duration::from_secs(1);
        assert_eq!(s.clone().validated().unwrap_err().key, "request_timeout");
        s.request_timeout = s.attempt_timeout;
        s.max_in_flight = usize::MAX;
        assert_eq!(s.clone().validated().unwrap_err().key, "max_in_flight");
        s.max_in_flight = MAX_COUNT;
        s.max_queue_len = MAX_COUNT + 1;
        assert_eq!(s.clone().validated().unwrap_err().key, "max_queue_len");
        s.max_queue_len = MAX_COUNT;
        assert!(s.validated().is_ok(), "a million each is allowed");
    }
}
