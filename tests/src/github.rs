//! A GitHub-like provider, written from GitHub's documentation — "Rate
//! limits for the REST API", "Rate limits and query limits for the GraphQL
//! API", "Best practices for using the REST API" — not from sluice's code;
//! its hour scaled to a minute by default.
//!
//! What the documentation says, and this model does:
//! * Separate budgets on one host, each counted in its own window: `core`
//!   (most of the REST API), `search` (the `/search/*` endpoints but
//!   code), `code_search` (`/search/code`) and `graphql` (points). A
//!   window begins at the first request after the last one ended; every
//!   answer carries `x-ratelimit-limit`, `-remaining`, `-used`, `-reset`
//!   (the window's end, UTC epoch seconds) and `-resource`.
//! * Over a REST budget: `403` (the docs: "a 403 or 429"), nothing
//!   remaining, "API rate limit exceeded for user ID 1.".
//! * Over the GraphQL budget: `200`, nothing remaining, and an error of
//!   type `RATE_LIMITED`. A query's points are computed from the query by
//!   GitHub; here a query says them in `?points=N` (1 if not).
//! * Secondary limits: more than `max_concurrent` requests at once are
//!   answered `403` "You have exceeded a secondary rate limit" with a
//!   `retry-after`; they do not count against the primary budget.
//!
//! Each request's verdict is kept with its budget and window number, so a
//! test judges each budget in whole windows.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::sim::{Model, ModelAnswer};

/// The limits of the model.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Budgets per window: `core`, `search`, `code_search`, `graphql`
    /// (points).
    pub budgets: Vec<(&'static str, u64)>,
    /// How long a window lasts (an hour at GitHub, for `search` a minute).
    pub window: Duration,
    /// Requests at once beyond which the secondary limit answers.
    pub max_concurrent: usize,
    /// The secondary limit's `retry-after`, seconds.
    pub secondary_wait: u64,
    /// How long each answer takes.
    pub service: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            budgets: vec![
                ("core", 600),
                ("search", 30),
                ("code_search", 10),
                ("graphql", 100),
            ],
            window: Duration::from_secs(60),
            max_concurrent: 12,
            secondary_wait: 2,
            service: Duration::from_millis(10),
        }
    }
}

/// What the model answered one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Served.
    Served,
    /// Refused by the primary limit (`403`, or GraphQL's `200
    /// RATE_LIMITED`).
    Primary,
    /// Refused by the secondary limit.
    Secondary,
}

/// One request, as the model judged it.
#[derive(Debug, Clone, Copy)]
pub struct Judged {
    /// When it arrived.
    pub at: Instant,
    /// The budget it drew on.
    pub resource: &'static str,
    /// The budget's window it fell in (0 = the first).
    pub window: u64,
    /// What it got.
    pub verdict: Verdict,
}

/// One budget's current window.
#[derive(Debug, Clone, Copy)]
struct Window {
    number: u64,
    began: Instant,
    ends_wall: SystemTime,
    used: u64,
}

/// The model's state.
#[derive(Debug)]
pub struct GitHub {
    limits: Limits,
    windows: HashMap<&'static str, Window>,
    /// Every request's verdict.
    pub judged: Vec<Judged>,
}

impl GitHub {
    /// A model with these limits.
    pub fn new(limits: Limits) -> GitHub {
        GitHub {
            limits,
            windows: HashMap::new(),
            judged: Vec::new(),
        }
    }

    /// The budget a path draws on (the docs' list of endpoints).
    fn resource(path: &str) -> &'static str {
        if path == "/graphql" {
            "graphql"
        } else if path == "/search/code" {
            "code_search"
        } else if path.starts_with("/search/") {
            "search"
        } else {
            "core"
        }
    }
}

impl Model for GitHub {
    fn service(&self) -> Duration {
        self.limits.service
    }

    fn answer(
        &mut self,
        _method: &http::Method,
        path_and_query: &str,
        _body: &[u8],
        in_flight: usize,
        now: Instant,
    ) -> ModelAnswer {
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        let resource = GitHub::resource(path);
        let limit = self
            .limits
            .budgets
            .iter()
            .find(|(r, _)| *r == resource)
            .map_or(60, |(_, l)| *l);
        let cost: u64 = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("points="))
            .and_then(|p| p.parse().ok())
            .unwrap_or(1);
        let window = self.limits.window;
        let w = self.windows.entry(resource).or_insert(Window {
            number: 0,
            began: now,
            ends_wall: SystemTime::now() + window,
            used: 0,
        });
        if now >= w.began + window {
            *w = Window {
                number: w.number + 1,
                began: now,
                ends_wall: SystemTime::now() + window,
                used: 0,
            };
        }
        let secondary = in_flight > self.limits.max_concurrent;
        let served = !secondary && w.used + cost <= limit;
        if served {
            w.used += cost;
        }
        let reset = w
            .ends_wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0));
        // Refused by the primary limit, nothing remains (the docs: "the
        // value of the x-ratelimit-remaining header will be 0"), even
        // when a cheaper query could still be paid.
        let primary = !secondary && !served;
        let remaining = if primary { 0 } else { limit - w.used };
        let mut headers = vec![
            ("x-ratelimit-limit", limit.to_string()),
            ("x-ratelimit-remaining", remaining.to_string()),
            ("x-ratelimit-used", w.used.to_string()),
            ("x-ratelimit-reset", reset.to_string()),
            ("x-ratelimit-resource", resource.to_string()),
        ];
        let verdict = if secondary {
            Verdict::Secondary
        } else if primary {
            Verdict::Primary
        } else {
            Verdict::Served
        };
        self.judged.push(Judged {
            at: now,
            resource,
            window: w.number,
            verdict,
        });
        let docs = "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api";
        match verdict {
            Verdict::Secondary => {
                headers.push(("retry-after", self.limits.secondary_wait.to_string()));
                (
                    403,
                    headers,
                    format!(
                        r#"{{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again.","documentation_url":"{docs}"}}"#
                    ),
                )
            }
            Verdict::Primary if resource == "graphql" => (
                200,
                headers,
                r#"{"errors":[{"type":"RATE_LIMITED","code":"graphql_rate_limit","message":"API rate limit exceeded for user ID 1."}]}"#.into(),
            ),
            Verdict::Primary => (
                403,
                headers,
                format!(r#"{{"message":"API rate limit exceeded for user ID 1.","documentation_url":"{docs}"}}"#),
            ),
            Verdict::Served if resource == "graphql" => {
                (200, headers, r#"{"data":{"viewer":{"login":"octocat"}}}"#.into())
            }
            Verdict::Served => (200, headers, r#"[{"id":1}]"#.into()),
        }
    }
}

impl GitHub {
    /// What `resource`'s window number `window` saw: served, refused (by
    /// either limit) and all requests.
    pub fn window(&self, resource: &str, window: u64) -> (usize, usize, usize) {
        let of: Vec<_> = self
            .judged
            .iter()
            .filter(|j| j.resource == resource && j.window == window)
            .collect();
        let served = of.iter().filter(|j| j.verdict == Verdict::Served).count();
        (served, of.len() - served, of.len())
    }

    /// Where `resource`'s refusals from window `from` on fell: each one's
    /// window, its place in the window's requests and its verdict.
    pub fn refusals_from(&self, resource: &str, from: u64) -> Vec<(u64, usize, Verdict)> {
        let mut place = HashMap::new();
        let mut out = Vec::new();
        for j in self.judged.iter().filter(|j| j.resource == resource) {
            let n = place.entry(j.window).or_insert(0usize);
            *n += 1;
            if j.window >= from && j.verdict != Verdict::Served {
                out.push((j.window, *n, j.verdict));
            }
        }
        out
    }

    /// Requests to `resource` refused from window `from` on, and all of
    /// them.
    pub fn refused_from(&self, resource: &str, from: u64) -> (usize, usize) {
        let of: Vec<_> = self
            .judged
            .iter()
            .filter(|j| j.resource == resource && j.window >= from)
            .collect();
        let refused = of.iter().filter(|j| j.verdict != Verdict::Served).count();
        (refused, of.len())
    }
}
