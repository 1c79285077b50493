//! Provider dialects (R-PD2, R-PD3): how each provider says "slow down",
//! "this will never work", and "I am overloaded" — read into one
//! [`Outcome`] for every layer.
//!
//! The generic reading (a `429` or a `503` is a throttle, any other 4xx is
//! the client's) misreads the APIs collectors call most:
//!
//! * **GitHub** answers its throttles `403` as often as `429`: the primary
//!   limit with `x-ratelimit-remaining: 0` (wait for `x-ratelimit-reset`,
//!   a Unix time), the secondary with `retry-after`, or only a message
//!   ("You have exceeded a secondary rate limit": wait at least a minute).
//!   A `403` with budget left and another message is a real permission
//!   error.
//! * **OpenAI** (and every compatible server) answers `429` both for a
//!   throttle and for what no wait will fix: `insufficient_quota` (billing)
//!   and a request larger than the whole budget ("Request too large").
//! * **Anthropic** answers `529 overloaded_error` when its capacity, not
//!   your quota, runs short: pressure to weigh, not a hold.
//! * **Google APIs** throttle with `429` whose body carries
//!   `google.rpc.RetryInfo` (`"retryDelay": "53s"`), and older ones with
//!   `403` and `rateLimitExceeded` / `userRateLimitExceeded`.
//! * **Salesforce** throttles with `403 REQUEST_LIMIT_EXCEEDED`.
//!
//! A dialect is a table here, not a change to every layer: it reads a
//! response's status, headers and — for the statuses that need it — the
//! first [`ERROR_BODY_MAX`] bytes of its body ([`ErrorBody`], read by the
//! proxy within that bound), and answers the one [`Outcome`] the breaker,
//! the pacer, the retry policy and the run all read.

use std::time::{Duration, SystemTime};

use http::StatusCode;

use super::formats;
use super::Outcome;

/// The most of an error body read to classify it.
pub const ERROR_BODY_MAX: usize = 16 * 1024;

/// The first bytes of an error response's body (at most
/// [`ERROR_BODY_MAX`]), put in its extensions by whoever read them: the
/// dialect reads it, and the body is still sent on whole.
#[derive(Debug, Clone)]
pub struct ErrorBody(pub bytes::Bytes);

/// How long GitHub asks a secondary limit's client to wait when it does
/// not say: "wait for at least one minute before retrying".
const GITHUB_SECONDARY_WAIT: Duration = Duration::from_secs(60);

/// A provider's dialect: chosen by host ([`Dialect::for_host`]) or by
/// `dialect = "..."` in its config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dialect {
    /// `429` and `503` are throttles; other 4xx are the client's.
    #[default]
    Generic,
    /// OpenAI and every OpenAI-compatible server (Azure OpenAI, vLLM,
    /// LiteLLM, OpenRouter, …).
    OpenAi,
    /// Anthropic's API.
    Anthropic,
    /// GitHub's REST and GraphQL APIs.
    GitHub,
    /// Google APIs (`*.googleapis.com`).
    Google,
    /// Shopify's Admin APIs.
    Shopify,
    /// Discord's API.
    Discord,
    /// Reddit's API.
    Reddit,
    /// Salesforce's REST API.
    Salesforce,
}

impl Dialect {
    /// Every dialect, by its config name.
    pub const ALL: [(&'static str, Dialect); 9] = [
        ("generic", Dialect::Generic),
        ("openai", Dialect::OpenAi),
        ("anthropic", Dialect::Anthropic),
        ("github", Dialect::GitHub),
        ("google", Dialect::Google),
        ("shopify", Dialect::Shopify),
        ("discord", Dialect::Discord),
        ("reddit", Dialect::Reddit),
        ("salesforce", Dialect::Salesforce),
    ];

    /// The dialect named `name` in a config, if any.
    pub fn named(name: &str) -> Option<Dialect> {
        let name = name.trim();
        Self::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, d)| *d)
    }

    /// Its config name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, d)| *d == self)
            .map_or("generic", |(n, _)| n)
    }

    /// The dialect a host speaks, by its name; [`Dialect::Generic`] for a
    /// host not known (an OpenAI-compatible server behind another host is
    /// named in the config: `dialect = "openai"`).
    pub fn for_host(host: &str) -> Dialect {
        // Compared in place, whatever the case: a crawl names a new
        // provider for each host, and this ran twice for each, eight
        // allocations a time (R-PF1, issue 38).
        let host = host.trim_end_matches('.');
        let exactly = |name: &str| host.eq_ignore_ascii_case(name);
        // A name under `domain` (`x.domain`).
        let under = |domain: &str| {
            let Some(dot) = host.len().checked_sub(domain.len() + 1) else {
                return false;
            };
            host.as_bytes()[dot] == b'.'
                && host
                    .get(dot + 1..)
                    .is_some_and(|tail| tail.eq_ignore_ascii_case(domain))
        };
        let is = |domain: &str| exactly(domain) || under(domain);
        if exactly("api.openai.com") || under("openai.azure.com") {
            Dialect::OpenAi
        } else if exactly("api.anthropic.com") {
            Dialect::Anthropic
        } else if exactly("api.github.com") || is("ghe.com") {
            Dialect::GitHub
        } else if is("googleapis.com") {
            Dialect::Google
        } else if is("myshopify.com") {
            Dialect::Shopify
        } else if is("discord.com") || is("discordapp.com") {
            Dialect::Discord
        } else if exactly("oauth.reddit.com") {
            Dialect::Reddit
        } else if is("salesforce.com") || is("force.com") {
            Dialect::Salesforce
        } else {
            Dialect::Generic
        }
    }

    /// Whether this dialect reads the body of an answer with `status` and
    /// `headers` to classify it (the proxy reads [`ERROR_BODY_MAX`] bytes
    /// of it first). GitHub's GraphQL answers its throttle `200` with
    /// `x-ratelimit-remaining: 0`: only such a `200`'s body is read, not
    /// every success's.
    pub fn reads_body(self, status: StatusCode, headers: &http::HeaderMap) -> bool {
        match self {
            Dialect::Generic | Dialect::Shopify | Dialect::Discord | Dialect::Reddit => false,
            Dialect::OpenAi => status == StatusCode::TOO_MANY_REQUESTS,
            Dialect::Anthropic => false,
            Dialect::GitHub => {
                status == StatusCode::FORBIDDEN
                    || status == StatusCode::OK && github_exhausted(headers)
            }
            Dialect::Salesforce => status == StatusCode::FORBIDDEN,
            Dialect::Google => matches!(status.as_u16(), 403 | 429),
        }
    }

    /// Classifies a response head (and the first bytes of its body, when
    /// this dialect reads them).
    pub fn classify(
        self,
        status: StatusCode,
        headers: &http::HeaderMap,
        body: Option<&[u8]>,
        now_wall: SystemTime,
    ) -> Outcome {
        let generic = Outcome::of(status, headers, now_wall);
        let code = status.as_u16();
        let text = body.map(String::from_utf8_lossy);
        let says = |needle: &str| text.as_deref().is_some_and(|t| t.contains(needle));
        let throttled = |retry_after| Outcome::Throttled {
            status: code,
            retry_after,
        };
        match (self, code) {
            // What no wait will fix: billing, or a request larger than the
            // whole budget. Passed on at once, never retried, no cut.
            (Dialect::OpenAi, 429)
                if says("insufficient_quota")
                    || says("Request too large")
                    || says("billing_hard_limit_reached") =>
            {
                Outcome::ClientError { status: code }
            }
            // The provider's capacity: pressure to weigh, no hold.
            (Dialect::Anthropic, 529) => Outcome::Overloaded { status: code },
            // GraphQL's primary limit: `200`, nothing remaining, and
            // `RATE_LIMITED` among the errors (docs: "Rate limits and query
            // limits for the GraphQL API"); held until the reset.
            (Dialect::GitHub, 200) if github_exhausted(headers) && says("RATE_LIMITED") => {
                throttled(
                    header(headers, "x-ratelimit-reset")
                        .and_then(|v| formats::epoch_seconds(v, now_wall)),
                )
            }
            (Dialect::GitHub, 403 | 429) => {
                let remaining = header(headers, "x-ratelimit-remaining").and_then(formats::count);
                let reset = || {
                    header(headers, "x-ratelimit-reset")
                        .and_then(|v| formats::epoch_seconds(v, now_wall))
                };
                if let Some(wait) = super::retry_after::from_headers(headers, now_wall) {
                    // Secondary (or any limit that says when).
                    throttled(Some(wait))
                } else if remaining == Some(0) {
                    throttled(reset())
                } else if says("secondary rate limit") {
                    throttled(Some(GITHUB_SECONDARY_WAIT))
                } else if says("rate limit exceeded") {
                    throttled(reset())
                } else if code == 403 {
                    // A real permission error: budget left, another
                    // message.
                    Outcome::ClientError { status: code }
                } else {
                    generic
                }
            }
            (Dialect::Google, 403)
                if says("rateLimitExceeded")
                    || says("userRateLimitExceeded")
                    || says("RATE_LIMIT_EXCEEDED")
                    || says("quotaExceeded") =>
            {
                throttled(google_retry_delay(text.as_deref()))
            }
            (Dialect::Google, 429) => {
                let said = super::retry_after::from_headers(headers, now_wall);
                throttled(said.or(google_retry_delay(text.as_deref())))
            }
            (Dialect::Salesforce, 403) if says("REQUEST_LIMIT_EXCEEDED") => throttled(None),
            _ => generic,
        }
    }
}

fn header<'h>(headers: &'h http::HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// GitHub says nothing of its budget remains.
fn github_exhausted(headers: &http::HeaderMap) -> bool {
    header(headers, "x-ratelimit-remaining").and_then(formats::count) == Some(0)
}

/// `google.rpc.RetryInfo`'s `"retryDelay": "53s"` (a protobuf Duration in
/// JSON: decimal seconds with an `s`), if the body carries one.
fn google_retry_delay(body: Option<&str>) -> Option<Duration> {
    let body = body?;
    let at = body.find("\"retryDelay\"")?;
    let rest = &body[at + "\"retryDelay\"".len()..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    let value = &rest[..rest.find('"')?];
    formats::delta_seconds(value.strip_suffix('s')?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(dialect: Dialect, status: u16, headers: &[(&str, &str)], body: &str) -> Outcome {
        let mut h = http::HeaderMap::new();
        for (k, v) in headers {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let status = StatusCode::from_u16(status).unwrap();
        let body = dialect.reads_body(status, &h).then_some(body.as_bytes());
        dialect.classify(
            status,
            &h,
            body,
            SystemTime::UNIX_EPOCH + Duration::from_secs(NOW),
        )
    }

    const NOW: u64 = 1_800_000_000;

    fn throttle(status: u16, secs: Option<u64>) -> Outcome {
        Outcome::Throttled {
            status,
            retry_after: secs.map(Duration::from_secs),
        }
    }

    /// R-PD2: dialects by host, and by name in a config.
    #[test]
    fn dialects_by_host_and_by_name() {
        for (host, d) in [
            ("api.openai.com", Dialect::OpenAi),
            ("myco.openai.azure.com", Dialect::OpenAi),
            ("api.anthropic.com", Dialect::Anthropic),
            ("api.github.com", Dialect::GitHub),
            ("API.GitHub.com.", Dialect::GitHub),
            ("sheets.googleapis.com", Dialect::Google),
            ("shop.myshopify.com", Dialect::Shopify),
            ("discord.com", Dialect::Discord),
            ("oauth.reddit.com", Dialect::Reddit),
            ("na1.salesforce.com", Dialect::Salesforce),
            ("example.com", Dialect::Generic),
            ("notgithub.com", Dialect::Generic),
            ("googleapis.com.evil.example", Dialect::Generic),
            ("openai.azure.com", Dialect::Generic),
            ("MyCo.OpenAI.Azure.com.", Dialect::OpenAi),
            ("evilgoogleapis.com", Dialect::Generic),
            ("x.GoogleAPIs.COM", Dialect::Google),
            ("ghe.com", Dialect::GitHub),
            ("é.ghe.com", Dialect::GitHub),
            ("éghe.com", Dialect::Generic),
            ("", Dialect::Generic),
        ] {
            assert_eq!(Dialect::for_host(host), d, "{host}");
        }
        for (name, d) in Dialect::ALL {
            assert_eq!(Dialect::named(name), Some(d));
            assert_eq!(d.name(), name);
        }
        assert_eq!(Dialect::named("OpenAI"), Some(Dialect::OpenAi));
        assert_eq!(Dialect::named("gpt"), None);
    }

    /// R-PD3, GitHub: throttles answered `403`, held like a `429` (until
    /// the reset, or `retry-after`, or a minute for a secondary limit that
    /// says nothing); a permission `403` is the client's.
    #[test]
    fn github_throttles_answered_403() {
        let gh = Dialect::GitHub;
        let primary = classify(
            gh,
            403,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1800000042"),
            ],
            r#"{"message":"API rate limit exceeded for user ID 1."}"#,
        );
        assert_eq!(primary, throttle(403, Some(42)));
        let secondary = classify(
            gh,
            403,
            &[("x-ratelimit-remaining", "4000"), ("retry-after", "30")],
            r#"{"message":"You have exceeded a secondary rate limit."}"#,
        );
        assert_eq!(secondary, throttle(403, Some(30)));
        let silent = classify(
            gh,
            403,
            &[("x-ratelimit-remaining", "4000")],
            r#"{"message":"You have exceeded a secondary rate limit. Please wait."}"#,
        );
        assert_eq!(silent, throttle(403, Some(60)));
        let permission = classify(
            gh,
            403,
            &[("x-ratelimit-remaining", "4999")],
            r#"{"message":"Resource not accessible by integration"}"#,
        );
        assert_eq!(permission, Outcome::ClientError { status: 403 });
        assert!(!permission.is_retryable() && !permission.is_breaker_failure());
        assert_eq!(
            classify(
                gh,
                429,
                &[
                    ("x-ratelimit-remaining", "0"),
                    ("x-ratelimit-reset", "1800000005")
                ],
                ""
            ),
            throttle(429, Some(5))
        );
        // GraphQL's primary limit, answered 200: a throttle until the
        // reset; the last point spent is a success, and a 200 with budget
        // left is not even read.
        let exhausted = [
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1800000007"),
            ("x-ratelimit-resource", "graphql"),
        ];
        let limited = r#"{"errors":[{"type":"RATE_LIMITED","message":"API rate limit exceeded for user ID 1."}]}"#;
        assert_eq!(
            classify(gh, 200, &exhausted, limited),
            throttle(200, Some(7))
        );
        assert_eq!(
            classify(gh, 200, &exhausted, r#"{"data":{"viewer":{"login":"o"}}}"#),
            Outcome::Success
        );
        assert!(!gh.reads_body(StatusCode::OK, &http::HeaderMap::new()));
        // The generic reading of the same 403: the client's.
        assert_eq!(
            classify(Dialect::Generic, 403, &[("x-ratelimit-remaining", "0")], ""),
            Outcome::ClientError { status: 403 }
        );
    }

    /// R-PD3, OpenAI: `insufficient_quota` and a request larger than the
    /// budget are not throttles (passed at once, no retry, no cut); any
    /// other `429` is.
    #[test]
    fn openai_429s_that_no_wait_fixes() {
        let quota = classify(
            Dialect::OpenAi,
            429,
            &[],
            r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
        );
        assert_eq!(quota, Outcome::ClientError { status: 429 });
        assert!(!quota.is_retryable() && !quota.is_breaker_failure());
        let large = classify(
            Dialect::OpenAi,
            429,
            &[],
            r#"{"error":{"message":"Request too large for gpt-4o on tokens per min (TPM): Limit 30000, Requested 30601."}}"#,
        );
        assert_eq!(large, Outcome::ClientError { status: 429 });
        let tpm = classify(
            Dialect::OpenAi,
            429,
            &[("retry-after-ms", "1500")],
            r#"{"error":{"message":"Rate limit reached for gpt-4o on tokens per min","type":"tokens","code":"rate_limit_exceeded"}}"#,
        );
        assert_eq!(
            tpm,
            Outcome::Throttled {
                status: 429,
                retry_after: Some(Duration::from_millis(1500))
            }
        );
    }

    /// R-PD3, Anthropic: `529` is the provider's capacity — weighed by the
    /// controller as a bare `503` is, never a hold; retried.
    #[test]
    fn anthropic_529_is_capacity() {
        let o = classify(
            Dialect::Anthropic,
            529,
            &[],
            r#"{"type":"error","error":{"type":"overloaded_error"}}"#,
        );
        assert_eq!(o, Outcome::Overloaded { status: 529 });
        assert_eq!(
            o.signal(),
            super::super::Signal::Ambiguous { timeout: false }
        );
        assert!(o.is_retryable());
        assert_eq!(o.retry_after(), None);
    }

    /// R-PD3, Google and Salesforce: throttles in the body.
    #[test]
    fn google_and_salesforce_throttles_in_the_body() {
        let retry_info = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[
            {"@type":"type.googleapis.com/google.rpc.QuotaFailure"},
            {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay": "53s"}]}}"#;
        assert_eq!(
            classify(Dialect::Google, 429, &[], retry_info),
            throttle(429, Some(53))
        );
        let old = r#"{"error":{"errors":[{"domain":"usageLimits","reason":"userRateLimitExceeded"}],"code":403}}"#;
        assert_eq!(
            classify(Dialect::Google, 403, &[], old),
            throttle(403, None)
        );
        let denied = r#"{"error":{"code":403,"status":"PERMISSION_DENIED"}}"#;
        assert_eq!(
            classify(Dialect::Google, 403, &[], denied),
            Outcome::ClientError { status: 403 }
        );
        let sf =
            r#"[{"message":"TotalRequests Limit exceeded.","errorCode":"REQUEST_LIMIT_EXCEEDED"}]"#;
        assert_eq!(
            classify(Dialect::Salesforce, 403, &[], sf),
            throttle(403, None)
        );
        assert_eq!(
            google_retry_delay(Some(r#""retryDelay":"1.5s""#)),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(google_retry_delay(Some(r#""retryDelay": 5"#)), None);
    }

    proptest::proptest! {
        /// Any body, any dialect: an outcome, never a panic.
        #[test]
        fn never_panics(status in 100u16..600, body in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let status = StatusCode::from_u16(status).unwrap();
            for (_, d) in Dialect::ALL {
                let _ = d.classify(status, &http::HeaderMap::new(), Some(&body), SystemTime::UNIX_EPOCH);
            }
        }
    }
}
