//! Budgets shared by replicas through Redis (R-DS1).
//!
//! A provider's limit belongs to its credential, not to a pod: with
//! `[shared] redis` and a provider's `shared = true`, every replica paces
//! that provider by one schedule kept in Redis. Each provider is one hash,
//! `{prefix}:{provider}` — the braces make the provider the key's hash
//! tag, so a Redis Cluster keeps it in one slot — holding the GCRA
//! theoretical arrival time, the shared rate, the throttle point, the
//! `Retry-After` hold and its length, the time of the last cut and of the
//! last raise, a count of admissions, and the fleet's last refusal after
//! a hold (for the token-bucket fit, R-SG5).
//!
//! Four Lua scripts, loaded once and run by SHA (`EVALSHA`, reloaded by the
//! client on `NOSCRIPT`), change it atomically, on the Redis server's clock
//! (`TIME`), so replica clocks do not matter:
//! - [`ADMIT`]: the next slot is taken if it is due (a hold counts as not
//!   due), else its distance is returned and the replica sleeps and asks
//!   again. Every answer carries the shared rate, throttle point, hold,
//!   the hold's length and the fleet's last refusal.
//! - [`CUT`]: a throttle cuts the shared rate once per congestion epoch: a
//!   request sent before the last shared cut cuts nothing, so eight
//!   replicas meeting one overshoot cut once.
//! - [`RAISE`]: a replica whose demand saturated the shared pace proposes
//!   the rate it grew to; at most one raise per increase window (and none
//!   within a window of a cut) is applied.
//! - [`HOLD`]: one replica's `Retry-After` holds every replica; a hold
//!   that begins once the last is over records the refusal that brought
//!   it (how long after the last hold's end, and the admissions between).
//!
//! Every call is bounded by `call_timeout`. A first call that fails or
//! times out holds the request and asks once more [`RECHECK`] later: a
//! miss of this replica's own (a stalled client, a timeout under load)
//! must not put its share on top of the slots the other replicas still
//! take. A second miss puts the replica on its own — it paces at `rate /
//! replicas` from the last shared state and says so
//! (`sluice_shared_budget_state`, the readout) — and Redis is not asked
//! again for [`RETRY_DOWN`]; the first answer after that rejoins. No
//! request fails because Redis is down.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Script;
use sluice_policy::pacer::shared::{AdmitFuture, FleetRefusal};
use sluice_policy::pacer::{Proposal, Seat, SharedAdmit, SharedBudget, SharedChange, SharedView};
use tokio::time::Instant;

use crate::config::{redact_url, ConfigError, Shared};

mod link;
use link::Link;

/// After a failed call that followed a miss (the store was already
/// resting), Redis is not asked again for this long: requests do not each
/// pay the call timeout while it is down.
pub const RETRY_DOWN: Duration = Duration::from_secs(1);

/// After a first failed call, Redis is asked once more this much later,
/// the request held meanwhile, before the replica goes alone (R-DS2).
pub const RECHECK: Duration = Duration::from_millis(250);

/// A shared budget nobody touched for a day is forgotten by Redis.
const KEY_TTL_MS: u64 = 24 * 3600 * 1000;

/// How often this replica's share of the admissions is measured.
const SHARE_EVERY: Duration = Duration::from_secs(5);

/// Rates and limits are kept as the text a replica sent (Lua's `tostring`
/// keeps 14 digits: a rate read back a hair lower than written would look
/// like a cut to every replica).
///
/// Takes the provider's next slot if it is due. `KEYS[1]`: the provider's
/// hash. ARGV: this replica's rate and throttle point (they start a budget
/// nobody has), the lateness forgiven (ms; at most half an interval), the
/// key's TTL (ms), the units the request costs (it takes as many slots,
/// R-FS2), and the provider's allowance — units and period (ms), or ""
/// — which every replica spends together: the schedule then runs no faster
/// than what is left over what remains of the period, and not at all once
/// it is spent (R-FS2); what is left of the hold this replica knows of
/// (ms, or ""), kept if the budget's own is shorter — a primary that lost
/// the last writes is seeded from the replicas, never from zero (R-DS2);
/// and "1" when this replica asks for a seat (its first answer).
/// Returns admitted (0/1), the wait (ms), the shared rate, throttle point
/// (or ""), the hold left (ms), the units admitted so far, the allowance's
/// period so far (ms, or "") and units spent, the fleet's last refusal
/// after a hold (see [`HOLD`]; "" if none), the last hold's length (ms,
/// or ""), the seat's number (counted from 1; 0 when none was asked) and
/// the store's clock (`seconds.microseconds` since the Unix epoch): where a
/// replica's sends go should it pace alone (R-DS2).
pub const ADMIT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local f = redis.call('HMGET', KEYS[1], 'tat', 'rate', 'hold', 'limit', 'admitted', 'rat', 'rafter', 'rsent', 'hlen')
local rate = tonumber(f[2])
local rate_text = f[2]
local limit = f[4] or ''
if not rate or rate <= 0 then
  rate = tonumber(ARGV[1])
  rate_text = ARGV[1]
  redis.call('HSET', KEYS[1], 'rate', ARGV[1])
  if ARGV[2] ~= '' then
    redis.call('HSET', KEYS[1], 'limit', ARGV[2])
    limit = ARGV[2]
  end
end
local tat = tonumber(f[1]) or 0
local hold = tonumber(f[3]) or 0
local known = tonumber(ARGV[8])
if known and known > 0 and now + known > hold then
  hold = now + known
  redis.call('HSET', KEYS[1], 'hold', tostring(hold))
end
local at = math.max(tat, hold, now)
local units = tonumber(ARGV[5]) or 1
local pace = rate
local aunits = tonumber(ARGV[6])
local aper = tonumber(ARGV[7])
local ab = nil
local aspent = 0
if aunits and aper and aper > 0 then
  local g = redis.call('HMGET', KEYS[1], 'ab', 'as')
  ab = tonumber(g[1])
  aspent = tonumber(g[2]) or 0
  if ab and now >= ab + aper then
    ab = ab + aper * math.floor((now - ab) / aper)
    aspent = 0
    redis.call('HSET', KEYS[1], 'ab', tostring(ab), 'as', '0')
  end
  local left = aunits - aspent
  if left <= 0 then
    at = math.max(at, ab + aper)
  else
    local remaining = aper
    if ab then remaining = ab + aper - now end
    local even = left / math.max(remaining / 1000, math.min(aper / 1000, 1))
    if even < pace then pace = even end
  end
end
local admitted = 0
local count = tonumber(f[5]) or 0
if at <= now then
  local due = math.max(tat, hold, now - math.min(tonumber(ARGV[3]), 500 / pace))
  redis.call('HSET', KEYS[1], 'tat', tostring(due + units * 1000 / pace))
  count = redis.call('HINCRBY', KEYS[1], 'admitted', units)
  admitted = 1
  if aunits and aper and aper > 0 then
    if not ab then ab = now end
    aspent = aspent + units
    redis.call('HSET', KEYS[1], 'ab', tostring(ab), 'as', tostring(aspent))
  end
end
local aelapsed = ''
if ab then aelapsed = tostring(now - ab) end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
local refusal = ''
if f[6] and f[7] and f[8] then
  refusal = f[6] .. ' ' .. tostring(now - tonumber(f[6])) .. ' ' .. f[7] .. ' ' .. f[8]
end
local seat = 0
if ARGV[9] == '1' then
  seat = redis.call('HINCRBY', KEYS[1], 'seats', 1)
end
return {admitted, tostring(at - now), rate_text, limit, tostring(math.max(hold - now, 0)), count, aelapsed, tostring(aspent), refusal, f[9] or '', seat, t[1] .. '.' .. string.format('%06d', tonumber(t[2]))}
";

/// Cuts the shared rate, once per congestion epoch. ARGV: how long ago
/// the throttled request was sent (ms), the rate after the cut, the
/// throttle point (or ""), the TTL (ms). Returns 1 if it cut.
pub const CUT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local f = redis.call('HMGET', KEYS[1], 'rate', 'cut')
if now - tonumber(ARGV[1]) <= (tonumber(f[2]) or 0) then
  return 0
end
local current = tonumber(f[1])
if not current or tonumber(ARGV[2]) < current then
  redis.call('HSET', KEYS[1], 'rate', ARGV[2])
end
redis.call('HSET', KEYS[1], 'cut', tostring(now))
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'limit', ARGV[3])
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
";

/// Raises the shared rate, at most once per increase window and not within
/// one of a cut. ARGV: the proposed rate, the throttle point (or "": none),
/// the window (ms), the TTL (ms). Returns 1 if it raised.
pub const RAISE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local f = redis.call('HMGET', KEYS[1], 'rate', 'raised', 'cut')
local current = tonumber(f[1])
local rate = tonumber(ARGV[1])
local last = math.max(tonumber(f[2]) or 0, tonumber(f[3]) or 0)
if (current and rate <= current) or now - last < tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], 'rate', ARGV[1], 'raised', tostring(now))
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'limit', ARGV[2])
else
  redis.call('HDEL', KEYS[1], 'limit')
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
";

/// Holds every replica. ARGV: the hold from now (ms), whether a refusal
/// brought it ("1", else "": a spent quota's), the TTL (ms).
///
/// A refusal's hold that begins once the last one is over is a new
/// refusal: how long
/// after the last hold's end it came, and how many units every replica was
/// admitted in between, are kept for the token-bucket fit (R-SG5) as
/// `rat` (its time), `rafter` (ms) and `rsent`; `held` is the count
/// when a hold began (nothing is admitted during one), and `hlen` the
/// last hold's length (ms): every replica knows the provider holds, and
/// what a failed probe costs, whether or not it asked during a hold.
pub const HOLD: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local f = redis.call('HMGET', KEYS[1], 'hold', 'admitted', 'held')
local last = tonumber(f[1]) or 0
local count = tonumber(f[2]) or 0
local hold = now + tonumber(ARGV[1])
if ARGV[2] ~= '1' then
  if hold > last then
    redis.call('HSET', KEYS[1], 'hold', tostring(hold))
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
if now >= last then
  local held = tonumber(f[3])
  if last > 0 and held then
    redis.call('HSET', KEYS[1], 'rat', tostring(math.floor(now)), 'rafter', tostring(now - last), 'rsent', tostring(count - held))
  end
  redis.call('HSET', KEYS[1], 'held', tostring(count))
end
if hold > last then
  redis.call('HSET', KEYS[1], 'hold', tostring(hold), 'hlen', ARGV[1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
";

struct Scripts {
    admit: Script,
    cut: Script,
    raise: Script,
    hold: Script,
}

/// The connection to Redis every shared provider uses.
pub struct SharedStore {
    link: Link,
    /// `single`, `cluster` or `sentinel`.
    kind: &'static str,
    prefix: String,
    replicas: u32,
    timeout: Duration,
    scripts: Scripts,
    /// After a failed call: not asked again before this instant.
    down_until: Mutex<Option<Instant>>,
    /// For logs: the URL without credentials.
    url: String,
}

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedStore")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl SharedStore {
    /// A store for `[shared]`; connects lazily (a Redis down at start is
    /// the degraded mode, not a failed start). `rediss://` trusts the
    /// bundled web roots, or `extra_ca` (PEM) when the upstream has one.
    pub fn new(config: &Shared, extra_ca: Option<&Path>) -> Result<Arc<Self>, ConfigError> {
        Ok(Arc::new(SharedStore {
            link: Link::new(config, extra_ca)?,
            kind: config.target.kind(),
            prefix: config.key_prefix.clone(),
            replicas: config.replicas,
            timeout: config.call_timeout,
            scripts: Scripts {
                admit: Script::new(ADMIT),
                cut: Script::new(CUT),
                raise: Script::new(RAISE),
                hold: Script::new(HOLD),
            },
            down_until: Mutex::new(None),
            url: redact_url(&config.redis),
        }))
    }

    /// `single`, `cluster` or `sentinel`: the deployment the budgets are in.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The shared budget of one provider.
    pub fn budget(self: &Arc<Self>, provider: &str) -> Arc<ProviderBudget> {
        // Braces would end the hash tag early.
        let tag: String = provider
            .chars()
            .map(|c| if c == '{' || c == '}' { '_' } else { c })
            .collect();
        Arc::new(ProviderBudget {
            store: self.clone(),
            key: format!("{}:{{{tag}}}", self.prefix),
            provider: provider.to_string(),
            state: Mutex::new(BudgetState::default()),
            down_until: Arc::default(),
        })
    }

    /// Whether a failure lately says not to ask yet: the store's (one
    /// server, Sentinel), or the key's own (a Cluster, where one primary
    /// down leaves the other slots answering).
    fn resting(&self, key: &Mutex<Option<Instant>>, now: Instant) -> bool {
        let rest = |m: &Mutex<Option<Instant>>| {
            m.lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some_and(|d| now < d)
        };
        rest(&self.down_until) || rest(key)
    }

    /// The rest a failure starts: the store's (one server, Sentinel) or
    /// the key's (a Cluster).
    fn scope<'a>(&'a self, key: &'a Mutex<Option<Instant>>) -> &'a Mutex<Option<Instant>> {
        if self.link.fails_per_key() {
            key
        } else {
            &self.down_until
        }
    }

    /// A call sent at `sent` failed. A first miss rests only until the
    /// recheck ([`RECHECK`]); a call sent once a rest was over (the
    /// recheck, or any call after) failing too rests [`RETRY_DOWN`]; a
    /// call already under way at the first miss changes nothing.
    fn failed(&self, key: &Mutex<Option<Instant>>, sent: Instant, now: Instant) {
        let mut rest = self.scope(key).lock().unwrap_or_else(|p| p.into_inner());
        *rest = Some(rest_after_miss(*rest, sent, now));
        drop(rest);
        self.link.failed();
    }

    /// A call answered: the next miss is a first one again.
    fn answered(&self, key: &Mutex<Option<Instant>>) {
        let mut rest = self.scope(key).lock().unwrap_or_else(|p| p.into_inner());
        if rest.is_some() {
            *rest = None;
        }
    }

    /// Runs a script within the call timeout; `None` on any failure (which
    /// rests the store, or the key: see [`SharedStore::failed`]).
    async fn run<T: redis::FromRedisValue>(
        &self,
        invocation: redis::ScriptInvocation<'_>,
        provider: &str,
        key: &Mutex<Option<Instant>>,
    ) -> Option<T> {
        let sent = Instant::now();
        let result = tokio::time::timeout(self.timeout, self.link.invoke(&invocation)).await;
        match result {
            Ok(Ok(v)) => {
                self.answered(key);
                Some(v)
            }
            Ok(Err(e)) => {
                self.failed(key, sent, Instant::now());
                tracing::debug!(provider, redis = %self.url, error = %e, "shared budget call failed");
                None
            }
            Err(_) => {
                self.failed(key, sent, Instant::now());
                tracing::debug!(provider, redis = %self.url, "shared budget call timed out");
                None
            }
        }
    }
}

/// Until when a store (or a key) rests after a call sent at `sent` failed
/// at `now`, given the rest it was under (`None`: it answered last).
fn rest_after_miss(rest: Option<Instant>, sent: Instant, now: Instant) -> Instant {
    match rest {
        None => now + RECHECK,
        Some(until) if sent >= until => now + RETRY_DOWN,
        Some(until) => until,
    }
}

/// Whether a replica paces by the shared budget or alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BudgetMode {
    /// Not yet asked.
    #[default]
    Joining,
    /// Pacing by the shared budget.
    Shared,
    /// Redis did not answer: pacing alone at its share.
    Degraded,
}

impl BudgetMode {
    /// The label in metrics and the readout.
    pub fn label(self) -> &'static str {
        match self {
            BudgetMode::Joining => "joining",
            BudgetMode::Shared => "shared",
            BudgetMode::Degraded => "degraded",
        }
    }
}

#[derive(Debug, Default)]
struct BudgetState {
    mode: BudgetMode,
    /// The shared rate as last seen.
    rate: Option<f64>,
    /// Admissions this replica took.
    here: u64,
    /// Admissions counted by the store, as last seen.
    all: u64,
    /// The counts when the share was last measured.
    sampled: Option<(Instant, u64, u64)>,
    /// This replica's share of the admissions over the last measure.
    share: Option<f64>,
    /// Times this replica went on its own for the provider.
    degraded: u64,
    /// When it last went on its own, and when it last came back.
    degraded_at: Option<Instant>,
    rejoined_at: Option<Instant>,
    /// This replica's seat, as the store numbered it (from 1), once given.
    seat: Option<u64>,
    /// The store's clock less this replica's, as last read (ns).
    skew: Option<i128>,
}

/// What the readout and metrics show of a shared provider.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetReadout {
    /// Shared, degraded or joining.
    pub mode: BudgetMode,
    /// The shared rate as last seen.
    pub rate_rps: Option<f64>,
    /// This replica's share of the shared admissions lately.
    pub share: Option<f64>,
    /// Admissions this replica took through the shared budget.
    pub admitted_here: u64,
    /// The Redis node that answers for the provider's key (`host:port`):
    /// the server, the Cluster primary of its slot, or the primary
    /// Sentinel named — as last known.
    pub node: Option<String>,
    /// `single`, `cluster` or `sentinel`.
    pub redis: &'static str,
    /// Times this replica went on its own for the provider (Redis, or its
    /// slot's primary, unreachable).
    pub degraded: u64,
    /// When it last went on its own, and when it last rejoined.
    pub degraded_at: Option<Instant>,
    /// This replica's seat (`0..replicas`): which slots it takes while it
    /// paces alone. Two replicas with one seat send together then.
    pub seat: Option<u32>,
    /// When it last rejoined the shared schedule after going on its own.
    pub rejoined_at: Option<Instant>,
}

/// One provider's budget in the store.
pub struct ProviderBudget {
    store: Arc<SharedStore>,
    key: String,
    provider: String,
    state: Mutex<BudgetState>,
    /// After a failed call for this key (a Cluster): not asked again
    /// before this instant.
    down_until: Arc<Mutex<Option<Instant>>>,
}

impl std::fmt::Debug for ProviderBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderBudget")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// The fleet's last refusal as [`ADMIT`] returns it: its time (the key's
/// clock, ms), how long ago, how long after the hold before it (ms), and
/// the units admitted in between — or "" when none is kept.
fn fleet_refusal(text: &str) -> Option<FleetRefusal> {
    let mut fields = text.split(' ').map(|f| f.parse::<f64>().ok());
    let mut next = || {
        fields
            .next()
            .flatten()
            .filter(|v| v.is_finite() && *v >= 0.0)
    };
    let (id, ago, after, sent) = (next()?, next()?, next()?, next()?);
    let ms = |v: f64| Duration::from_secs_f64(v / 1000.0);
    Some(FleetRefusal {
        id: id as u64,
        ago: ms(ago),
        after: ms(after),
        sent: sent as u64,
    })
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl ProviderBudget {
    fn state(&self) -> std::sync::MutexGuard<'_, BudgetState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The seat the store's `n`th number (from 1) names among the
    /// replicas.
    fn seat_of(&self, n: u64) -> u32 {
        let seats = u64::from(self.store.replicas.max(1));
        // Below `replicas`, a u32.
        (n.saturating_sub(1) % seats) as u32
    }

    /// The readout.
    pub fn readout(&self) -> BudgetReadout {
        let s = self.state();
        BudgetReadout {
            mode: s.mode,
            rate_rps: s.rate,
            share: s.share,
            admitted_here: s.here,
            node: self.store.link.node_of(&self.key),
            redis: self.store.kind,
            degraded: s.degraded,
            degraded_at: s.degraded_at,
            rejoined_at: s.rejoined_at,
            seat: s.seat.map(|n| self.seat_of(n)),
        }
    }

    fn set_mode(&self, mode: BudgetMode) {
        let mut s = self.state();
        if s.mode == mode {
            return;
        }
        let node = self.store.link.node_of(&self.key);
        let node = node.as_deref().unwrap_or("unknown");
        match mode {
            BudgetMode::Degraded => {
                s.degraded += 1;
                s.degraded_at = Some(Instant::now());
                tracing::warn!(
                    provider = %self.provider,
                    redis = %self.store.url,
                    node,
                    replicas = self.store.replicas,
                    "shared budget unreachable: pacing alone at this replica's share"
                );
            }
            _ => {
                if s.mode == BudgetMode::Degraded {
                    s.rejoined_at = Some(Instant::now());
                }
                tracing::info!(provider = %self.provider, node, "shared budget joined");
            }
        }
        s.mode = mode;
    }

    async fn ask(&self, proposal: Proposal) -> Option<SharedAdmit> {
        let now = Instant::now();
        if self.store.resting(&self.down_until, now) {
            self.set_mode(BudgetMode::Degraded);
            return None;
        }
        let mut invocation = self.store.scripts.admit.prepare_invoke();
        invocation
            .key(&self.key)
            .arg(proposal.rate.to_string())
            .arg(opt(proposal.limit))
            .arg(millis(sluice_policy::pacer::SHARED_SLACK))
            .arg(KEY_TTL_MS)
            .arg(proposal.units.max(1));
        match proposal.allowance {
            Some(a) => invocation.arg(a.units).arg(millis(a.per)),
            None => invocation.arg("").arg(""),
        };
        invocation.arg(
            proposal
                .hold
                .map_or_else(String::new, |h| millis(h).to_string()),
        );
        invocation.arg(if self.state().seat.is_none() { "1" } else { "" });
        type Reply = (
            i64,
            String,
            String,
            String,
            String,
            u64,
            String,
            String,
            String,
            String,
            u64,
            String,
        );
        let sent = wall_clock();
        let reply: Option<Reply> = self
            .store
            .run(invocation, &self.provider, &self.down_until)
            .await;
        let answered = wall_clock();
        let Some((
            admitted,
            wait,
            rate,
            limit,
            hold,
            count,
            aelapsed,
            aspent,
            refusal,
            held,
            seat,
            clock,
        )) = reply
        else {
            self.set_mode(BudgetMode::Degraded);
            return None;
        };
        let ms = |v: &str| {
            v.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .map_or(Duration::ZERO, |v| Duration::from_secs_f64(v / 1000.0))
        };
        let rate: f64 = rate.parse().ok().filter(|r: &f64| *r > 0.0)?;
        let view = SharedView {
            rate,
            limit: limit.parse().ok(),
            hold: Some(ms(&hold)).filter(|h| !h.is_zero()),
            admitted: count,
            allowance: match (aelapsed.parse::<f64>(), aspent.parse::<f64>()) {
                (Ok(e), Ok(spent)) if e.is_finite() && e >= 0.0 && spent >= 0.0 => {
                    Some(sluice_policy::pacer::AllowanceUse {
                        elapsed: Duration::from_secs_f64(e / 1000.0),
                        spent,
                    })
                }
                _ => None,
            },
            refusal: fleet_refusal(&refusal),
            held: Some(ms(&held)).filter(|h| !h.is_zero()),
        };
        self.set_mode(BudgetMode::Shared);
        let mut s = self.state();
        if seat > 0 {
            s.seat = Some(seat);
        }
        // The store's clock against this replica's, read half way through
        // the call.
        if let Some(clock) = store_clock(&clock) {
            s.skew = Some(clock - (sent + answered) / 2);
        }
        s.rate = Some(rate);
        s.all = count;
        if admitted == 1 {
            s.here += u64::from(proposal.units.max(1));
            let now = Instant::now();
            match s.sampled {
                Some((at, all0, here0)) if now - at >= SHARE_EVERY => {
                    let all = count.saturating_sub(all0);
                    if all > 0 {
                        s.share = Some((s.here - here0) as f64 / all as f64);
                    }
                    s.sampled = Some((now, count, s.here));
                }
                None => s.sampled = Some((now, count, s.here)),
                _ => {}
            }
        }
        Some(SharedAdmit {
            admitted: admitted == 1,
            wait: ms(&wait),
            view,
        })
    }
}

impl SharedBudget for ProviderBudget {
    fn admit(&self, proposal: Proposal) -> AdmitFuture<'_> {
        Box::pin(self.ask(proposal))
    }

    fn report(&self, change: SharedChange) {
        let now = Instant::now();
        if self.store.resting(&self.down_until, now) {
            return;
        }
        let store = self.store.clone();
        let key = self.key.clone();
        let provider = self.provider.clone();
        let down_until = self.down_until.clone();
        tokio::spawn(async move {
            let scripts = &store.scripts;
            let mut invocation = match change {
                SharedChange::Cut {
                    sent_at,
                    rate,
                    limit,
                } => {
                    let mut i = scripts.cut.prepare_invoke();
                    i.key(&key)
                        .arg(millis(now.saturating_duration_since(sent_at)))
                        .arg(rate.to_string())
                        .arg(opt(limit));
                    i
                }
                SharedChange::Raise { rate, limit, every } => {
                    let mut i = scripts.raise.prepare_invoke();
                    i.key(&key)
                        .arg(rate.to_string())
                        .arg(opt(limit))
                        .arg(millis(every));
                    i
                }
                SharedChange::Hold { until, refused } => {
                    let mut i = scripts.hold.prepare_invoke();
                    i.key(&key)
                        .arg(millis(until.saturating_duration_since(now)))
                        .arg(if refused { "1" } else { "" });
                    i
                }
            };
            invocation.arg(KEY_TTL_MS);
            let _: Option<i64> = store.run(invocation, &provider, &down_until).await;
        });
    }

    fn replicas(&self) -> u32 {
        self.store.replicas
    }

    fn retry_every(&self) -> Duration {
        RETRY_DOWN
    }

    fn recheck_after(&self) -> Duration {
        RECHECK
    }

    fn seat(&self) -> Option<Seat> {
        let s = self.state();
        let (seat, skew) = (s.seat?, s.skew?);
        let clock = u64::try_from(wall_clock() + skew).ok()?;
        Some(Seat {
            index: self.seat_of(seat),
            clock: Duration::from_nanos(clock),
        })
    }
}

/// This host's clock: nanoseconds since the Unix epoch.
fn wall_clock() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// The store's clock as [`ADMIT`] returns it (`seconds.microseconds`), in
/// nanoseconds since the Unix epoch.
fn store_clock(text: &str) -> Option<i128> {
    let (secs, micros) = text.split_once('.')?;
    let (secs, micros) = (secs.parse::<i128>().ok()?, micros.parse::<i128>().ok()?);
    (secs >= 0 && (0..1_000_000).contains(&micros)).then_some(secs * 1_000_000_000 + micros * 1_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// R-DS2: a first miss rests until the recheck; the recheck (or any
    /// call sent once a rest was over) missing too rests a second; calls
    /// already under way at the first miss do not lengthen it.
    #[test]
    fn a_first_miss_rests_only_until_the_recheck() {
        let t0 = Instant::now();
        let ms = |n: u64| Duration::from_millis(n);
        let first = rest_after_miss(None, t0, t0 + ms(50));
        assert_eq!(first, t0 + ms(50) + RECHECK);
        // Sent before the first miss, failing just after it.
        assert_eq!(
            rest_after_miss(Some(first), t0 + ms(10), t0 + ms(60)),
            first
        );
        // The recheck.
        let recheck = first + ms(1);
        let second = rest_after_miss(Some(first), recheck, recheck + ms(50));
        assert_eq!(second, recheck + ms(50) + RETRY_DOWN);
        // Still down a second later.
        let later = second + ms(1);
        assert_eq!(
            rest_after_miss(Some(second), later, later + ms(50)),
            later + ms(50) + RETRY_DOWN
        );
    }

    #[test]
    fn the_fleets_refusal_is_read_as_admit_returns_it() {
        assert_eq!(
            fleet_refusal("1764331200123 250.5 4250.25 91"),
            Some(FleetRefusal {
                id: 1_764_331_200_123,
                ago: Duration::from_secs_f64(0.2505),
                after: Duration::from_secs_f64(4.25025),
                sent: 91,
            })
        );
        for bad in ["", "1 2 3", "1 2 x 4", "1 -2 3 4", "1 NaN 3 4"] {
            assert_eq!(fleet_refusal(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_stores_clock_is_read_as_admit_returns_it() {
        assert_eq!(
            store_clock("1796000000.000250"),
            Some(1_796_000_000_000_250_000)
        );
        assert_eq!(store_clock("0.999999"), Some(999_999_000));
        for bad in [
            "",
            "1796000000",
            "x.000001",
            "1.x",
            "-1.000000",
            "1.1000000",
        ] {
            assert_eq!(store_clock(bad), None, "{bad:?}");
        }
    }
}
