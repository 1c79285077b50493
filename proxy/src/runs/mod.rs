//! Runs (R-RN1–R-RN8): a collector's bounded piece of work, with its lease,
//! budgets, checkpoints and gap records, kept outside the collector so
//! that a collector that crashes, is killed or is rescheduled loses
//! nothing it committed.
//!
//! A collector is a proxy user (`[collectors.NAME]`). While one of its
//! runs is active, every request it sends carries the run's
//! [`RunHandle`] through the provider's stack: the run's budgets are
//! checked before each attempt, and source pressure is waited out
//! (`sluice_policy::run`). The registry here holds the leases (one active
//! run per collector, fenced), the committed checkpoints and the pending
//! gap records; the admin API (`serve::collectors`) is its HTTP face.
//!
//! Everything durable goes through the store's one writer; a checkpoint
//! or gap is answered only after the writer's flush.
//!
//! One `Runs` registry, its work split by concern: `lease` (opening,
//! heartbeats, the sweep, attaching requests, resuming after a restart),
//! `checkpoints`, `gaps`, and `records` (what the store holds).

mod checkpoints;
mod gaps;
mod lease;
pub mod records;
mod restore;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sluice_policy::error::Cause;
use sluice_policy::run::RunHandle;
use tokio::sync::Notify;
use tokio::time::Instant;

use self::records::{seq_key, split_id, Checkpoint, Gap, Mode, RunProvider, RunRecord};
use crate::config::Config;
use crate::observe::metrics::Metrics;
use crate::store::{unix_ms_now, RunTree, Store, StoreError, StoreWriter};

/// What a run is opened with; every field optional (`{}` is an unbounded
/// steady run).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Opening {
    /// Attempts allowed, retries included.
    pub request_cap: Option<u64>,
    /// Seconds until no attempt starts.
    pub deadline_s: Option<f64>,
    /// Retries as a share of first attempts.
    pub retry_ratio: Option<f64>,
    /// Which cursor the run moves.
    pub mode: Mode,
}

/// Why a run operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No such collector in the config.
    #[error("unknown collector")]
    UnknownCollector,
    /// No such run.
    #[error("unknown run")]
    UnknownRun,
    /// The run is not active any more.
    #[error("the run is {0}")]
    NotActive(&'static str),
    /// Another run holds the collector's lease.
    #[error("run {0} holds the collector's lease")]
    Held(String),
    /// The fencing token is not the lease's.
    #[error("stale fencing token: the lease's is {0}")]
    StaleFence(u64),
    /// The checkpoint does not move forward.
    #[error("slice {given} does not advance the stored slice {stored}")]
    SliceNotAdvancing {
        /// The slice sent.
        given: u64,
        /// The slice stored.
        stored: u64,
    },
    /// The checkpoint is for the other mode's cursor.
    #[error("a {run} run cannot write the {given} cursor")]
    WrongMode {
        /// The run's mode.
        run: &'static str,
        /// The mode written.
        given: &'static str,
    },
    /// No such gap record.
    #[error("unknown gap")]
    UnknownGap,
    /// The store could not make it durable.
    #[error("not stored: {0}")]
    NotDurable(String),
}

impl From<StoreError> for RunError {
    fn from(e: StoreError) -> Self {
        RunError::NotDurable(e.to_string())
    }
}

/// A run while it is active.
#[derive(Debug)]
struct Active {
    record: RunRecord,
    handle: RunHandle,
    lease_until: Instant,
    /// Gap records were written for its stop.
    settled: bool,
    /// Providers whose stop's gap records were written.
    settled_providers: std::collections::BTreeSet<String>,
    /// Streams this run committed checkpoints of: a stop records gaps for
    /// these only (R-RN12).
    streams: std::collections::BTreeSet<String>,
    /// Attempts already counted in the metrics.
    counted: u64,
    /// The lease's end as last written (ms since the epoch).
    lease_written_ms: u64,
}

/// How a run's request was answered, for its counters.
#[derive(Debug, Clone, Copy)]
pub enum Answer<'a> {
    /// With a response of this status (the provider's, passed on).
    Status(u16),
    /// With a failure: sluice's refusal, or no answer from the provider.
    Failed(&'a Cause),
}

/// The store key (in the meta tree) of the last run or gap number handed
/// out.
const SEQ_KEY: &[u8] = b"seq";

/// The store key (in the meta tree) of a run's durable reservation.
fn reserve_key(id: &str) -> Vec<u8> {
    let mut k = b"reserve\0".to_vec();
    k.extend_from_slice(id.as_bytes());
    k
}

/// An open stop gap's place: collector, mode, stream, provider.
type GapKey = (String, Mode, String, Option<String>);

impl Active {
    /// The record with the live counters.
    fn snapshot(&self) -> RunRecord {
        let s = self.handle.state();
        let mut r = self.record.clone();
        r.attempts = s.attempts;
        r.units = s.units;
        r.retries = s.retries;
        r.cooldown_waits = s.waits_total;
        r.stop_reason = s.stopped.map(|s| s.label().to_string());
        r.provider_stops = s
            .stopped_providers()
            .map(|(p, reason)| (p.to_string(), reason.label().to_string()))
            .collect();
        r.providers = s
            .providers
            .iter()
            .map(|(name, p)| {
                (
                    name.clone(),
                    RunProvider {
                        attempts: p.attempts,
                        waits: p.waits,
                        stopped: p.stopped.map(|r| r.label().to_string()),
                    },
                )
            })
            .collect();
        // What a restart charges: the durable reservation, which every
        // attempt that left is within (R-RN10); without a store, what was
        // counted.
        r.attempts_reserved = self.handle.reserved().unwrap_or(s.units);
        r.lease_until_unix_ms = Some(ms_from(Instant::now(), self.lease_until));
        r.streams = self.streams.iter().cloned().collect();
        r
    }
}

/// One collector's place in the registry.
#[derive(Debug, Default)]
struct Slot {
    /// Its active runs: at most one per mode, so a steady run and a
    /// catch-up run of one collector go on side by side (R-RN4, R-FS1).
    active: BTreeMap<Mode, Active>,
    /// The last fencing token handed out (one sequence for both modes).
    fence: u64,
    /// The last run that ended.
    last: Option<RunRecord>,
    /// Pending gap records.
    pending_gaps: u64,
}

#[derive(Debug)]
struct Registry {
    slots: BTreeMap<String, Slot>,
    checkpoints: BTreeMap<(String, Mode, String), Checkpoint>,
    /// The open gap a stop recorded per collector, mode, stream (`*` when
    /// the run checkpointed nothing) and provider (`None` for a run-wide
    /// stop): one at a time (R-RN12).
    stop_gaps: BTreeMap<GapKey, Gap>,
    lease_ttl: Duration,
    max_cooldown_waits: u32,
    /// Ended runs not yet written, when there is no store: kept so
    /// `GET /v1/runs/{id}` still answers.
    ended: HashMap<String, RunRecord>,
    /// Run and gap numbers when there is no store.
    next_seq: u64,
}

/// The registry of runs.
#[derive(Debug)]
pub struct Runs {
    registry: Mutex<Registry>,
    /// Wakes those waiting (`wait_s`) for a lease.
    released: Notify,
    store: Option<Arc<Store>>,
    writer: Option<StoreWriter>,
    metrics: Option<Arc<Metrics>>,
}

/// The live view of a run, for the API.
#[derive(Debug, Clone)]
pub struct RunView {
    /// The record, counters live.
    pub record: RunRecord,
    /// When the lease lapses, if active (ms since the epoch).
    pub lease_expires_unix_ms: Option<u64>,
}

/// A collector's readout.
#[derive(Debug, Clone)]
pub struct CollectorView {
    /// Its name.
    pub name: String,
    /// Its active runs, steady first (at most one per mode).
    pub active: Vec<RunView>,
    /// The last run that ended.
    pub last: Option<RunRecord>,
    /// Committed checkpoints: (mode, stream) → checkpoint.
    pub checkpoints: Vec<(Mode, String, Checkpoint)>,
    /// Pending gap records.
    pub pending_gaps: u64,
}

/// One page of gap records.
#[derive(Debug, Clone)]
pub struct GapPage {
    /// The records.
    pub gaps: Vec<Gap>,
    /// Where the next page starts; `None` when drained.
    pub next: Option<String>,
}

fn ms_from(now: Instant, at: Instant) -> u64 {
    let ahead = at.saturating_duration_since(now);
    unix_ms_now() + ahead.as_millis() as u64
}

impl Runs {
    /// The registry for `config`'s collectors, with what the store holds:
    /// checkpoints, gap counts, fencing tokens, and runs that were active
    /// when sluice stopped (now `interrupted`).
    pub fn new(
        config: &Config,
        store: Option<Arc<Store>>,
        writer: Option<StoreWriter>,
        metrics: Option<Arc<Metrics>>,
    ) -> Runs {
        let mut registry = Registry {
            slots: BTreeMap::new(),
            checkpoints: BTreeMap::new(),
            stop_gaps: BTreeMap::new(),
            lease_ttl: config.runs.lease_ttl,
            max_cooldown_waits: config.runs.max_cooldown_waits,
            ended: HashMap::new(),
            next_seq: 0,
        };
        for name in config.collectors.keys() {
            registry.slots.insert(name.clone(), Slot::default());
        }
        let runs = Runs {
            registry: Mutex::new(registry),
            released: Notify::new(),
            store,
            writer,
            metrics,
        };
        runs.load();
        runs.export();
        runs
    }

    /// The active run `id`, or why not: finished, expired, interrupted
    /// (from the registry or the store) — or unknown.
    fn active<'a>(&self, reg: &'a mut Registry, id: &str) -> Result<&'a mut Active, RunError> {
        let (name, seq) = split_id(id).ok_or(RunError::UnknownRun)?;
        let stored = || {
            let v = self
                .store
                .as_ref()?
                .get(RunTree::Runs, &seq_key(name, seq))?;
            serde_json::from_slice::<RunRecord>(&v)
                .ok()
                .map(|r| r.phase)
        };
        let ended = reg.ended.get(id).map(|r| r.phase);
        let slot = reg.slots.get_mut(name).ok_or(RunError::UnknownRun)?;
        match slot.active.values_mut().find(|a| a.record.id == id) {
            Some(a) => Ok(a),
            None => {
                let last = slot.last.as_ref().filter(|l| l.id == id).map(|l| l.phase);
                match ended.or(last).or_else(stored) {
                    Some(phase) => Err(RunError::NotActive(phase.label())),
                    None => Err(RunError::UnknownRun),
                }
            }
        }
    }

    /// Sets the per-collector gauges (active run, pending gaps); the
    /// counters move as things happen.
    pub fn export(&self) {
        let Some(m) = &self.metrics else { return };
        let reg = self.lock();
        for (name, slot) in &reg.slots {
            m.runs_active
                .with_label_values(&[name])
                .set(slot.active.len() as i64);
            m.gaps_pending
                .with_label_values(&[name])
                .set(slot.pending_gaps as i64);
            m.run_attempts.with_label_values(&[name]);
            m.checkpoint_commits.with_label_values(&[name]);
        }
    }

    fn count_attempts(&self, name: &str, active: &mut Active) {
        let attempts = active.handle.attempts();
        if attempts > active.counted {
            if let Some(m) = &self.metrics {
                m.run_attempts
                    .with_label_values(&[name])
                    .inc_by(attempts - active.counted);
            }
            active.counted = attempts;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a reloaded config: new collectors get a slot; lease and
    /// waiting settings apply to runs opened from now on.
    pub fn reload(&self, config: &Config) {
        let mut reg = self.lock();
        reg.lease_ttl = config.runs.lease_ttl;
        reg.max_cooldown_waits = config.runs.max_cooldown_waits;
        for name in config.collectors.keys() {
            reg.slots.entry(name.clone()).or_default();
        }
    }

    /// Whether `name` is a configured collector.
    pub fn is_collector(&self, name: &str) -> bool {
        self.lock().slots.contains_key(name)
    }

    /// Queues a record for the store's writer; `false` when it was not
    /// queued (no store, or the writer's queue full: the write is dropped,
    /// and nothing that depends on it may be answered as durable).
    fn write(&self, t: RunTree, key: Vec<u8>, record: &impl serde::Serialize) -> bool {
        match (&self.writer, serde_json::to_vec(record)) {
            (Some(w), Ok(value)) => w.put(t, key, value),
            _ => false,
        }
    }

    /// Keeps `run`'s reservation of units in the store: before an attempt
    /// leaves past it, the next block is written and flushed (R-RN10).
    /// `durable`: what the store already holds.
    fn reserving(&self, run: &RunHandle, id: &str, durable: u64) {
        let Some(writer) = self.writer.clone() else {
            return;
        };
        let key = reserve_key(id);
        let id = id.to_string();
        run.reserving(
            Arc::new(move |units| {
                let (writer, key, id) = (writer.clone(), key.clone(), id.clone());
                Box::pin(async move {
                    writer.put(RunTree::Meta, key, units.to_be_bytes().to_vec());
                    if let Err(e) = writer.flush().await {
                        tracing::warn!(run = %id, error = %e, "a run's attempt reservation was not made durable");
                    }
                })
            }),
            durable,
        );
    }

    /// Makes what was written durable soon; nobody waits on it.
    fn flush_soon(&self) {
        if let Some(w) = self.writer.clone() {
            tokio::spawn(async move {
                let _ = w.flush().await;
            });
        }
    }

    /// Waits until every write queued so far is readable from the store
    /// (a failed writer has counted its own error; the read goes on).
    async fn applied(&self) {
        if let Some(w) = &self.writer {
            let _ = w.applied().await;
        }
    }

    async fn flush(&self) -> Result<(), RunError> {
        match &self.writer {
            Some(w) => Ok(w.flush().await?),
            None => Err(RunError::NotDurable("no state store".into())),
        }
    }

    /// The next run or gap number: one after the last handed out, kept
    /// in the store with every new number (sled's own id generator jumps
    /// by a million or more after each restart: `collector-a.1` was
    /// followed by `.2000001`).
    fn next_seq(&self, reg: &mut Registry) -> u64 {
        reg.next_seq += 1;
        if let Some(w) = &self.writer {
            w.put(
                RunTree::Meta,
                SEQ_KEY.to_vec(),
                reg.next_seq.to_be_bytes().to_vec(),
            );
        }
        reg.next_seq
    }

    /// Every collector's readout.
    pub fn collectors(&self) -> Vec<CollectorView> {
        self.sweep(Instant::now());
        let names: Vec<String> = self.lock().slots.keys().cloned().collect();
        names
            .iter()
            .filter_map(|n| self.collector(n).ok())
            .collect()
    }

    /// One collector's readout.
    pub fn collector(&self, name: &str) -> Result<CollectorView, RunError> {
        let checkpoints = self.checkpoints(name)?;
        let now = Instant::now();
        let reg = self.lock();
        let slot = reg.slots.get(name).ok_or(RunError::UnknownCollector)?;
        Ok(CollectorView {
            name: name.to_string(),
            active: slot
                .active
                .values()
                .map(|a| RunView {
                    record: a.snapshot(),
                    lease_expires_unix_ms: Some(ms_from(now, a.lease_until)),
                })
                .collect(),
            last: slot.last.clone(),
            checkpoints,
            pending_gaps: slot.pending_gaps,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Collector;
    use crate::store::HeldFlush;

    /// Issue 19: a checkpoint or gap the store's writer dropped (its queue
    /// full behind a stalled disk) is refused as not durable — never
    /// answered as committed — and nothing changes.
    #[test]
    fn a_write_the_writer_dropped_is_not_answered_as_durable() {
        let (store, release) = HeldFlush::new();
        let writer = StoreWriter::spawn(store, prometheus::IntCounter::new("e", "e").unwrap());
        let mut config = Config::default();
        config.collectors.insert(
            "c".into(),
            Collector {
                name: "c".into(),
                token_file: "/dev/null".into(),
                token: "t".into(),
                weight: 1.0,
                catchup_floor: 0.1,
                allow: None,
            },
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let runs = Runs::new(&config, None, Some(writer.clone()), None);
            release.send(()).unwrap();
            let view = runs
                .open("c", Opening::default(), Duration::ZERO)
                .await
                .unwrap();
            let (id, fence) = (view.record.id.clone(), view.record.fencing_token);
            // The disk stalls in a flush; the writer's queue fills.
            let stalled = tokio::spawn({
                let w = writer.clone();
                async move { w.flush().await }
            });
            tokio::task::yield_now().await;
            let mut queued = 0;
            while writer.put(RunTree::Meta, b"filler".to_vec(), Vec::new()) {
                queued += 1;
                assert!(
                    queued <= 2 * crate::store::WRITER_QUEUE,
                    "the queue is bounded"
                );
            }
            let err = runs
                .checkpoint(&id, "s", Mode::Steady, 1, "x".into(), fence)
                .await
                .unwrap_err();
            assert!(matches!(err, RunError::NotDurable(_)), "{err}");
            assert!(
                runs.checkpoints("c").unwrap().is_empty(),
                "nothing committed"
            );
            let err = runs
                .add_gap(&id, "s".into(), None, "upstream_error".into(), None)
                .await
                .unwrap_err();
            assert!(matches!(err, RunError::NotDurable(_)), "{err}");
            assert_eq!(runs.collector("c").unwrap().pending_gaps, 0);
            for _ in 0..8 {
                let _ = release.send(());
            }
            drop(release);
            let _ = stalled.await;
        });
    }
}
