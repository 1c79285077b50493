//! Quotas providers advertise in their responses (R-SG1), parsed once.
//!
//! Two header families are in use:
//!
//! * the IETF httpapi draft's: the structured-field form
//!   `RateLimit-Policy: "hour";q=5000;w=3600` with `RateLimit:
//!   "hour";r=4210;t=1733` (later drafts), the one-header form `RateLimit:
//!   limit=100, remaining=50, reset=30` with `RateLimit-Policy: 100;w=60`
//!   (earlier drafts), and the separate `RateLimit-Limit`,
//!   `RateLimit-Remaining`, `RateLimit-Reset` (delta seconds);
//! * the widespread `X-RateLimit-Limit`, `-Remaining`, `-Reset` (GitHub and
//!   many SaaS APIs), whose reset is delta seconds or a Unix time — told
//!   apart by size: no window lasts 30 years, no Unix time now is that
//!   small — or any other form providers write a reset in
//!   ([`formats::reset`]), and `X-RateLimit-Reset-After` (delta seconds).
//!
//! A header that is present but unreadable is reported as malformed and
//! trusted for nothing; a response without either family advertises
//! nothing. What a provider advertises is a claim: the pacer follows it
//! only within the owner's ceiling, and keeps learning from what the
//! provider does (a provider may advertise more than it allows).

use std::time::{Duration, SystemTime};

use http::HeaderMap;

use crate::classify::{formats, Dialect};

/// The longest window or reset believed (a day, like `Retry-After`).
pub const MAX_BELIEVED: Duration = crate::classify::retry_after::MAX_BELIEVED;

/// A quota as one response advertised it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Advertised {
    /// Requests allowed per window (the policy), if stated.
    pub limit: Option<u64>,
    /// The window, if stated.
    pub window: Option<Duration>,
    /// Requests left in the current window.
    pub remaining: u64,
    /// Until the window resets (the quota is whole again).
    pub reset: Duration,
    /// How coarse `reset` is: a second when the header carried whole
    /// seconds (the true reset may be up to that much earlier).
    pub granularity: Duration,
    /// Which family said so.
    pub family: Family,
}

/// Which header family a quota came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `RateLimit` / `RateLimit-Policy` (IETF httpapi draft, any version).
    Ietf,
    /// `X-RateLimit-*`.
    XRateLimit,
    /// None advertised: a fixed window learned from the provider's
    /// `Retry-After`s.
    Learned,
    /// A budget that refills continuously (R-PD1): a leaky bucket
    /// (Shopify's `X-Shopify-Shop-Api-Call-Limit: 32/40`, draining 2 a
    /// second) or a rolling allowance (Salesforce's `Sforce-Limit-Info:
    /// api-usage=18/5000` over 24 hours). `remaining` can be spent at once,
    /// `limit / window` is the refill rate, `reset` is until it is whole
    /// again — there is no window's end to spend it by.
    Bucket,
}

impl Family {
    /// The label in metrics and the readout.
    pub fn label(self) -> &'static str {
        match self {
            Family::Ietf => "ratelimit",
            Family::XRateLimit => "x-ratelimit",
            Family::Learned => "learned_window",
            Family::Bucket => "bucket",
        }
    }
}

/// Quota headers were present but could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed(pub Family);

impl Advertised {
    /// The rate that spends what remains evenly until the reset — never
    /// above the policy's own rate (`limit / window`) when stated. `None`
    /// when nothing remains (hold until the reset).
    pub fn even_rate(&self) -> Option<f64> {
        if self.remaining == 0 {
            return None;
        }
        let policy = self.policy_rate();
        if self.reset.is_zero() {
            // The window is resetting now: a whole window ahead, at the
            // policy's rate, or what remains per second.
            return Some(policy.unwrap_or(self.remaining as f64));
        }
        let rate = self.remaining as f64 / self.reset.as_secs_f64();
        Some(policy.map_or(rate, |p| rate.min(p)))
    }

    /// `limit / window`, when both are stated.
    pub fn policy_rate(&self) -> Option<f64> {
        match (self.limit, self.window) {
            (Some(l), Some(w)) if !w.is_zero() => Some(l as f64 / w.as_secs_f64()),
            _ => None,
        }
    }
}

/// The quota a response of a provider speaking `dialect` advertises
/// (R-PD2): its own headers where it has them (Shopify's call limit,
/// Salesforce's daily usage), else the generic families.
pub fn advertised_by(
    dialect: Dialect,
    headers: &HeaderMap,
    now_wall: SystemTime,
) -> Result<Option<Advertised>, Malformed> {
    let own = match dialect {
        Dialect::Shopify => shopify(headers),
        Dialect::Salesforce => salesforce(headers),
        Dialect::OpenAi | Dialect::Anthropic => llm(dialect, headers, "requests", now_wall),
        _ => Ok(None),
    };
    match own? {
        Some(a) => Ok(Some(a)),
        None => advertised(headers, now_wall),
    }
}

/// The tokens budget a response of an LLM provider tells (R-PD1, R-PD5):
/// OpenAI's `x-ratelimit-*-tokens`, Anthropic's
/// `anthropic-ratelimit-tokens-*` (or, where only the input and output
/// budgets are told, the input one). `None` for other dialects, or when
/// not told or unreadable.
pub fn tokens_by(
    dialect: Dialect,
    headers: &HeaderMap,
    now_wall: SystemTime,
) -> Option<Advertised> {
    match dialect {
        Dialect::OpenAi => llm(dialect, headers, "tokens", now_wall).ok().flatten(),
        Dialect::Anthropic => llm(dialect, headers, "tokens", now_wall)
            .ok()
            .flatten()
            .or_else(|| {
                llm(dialect, headers, "input-tokens", now_wall)
                    .ok()
                    .flatten()
            }),
        _ => None,
    }
}

/// An LLM provider's budget of `unit` (`requests`, `tokens`): a bucket
/// that refills continuously, its reset the time until it is whole again
/// — a Go duration at OpenAI (`6m0s`, `12ms`), an RFC 3339 time at
/// Anthropic. The budgets are per minute (or per day); which is read from
/// how long the part spent takes to refill: `reset × limit / spent`.
fn llm(
    dialect: Dialect,
    headers: &HeaderMap,
    unit: &str,
    now_wall: SystemTime,
) -> Result<Option<Advertised>, Malformed> {
    let name = |field: &str| match dialect {
        Dialect::Anthropic => format!("anthropic-ratelimit-{unit}-{field}"),
        _ => format!("x-ratelimit-{field}-{unit}"),
    };
    let (limit, remaining, reset) = (
        text(headers, &name("limit")),
        text(headers, &name("remaining")),
        text(headers, &name("reset")),
    );
    let (Some(limit), Some(remaining)) = (limit, remaining) else {
        return Ok(None);
    };
    let bad = Malformed(Family::Bucket);
    let limit = formats::count(limit).filter(|l| *l > 0).ok_or(bad)?;
    let remaining = formats::count(remaining).ok_or(bad)?.min(limit);
    let reset = match reset {
        Some(r) => formats::reset(r, now_wall).ok_or(bad)?,
        None => Duration::ZERO,
    };
    let spent = limit - remaining;
    let minute = Duration::from_secs(60);
    let window = if spent == 0 || reset.is_zero() {
        minute
    } else {
        reset
            .mul_f64(limit as f64 / spent as f64)
            .clamp(Duration::from_secs(1), MAX_BELIEVED)
    };
    Ok(Some(Advertised {
        limit: Some(limit),
        window: Some(window),
        remaining,
        reset,
        granularity: Duration::ZERO,
        family: Family::Bucket,
    }))
}

/// A used/size pair (`32/40`, `api-usage=18/5000`'s value).
fn used_of(v: &str) -> Option<(u64, u64)> {
    let (used, size) = v.trim().split_once('/')?;
    let (used, size) = (formats::count(used)?, formats::count(size)?);
    (size > 0).then_some((used.min(size), size))
}

/// Shopify's REST call limit: `X-Shopify-Shop-Api-Call-Limit: 32/40`, a
/// leaky bucket that drains a twentieth of its size a second (40 at 2/s,
/// Plus's 400 at 20/s — "REST Admin API rate limits").
fn shopify(headers: &HeaderMap) -> Result<Option<Advertised>, Malformed> {
    let Some(v) = text(headers, "x-shopify-shop-api-call-limit") else {
        return Ok(None);
    };
    let (used, size) = used_of(v).ok_or(Malformed(Family::Bucket))?;
    Ok(Some(refilling(used, size, Duration::from_secs(20))))
}

/// A bucket of `size` with `used` spent, whole again after a `window` from
/// empty: refilled at `size / window`.
fn refilling(used: u64, size: u64, window: Duration) -> Advertised {
    Advertised {
        limit: Some(size),
        window: Some(window),
        remaining: size - used,
        reset: window.mul_f64(used as f64 / size as f64),
        granularity: Duration::ZERO,
        family: Family::Bucket,
    }
}

/// Salesforce's `Sforce-Limit-Info: api-usage=18/5000`: API requests in
/// the last 24 hours, a rolling allowance ("API Request Limits and
/// Allocations").
fn salesforce(headers: &HeaderMap) -> Result<Option<Advertised>, Malformed> {
    let Some(v) = text(headers, "sforce-limit-info") else {
        return Ok(None);
    };
    let usage = v
        .split(',')
        .find_map(|p| p.trim().strip_prefix("api-usage="))
        .and_then(used_of)
        .ok_or(Malformed(Family::Bucket))?;
    let (used, size) = usage;
    Ok(Some(refilling(used, size, Duration::from_secs(24 * 3600))))
}

/// The quota a response advertises: `Ok(None)` when it advertises none.
pub fn advertised(
    headers: &HeaderMap,
    now_wall: SystemTime,
) -> Result<Option<Advertised>, Malformed> {
    // Most answers carry neither family: one pass over the names decides,
    // instead of a dozen look-ups by name (each parsing the name).
    let any = headers.keys().any(|k| {
        let k = k.as_str();
        k.starts_with("ratelimit") || k.starts_with("x-ratelimit")
    });
    if !any {
        return Ok(None);
    }
    if let Some(a) = ietf(headers, now_wall)? {
        return Ok(Some(a));
    }
    x_ratelimit(headers, now_wall)
}

fn text<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn present(headers: &HeaderMap, names: &[&str]) -> bool {
    names.iter().any(|n| headers.contains_key(*n))
}

/// One parameter (`q=100`) of a structured-field item or a `k=v` list.
fn param<'a>(item: &'a str, key: &str) -> Option<&'a str> {
    item.split([';', ','])
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(key))
        .map(|(_, v)| v.trim())
}

/// The IETF family, any draft.
fn ietf(headers: &HeaderMap, now_wall: SystemTime) -> Result<Option<Advertised>, Malformed> {
    let names = [
        "ratelimit",
        "ratelimit-policy",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
    ];
    if !present(headers, &names) {
        return Ok(None);
    }
    let bad = Malformed(Family::Ietf);
    let policy = text(headers, "ratelimit-policy");
    let (limit, window) = policy.map(ietf_policy).transpose()?.flatten().unzip();
    // Remaining and reset: `RateLimit: "name";r=50;t=30` (structured),
    // `RateLimit: limit=100, remaining=50, reset=30`, or the separate
    // headers.
    let (remaining, reset, stated_limit) = match text(headers, "ratelimit") {
        Some(v) => {
            let r = param(v, "r").or_else(|| param(v, "remaining"));
            let t = param(v, "t").or_else(|| param(v, "reset"));
            let l = param(v, "limit")
                .map(|l| formats::count(l).ok_or(bad))
                .transpose()?;
            (
                r.map(|r| formats::count(r).ok_or(bad)).transpose()?,
                t.map(|t| formats::delta_seconds(t).ok_or(bad))
                    .transpose()?,
                l,
            )
        }
        None => (
            text(headers, "ratelimit-remaining")
                .map(|r| formats::count(r).ok_or(bad))
                .transpose()?,
            text(headers, "ratelimit-reset")
                .map(|t| formats::delta_seconds(t).ok_or(bad))
                .transpose()?,
            text(headers, "ratelimit-limit")
                .map(|l| formats::count(l.split([',', ';']).next().unwrap_or("")).ok_or(bad))
                .transpose()?,
        ),
    };
    let _ = now_wall;
    match (remaining, reset) {
        (Some(remaining), Some(reset)) => Ok(Some(Advertised {
            granularity: Duration::from_secs(1),
            limit: limit.or(stated_limit),
            // Without a policy, the window is at least the time to reset.
            window,
            remaining,
            reset,
            family: Family::Ietf,
        })),
        // A policy alone says what is allowed, not where we are: nothing to
        // pace to yet.
        (None, None) if policy.is_some() => Ok(None),
        _ => Err(bad),
    }
}

/// An IETF quota policy: `"name";q=100;w=60` (structured) or `100;w=60`
/// (earlier drafts); of several, the most restrictive rate — its quota and
/// window.
fn ietf_policy(p: &str) -> Result<Option<(u64, Duration)>, Malformed> {
    let bad = Malformed(Family::Ietf);
    let mut best: Option<(u64, Duration)> = None;
    for item in split_list(p) {
        let q = param(item, "q").or_else(|| {
            item.split(';')
                .next()
                .filter(|f| formats::count(f).is_some())
        });
        let w = param(item, "w");
        let (Some(q), Some(w)) = (
            q.and_then(formats::count),
            w.and_then(formats::delta_seconds),
        ) else {
            return Err(bad);
        };
        if w.is_zero() {
            return Err(bad);
        }
        let rate = q as f64 / w.as_secs_f64();
        if best.is_none_or(|(bq, bw)| rate < bq as f64 / bw.as_secs_f64()) {
            best = Some((q, w));
        }
    }
    Ok(best)
}

/// Splits a structured-field list on commas outside quotes.
fn split_list(v: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in v.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(v[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(v[start..].trim());
    out.retain(|s| !s.is_empty());
    out
}

/// `X-RateLimit-*`.
fn x_ratelimit(headers: &HeaderMap, now_wall: SystemTime) -> Result<Option<Advertised>, Malformed> {
    let names = [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-ratelimit-reset-after",
    ];
    if !present(headers, &names) {
        return Ok(None);
    }
    let bad = Malformed(Family::XRateLimit);
    let limit = text(headers, "x-ratelimit-limit")
        .map(|l| formats::count(l).ok_or(bad))
        .transpose()?;
    let remaining = text(headers, "x-ratelimit-remaining")
        .map(|r| formats::count(r).ok_or(bad))
        .transpose()?;
    let (reset, whole) = match (
        text(headers, "x-ratelimit-reset-after"),
        text(headers, "x-ratelimit-reset"),
    ) {
        (Some(after), _) => (
            Some(formats::delta_seconds(after).ok_or(bad)?),
            !after.contains('.'),
        ),
        (None, Some(at)) => (
            Some(formats::reset(at, now_wall).ok_or(bad)?),
            !at.contains('.'),
        ),
        (None, None) => (None, false),
    };
    match (remaining, reset) {
        (Some(remaining), Some(reset)) => Ok(Some(Advertised {
            granularity: if whole {
                Duration::from_secs(1)
            } else {
                Duration::ZERO
            },
            limit,
            window: None,
            remaining,
            reset,
            family: Family::XRateLimit,
        })),
        _ => Err(bad),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn now() -> SystemTime {
        std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    fn parse(pairs: &[(&str, &str)]) -> Result<Option<Advertised>, Malformed> {
        advertised(&headers(pairs), now())
    }

    /// R-PD2: Shopify's call limit and Salesforce's daily usage, read by
    /// their dialects as budgets that refill; the generic families still
    /// read for every other dialect, and these headers mean nothing to
    /// them.
    #[test]
    fn shopify_and_salesforce_budgets() {
        let read = |d: Dialect, pairs: &[(&str, &str)]| advertised_by(d, &headers(pairs), now());
        let a = read(
            Dialect::Shopify,
            &[("x-shopify-shop-api-call-limit", "32/40")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(a.family, Family::Bucket);
        assert_eq!((a.limit, a.remaining), (Some(40), 8));
        assert_eq!(a.policy_rate(), Some(2.0));
        assert_eq!(a.reset, Duration::from_secs(16));
        let plus = read(
            Dialect::Shopify,
            &[("x-shopify-shop-api-call-limit", "1/400")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(plus.policy_rate(), Some(20.0));
        let sf = read(
            Dialect::Salesforce,
            &[("sforce-limit-info", "api-usage=18/5000")],
        )
        .unwrap()
        .unwrap();
        assert_eq!((sf.limit, sf.remaining), (Some(5000), 4982));
        assert_eq!(sf.window, Some(Duration::from_secs(86_400)));
        assert!(read(
            Dialect::Shopify,
            &[("x-shopify-shop-api-call-limit", "x/40")]
        )
        .is_err());
        assert!(read(
            Dialect::Shopify,
            &[("x-shopify-shop-api-call-limit", "3/0")]
        )
        .is_err());
        assert_eq!(
            read(
                Dialect::Generic,
                &[("x-shopify-shop-api-call-limit", "32/40")]
            ),
            Ok(None)
        );
        let generic = read(
            Dialect::Shopify,
            &[
                ("x-ratelimit-remaining", "996.0"),
                ("x-ratelimit-reset", "432"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(generic.remaining, 996);
    }

    /// R-PD1: OpenAI's and Anthropic's requests and tokens budgets, each a
    /// bucket refilling per minute (read from how long the part spent
    /// takes to refill), their resets a Go duration and an RFC 3339 time.
    #[test]
    fn llm_requests_and_tokens_budgets() {
        let openai = headers(&[
            ("x-ratelimit-limit-requests", "1200"),
            ("x-ratelimit-remaining-requests", "1199"),
            ("x-ratelimit-reset-requests", "50ms"),
            ("x-ratelimit-limit-tokens", "120000"),
            ("x-ratelimit-remaining-tokens", "119400"),
            ("x-ratelimit-reset-tokens", "300ms"),
        ]);
        let r = advertised_by(Dialect::OpenAi, &openai, now())
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.limit, r.remaining, r.family),
            (Some(1200), 1199, Family::Bucket)
        );
        assert!((r.policy_rate().unwrap() - 20.0).abs() < 1e-6, "{r:?}");
        let t = tokens_by(Dialect::OpenAi, &openai, now()).unwrap();
        assert_eq!((t.limit, t.remaining), (Some(120_000), 119_400));
        assert!((t.policy_rate().unwrap() - 2000.0).abs() < 1e-6, "{t:?}");
        let per_day = headers(&[
            ("x-ratelimit-limit-requests", "10000"),
            ("x-ratelimit-remaining-requests", "9000"),
            ("x-ratelimit-reset-requests", "2h24m0s"),
        ]);
        let d = advertised_by(Dialect::OpenAi, &per_day, now())
            .unwrap()
            .unwrap();
        assert_eq!(
            d.window,
            Some(Duration::from_secs(86_400)),
            "a daily budget"
        );
        // 1,800,000,002: two seconds after `now()`.
        let at = "2027-01-15T08:00:02Z";
        let anthropic = headers(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("anthropic-ratelimit-requests-reset", at),
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "39000"),
            ("anthropic-ratelimit-input-tokens-reset", at),
        ]);
        let r = advertised_by(Dialect::Anthropic, &anthropic, now())
            .unwrap()
            .unwrap();
        assert_eq!((r.limit, r.remaining), (Some(50), 49));
        let t = tokens_by(Dialect::Anthropic, &anthropic, now()).unwrap();
        assert_eq!((t.limit, t.remaining), (Some(40_000), 39_000));
        assert_eq!(tokens_by(Dialect::Generic, &openai, now()), None);
        assert!(advertised_by(
            Dialect::OpenAi,
            &headers(&[
                ("x-ratelimit-limit-requests", "x"),
                ("x-ratelimit-remaining-requests", "1")
            ]),
            now()
        )
        .is_err());
    }

    /// Found by fuzzing (`fuzz/fuzz_targets/quota_headers.rs`): a Unix-time
    /// reset past what `SystemTime` holds panicked the request's task. It
    /// is as far off as anything believed now, never a panic.
    #[test]
    fn a_reset_beyond_any_clock_is_the_longest_believed() {
        for reset in ["180000800000003000070", "1e300", "18446744073709551616"] {
            let a = parse(&[
                ("x-ratelimit-limit", "100"),
                ("x-ratelimit-remaining", "42"),
                ("x-ratelimit-reset", reset),
            ])
            .unwrap()
            .unwrap();
            assert_eq!(a.reset, MAX_BELIEVED, "{reset}");
        }
    }

    #[test]
    fn structured_draft() {
        let a = parse(&[
            (
                "RateLimit-Policy",
                "\"burst\";q=100;w=60, \"day\";q=1000;w=86400",
            ),
            ("RateLimit", "\"day\";r=420;t=3600"),
        ])
        .unwrap()
        .unwrap();
        // The most restrictive policy: 1000 a day.
        assert_eq!(
            (a.limit, a.window),
            (Some(1000), Some(Duration::from_secs(86400)))
        );
        assert_eq!((a.remaining, a.reset), (420, Duration::from_secs(3600)));
        assert_eq!(a.family, Family::Ietf);
    }

    #[test]
    fn earlier_drafts() {
        let a = parse(&[
            ("RateLimit", "limit=100, remaining=50, reset=30"),
            ("RateLimit-Policy", "100;w=60"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (a.limit, a.window, a.remaining),
            (Some(100), Some(Duration::from_secs(60)), 50)
        );
        assert_eq!(a.reset, Duration::from_secs(30));
        let a = parse(&[
            ("RateLimit-Limit", "10"),
            ("RateLimit-Remaining", "3"),
            ("RateLimit-Reset", "1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (a.limit, a.window, a.remaining, a.reset),
            (Some(10), None, 3, Duration::from_secs(1))
        );
    }

    #[test]
    fn x_ratelimit_with_delta_or_unix_reset() {
        let a = parse(&[
            ("X-RateLimit-Limit", "5000"),
            ("X-RateLimit-Remaining", "4999"),
            ("X-RateLimit-Reset", "1800003600"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (a.limit, a.remaining, a.reset),
            (Some(5000), 4999, Duration::from_secs(3600))
        );
        assert_eq!(a.family, Family::XRateLimit);
        let a = parse(&[("X-RateLimit-Remaining", "7"), ("X-RateLimit-Reset", "12")])
            .unwrap()
            .unwrap();
        assert_eq!(
            (a.limit, a.remaining, a.reset),
            (None, 7, Duration::from_secs(12))
        );
        let a = parse(&[
            ("X-RateLimit-Remaining", "7"),
            ("X-RateLimit-Reset-After", "1.5"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(a.reset, Duration::from_millis(1500));
        // A Unix time in the past: the window has reset.
        let a = parse(&[
            ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", "1700000000"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(a.reset, Duration::ZERO);
    }

    /// R-PD4: Reddit's float remaining (`996.0`, reset in seconds), Jira's
    /// ISO 8601 reset time and a Go-duration reset are read, not refused
    /// as malformed.
    #[test]
    fn floats_and_every_reset_format_are_read() {
        let reddit = parse(&[
            ("x-ratelimit-used", "4"),
            ("x-ratelimit-remaining", "996.0"),
            ("x-ratelimit-reset", "432"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (reddit.remaining, reddit.reset),
            (996, Duration::from_secs(432))
        );
        // 1_800_000_000 is 2027-01-15T08:00:00Z.
        let jira = parse(&[
            ("X-RateLimit-Limit", "100"),
            ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", "2027-01-15T08:01Z"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(jira.reset, Duration::from_secs(60));
        let go = parse(&[
            ("X-RateLimit-Remaining", "3"),
            ("X-RateLimit-Reset", "1m30s"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(go.reset, Duration::from_secs(90));
    }

    #[test]
    fn nothing_advertised_and_malformed_values() {
        assert_eq!(parse(&[("Content-Type", "text/plain")]), Ok(None));
        assert_eq!(
            parse(&[("RateLimit-Policy", "10;w=1")]),
            Ok(None),
            "a policy alone"
        );
        for bad in [
            vec![("X-RateLimit-Remaining", "-1"), ("X-RateLimit-Reset", "10")],
            vec![
                ("X-RateLimit-Remaining", "lots"),
                ("X-RateLimit-Reset", "10"),
            ],
            vec![("X-RateLimit-Remaining", "5")],
            vec![
                ("X-RateLimit-Remaining", "5"),
                ("X-RateLimit-Reset", "soon"),
            ],
            vec![
                ("X-RateLimit-Limit", "1e3"),
                ("X-RateLimit-Remaining", "5"),
                ("X-RateLimit-Reset", "1"),
            ],
        ] {
            assert_eq!(parse(&bad), Err(Malformed(Family::XRateLimit)), "{bad:?}");
        }
        for bad in [
            vec![("RateLimit", "\"d\";r=x;t=1")],
            vec![
                ("RateLimit-Policy", "\"d\";q=10;w=0"),
                ("RateLimit", "\"d\";r=1;t=1"),
            ],
            vec![
                ("RateLimit-Policy", "\"d\";q=10"),
                ("RateLimit", "\"d\";r=1;t=1"),
            ],
            vec![("RateLimit-Remaining", "3")],
        ] {
            assert_eq!(parse(&bad), Err(Malformed(Family::Ietf)), "{bad:?}");
        }
    }

    #[test]
    fn even_rate_spends_what_remains_until_the_reset() {
        let a = Advertised {
            limit: Some(5000),
            window: Some(Duration::from_secs(3600)),
            remaining: 3600,
            reset: Duration::from_secs(1800),
            granularity: Duration::from_secs(1),
            family: Family::XRateLimit,
        };
        // 3600 left over 1800 s is 2/s, but the policy's own rate is
        // 5000/3600 = 1.39/s: not above it.
        assert!((a.even_rate().unwrap() - 5000.0 / 3600.0).abs() < 1e-9);
        let a = Advertised {
            remaining: 100,
            ..a
        };
        assert!((a.even_rate().unwrap() - 100.0 / 1800.0).abs() < 1e-9);
        assert_eq!(Advertised { remaining: 0, ..a }.even_rate(), None);
        let a = Advertised {
            limit: None,
            window: None,
            remaining: 30,
            reset: Duration::ZERO,
            granularity: Duration::ZERO,
            family: Family::XRateLimit,
        };
        assert_eq!(a.even_rate(), Some(30.0), "a reset that has come");
    }

    proptest::proptest! {
        /// Any header values: a verdict, never a panic.
        #[test]
        fn any_values_are_handled(
            limit in ".{0,12}", remaining in ".{0,12}", reset in ".{0,16}", policy in ".{0,40}",
        ) {
            let mut h = HeaderMap::new();
            for (k, v) in [
                ("x-ratelimit-limit", &limit),
                ("x-ratelimit-remaining", &remaining),
                ("x-ratelimit-reset", &reset),
                ("ratelimit-policy", &policy),
                ("ratelimit", &remaining),
            ] {
                if let Ok(v) = v.parse() {
                    h.insert(k, v);
                }
            }
            let _ = advertised(&h, now());
        }
    }
}
