//! The provider table: which provider a host belongs to, and each
//! provider's policy state and stack.
//!
//! The config names providers by host patterns; every other host is a
//! provider of its own, keyed by its normalised name. Arbitrary CONNECT
//! targets must not grow memory without bound, so providers unused for
//! `provider_idle` are evicted (what they learned is kept for
//! `state_max_age`, so a provider that comes back resumes its rate), and at
//! most `max_providers` are tracked: beyond that, unknown hosts share one
//! `_overflow` provider (linkerd's idle cache, hyper-util's pool keys).
//! An evicted provider's state stays in memory only until it is saved: a
//! provider that comes back, after an eviction or a restart, reads its
//! record from the store (R-PS1).
//!
//! One concern in one file (about 600 lines with its tests): the table —
//! look-up, building a provider's stack, eviction, the kept state and
//! reload all take the same two locks in the same order, and reading them
//! side by side is how that order stays right.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use http::{Method, Request, Response};
use sluice_policy::classify::{Dialect, Resource};
use sluice_policy::error::BoxFuture;
use sluice_policy::events::ObserverSink;
use sluice_policy::provider::{LearnedState, PolicyOptions};
use sluice_policy::{ProviderPolicy, ValidSettings};
use tokio::time::Instant;

use crate::config::{normalise_host, Config, Limits, NamedProvider};
use crate::http::body::{ProxyBody, UpstreamBody};
use crate::shared::{ProviderBudget, SharedStore};
use crate::store::Store;
use crate::upstream::Upstream;

/// What identifies a provider's saved record: its learned state and when
/// it was last used (since the table's epoch). An allowance's start counts
/// to the 100 ms (its `elapsed` is read at `now`).
fn fingerprint(state: &LearnedState, used: Duration, now: Instant, epoch: Instant) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    state.rate_rps.to_bits().hash(&mut h);
    state.limit_rps.map(f64::to_bits).hash(&mut h);
    state.baseline.hash(&mut h);
    state.breaker.hash(&mut h);
    state.open_remaining.hash(&mut h);
    let known = state.known;
    (known.hold, known.fitted, known.sharp, known.steady).hash(&mut h);
    if let Some(a) = state.allowance {
        let began = now.checked_sub(a.elapsed).unwrap_or(now);
        (began.saturating_duration_since(epoch).as_millis() / 100).hash(&mut h);
        a.spent.to_bits().hash(&mut h);
    }
    used.as_millis().hash(&mut h);
    h.finish()
}

/// Gives back a map's room once it holds under a quarter of it: a crawl's
/// table and its kept states grow to tens of thousands and empty again,
/// and a map keeps its largest size otherwise (R-PF1, issue 38: 0.3 KB a
/// host 15 s after 10,000 hosts, none of them live).
fn shrink<K: Eq + std::hash::Hash, V, S: std::hash::BuildHasher>(map: &mut HashMap<K, V, S>) {
    if let Some(room) = room_to_keep(map.capacity(), map.len()) {
        map.shrink_to(room);
    }
}

/// [`shrink`], for the table.
fn shrink_table(table: &mut Table) {
    if let Some(room) = room_to_keep(table.capacity(), table.len()) {
        table.shrink_to(room);
    }
}

/// The room a map of `len` keeps, if its `capacity` is over four times
/// that.
fn room_to_keep(capacity: usize, len: usize) -> Option<usize> {
    (capacity > 4 * len.max(64)).then_some(2 * len)
}

/// Whether `p` is a host's own provider — not a configured one, a lane of
/// one, the overflow, one whose budget is shared or one seen only through
/// raw tunnels — holding, at `now`, nothing a new one would not start
/// from (R-PF1): there is nothing of it to save, and nothing lost when it
/// is let go.
fn untaught(rules: &Rules, name: &str, p: &Provider, now: Instant) -> bool {
    own(rules, name, p) && p.policy.learned_nothing(now)
}

/// Whether `p` is a host's own provider with nothing for the store
/// (R-PF1): what it learned is a cold start's, and no record of it was
/// restored or ever handed to the store — none can be there to overwrite.
/// A broad crawl's dead hosts (refused connects, `502`s) learn only
/// failures in a row, which pass with the windows; their records filled
/// the store with cold starts. A configured provider is saved whatever it
/// learned: the admin page and `sluice status` show it restored after a
/// restart.
fn nothing_to_keep(rules: &Rules, name: &str, p: &Provider, now: Instant) -> bool {
    !p.restored
        && p.saved.load(Ordering::Relaxed) == 0
        && own(rules, name, p)
        && p.policy.learned_is_cold(now)
}

/// Whether `p` is a host's own provider: not a configured one or a lane of
/// one, not the overflow, seeing each request, its budget not shared.
fn own(rules: &Rules, name: &str, p: &Provider) -> bool {
    let base = p.lane_of.as_deref().unwrap_or(name);
    let configured = rules.named.iter().any(|n| n.name == base);
    !configured && name != OVERFLOW && p.visible() && p.budget().is_none()
}

/// What identifies the config a provider runs under: its settings, whether
/// it is intercepted, and how sluice reaches any provider (`reach`: the
/// destination guard, the upstream CA and connect timeout). Stored beside
/// its learned state: a breaker opened under another config is cleared
/// (issue 36: a breaker opened while a config was being debugged stayed
/// open after the fix). FNV-1a over the settings as written out — stable
/// across builds, unlike the std hasher's seedless keys.
fn config_print(settings: &ValidSettings, intercept: bool, reach: &str) -> u64 {
    let text = format!("{settings:?}|{intercept}|{reach}");
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What the config says of how sluice reaches providers, for
/// [`config_print`].
fn reach(config: &Config) -> String {
    format!(
        "{:?}|{:?}|{:?}",
        config.destinations, config.extra_ca, config.connect_timeout
    )
}

/// A provider's learned state as the store keeps it.
#[derive(Debug, Clone)]
pub struct Learned {
    /// The provider's name.
    pub name: String,
    /// What it learned.
    pub state: LearnedState,
    /// Time since its last use.
    pub age: Duration,
    /// The [`config_print`] it learned it under (none from a record older
    /// than the print).
    pub config: Option<u64>,
}

/// Where a provider no longer in memory finds what it learned when it
/// comes back: the store (R-PS1). A crawl's store may hold a million
/// hosts' records; memory holds only those not saved yet (issue 38).
pub type Recall = Box<dyn Fn(&str) -> Option<Learned> + Send + Sync>;

/// Reads a provider's record from the store, for a provider that is not
/// in memory (R-PS1).
pub fn recall(store: Arc<Store>) -> Recall {
    Box::new(move |name| {
        let record = store.learned_of(name)?;
        Some(Learned {
            name: name.to_string(),
            state: record.state(),
            age: record.age(),
            config: record.config,
        })
    })
}

/// The providers by name: hashed with foldhash (seeded per process), not
/// SipHash — every request looks its provider up (R-PF1, issue 38).
type Table = HashSet<Entry, foldhash::fast::RandomState>;

/// A provider in the table, found by its own name: a slot holds one
/// pointer, not a second one to a copy of the name beside it (8 bytes a
/// slot, not 24: R-PF1, issue 38).
#[derive(Clone)]
struct Entry(Arc<Provider>);

impl std::borrow::Borrow<str> for Entry {
    fn borrow(&self) -> &str {
        self.0.name()
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.0.name() == other.0.name()
    }
}

impl Eq for Entry {}

impl std::hash::Hash for Entry {
    /// As `str` hashes: found by a `&str`.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (*self.0.name()).hash(state);
    }
}

/// The provider every unknown host shares once the table is full.
pub const OVERFLOW: &str = "_overflow";

/// `settings`, speaking `spoken` — the dialect the provider's hosts speak
/// — where they name none (R-PD2); the same `Arc` (one copy of the
/// defaults for every provider) where there is nothing to add.
fn speaking(settings: Arc<ValidSettings>, spoken: Dialect) -> Arc<ValidSettings> {
    if settings.dialect.is_some() || spoken == Dialect::Generic {
        return settings;
    }
    Arc::new(settings.or_dialect(spoken))
}

/// The most lanes (budgets of their own, R-PD1) one provider may have:
/// GitHub has a handful; Discord's routes per channel could be thousands,
/// and beyond this many share the provider's main lane.
pub const MAX_LANES: usize = 32;

/// Makes the event and transition sinks of a new provider (metrics, logs,
/// the store).
pub trait Observer: Send + Sync {
    /// Sinks for the provider `name`, and its label in metrics.
    fn sinks(&self, name: &Arc<str>) -> Sinks;

    /// Providers with these labels of their own left the table: their
    /// series may go, their labels to other providers.
    fn gone(&self, labels: &[Arc<str>]) {
        let _ = labels;
    }
}

/// Where a new provider's events and breaker transitions go, and its
/// label in metrics: its name, or the one every provider beyond the label
/// cap shares.
pub struct Sinks {
    /// Its events and its breaker's transitions.
    pub observer: ObserverSink,
    /// Its label.
    pub label: Arc<str>,
}

/// Notes `p`'s label as gone if it is its own name (not the one every
/// provider past the label cap shares).
fn labelled(p: &Provider, gone: &mut Vec<Arc<str>>) {
    if p.labelled {
        gone.push(p.name().clone());
    }
}

/// One provider: its policy state and its stack.
pub struct Provider {
    /// Whether it has metric series of its own (its name is its label),
    /// or shares `_other`'s beyond the label cap.
    labelled: bool,
    /// Its shared policy state.
    pub policy: Arc<ProviderPolicy>,
    /// Its count of successful requests, found once.
    pub requests: crate::observe::metrics::RequestHandle,
    /// Whether its CONNECT tunnels are intercepted.
    intercept: AtomicBool,
    /// Whether it started from restored state.
    pub restored: bool,
    /// Whether any of its traffic went through a raw tunnel (per-request
    /// visibility lost).
    raw_tunnels: AtomicBool,
    /// Milliseconds since the table's epoch at last use.
    last_used: AtomicU64,
    /// A fingerprint of what was last handed to the store (learned state
    /// and last use): unchanged providers are not saved again.
    saved: AtomicU64,
    /// Its budget in Redis, while shared (R-DS1).
    budget: Mutex<Option<Arc<ProviderBudget>>>,
    /// The provider this is a lane of (`{resource}@{provider}`, R-PD1): a
    /// budget of its own on the same hosts, with the same settings.
    pub lane_of: Option<Box<str>>,
    /// The dialect its hosts speak (R-PD2), for settings that name none.
    spoken: Dialect,
    /// The [`config_print`] of the config it runs under.
    config: AtomicU64,
}

impl Provider {
    /// Its name: its policy's (16 bytes fewer a provider than a copy of
    /// the pointer: jemalloc's 112-byte class, not 128 — R-PF1, issue 38).
    pub fn name(&self) -> &Arc<str> {
        self.policy.shared_name()
    }
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("name", &self.name())
            .finish()
    }
}

/// Learned state waiting for its provider to be used again.
#[derive(Debug, Clone, Copy)]
struct Kept {
    state: LearnedState,
    at: Instant,
    /// The [`config_print`] it was learned under, if known.
    config: Option<u64>,
    /// Saved since it was kept: an evicted provider's state no longer
    /// changes.
    saved: bool,
}

struct Rules {
    named: Vec<NamedProvider>,
    /// One copy, shared by every provider of the defaults.
    defaults: Arc<ValidSettings>,
    defaults_intercept: bool,
    limits: Limits,
    /// [`reach`] of the config.
    reach: String,
    /// The [`config_print`] of `defaults`, not intercepted as they say:
    /// found once, not for every host a crawl meets.
    defaults_print: u64,
}

impl Rules {
    fn of(config: &Config) -> Rules {
        let defaults = Arc::new(config.defaults.clone());
        let reach = reach(config);
        Rules {
            named: config.providers.clone(),
            defaults_print: config_print(&defaults, config.defaults_intercept, &reach),
            defaults,
            defaults_intercept: config.defaults_intercept,
            limits: config.limits.clone(),
            reach,
        }
    }

    /// The [`config_print`] of a provider with these settings.
    fn print(&self, settings: &Arc<ValidSettings>, intercept: bool) -> u64 {
        if Arc::ptr_eq(settings, &self.defaults) && intercept == self.defaults_intercept {
            return self.defaults_print;
        }
        config_print(settings, intercept, &self.reach)
    }

    /// The named provider a (normalised) host belongs to, if any.
    fn named_for(&self, host: &str) -> Option<&NamedProvider> {
        self.named
            .iter()
            .find(|p| p.hosts.iter().any(|h| h.matches(host)))
    }
}

/// The table.
pub struct Providers {
    epoch: Instant,
    /// When a full table last looked for room (ms since `epoch`).
    room_sought: AtomicU64,
    rules: RwLock<Rules>,
    entries: Mutex<Table>,
    kept: Mutex<HashMap<String, Kept>>,
    upstream: Upstream,
    observer: Option<Arc<dyn Observer>>,
    /// Where shared budgets live, when `[shared]` is configured.
    shared: Option<Arc<SharedStore>>,
    /// The store's records, when there is a store.
    recall: Option<Recall>,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Providers").finish_non_exhaustive()
    }
}

impl Providers {
    /// The upstream client every provider's stack ends in.
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// A table for this config over this upstream client.
    pub fn new(config: &Config, upstream: Upstream, observer: Option<Arc<dyn Observer>>) -> Self {
        Providers {
            epoch: Instant::now(),
            room_sought: AtomicU64::new(0),
            rules: RwLock::new(Rules::of(config)),
            entries: Mutex::new(Table::default()),
            kept: Mutex::new(HashMap::new()),
            upstream,
            observer,
            shared: None,
            recall: None,
        }
    }

    /// Reads what a provider learned from `recall` (the store) when it is
    /// not in memory; kept states are then let go once saved.
    pub fn with_recall(mut self, recall: Option<Recall>) -> Self {
        self.recall = recall;
        self
    }

    /// Shares the budgets of providers with `shared = true` through this
    /// store (R-DS1).
    pub fn with_shared(mut self, store: Option<Arc<SharedStore>>) -> Self {
        self.shared = store;
        self
    }

    fn rules(&self) -> std::sync::RwLockReadGuard<'_, Rules> {
        self.rules.read().unwrap_or_else(|p| p.into_inner())
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Table> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live provider for a host — the named provider it belongs to, or
    /// the host's own — found without copying a name.
    fn find_live(&self, entries: &Table, host: &str) -> Option<Arc<Provider>> {
        let host = normalise_host(host);
        let rules = self.rules();
        let name = rules.named_for(&host).map_or(&*host, |p| p.name.as_str());
        entries.get(name).map(|e| e.0.clone())
    }

    /// The provider name, settings and interception for a host.
    pub fn lookup(&self, host: &str) -> (String, Arc<ValidSettings>, bool) {
        let host = normalise_host(host);
        let rules = self.rules();
        match rules.named_for(&host) {
            Some(p) => (p.name.clone(), Arc::new(p.settings.clone()), p.intercept),
            None => (
                host.into_owned(),
                rules.defaults.clone(),
                rules.defaults_intercept,
            ),
        }
    }

    /// Sends `req` through `p`'s stack, composed for this request from its
    /// policy and the upstream (no stack kept a provider: R-PF1).
    pub fn send(&self, p: &Provider, req: Request<ProxyBody>) -> BoxFuture<Response<UpstreamBody>> {
        sluice_policy::stack::send(&p.policy, self.upstream.clone(), req)
    }

    /// The provider for a host, created (and its learned state restored)
    /// on first use.
    pub fn get(&self, host: &str) -> Arc<Provider> {
        let now = sluice_policy::clock::now();
        let mut entries = self.entries();
        // A live provider is found by name alone: its settings are not
        // copied on every request (issue 24).
        if let Some(p) = self.find_live(&entries, host) {
            p.touch(self.epoch, now);
            return p;
        }
        let (name, settings, intercept) = self.lookup(host);
        let max = self.rules().limits.max_providers;
        if entries.len() >= max {
            self.make_room(&mut entries, now);
        }
        let name = if entries.len() >= max && !self.is_named(&name) {
            // Full: unknown hosts share one provider rather than grow memory.
            if let Some(Entry(p)) = entries.get(OVERFLOW) {
                p.touch(self.epoch, now);
                return p.clone();
            }
            OVERFLOW.to_string()
        } else {
            name
        };
        let spoken = match name.as_str() {
            OVERFLOW => Dialect::Generic,
            _ => Dialect::for_host(&normalise_host(host)),
        };
        let name: Arc<str> = name.into();
        let provider = Arc::new(self.build(&name, settings, intercept, now, None, spoken));
        entries.insert(Entry(provider.clone()));
        provider
    }

    /// The lane of `base` a request of `method` to `path` is paced in, and
    /// the budget it draws on: `base` itself, or — where `base`'s dialect
    /// keeps a budget of its own for such requests on the same hosts
    /// (GitHub's `search`, a Discord route: R-PD1) — `{resource}@{base}`,
    /// made on first use with `base`'s settings. At most [`MAX_LANES`] per
    /// provider, and none once the table is full: then `base` itself.
    pub fn lane(
        &self,
        base: &Arc<Provider>,
        method: &Method,
        path: &str,
    ) -> (Arc<Provider>, Option<Resource>) {
        let dialect = base.policy.bulkhead.dialect();
        let Some(resource) = dialect.resource(method, path) else {
            return (base.clone(), None);
        };
        let name = format!("{}@{}", resource.name(), base.name());
        let now = sluice_policy::clock::now();
        let mut entries = self.entries();
        if let Some(Entry(p)) = entries.get(name.as_str()) {
            p.touch(self.epoch, now);
            return (p.clone(), Some(resource));
        }
        let max = self.rules().limits.max_providers;
        if entries.len() >= max {
            self.make_room(&mut entries, now);
        }
        let lanes = entries
            .iter()
            .filter(|Entry(p)| p.lane_of.as_deref() == Some(&**base.name()))
            .count();
        if entries.len() >= max || lanes >= MAX_LANES {
            return (base.clone(), None);
        }
        let name: Arc<str> = name.into();
        let lane = Arc::new(self.build(
            &name,
            base.policy.settings(),
            base.intercept(),
            now,
            Some((**base.name()).into()),
            base.spoken,
        ));
        entries.insert(Entry(lane.clone()));
        (lane, Some(resource))
    }

    /// The live provider with this name, if any.
    pub fn live(&self, name: &str) -> Option<Arc<Provider>> {
        self.entries().get(name).map(|e| e.0.clone())
    }

    fn is_named(&self, name: &str) -> bool {
        self.rules().named.iter().any(|p| p.name == name)
    }

    /// The names of the configured providers.
    pub fn named(&self) -> Vec<String> {
        self.rules().named.iter().map(|p| p.name.clone()).collect()
    }

    fn build(
        &self,
        name: &Arc<str>,
        settings: Arc<ValidSettings>,
        intercept: bool,
        now: Instant,
        lane_of: Option<Box<str>>,
        spoken: Dialect,
    ) -> Provider {
        let settings = speaking(settings, spoken);
        let config = self.rules().print(&settings, intercept);
        let (observer, labelled) = match &self.observer {
            Some(o) => {
                let s = o.sinks(name);
                (Some(s.observer), s.label == *name)
            }
            None => (None, true),
        };
        let policy = ProviderPolicy::new(
            name.clone(),
            settings,
            PolicyOptions {
                observer,
                jitter: None,
            },
        );
        let kept = self.take_kept(name, now);
        if let Some(k) = &kept {
            let changed = k.config.is_some_and(|c| c != config);
            if policy.restore(&k.state, changed) {
                tracing::info!(provider = %name, "breaker restored open, cleared: the provider's config changed since it opened");
            }
        }
        let p = Provider {
            labelled,
            policy,
            requests: Default::default(),
            intercept: AtomicBool::new(intercept),
            restored: kept.is_some(),
            raw_tunnels: AtomicBool::new(false),
            last_used: AtomicU64::new(0),
            saved: AtomicU64::new(0),
            budget: Mutex::new(None),
            lane_of,
            spoken,
            config: AtomicU64::new(config),
        };
        p.share(self.shared.as_ref(), p.policy.settings().shared);
        p.touch(self.epoch, now);
        p
    }

    /// What `name` learned before, if younger than `state_max_age`: kept
    /// in memory since its eviction, else its record in the store.
    fn take_kept(&self, name: &str, now: Instant) -> Option<Kept> {
        let max_age = self.rules().limits.state_max_age;
        let kept = self
            .kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        match kept {
            Some(k) => Some(k).filter(|k| now.saturating_duration_since(k.at) < max_age),
            None => {
                let l = self.recalled(name, max_age)?;
                tracing::debug!(provider = %name, age_ms = l.age.as_millis() as u64, "learned state restored from the store");
                Some(Kept {
                    state: l.state,
                    at: now.checked_sub(l.age).unwrap_or(now),
                    config: l.config,
                    saved: true,
                })
            }
        }
    }

    /// `name`'s record in the store, if younger than `max_age`.
    fn recalled(&self, name: &str, max_age: Duration) -> Option<Learned> {
        let recall = self.recall.as_ref()?;
        recall(name).filter(|l| l.age < max_age)
    }

    /// Keeps learned state for providers not live yet: each is restored
    /// when its provider is first used, if it is still younger than
    /// `state_max_age`. `age` is how old it already is.
    pub fn keep(&self, name: &str, state: LearnedState, age: Duration, config: Option<u64>) {
        let at = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.insert(
            name.to_string(),
            Kept {
                state,
                at,
                config,
                saved: false,
            },
        );
        self.bound_kept(&mut kept);
    }

    /// Kept states are bounded too (4 × `max_providers`): a crawl over many
    /// hosts must not grow memory for the staleness window. Past the bound
    /// the oldest eighth goes at once — one pass, not one per eviction (a
    /// scan of 400,000 states for each host a crawl evicted, before).
    fn bound_kept(&self, kept: &mut HashMap<String, Kept>) {
        let max = self.rules().limits.max_providers.saturating_mul(4);
        if kept.len() <= max {
            return;
        }
        let mut ats: Vec<Instant> = kept.values().map(|k| k.at).collect();
        let keep = max - max / 8;
        // Newest first: what stands at `keep` and after it goes.
        let (_, &mut cut, _) = ats.select_nth_unstable_by(keep, |a, b| b.cmp(a));
        kept.retain(|_, k| k.at > cut);
    }

    /// What a provider that is not live has learned, kept since its
    /// eviction or saved in the store, if any: the state and how old it is.
    pub fn kept(&self, name: &str) -> Option<(LearnedState, Duration)> {
        let now = Instant::now();
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = kept.get(name) {
            return Some((k.state, now.saturating_duration_since(k.at)));
        }
        drop(kept);
        let max_age = self.rules().limits.state_max_age;
        self.recalled(name, max_age).map(|l| (l.state, l.age))
    }

    /// Evicts providers idle for `provider_idle`, keeping what they
    /// learned, and lets go those that learned nothing once their windows
    /// have passed.
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut entries = self.entries();
        let mut gone = self.evict_idle(&mut entries, now);
        gone.extend(self.let_go_quiet(&mut entries, now));
        shrink_table(&mut entries);
        drop(entries);
        self.forget(&gone);
        let max_age = self.rules().limits.state_max_age;
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|_, k| now.saturating_duration_since(k.at) < max_age);
        shrink(&mut kept);
    }

    /// A full table looks for room — evicts idle providers, lets go those
    /// that learned nothing — at most every 100 ms: each look is a pass
    /// over the table, and a crawl past `max_providers` asks for room with
    /// every new host (a pass over 100,000 providers for each, before).
    fn make_room(&self, entries: &mut Table, now: Instant) {
        let ms = now.saturating_duration_since(self.epoch).as_millis() as u64;
        let last = self.room_sought.load(Ordering::Relaxed);
        if last != 0 && ms.saturating_sub(last) < 100 {
            return;
        }
        self.room_sought.store(ms.max(1), Ordering::Relaxed);
        let mut gone = self.evict_idle(entries, now);
        gone.extend(self.let_go_quiet(entries, now));
        self.forget(&gone);
    }

    /// Tells the observer which labelled providers left the table.
    fn forget(&self, gone: &[Arc<str>]) {
        if let (false, Some(o)) = (gone.is_empty(), &self.observer) {
            o.gone(gone);
        }
    }

    /// What `p` learned, as kept once it leaves the table: its age counts
    /// from its last use, not from its leaving.
    fn fold(&self, p: &Provider, now: Instant) -> Kept {
        Kept {
            state: p.policy.learned(now),
            at: p.last_used(self.epoch),
            config: Some(p.config.load(Ordering::Relaxed)),
            saved: false,
        }
    }

    /// Evicts providers idle for `provider_idle`; the labels of their own
    /// that they held.
    fn evict_idle(&self, entries: &mut Table, now: Instant) -> Vec<Arc<str>> {
        let rules = self.rules();
        let idle = rules.limits.provider_idle;
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let mut gone = Vec::new();
        entries.retain(|Entry(p)| {
            let name = &p.name();
            let unused = now.saturating_duration_since(p.last_used(self.epoch)) >= idle;
            let busy = Arc::strong_count(p) > 1 || p.policy.bulkhead.in_flight() > 0;
            if unused && !busy {
                if !nothing_to_keep(&rules, name, p, now) {
                    kept.insert(name.to_string(), self.fold(p, now));
                }
                self.bound_kept(&mut kept);
                labelled(p, &mut gone);
                false
            } else {
                true
            }
        });
        gone
    }

    /// Lets go the hosts' own providers (not a configured one, a lane of
    /// one, the overflow or one whose budget is shared) once their windows
    /// have passed (R-PF1, issue 38): one that learned nothing, or nothing
    /// a cold start does not hold, is dropped; one that learned something
    /// is folded into what it learned — kept
    /// until the store has it, then read back from the store on its next
    /// request, as an evicted one is. A broad crawl's host would otherwise
    /// hold its state — a few KB — for `provider_idle`. A provider with
    /// anything under way (a hold ahead, a quota followed, a probe, an
    /// outage, a request) stays, as does one a request holds.
    ///
    /// Only once the table holds more providers than get metric series of
    /// their own (`limits.max_metric_providers`, 256): below that it is a
    /// sidecar's few providers, each watched on the admin page and in
    /// `sluice status`, and one polled every 30 s would flicker out of
    /// sight between polls.
    fn let_go_quiet(&self, entries: &mut Table, now: Instant) -> Vec<Arc<str>> {
        let rules = self.rules();
        let mut gone = Vec::new();
        if entries.len() <= rules.limits.max_metric_providers {
            return gone;
        }
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|Entry(p)| {
            let name = &p.name();
            let quiet = now.saturating_duration_since(p.last_used(self.epoch)) >= p.policy.quiet();
            if !quiet || Arc::strong_count(p) > 1 || !own(&rules, name, p) {
                return true;
            }
            if p.policy.learned_nothing(now) {
                labelled(p, &mut gone);
                return false;
            }
            if !p.policy.settled(now) {
                return true;
            }
            if !nothing_to_keep(&rules, name, p, now) {
                kept.insert(name.to_string(), self.fold(p, now));
            }
            labelled(p, &mut gone);
            false
        });
        self.bound_kept(&mut kept);
        gone
    }

    /// The `n` live providers used last, by name; and how many are live.
    pub fn recent(&self, n: usize) -> (Vec<Arc<Provider>>, usize) {
        let mut all: Vec<_> = self.entries().iter().map(|e| e.0.clone()).collect();
        let total = all.len();
        if n < total {
            all.select_nth_unstable_by_key(n, |p| {
                std::cmp::Reverse(p.last_used.load(Ordering::Relaxed))
            });
            all.truncate(n);
        }
        all.sort_by(|a, b| a.name().cmp(b.name()));
        (all, total)
    }

    /// Every live provider, by name.
    pub fn all(&self) -> Vec<Arc<Provider>> {
        let mut all: Vec<_> = self.entries().iter().map(|e| e.0.clone()).collect();
        all.sort_by(|a, b| a.name().cmp(b.name()));
        all
    }

    /// Learned state of live providers and of those kept since eviction,
    /// each with its age: the time since the provider was last used, which
    /// is what the staleness guard measures (R-PS1).
    pub fn learned(&self) -> Vec<Learned> {
        self.learned_where(false)
    }

    /// Like [`Providers::learned`], only what changed since it was last
    /// handed out here: a provider whose learned state and last use are
    /// the same, or a kept state already given, is left out (issue 24:
    /// every provider was saved every `save_interval`, thousands of
    /// unchanged records rewritten into sled each time).
    pub fn learned_changed(&self) -> Vec<Learned> {
        self.learned_where(true)
    }

    fn learned_where(&self, changed_only: bool) -> Vec<Learned> {
        let now = Instant::now();
        let all = self.all();
        // Nothing to save of a provider that learned nothing, or nothing a
        // cold start does not hold (R-PF1). (The
        // table's lock is not held: the rules are taken after it, as
        // everywhere, and let go before the kept states'.)
        let rules = self.rules();
        let mut out: Vec<_> = all
            .iter()
            .filter(|p| {
                !untaught(&rules, p.name(), p, now) && !nothing_to_keep(&rules, p.name(), p, now)
            })
            .filter_map(|p| {
                let used = p.last_used(self.epoch);
                let state = p.policy.learned(now);
                let since = used.saturating_duration_since(self.epoch);
                let print = fingerprint(&state, since, now, self.epoch);
                let same = p.saved.swap(print, Ordering::Relaxed) == print;
                if changed_only && same {
                    return None;
                }
                Some(Learned {
                    name: p.name().to_string(),
                    state,
                    age: now.saturating_duration_since(used),
                    config: Some(p.config.load(Ordering::Relaxed)),
                })
            })
            .collect();
        drop(rules);
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if changed_only && self.recall.is_some() {
            // Handed to the store by an earlier save, which has finished
            // (saves run one after another): the store keeps them now.
            kept.retain(|_, k| !k.saved);
            shrink(&mut kept);
        }
        out.extend(kept.iter_mut().filter_map(|(n, k)| {
            if changed_only && std::mem::replace(&mut k.saved, true) {
                return None;
            }
            Some(Learned {
                name: n.clone(),
                state: k.state,
                age: now.saturating_duration_since(k.at),
                config: k.config,
            })
        }));
        out
    }

    /// Applies a reloaded config (R-OP5): new rules for lookups, new
    /// settings for live providers — their learned state is kept, except
    /// an open breaker of a provider whose config changed: it closes.
    pub fn reload(&self, config: &Config) {
        {
            let mut rules = self.rules.write().unwrap_or_else(|p| p.into_inner());
            *rules = Rules::of(config);
        }
        let defaults = self.rules().defaults.clone();
        for p in self.all() {
            // A lane takes its provider's settings.
            let name = p.lane_of.as_deref().unwrap_or(p.name());
            let (settings, intercept) = match config.providers.iter().find(|n| n.name == name) {
                Some(n) => (Arc::new(n.settings.clone()), n.intercept),
                None => (defaults.clone(), config.defaults_intercept),
            };
            let settings = speaking(settings, p.spoken);
            let print = self.rules().print(&settings, intercept);
            p.share(self.shared.as_ref(), settings.shared);
            p.policy.update_settings(settings);
            p.intercept.store(intercept, Ordering::Relaxed);
            if p.config.swap(print, Ordering::Relaxed) != print && p.policy.clear_breaker() {
                tracing::info!(provider = %p.name(), "breaker cleared: the provider's config changed");
            }
        }
    }
}

impl Provider {
    /// Its label in metrics: its name, or `_other` beyond the label cap.
    pub fn label(&self) -> &str {
        if self.labelled {
            self.name()
        } else {
            crate::observe::metrics::OTHER
        }
    }

    /// Shares its budget through `store` (or stops sharing it).
    fn share(&self, store: Option<&Arc<SharedStore>>, shared: bool) {
        let mut budget = self.budget.lock().unwrap_or_else(|p| p.into_inner());
        match (store.filter(|_| shared), budget.is_some()) {
            (Some(store), false) => {
                let b = store.budget(self.name());
                self.policy.pacer.set_budget(Some(b.clone()));
                *budget = Some(b);
            }
            (None, true) => {
                self.policy.pacer.set_budget(None);
                *budget = None;
            }
            _ => {}
        }
    }

    /// Its shared budget, while shared.
    pub fn budget(&self) -> Option<Arc<ProviderBudget>> {
        self.budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn touch(&self, epoch: Instant, now: Instant) {
        let ms = now.saturating_duration_since(epoch).as_millis() as u64;
        self.last_used.store(ms, Ordering::Relaxed);
    }

    fn last_used(&self, epoch: Instant) -> Instant {
        epoch + Duration::from_millis(self.last_used.load(Ordering::Relaxed))
    }

    /// Whether its CONNECT tunnels are intercepted.
    pub fn intercept(&self) -> bool {
        self.intercept.load(Ordering::Relaxed)
    }

    /// Marks that a raw tunnel carried this provider's traffic.
    pub fn saw_raw_tunnel(&self) {
        self.raw_tunnels.store(true, Ordering::Relaxed);
    }

    /// Whether sluice sees each of this provider's requests.
    pub fn visible(&self) -> bool {
        !self.raw_tunnels.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::guard::Guard;
    use crate::upstream::tls_config;

    fn table(config: &str) -> Providers {
        let config = Config::from_toml(config).unwrap();
        let upstream = Upstream::new(
            Guard::default(),
            tls_config(None).unwrap(),
            Duration::from_secs(1),
            crate::upstream::pool::DEFAULT_MAX_IDLE,
        );
        Providers::new(&config, upstream, None)
    }

    #[tokio::test(start_paused = true)]
    async fn hosts_map_to_providers_and_the_table_is_capped() {
        let t = table(
            "[limits]\nmax_providers = 2\n[providers.named]\nhosts = [\"*.named.test\"]\nceiling_rps = 7.0\n",
        );
        let named = t.get("API.Named.Test.");
        assert_eq!(named.name().as_ref(), "named");
        assert_eq!(named.policy.settings().ceiling_rps, 7.0);
        assert_eq!(t.get("a.test").name().as_ref(), "a.test");
        // Full (and nothing idle yet): an unknown host shares one provider.
        assert_eq!(t.get("b.test").name().as_ref(), OVERFLOW);
        assert_eq!(t.get("c.test").name().as_ref(), OVERFLOW);
        // Named providers are never folded.
        assert_eq!(t.get("x.named.test").name().as_ref(), "named");
    }

    /// R-PD1, R-PD2: a named provider speaks its hosts' dialect (and
    /// keeps it over a reload); a budget of its own on the same hosts is a
    /// lane `{resource}@{provider}` with the provider's settings; lanes
    /// are bounded per provider.
    #[tokio::test(start_paused = true)]
    async fn lanes_for_budgets_of_their_own() {
        let config = "[providers.gh]\nhosts = [\"api.github.com\"]\nceiling_rps = 7.0\n\
                      [providers.dc]\nhosts = [\"discord.com\"]\n";
        let t = table(config);
        let gh = t.get("api.github.com");
        assert_eq!(gh.policy.bulkhead.dialect(), Dialect::GitHub);
        let (core, r) = t.lane(&gh, &Method::GET, "/repos/o/r/issues");
        assert!(Arc::ptr_eq(&core, &gh) && r.is_none());
        let (search, r) = t.lane(&gh, &Method::GET, "/search/issues?q=x");
        assert_eq!(search.name().as_ref(), "search@gh");
        assert_eq!(r.unwrap().name(), "search");
        assert_eq!(search.lane_of.as_deref(), Some("gh"));
        assert_eq!(search.policy.bulkhead.dialect(), Dialect::GitHub);
        assert_eq!(search.policy.settings().ceiling_rps, 7.0);
        let (again, _) = t.lane(&gh, &Method::GET, "/search/code");
        assert_eq!(again.name().as_ref(), "code_search@gh");
        assert!(Arc::ptr_eq(
            &t.lane(&gh, &Method::GET, "/search/users").0,
            &search
        ));

        t.reload(&Config::from_toml(&config.replace("7.0", "9.0")).unwrap());
        assert_eq!(search.policy.settings().ceiling_rps, 9.0, "a lane follows");
        assert_eq!(gh.policy.bulkhead.dialect(), Dialect::GitHub, "kept");
        assert_eq!(search.policy.bulkhead.dialect(), Dialect::GitHub);

        let dc = t.get("discord.com");
        for channel in 0..MAX_LANES + 5 {
            t.lane(
                &dc,
                &Method::GET,
                &format!("/api/v10/channels/{}/messages", 100_000 + channel),
            );
        }
        let lanes = t
            .all()
            .iter()
            .filter(|p| p.lane_of.as_deref() == Some("dc"))
            .count();
        assert_eq!(lanes, MAX_LANES);
        let (beyond, r) = t.lane(&dc, &Method::GET, "/api/v10/channels/999999/messages");
        assert!(
            Arc::ptr_eq(&beyond, &dc) && r.is_none(),
            "beyond: the main lane"
        );
    }

    /// Issue 24: the periodic save hands the store only what changed —
    /// a provider once, then again when it is used or learns something;
    /// a kept state once. The full list (shutdown) has everyone.
    #[tokio::test(start_paused = true)]
    async fn only_what_changed_is_saved_again() {
        let t = table("");
        let names = |v: Vec<Learned>| {
            let mut n: Vec<String> = v.into_iter().map(|l| l.name).collect();
            n.sort();
            n
        };
        // Each taught something (a rate of its own): a provider that
        // learned nothing has nothing to save.
        let a = t.get("a.test");
        a.policy.pacer.lock().restore(3.0, None, None);
        t.get("b.test").policy.pacer.lock().restore(4.0, None, None);
        assert_eq!(names(t.learned_changed()), ["a.test", "b.test"]);
        assert!(t.learned_changed().is_empty(), "nothing changed");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(t.learned_changed().is_empty(), "time alone changes nothing");
        t.get("a.test");
        assert_eq!(names(t.learned_changed()), ["a.test"], "a was used");
        a.policy.pacer.feedback(
            Some(sluice_policy::classify::Outcome::Throttled {
                status: 429,
                retry_after: None,
            }),
            Instant::now(),
            None,
        );
        assert_eq!(names(t.learned_changed()), ["a.test"], "a cut its rate");
        let state = a.policy.learned(Instant::now());
        t.keep("gone.test", state, Duration::from_secs(1), None);
        assert_eq!(names(t.learned_changed()), ["gone.test"]);
        assert!(t.learned_changed().is_empty());
        assert_eq!(names(t.learned()), ["a.test", "b.test", "gone.test"]);
    }

    /// R-PF1, issue 38: a host's provider that learned nothing is not
    /// saved, and is let go once its windows have passed, as is one that
    /// only failed (a cold start's state, failures in a row); one that learned
    /// something is folded into what it learned then, and made again from
    /// it; a configured one, one in use and one with a hold ahead stay.
    #[tokio::test(start_paused = true)]
    async fn providers_are_let_go_once_quiet_and_folded_if_taught() {
        // A table past its metric series' cap (a crawl, not a sidecar).
        let t = table(
            "[limits]\nmax_metric_providers = 1\n[providers.named]\nhosts = [\"named.test\"]\n",
        );
        t.get("quiet.test");
        t.get("named.test");
        t.get("taught.test")
            .policy
            .pacer
            .lock()
            .restore(3.0, None, None);
        // Told to wait a minute: a hold ahead is under way.
        let held = t.get("held.test");
        held.policy.pacer.feedback(
            Some(sluice_policy::classify::Outcome::Throttled {
                status: 429,
                retry_after: Some(Duration::from_secs(60)),
            }),
            Instant::now(),
            None,
        );
        drop(held);
        // A dead host: its connects refused.
        let dead = t.get("dead.test");
        dead.policy.pacer.feedback(
            Some(sluice_policy::classify::Outcome::ConnectError { retryable: true }),
            Instant::now(),
            None,
        );
        assert!(
            !dead.policy.learned_nothing(Instant::now()),
            "failures in a row are evidence while the windows last"
        );
        drop(dead);
        let in_use = t.get("in-use.test");
        let saved: Vec<String> = t.learned_changed().into_iter().map(|l| l.name).collect();
        assert_eq!(
            saved,
            ["held.test", "named", "taught.test"],
            "nothing to save of the rest"
        );
        tokio::time::advance(Duration::from_secs(9)).await;
        t.sweep();
        assert_eq!(t.all().len(), 6, "within the windows: all stay");
        tokio::time::advance(Duration::from_secs(2)).await;
        t.sweep();
        let mut live: Vec<String> = t.all().iter().map(|p| p.name().to_string()).collect();
        live.sort();
        assert_eq!(live, ["held.test", "in-use.test", "named"]);
        let folded = t.learned_changed();
        let names: Vec<&str> = folded.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["taught.test"], "folded: to be saved");
        assert_eq!(folded[0].state.rate_rps, 3.0);
        drop(in_use);
        t.sweep();
        assert_eq!(t.all().len(), 2, "let go once no request holds it");
        assert!(!t.get("quiet.test").restored, "made again, cold");
        assert!(
            !t.get("dead.test").restored,
            "made again, cold: nothing of it was kept"
        );
        let back = t.get("taught.test");
        assert!(back.restored, "made again from what it learned");
        assert_eq!(back.policy.pacer.snapshot(Instant::now()).rate_rps, 3.0);

        // A sidecar's few providers (no more than get series of their own)
        // stay for `provider_idle`, watched.
        let few = table("");
        few.get("quiet.test");
        tokio::time::advance(Duration::from_secs(11)).await;
        few.sweep();
        assert_eq!(few.all().len(), 1, "below the cap: kept");
    }

    #[tokio::test(start_paused = true)]
    async fn kept_state_is_bounded_oldest_first() {
        let t = table("[limits]\nmax_providers = 1\n");
        let state = t.get("seed.test").policy.learned(Instant::now());
        for i in 0..10u64 {
            t.keep(
                &format!("h{i}.test"),
                state,
                Duration::from_secs(100 - i),
                None,
            );
        }
        let kept = t.kept.lock().unwrap();
        assert_eq!(kept.len(), 4);
        assert!(kept.contains_key("h9.test") && !kept.contains_key("h0.test"));
    }

    /// R-PS1, issue 38: an evicted provider's state leaves memory once the
    /// store has it, and the provider resumes it from the store when it
    /// comes back — also past the bound on states kept in memory (4 ×
    /// `max_providers`), where it came back cold before.
    #[tokio::test(start_paused = true)]
    async fn evicted_state_leaves_memory_once_saved_and_comes_back_from_the_store() {
        let dir = std::env::temp_dir().join(format!("sluice-recall-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (cold, errors) = (
            prometheus::IntCounterVec::new(prometheus::Opts::new("c", "c"), &["reason"]).unwrap(),
            prometheus::IntCounter::new("e", "e").unwrap(),
        );
        let store = Arc::new(Store::open(&dir, &cold, &errors).unwrap());
        let t = table("[limits]\nmax_providers = 2\nprovider_idle = \"60s\"\n")
            .with_recall(Some(recall(store.clone())));
        let save = |t: &Providers| {
            for l in t.learned_changed() {
                let record = crate::store::LearnedRecord::of(&l.state, l.age, l.config);
                store.save_learned(&l.name, &record).unwrap();
            }
        };
        // Twelve hosts, each with a rate of its own, evicted in pairs: more
        // than the 8 states memory may keep.
        for i in 0..12u32 {
            let p = t.get(&format!("h{i}.test"));
            p.policy
                .pacer
                .lock()
                .restore(1.0 + f64::from(i), None, None);
            drop(p);
            if i % 2 == 1 {
                tokio::time::advance(Duration::from_secs(61)).await;
                t.sweep();
                save(&t);
            }
        }
        save(&t);
        assert!(
            t.kept.lock().unwrap().is_empty(),
            "saved states left memory"
        );
        for i in [0u32, 5, 11] {
            let back = t.get(&format!("h{i}.test"));
            assert!(back.restored, "h{i} restored");
            let rate = back.policy.pacer.snapshot(Instant::now()).rate_rps;
            assert_eq!(rate, 1.0 + f64::from(i), "h{i}'s rate from the store");
            drop(back);
            // Room for the next (the table holds two).
            tokio::time::advance(Duration::from_secs(61)).await;
            t.sweep();
        }
        // The admin page reads a provider not in memory from the store too.
        assert_eq!(t.kept("h3.test").map(|(k, _)| k.rate_rps), Some(4.0));
        drop(t);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_providers_are_evicted_and_resume_what_they_learned() {
        let t = table("[limits]\nprovider_idle = \"60s\"\nstate_max_age = \"1h\"\n");
        t.get("a.test")
            .policy
            .pacer
            .lock()
            .restore(3.25, Some(4.0), None);
        tokio::time::advance(Duration::from_secs(61)).await;
        t.sweep();
        assert!(t.all().is_empty(), "evicted");
        let again = t.get("a.test");
        let snap = again.policy.pacer.snapshot(Instant::now());
        assert_eq!(snap.rate_rps, 3.25);
        assert_eq!(snap.limit_rps, Some(4.0));
        assert!(again.restored);
        drop(again);
        // Older than state_max_age: a cold start.
        tokio::time::advance(Duration::from_secs(61)).await;
        t.sweep();
        tokio::time::advance(Duration::from_secs(3601)).await;
        t.sweep();
        let cold = t.get("a.test");
        assert_eq!(cold.policy.pacer.snapshot(Instant::now()).rate_rps, 5.0);
    }
}
