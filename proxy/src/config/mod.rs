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
//! yet used by a setting needs a `FromToml` impl saying how TOML writes
//! it.

mod build;
mod hosts;
mod model;
mod raw;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;
use sluice_policy::{ProviderSettings, ValidSettings};

pub use self::build::{DEFAULT_WEIGHT, RESTART_ONLY};
pub use self::hosts::{
    normalise_host, port_number, port_of, without_port, written_port, HostPattern,
};
pub use self::model::*;
use self::raw::*;
pub use self::raw::{parse_duration, parse_listener, BadDuration, Dur};

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

    /// R-DS2: `[shared] redis` names one server, a Cluster or a Sentinel
    /// primary; anything else is an error naming the key and the forms.
    #[test]
    fn shared_redis_names_one_server_a_cluster_or_sentinel() {
        let target = |v: &str| {
            Config::from_toml(&format!("[shared]\nredis = {v}\n")).map(|c| c.shared.unwrap().target)
        };
        assert_eq!(
            target("\"redis://10.0.0.1:6379/0\"").unwrap(),
            RedisTarget::Single("redis://10.0.0.1:6379/0".into())
        );
        assert_eq!(
            target("\"rediss+cluster://u:pw@a:7000,b:7001\"").unwrap(),
            RedisTarget::Cluster(vec![
                "rediss://u:pw@a:7000".into(),
                "rediss://u:pw@b:7001".into()
            ])
        );
        assert_eq!(
            target("[\"redis://a:7000\", \"redis://b:7001\"]").unwrap(),
            RedisTarget::Cluster(vec!["redis://a:7000".into(), "redis://b:7001".into()])
        );
        assert_eq!(
            target("\"redis+sentinel://:pw@s1:26379,s2:26379/main/2\"").unwrap(),
            RedisTarget::Sentinel {
                sentinels: vec!["redis://s1:26379".into(), "redis://s2:26379".into()],
                master: "main".into(),
                tls: false,
                username: None,
                password: Some("pw".into()),
                db: 2,
            }
        );
        for bad in [
            "\"redis+sentinel://s1:26379\"",
            "\"redis+cluster://a:7000,b\"",
            "\"redis+cluster://a:7000/3\"",
            "\"memcached://a:1\"",
            "\"redis://\"",
            "[]",
            "[\"redis://a:1\", \"http://b:2\"]",
        ] {
            let e = target(bad).unwrap_err();
            assert_eq!(e.key, "shared.redis", "{bad}: {e}");
            assert!(e.reason.contains("redis+sentinel://"), "{bad}: {e}");
        }
        // Passwords never reach a log line.
        let c =
            Config::from_toml("[shared]\nredis = \"redis+cluster://u:secret@a:7000\"\n").unwrap();
        assert!(!format!("{:?}", c.shared).contains("secret"));
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
        // The one-look path and the trimming one agree.
        for host in [
            "127.0.0.1",
            "a-b.test",
            "",
            "x_y.test",
            " api.test ",
            "a..",
            "[::1].",
        ] {
            let slow = host
                .trim()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .trim_end_matches('.');
            assert_eq!(normalise_host(host), slow, "{host:?}");
        }
    }

    /// R-PF1: ports read digit by digit, as RFC 3986 writes them — no
    /// sign, no more than 65535.
    #[test]
    fn ports_are_decimal_digits_up_to_65535() {
        for (written, port) in [
            ("80", Some(80)),
            ("080", Some(80)),
            ("0", Some(0)),
            ("65535", Some(65535)),
            ("65536", None),
            ("123456", None),
            ("+80", None),
            ("-1", None),
            ("8 0", None),
            ("", None),
        ] {
            assert_eq!(port_number(written), port, "{written:?}");
        }
        assert_eq!(without_port("h.test:080", 80), Some("h.test"));
        assert_eq!(without_port("h.test:18080", 80), None);
        assert_eq!(without_port("[::1]:443", 443), Some("[::1]"));
        assert_eq!(port_of("h.test:+80"), None);
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

    /// Issue 36, defect 9: an error says where (line and column), the
    /// nearest key to a misspelt one, an example of a value it takes, and
    /// never Rust's debug output or a requirement id.
    #[test]
    fn errors_say_where_what_to_write_and_nothing_internal() {
        let e = Config::from_toml("[destinations\nallow = []\n").unwrap_err();
        assert!(e.to_string().contains("(line 1, column 14)"), "{e}");
        let e = Config::from_toml("[defaults]\nceiling = 5.0\n").unwrap_err();
        assert_eq!(e.key, "defaults.ceiling");
        assert!(e.reason.contains("did you mean `ceiling_rps`?"), "{e}");
        assert!(e.reason.contains("(line 2, column 1)"), "{e}");
        let e = Config::from_toml("lsten = \"127.0.0.1:1\"\n").unwrap_err();
        assert!(e.reason.contains("did you mean `listen`?"), "{e}");
        let e = Config::from_toml("[defaults]\nxyz = 1\n").unwrap_err();
        assert!(
            !e.reason.contains("did you mean") && e.reason.contains("ceiling_rps"),
            "{e}"
        );
        let e = Config::from_toml("listen = \"nope\"\n").unwrap_err();
        assert!(e.reason.contains("e.g. \"127.0.0.1:3128\""), "{e}");
        let c = Config::from_toml("listen = \"localhost:13129\"\n").unwrap();
        assert_eq!(c.listen, "127.0.0.1:13129".parse().unwrap());
        let e = Config::from_toml(
            "[providers.a]\nhosts = [\"a.com\"]\n[providers.b]\nhosts = [\"a.com\"]\n",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "config error: providers.b.hosts: \"a.com\" is already a host of provider a: \
             a host belongs to one provider"
        );
        let e =
            Config::from_toml("[defaults]\nstart_rps = 500.0\nceiling_rps = 10.0\n").unwrap_err();
        assert!(!e.reason.contains("R-"), "{e}");
    }

    #[test]
    fn an_unwritable_state_dir_is_an_error_naming_it() {
        let c = Config {
            state_dir: "/proc/sluice-nope".into(),
            ..Config::default()
        };
        let e = c.check_state_dir().unwrap_err();
        assert_eq!(e.key, "state_dir");
        assert!(e.reason.contains("/proc/sluice-nope"), "{e}");
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
