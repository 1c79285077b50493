//! A Discord-like provider, written from Discord's documentation ("Rate
//! Limits", developer docs, topics/rate-limits) — not from sluice's code.
//!
//! What the documentation says, and this model does:
//! * Limits are per route, and a route is counted apart for each value of
//!   its major parameter (`channel_id`, `guild_id`, `webhook_id`): a
//!   bucket per (route, major id). Each bucket's window begins at its
//!   first request and resets at its end.
//! * Every answer carries `X-RateLimit-Limit`, `-Remaining`, `-Reset`
//!   (epoch seconds with milliseconds), `-Reset-After` (seconds, with
//!   milliseconds) and `-Bucket` (an opaque hash of the route).
//! * Over a bucket: `429` with a JSON body `{"message": "You are being
//!   rate limited.", "retry_after": 0.529, "global": false}`, a
//!   `Retry-After` in seconds and `X-RateLimit-Scope: user`.
//! * A global limit across every route (50 a second), answered the same
//!   with `"global": true` and `X-RateLimit-Global: true`.
//!
//! Which route a path is, and its limit, come from the model's table.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::sim::{Model, ModelAnswer};

/// A route's limit: paths whose route (ids made `{id}`, the major one
/// kept as `{major}`) is `route` allow `limit` requests per `per`.
#[derive(Debug, Clone)]
pub struct Route {
    /// `METHOD /route/{major}/...`.
    pub route: &'static str,
    /// Requests per window.
    pub limit: u64,
    /// The window.
    pub per: Duration,
}

/// One request as the model judged it.
#[derive(Debug, Clone)]
pub struct Judged {
    /// When it arrived.
    pub at: Instant,
    /// Its bucket: the route and the major id.
    pub bucket: String,
    /// Whether it was served (else `429`).
    pub served: bool,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    began: Instant,
    ends_wall: SystemTime,
    used: u64,
}

/// The model.
#[derive(Debug)]
pub struct Discord {
    routes: Vec<Route>,
    global: u64,
    windows: HashMap<String, Window>,
    /// The global limit's second and its count.
    global_second: (Option<Instant>, u64),
    /// Every request's verdict.
    pub judged: Vec<Judged>,
}

const MAJOR: [&str; 3] = ["channels", "guilds", "webhooks"];

impl Discord {
    /// A model with these routes and the documented global limit (50 a
    /// second).
    pub fn new(routes: Vec<Route>) -> Discord {
        Discord {
            routes,
            global: 50,
            windows: HashMap::new(),
            global_second: (None, 0),
            judged: Vec::new(),
        }
    }

    /// A path's route and its bucket (route and major id).
    fn route_of(method: &http::Method, path: &str) -> (String, String) {
        let path = path.split('?').next().unwrap_or("");
        let mut segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        if segments.first() == Some(&"api") {
            segments.remove(0);
            if segments.first().is_some_and(|v| v.starts_with('v')) {
                segments.remove(0);
            }
        }
        let (mut route, mut bucket) = (method.to_string() + " ", method.to_string() + " ");
        let mut previous = "";
        for s in segments {
            let id = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            route.push('/');
            bucket.push('/');
            match (id, MAJOR.contains(&previous)) {
                (true, true) => {
                    route.push_str("{major}");
                    bucket.push_str(s);
                }
                (true, false) => {
                    route.push_str("{id}");
                    bucket.push_str("{id}");
                }
                _ => {
                    route.push_str(s);
                    bucket.push_str(s);
                }
            }
            previous = s;
        }
        (route, bucket)
    }

    /// What `bucket` (its route with the major id) saw from `from` on:
    /// served and refused.
    pub fn seen_from(&self, bucket: &str, from: Instant) -> (usize, usize) {
        let of: Vec<_> = self
            .judged
            .iter()
            .filter(|j| j.bucket == bucket && j.at >= from)
            .collect();
        let served = of.iter().filter(|j| j.served).count();
        (served, of.len() - served)
    }

    /// When `bucket` first saw a request.
    pub fn first(&self, bucket: &str) -> Option<Instant> {
        self.judged
            .iter()
            .find(|j| j.bucket == bucket)
            .map(|j| j.at)
    }
}

fn ms(d: Duration) -> String {
    // Discord's values carry milliseconds; a reset is never early, so
    // round up.
    let ms = d.as_micros().div_ceil(1000);
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

impl Model for Discord {
    fn answer(
        &mut self,
        method: &http::Method,
        path: &str,
        _body: &[u8],
        _in_flight: usize,
        now: Instant,
    ) -> ModelAnswer {
        let (route, bucket) = Discord::route_of(method, path);
        let Some(limits) = self.routes.iter().find(|r| r.route == route).cloned() else {
            return (
                404,
                vec![],
                r#"{"message": "404: Not Found", "code": 0}"#.into(),
            );
        };
        // The global limit: per second, across every route.
        let (second, count) = &mut self.global_second;
        if second.is_none_or(|s| now >= s + Duration::from_secs(1)) {
            *second = Some(now);
            *count = 0;
        }
        *count += 1;
        let global = *count > self.global;
        let w = self.windows.entry(bucket.clone()).or_insert(Window {
            began: now,
            ends_wall: SystemTime::now() + limits.per,
            used: 0,
        });
        if now >= w.began + limits.per {
            *w = Window {
                began: now,
                ends_wall: SystemTime::now() + limits.per,
                used: 0,
            };
        }
        let served = !global && w.used < limits.limit;
        if served {
            w.used += 1;
        }
        let after = (w.began + limits.per).saturating_duration_since(now);
        let reset = w
            .ends_wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let hash = format!("{:016x}", {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            route.hash(&mut h);
            h.finish()
        });
        let mut headers = vec![
            ("x-ratelimit-limit", limits.limit.to_string()),
            ("x-ratelimit-remaining", (limits.limit - w.used).to_string()),
            ("x-ratelimit-reset", ms(reset)),
            ("x-ratelimit-reset-after", ms(after)),
            ("x-ratelimit-bucket", hash),
        ];
        self.judged.push(Judged {
            at: now,
            bucket,
            served,
        });
        if served {
            return (200, headers, r#"[{"id":"1"}]"#.into());
        }
        let wait = if global {
            Duration::from_secs(1)
        } else {
            after
        };
        headers.push(("retry-after", wait.as_secs_f64().ceil().to_string()));
        headers.push((
            "x-ratelimit-scope",
            if global { "global" } else { "user" }.into(),
        ));
        if global {
            headers.push(("x-ratelimit-global", "true".into()));
        }
        (
            429,
            headers,
            format!(
                r#"{{"message": "You are being rate limited.", "retry_after": {}, "global": {global}}}"#,
                ms(wait)
            ),
        )
    }
}
