//! Providers whose budgets speak a dialect of their own, each written from
//! its documentation — not from sluice's code — as a [`Model`] for the
//! simulator ([`crate::sim::Sim::start_model`]):
//!
//! * [`Shopify`] — "REST Admin API rate limits": a leaky bucket per app
//!   and store, 40 requests draining 2 a second; every answer says
//!   `X-Shopify-Shop-Api-Call-Limit: {used}/40`; over it, `429` with
//!   `Retry-After: 2.0`.
//! * [`Salesforce`] — "API Request Limits and Allocations": a rolling
//!   allowance of API requests over 24 hours, told in every answer as
//!   `Sforce-Limit-Info: api-usage={used}/{limit}`; over it, `403` with
//!   `REQUEST_LIMIT_EXCEEDED`.
//! * [`Reddit`] — the Data API wiki: requests per client id counted in
//!   fixed, clock-aligned periods, told as `X-Ratelimit-Used`,
//!   `X-Ratelimit-Remaining` (a float, `996.0`) and `X-Ratelimit-Reset`
//!   (seconds to the period's end); over it, `429`.
//! * [`Google`] — Google APIs' error model (`google.rpc.Status`): no
//!   headers; over a quota, `429 RESOURCE_EXHAUSTED` whose details carry
//!   `QuotaFailure` and `RetryInfo { retryDelay: "1.234s" }`.
//!
//! Each keeps every request's verdict with its arrival time.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::sim::{Model, ModelAnswer};

/// One request as a model judged it.
#[derive(Debug, Clone, Copy)]
pub struct Judged {
    /// When it arrived.
    pub at: Instant,
    /// Whether it was served.
    pub served: bool,
}

/// Served and refused among `judged` arriving in `[from, to)`.
pub fn seen(judged: &[Judged], from: Instant, to: Instant) -> (usize, usize) {
    let of: Vec<_> = judged
        .iter()
        .filter(|j| j.at >= from && j.at < to)
        .collect();
    let served = of.iter().filter(|j| j.served).count();
    (served, of.len() - served)
}

/// Shopify's REST Admin API.
#[derive(Debug)]
pub struct Shopify {
    size: f64,
    leak: f64,
    level: f64,
    at: Option<Instant>,
    /// Every request.
    pub judged: Vec<Judged>,
}

impl Shopify {
    /// A bucket of `size` draining `leak` a second, `used` already in it
    /// (an app busy just before).
    pub fn new(size: u64, leak: f64, used: u64) -> Shopify {
        Shopify {
            size: size as f64,
            leak,
            level: used as f64,
            at: None,
            judged: Vec::new(),
        }
    }
}

impl Model for Shopify {
    fn answer(
        &mut self,
        _: &http::Method,
        _: &str,
        _: &[u8],
        _: usize,
        now: Instant,
    ) -> ModelAnswer {
        if let Some(at) = self.at {
            self.level = (self.level - (now - at).as_secs_f64() * self.leak).max(0.0);
        }
        self.at = Some(now);
        let served = self.level + 1.0 <= self.size;
        if served {
            self.level += 1.0;
        }
        self.judged.push(Judged { at: now, served });
        let mut headers = vec![(
            "x-shopify-shop-api-call-limit",
            format!("{}/{}", self.level.ceil() as u64, self.size as u64),
        )];
        if served {
            return (200, headers, r#"{"products":[]}"#.into());
        }
        headers.push(("retry-after", "2.0".into()));
        (
            429,
            headers,
            r#"{"errors":"Exceeded 2 calls per second for api client. Reduce request rates to resume uninterrupted service."}"#.into(),
        )
    }
}

/// Salesforce's REST API.
#[derive(Debug)]
pub struct Salesforce {
    limit: u64,
    window: Duration,
    recent: VecDeque<Instant>,
    /// Every request.
    pub judged: Vec<Judged>,
}

impl Salesforce {
    /// `limit` requests in any `window` (24 hours at Salesforce).
    pub fn new(limit: u64, window: Duration) -> Salesforce {
        Salesforce {
            limit,
            window,
            recent: VecDeque::new(),
            judged: Vec::new(),
        }
    }
}

impl Model for Salesforce {
    fn answer(
        &mut self,
        _: &http::Method,
        _: &str,
        _: &[u8],
        _: usize,
        now: Instant,
    ) -> ModelAnswer {
        while self.recent.front().is_some_and(|t| now - *t >= self.window) {
            self.recent.pop_front();
        }
        let served = (self.recent.len() as u64) < self.limit;
        if served {
            self.recent.push_back(now);
        }
        self.judged.push(Judged { at: now, served });
        let headers = vec![(
            "sforce-limit-info",
            format!("api-usage={}/{}", self.recent.len(), self.limit),
        )];
        if served {
            (
                200,
                headers,
                r#"{"totalSize":0,"done":true,"records":[]}"#.into(),
            )
        } else {
            (
                403,
                headers,
                r#"[{"message":"TotalRequests Limit exceeded.","errorCode":"REQUEST_LIMIT_EXCEEDED"}]"#.into(),
            )
        }
    }
}

/// Reddit's Data API.
#[derive(Debug)]
pub struct Reddit {
    limit: u64,
    period: Duration,
    current: Option<(u64, u64)>,
    /// Every request.
    pub judged: Vec<Judged>,
}

impl Reddit {
    /// `limit` requests in each clock-aligned `period` (whole seconds).
    pub fn new(limit: u64, period: Duration) -> Reddit {
        Reddit {
            limit,
            period,
            current: None,
            judged: Vec::new(),
        }
    }
}

impl Model for Reddit {
    fn answer(
        &mut self,
        _: &http::Method,
        _: &str,
        _: &[u8],
        _: usize,
        now: Instant,
    ) -> ModelAnswer {
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let period_ms = self.period.as_millis() as u64;
        let number = wall.as_millis() as u64 / period_ms;
        let used = match self.current {
            Some((n, used)) if n == number => used,
            _ => 0,
        };
        let served = used < self.limit;
        let used = used + u64::from(served);
        self.current = Some((number, used));
        self.judged.push(Judged { at: now, served });
        let ends = Duration::from_millis((number + 1) * period_ms);
        let reset = (ends - wall).as_secs() + u64::from((ends - wall).subsec_nanos() > 0);
        let headers = vec![
            ("x-ratelimit-used", used.to_string()),
            (
                "x-ratelimit-remaining",
                format!("{:.1}", (self.limit - used) as f64),
            ),
            ("x-ratelimit-reset", reset.to_string()),
        ];
        if served {
            (
                200,
                headers,
                r#"{"kind":"Listing","data":{"children":[]}}"#.into(),
            )
        } else {
            (
                429,
                headers,
                r#"{"message": "Too Many Requests", "error": 429}"#.into(),
            )
        }
    }
}

/// A Google API.
#[derive(Debug)]
pub struct Google {
    limit: u64,
    window: Duration,
    current: Option<(Instant, u64)>,
    /// Every request, and the delay each refusal told.
    pub judged: Vec<(Judged, Option<Duration>)>,
}

impl Google {
    /// `limit` requests per `window`, windows from the first request.
    pub fn new(limit: u64, window: Duration) -> Google {
        Google {
            limit,
            window,
            current: None,
            judged: Vec::new(),
        }
    }
}

impl Model for Google {
    fn answer(
        &mut self,
        _: &http::Method,
        _: &str,
        _: &[u8],
        _: usize,
        now: Instant,
    ) -> ModelAnswer {
        let (began, used) = match self.current {
            Some((began, used)) if now < began + self.window => (began, used),
            _ => (now, 0),
        };
        let served = used < self.limit;
        self.current = Some((began, used + u64::from(served)));
        if served {
            self.judged.push((Judged { at: now, served }, None));
            return (200, vec![], r#"{"values":[]}"#.into());
        }
        let delay = began + self.window - now;
        self.judged.push((Judged { at: now, served }, Some(delay)));
        let body = format!(
            r#"{{"error":{{"code":429,"message":"Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute per user'.","status":"RESOURCE_EXHAUSTED","details":[{{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{{"subject":"project:1","description":"Read requests per minute per user"}}]}},{{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"{:.3}s"}}]}}}}"#,
            delay.as_secs_f64() + 0.0005
        );
        (429, vec![("content-type", "application/json".into())], body)
    }
}
