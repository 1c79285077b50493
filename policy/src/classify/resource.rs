//! Several budgets on one host (R-PD1): which of a provider's budgets a
//! request draws on, known before it is sent.
//!
//! Some providers keep separate budgets behind one host, and a request
//! spends only its own:
//!
//! * **GitHub** names them in `x-ratelimit-resource`: `core` (most of the
//!   REST API), `search` (30 a minute), `code_search` (10 a minute),
//!   `graphql` (points), and a few for single endpoints. Which endpoints
//!   spend which is documented ("Rate limits for the REST API"), so the
//!   path says it before the request is sent.
//! * **Discord** limits each route on its own ("per-route" buckets, named
//!   in `X-RateLimit-Bucket`), the route counted apart for each major
//!   parameter (`channel_id`, `guild_id`, `webhook_id`): the same route
//!   on two channels spends two budgets.
//!
//! A request drawing on a budget of its own is paced in a lane of its own
//! — the same provider's stack under `{resource}@{provider}` — so a
//! `search` budget run dry never slows `core`. The lane is named here, by
//! the dialect; the proxy's provider table keeps the lanes (a bounded
//! number per provider).
//!
//! Names carry no path: a Discord route is named by a hash of its shape
//! (`route-1f2e3d4c`), as Discord itself names its buckets, so metrics and
//! logs never show a channel's id or a path.

use std::borrow::Cow;

use super::Dialect;

/// The budget a request draws on when it is not its provider's main one:
/// put in the request's extensions by whoever routes it to its lane, and
/// read by the pacer to take only its own budget's headers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Resource(pub Cow<'static, str>);

impl Resource {
    /// Its name, as in the lane's name (`{resource}@{provider}`).
    pub fn name(&self) -> &str {
        &self.0
    }
}

/// The header GitHub names a response's budget in.
const GITHUB_RESOURCE: &str = "x-ratelimit-resource";

/// Discord's major parameters: a route is counted apart for each value of
/// the id after one of these.
const DISCORD_MAJOR: [&str; 3] = ["channels", "guilds", "webhooks"];

impl Dialect {
    /// The budget a request of `method` to `path` draws on, when it is not
    /// the provider's main one (`None`: the main one).
    pub fn resource(self, method: &http::Method, path: &str) -> Option<Resource> {
        match self {
            Dialect::GitHub => github_resource(path).map(|r| Resource(Cow::Borrowed(r))),
            Dialect::Discord => discord_route(method, path).map(Resource),
            _ => None,
        }
    }

    /// Whether an answer's quota headers speak for another budget than the
    /// one its request drew on (`lane`; `None` for the main one) — then
    /// they are not this lane's to pace by. GitHub names the budget; a
    /// request it counts elsewhere than the path said (an endpoint added
    /// since) must not pace `core` to, say, `dependency_snapshots`' 100.
    pub fn speaks_for_another(self, headers: &http::HeaderMap, lane: Option<&Resource>) -> bool {
        match self {
            Dialect::GitHub => {
                let Some(named) = headers.get(GITHUB_RESOURCE).and_then(|v| v.to_str().ok()) else {
                    return false;
                };
                let expected = lane.map_or("core", Resource::name);
                !named.trim().eq_ignore_ascii_case(expected)
            }
            _ => false,
        }
    }
}

/// GitHub's budget for a path, per its documentation; Enterprise Server
/// serves the same API under `/api/v3` (and GraphQL at `/api/graphql`).
fn github_resource(path: &str) -> Option<&'static str> {
    let path = path.split(['?', '#']).next().unwrap_or("");
    let path = path.strip_prefix("/api/v3").unwrap_or(path);
    if path == "/graphql" || path == "/api/graphql" {
        return Some("graphql");
    }
    if path == "/search/code" || path.starts_with("/search/code/") {
        return Some("code_search");
    }
    if path.starts_with("/search/") {
        return Some("search");
    }
    if path.starts_with("/app-manifests/") && path.ends_with("/conversions") {
        return Some("integration_manifest");
    }
    if path.ends_with("/dependency-graph/snapshots") {
        return Some("dependency_snapshots");
    }
    if path.ends_with("/code-scanning/sarifs") {
        return Some("code_scanning_upload");
    }
    if path.ends_with("/actions/runners/registration-token") {
        return Some("actions_runner_registration");
    }
    None
}

/// A Discord route's bucket name: a hash of the method and the path with
/// every id but the major parameter's made `{id}` (`/api/v10` dropped).
fn discord_route(method: &http::Method, path: &str) -> Option<Cow<'static, str>> {
    let path = path.split(['?', '#']).next().unwrap_or("");
    let mut segments = path.trim_start_matches('/').split('/').peekable();
    if segments.peek() == Some(&"api") {
        segments.next();
        if segments.peek().is_some_and(|v| v.starts_with('v')) {
            segments.next();
        }
    }
    let mut shape = String::with_capacity(path.len() + 8);
    shape.push_str(method.as_str());
    let mut previous = "";
    let mut any = false;
    for s in segments.filter(|s| !s.is_empty()) {
        any = true;
        shape.push('/');
        let id = s.bytes().all(|b| b.is_ascii_digit()) && s.len() >= 5;
        if id && !DISCORD_MAJOR.contains(&previous) {
            shape.push_str("{id}");
        } else {
            shape.push_str(s);
        }
        previous = s;
    }
    any.then(|| Cow::Owned(format!("route-{:08x}", fnv1a(shape.as_bytes()))))
}

/// FNV-1a, 32 bits: a route's name stays the same across versions and
/// restarts (it names the lane's saved state).
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h: u32, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn gh(path: &str) -> Option<String> {
        Dialect::GitHub
            .resource(&Method::GET, path)
            .map(|r| r.name().to_string())
    }

    /// R-PD1, GitHub: the documented budgets by path; everything else is
    /// `core`.
    #[test]
    fn github_budgets_by_path() {
        assert_eq!(gh("/search/repositories?q=x").as_deref(), Some("search"));
        assert_eq!(gh("/search/issues").as_deref(), Some("search"));
        assert_eq!(gh("/search/code?q=x").as_deref(), Some("code_search"));
        assert_eq!(gh("/graphql").as_deref(), Some("graphql"));
        assert_eq!(gh("/api/graphql").as_deref(), Some("graphql"));
        assert_eq!(gh("/api/v3/search/commits").as_deref(), Some("search"));
        assert_eq!(
            gh("/repos/o/r/dependency-graph/snapshots").as_deref(),
            Some("dependency_snapshots")
        );
        assert_eq!(gh("/repos/o/r/issues"), None);
        assert_eq!(gh("/searchers"), None);
        assert_eq!(gh("/"), None);
        assert_eq!(Dialect::Generic.resource(&Method::GET, "/search/x"), None);
    }

    /// R-PD1, GitHub: an answer naming another budget than its lane's is
    /// not that lane's to pace by.
    #[test]
    fn github_headers_for_another_budget() {
        let mut h = http::HeaderMap::new();
        let search = Resource(Cow::Borrowed("search"));
        assert!(!Dialect::GitHub.speaks_for_another(&h, None), "unnamed");
        h.insert(GITHUB_RESOURCE, "core".parse().unwrap());
        assert!(!Dialect::GitHub.speaks_for_another(&h, None));
        assert!(Dialect::GitHub.speaks_for_another(&h, Some(&search)));
        h.insert(GITHUB_RESOURCE, "search".parse().unwrap());
        assert!(!Dialect::GitHub.speaks_for_another(&h, Some(&search)));
        h.insert(GITHUB_RESOURCE, "dependency_snapshots".parse().unwrap());
        assert!(Dialect::GitHub.speaks_for_another(&h, None));
        assert!(!Dialect::Generic.speaks_for_another(&h, None));
    }

    /// R-PD1, Discord: one bucket per route and major parameter; minor ids
    /// do not make new buckets; names carry no path.
    #[test]
    fn discord_routes_by_shape_and_major_parameter() {
        let route = |m: Method, p: &str| Dialect::Discord.resource(&m, p).unwrap().0;
        let msgs = route(Method::GET, "/api/v10/channels/111111111111/messages");
        assert_eq!(
            msgs,
            route(
                Method::GET,
                "/api/v9/channels/111111111111/messages?limit=5"
            )
        );
        assert_ne!(
            msgs,
            route(Method::GET, "/api/v10/channels/222222222222/messages"),
            "another channel, another bucket"
        );
        assert_ne!(
            msgs,
            route(Method::POST, "/api/v10/channels/111111111111/messages")
        );
        assert_eq!(
            route(
                Method::GET,
                "/api/v10/channels/111111111111/messages/333333333333"
            ),
            route(
                Method::GET,
                "/api/v10/channels/111111111111/messages/444444444444"
            ),
            "a message's id is not a major parameter"
        );
        assert!(msgs.starts_with("route-") && !msgs.contains('/') && msgs.len() == 14);
        assert_eq!(Dialect::Discord.resource(&Method::GET, "/"), None);
    }
}
