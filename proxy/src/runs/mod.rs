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
//! gap records; the admin API (`serve::runs`) is its HTTP face.
//!
//! Everything durable goes through the store's one writer; a checkpoint
//! or gap is answered only after the writer's flush.

pub mod records;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sluice_policy::error::Cause;
use sluice_policy::run::{Envelope, ProviderWaits, RunHandle, RunState, StopReason};
use tokio::sync::Notify;
use tokio::time::Instant;

use self::records::{
    checkpoint_key, prefix, seq_key, split_id, Checkpoint, Gap, Mode, Phase, RunProvider,
    RunRecord, GAP_REASONS,
};
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
    /// Attempts reserved on disk (see [`RunRecord::attempts_reserved`]).
    reserved: u64,
    /// Requests attached to it: each may start an attempt before the
    /// counter sees it.
    attached: u64,
    /// The lease's end as last written (ms since the epoch).
    lease_written_ms: u64,
}

/// An open stop gap's place: collector, mode, stream, provider.
type GapKey = (String, Mode, String, Option<String>);

/// Attempts reserved on disk at a time: one flush per this many attempts,
/// and at most this many lost to a crash.
const RESERVE_BLOCK: u64 = 32;

/// A new block is reserved once fewer than this many are left beyond the
/// requests attached (their retries start inside the block already on
/// disk).
const RESERVE_MARGIN: u64 = 16;

impl Active {
    /// The record with the live counters.
    fn snapshot(&self) -> RunRecord {
        let s = self.handle.state();
        let mut r = self.record.clone();
        r.attempts = s.attempts;
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
        r.attempts_reserved = self.reserved.max(s.attempts);
        r.lease_until_unix_ms = Some(ms_from(Instant::now(), self.lease_until));
        r.streams = self.streams.iter().cloned().collect();
        r
    }
}

/// One collector's place in the registry.
#[derive(Debug, Default)]
struct Slot {
    active: Option<Active>,
    /// The last fencing token handed out.
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
    /// Its active run.
    pub active: Option<RunView>,
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
            next_seq: 1,
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
        match slot.active.as_mut() {
            Some(a) if a.record.id == id => Ok(a),
            _ => {
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
                .set(i64::from(slot.active.is_some()));
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

    fn load(&self) {
        let Some(store) = &self.store else { return };
        let mut reg = self.lock();
        let names: Vec<String> = reg.slots.keys().cloned().collect();
        for name in names {
            let fence = store
                .get(RunTree::Meta, &fence_key(&name))
                .and_then(|v| v.try_into().ok())
                .map_or(0, u64::from_be_bytes);
            let mut last = None;
            let mut resumed = None;
            let mut interrupted = Vec::new();
            let now_ms = unix_ms_now();
            for (key, value) in store.scan_newest(RunTree::Runs, &prefix(&name)) {
                let Ok(mut record) = serde_json::from_slice::<RunRecord>(&value) else {
                    continue;
                };
                if record.phase == Phase::Active {
                    // The newest active run whose lease has not lapsed goes
                    // on (R-RN10); any other was interrupted.
                    let alive = record.lease_until_unix_ms.is_some_and(|l| l > now_ms);
                    if alive && resumed.is_none() && record.fencing_token == fence {
                        resumed = Some(record);
                        continue;
                    }
                    record.phase = Phase::Interrupted;
                    record.ended_unix_ms = Some(now_ms);
                    interrupted.push((key, record.clone()));
                }
                if last.is_none() {
                    last = Some(record);
                }
            }
            let mut pending = 0;
            for (_, value) in store.scan(RunTree::Gaps, &prefix(&name), &[]) {
                pending += 1;
                let Ok(gap) = serde_json::from_slice::<Gap>(&value) else {
                    continue;
                };
                if let (true, Some(mode)) = (gap.stop, gap.mode) {
                    // Scanned oldest first: the newest stays indexed.
                    let key = (name.clone(), mode, gap.stream.clone(), gap.provider.clone());
                    reg.stop_gaps.insert(key, gap);
                }
            }
            for (key, value) in store.scan(RunTree::Checkpoints, &prefix(&name), &[]) {
                let rest = &key[name.len() + 1..];
                let Some(split) = rest.iter().position(|&b| b == 0) else {
                    continue;
                };
                let mode = std::str::from_utf8(&rest[..split])
                    .ok()
                    .and_then(Mode::parse);
                let stream = String::from_utf8(rest[split + 1..].to_vec()).ok();
                let checkpoint = serde_json::from_slice::<Checkpoint>(&value).ok();
                if let (Some(mode), Some(stream), Some(c)) = (mode, stream, checkpoint) {
                    reg.checkpoints.insert((name.clone(), mode, stream), c);
                }
            }
            let max_waits = reg.max_cooldown_waits;
            if let Some(slot) = reg.slots.get_mut(&name) {
                slot.fence = fence;
                slot.last = last;
                slot.pending_gaps = pending;
                if let Some(record) = resumed {
                    tracing::info!(collector = %name, run = %record.id, attempts = record.attempts_reserved, "run resumed after a restart");
                    slot.active = Some(resume(record, now_ms, max_waits));
                }
            }
            // Runs whose lease lapsed while sluice was down: interrupted,
            // their remainder recorded as gaps unless a stop already did.
            for (key, mut record) in interrupted {
                if record.stop_reason.is_none() && record.lease_until_unix_ms.is_some() {
                    let mut streams = record.streams.clone();
                    if streams.is_empty() {
                        streams.push("*".to_string());
                    }
                    for stream in streams {
                        let gap = self.stop_gap(
                            &mut reg,
                            &name,
                            record.mode,
                            &stream,
                            Phase::Interrupted.label(),
                            None,
                            &record.id,
                        );
                        record.gaps_recorded += u64::from(gap.is_some());
                    }
                }
                self.write(RunTree::Runs, key, &record);
            }
        }
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

    /// Makes what was written durable soon; nobody waits on it.
    fn flush_soon(&self) {
        if let Some(w) = self.writer.clone() {
            tokio::spawn(async move {
                let _ = w.flush().await;
            });
        }
    }

    async fn flush(&self) -> Result<(), RunError> {
        match &self.writer {
            Some(w) => Ok(w.flush().await?),
            None => Err(RunError::NotDurable("no state store".into())),
        }
    }

    fn next_seq(&self, reg: &mut Registry) -> u64 {
        if let Some(Ok(id)) = self.store.as_ref().map(|s| s.next_id()) {
            // sled's ids start at 0; keep 0 free.
            return id + 1;
        }
        reg.next_seq += 1;
        reg.next_seq
    }

    /// Ends runs whose lease lapsed and stops runs whose deadline passed
    /// (writing their gap records). Called before every operation and by
    /// the process's sweep.
    pub fn sweep(&self, now: Instant) {
        let mut reg = self.lock();
        let names: Vec<String> = reg.slots.keys().cloned().collect();
        for name in names {
            self.settle(&mut reg, &name);
            let lapsed = reg.slots[&name]
                .active
                .as_ref()
                .is_some_and(|a| a.lease_until <= now);
            if lapsed {
                self.end(&mut reg, &name, Phase::Expired);
            }
        }
    }

    /// Ends `name`'s active run with `phase`, releasing the lease.
    fn end(&self, reg: &mut Registry, name: &str, phase: Phase) -> Option<RunRecord> {
        // A run that ends without a stop — its lease lapsed — leaves its
        // remainder as gap records like any stop (R-RN10).
        let unsettled = reg
            .slots
            .get(name)
            .and_then(|s| s.active.as_ref())
            .is_some_and(|a| !a.settled && a.handle.stopped().is_none());
        if unsettled && matches!(phase, Phase::Expired | Phase::Interrupted) {
            self.write_gaps(reg, name, phase.label(), None);
        }
        self.finalize_stop_gaps(reg, name);
        let slot = reg.slots.get_mut(name)?;
        let mut active = slot.active.take()?;
        self.count_attempts(name, &mut active);
        let mut record = active.snapshot();
        if let Some(m) = &self.metrics {
            let reason = record.stop_reason.as_deref().unwrap_or("none");
            m.runs.with_label_values(&[name, reason]).inc();
        }
        record.phase = phase;
        record.ended_unix_ms = Some(unix_ms_now());
        slot.last = Some(record.clone());
        if let Some((_, seq)) = split_id(&record.id) {
            self.write(RunTree::Runs, seq_key(name, seq), &record);
        }
        if self.store.is_none() {
            reg.ended.insert(record.id.clone(), record.clone());
        }
        self.released.notify_waiters();
        Some(record)
    }

    /// If `name`'s active run has stopped, or a provider's part of it
    /// has (R-RN8), and its gaps are not written yet: one gap record per
    /// stream it checkpointed in its mode, with the last committed cursor
    /// and the stop reason (one record with no cursor when there is no
    /// checkpoint yet) — the remainder, deferred and resumable. A
    /// provider's stop names the provider.
    fn settle(&self, reg: &mut Registry, name: &str) {
        let Some(active) = reg.slots.get(name).and_then(|s| s.active.as_ref()) else {
            return;
        };
        let now = Instant::now();
        let state = active.handle.state();
        let providers: Vec<(String, StopReason)> = state
            .stopped_providers()
            .filter(|(p, _)| !active.settled_providers.contains(*p))
            .map(|(p, r)| (p.to_string(), r))
            .collect();
        let run_stop = if active.settled {
            None
        } else {
            match state.stopped {
                Some(r) => Some(r),
                // A deadline that passed with no request to see it.
                None if state.envelope.deadline.is_some_and(|d| now >= d) => {
                    active.handle.stop(StopReason::Deadline);
                    Some(StopReason::Deadline)
                }
                None => None,
            }
        };
        for (provider, reason) in providers {
            let written = self.write_gaps(reg, name, reason.label(), Some(&provider));
            if let Some(active) = reg.slots.get_mut(name).and_then(|s| s.active.as_mut()) {
                active.settled_providers.insert(provider.clone());
            }
            tracing::info!(collector = %name, provider = %provider, reason = reason.label(), gaps = written, "a provider's part of the run stopped; its remainder deferred as gap records");
        }
        if let Some(reason) = run_stop {
            let written = self.write_gaps(reg, name, reason.label(), None);
            if let Some(active) = reg.slots.get_mut(name).and_then(|s| s.active.as_mut()) {
                active.settled = true;
            }
            tracing::info!(collector = %name, reason = reason.label(), gaps = written, "run stopped; remainder deferred as gap records");
        }
    }

    /// Writes the gap records of a stop (see [`Runs::settle`]): one per
    /// stream the run checkpointed, or one `*` when it checkpointed none;
    /// each supersedes the open stop gap of its stream and mode. Writes the
    /// run's record with their count; returns how many.
    fn write_gaps(
        &self,
        reg: &mut Registry,
        name: &str,
        reason: &str,
        provider: Option<&str>,
    ) -> u64 {
        let Some(active) = reg.slots.get(name).and_then(|s| s.active.as_ref()) else {
            return 0;
        };
        let (mode, run_id) = (active.record.mode, active.record.id.clone());
        let mut streams: Vec<String> = active.streams.iter().cloned().collect();
        if streams.is_empty() {
            streams.push("*".to_string());
        }
        let mut written = 0;
        for stream in streams {
            let gap = self.stop_gap(reg, name, mode, &stream, reason, provider, &run_id);
            written += u64::from(gap.is_some());
        }
        if let Some(active) = reg.slots.get_mut(name).and_then(|s| s.active.as_mut()) {
            active.record.gaps_recorded += written;
            let record = active.snapshot();
            if let Some((_, seq)) = split_id(&record.id) {
                self.write(RunTree::Runs, seq_key(name, seq), &record);
            }
        }
        self.flush_soon();
        written
    }

    /// Records a stop's gap of one stream and mode, with the stream's
    /// cursor as it stands, superseding the open one (R-RN12).
    #[allow(clippy::too_many_arguments)]
    fn stop_gap(
        &self,
        reg: &mut Registry,
        name: &str,
        mode: Mode,
        stream: &str,
        reason: &str,
        provider: Option<&str>,
        run_id: &str,
    ) -> Option<Gap> {
        let at = reg
            .checkpoints
            .get(&(name.to_string(), mode, stream.to_string()));
        let (cursor, slice) = (at.map(|c| c.cursor.clone()), at.map(|c| c.slice));
        let key = (
            name.to_string(),
            mode,
            stream.to_string(),
            provider.map(str::to_string),
        );
        if let Some(old) = reg.stop_gaps.remove(&key) {
            self.drop_gap(reg, name, &old.id);
        }
        let seq = self.next_seq(reg);
        let gap = Gap {
            id: format!("{name}.{seq}"),
            stream: stream.to_string(),
            cursor,
            reason: reason.to_string(),
            detail: None,
            run: Some(run_id.to_string()),
            provider: provider.map(str::to_string),
            mode: Some(mode),
            slice,
            stop: true,
            at_unix_ms: unix_ms_now(),
        };
        self.write(RunTree::Gaps, seq_key(name, seq), &gap);
        if let Some(slot) = reg.slots.get_mut(name) {
            slot.pending_gaps += 1;
        }
        reg.stop_gaps.insert(key, gap.clone());
        Some(gap)
    }

    /// Removes a pending gap record from the store and the count.
    fn drop_gap(&self, reg: &mut Registry, name: &str, id: &str) {
        if let (Some(w), Some((_, seq))) = (&self.writer, split_id(id)) {
            w.remove(RunTree::Gaps, seq_key(name, seq));
        }
        if let Some(slot) = reg.slots.get_mut(name) {
            slot.pending_gaps = slot.pending_gaps.saturating_sub(1);
        }
    }

    /// As a run ends: its stop's gaps take the cursors as of the end of
    /// the run (a collector may commit after the `403`), and a `*` gap
    /// gives way to the streams the run committed after all (R-RN12).
    fn finalize_stop_gaps(&self, reg: &mut Registry, name: &str) {
        let Some(active) = reg.slots.get(name).and_then(|s| s.active.as_ref()) else {
            return;
        };
        let (mode, run_id) = (active.record.mode, active.record.id.clone());
        let streams: Vec<String> = active.streams.iter().cloned().collect();
        let mine: Vec<Gap> = reg
            .stop_gaps
            .iter()
            .filter(|((c, m, _, _), g)| {
                c == name && *m == mode && g.run.as_deref() == Some(&run_id)
            })
            .map(|(_, g)| g.clone())
            .collect();
        let mut changed = false;
        for gap in mine {
            if gap.stream == "*" {
                if streams.is_empty() {
                    continue;
                }
                reg.stop_gaps.remove(&(
                    name.to_string(),
                    mode,
                    "*".to_string(),
                    gap.provider.clone(),
                ));
                self.drop_gap(reg, name, &gap.id);
                for stream in &streams {
                    let key = (name.to_string(), mode, stream.clone(), gap.provider.clone());
                    if reg.stop_gaps.get(&key).and_then(|g| g.run.as_deref()) != Some(&run_id) {
                        self.stop_gap(
                            reg,
                            name,
                            mode,
                            stream,
                            &gap.reason,
                            gap.provider.as_deref(),
                            &run_id,
                        );
                    }
                }
                changed = true;
                continue;
            }
            let Some(now) = reg
                .checkpoints
                .get(&(name.to_string(), mode, gap.stream.clone()))
            else {
                continue;
            };
            let key = (
                name.to_string(),
                mode,
                gap.stream.clone(),
                gap.provider.clone(),
            );
            if gap.slice != Some(now.slice) {
                let mut gap = gap;
                gap.cursor = Some(now.cursor.clone());
                gap.slice = Some(now.slice);
                if let Some((_, seq)) = split_id(&gap.id) {
                    self.write(RunTree::Gaps, seq_key(name, seq), &gap);
                }
                reg.stop_gaps.insert(key, gap);
                changed = true;
            }
        }
        if changed {
            self.flush_soon();
        }
    }

    /// Opens a run for `name`, or says which run holds the lease. With
    /// `wait`, waits up to that long for the lease to be released or to
    /// lapse.
    pub async fn open(
        &self,
        name: &str,
        opening: Opening,
        wait: Duration,
    ) -> Result<RunView, RunError> {
        let give_up = Instant::now() + wait;
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let lease_until = match self.try_open(name, &opening) {
                Ok(view) => {
                    // The lease and its fencing token are on disk before
                    // anyone holds them.
                    if self.writer.is_some() {
                        self.flush().await?;
                    }
                    return Ok(view);
                }
                Err((RunError::Held(holder), lease_until)) => {
                    if Instant::now() >= give_up {
                        return Err(RunError::Held(holder));
                    }
                    lease_until
                }
                Err((e, _)) => return Err(e),
            };
            // Until the lease is released, lapses, or the wait is over.
            let wake = give_up.min(lease_until + Duration::from_millis(1));
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    fn try_open(&self, name: &str, opening: &Opening) -> Result<RunView, (RunError, Instant)> {
        let now = Instant::now();
        self.sweep(now);
        let mut reg = self.lock();
        let Some(slot) = reg.slots.get(name) else {
            return Err((RunError::UnknownCollector, now));
        };
        if let Some(a) = &slot.active {
            return Err((RunError::Held(a.record.id.clone()), a.lease_until));
        }
        let seq = self.next_seq(&mut reg);
        let (ttl, max_waits) = (reg.lease_ttl, reg.max_cooldown_waits);
        let slot = reg.slots.get_mut(name).expect("checked above");
        slot.fence += 1;
        let fence = slot.fence;
        let record = RunRecord {
            id: format!("{name}.{seq}"),
            collector: name.to_string(),
            mode: opening.mode,
            request_cap: opening.request_cap,
            deadline_s: opening.deadline_s,
            retry_ratio: opening.retry_ratio,
            fencing_token: fence,
            started_unix_ms: unix_ms_now(),
            ended_unix_ms: None,
            phase: Phase::Active,
            stop_reason: None,
            provider_stops: Default::default(),
            attempts: 0,
            retries: 0,
            cooldown_waits: 0,
            refusals: BTreeMap::new(),
            gaps_recorded: 0,
            lease_until_unix_ms: Some(ms_from(now, now + ttl)),
            attempts_reserved: RESERVE_BLOCK,
            streams: Vec::new(),
            providers: BTreeMap::new(),
        };
        let handle = RunHandle::new(Envelope {
            request_cap: opening.request_cap,
            deadline: opening.deadline_s.map(|s| now + Duration::from_secs_f64(s)),
            retry_budget: None,
            retry_ratio: opening.retry_ratio,
            max_cooldown_waits: max_waits,
        });
        let active = Active {
            record: record.clone(),
            handle,
            lease_until: now + ttl,
            settled: false,
            settled_providers: Default::default(),
            streams: Default::default(),
            counted: 0,
            reserved: RESERVE_BLOCK,
            attached: 0,
            lease_written_ms: ms_from(now, now + ttl),
        };
        let view = RunView {
            record,
            lease_expires_unix_ms: Some(ms_from(now, active.lease_until)),
        };
        slot.active = Some(active);
        if let Some(w) = &self.writer {
            w.put(RunTree::Meta, fence_key(name), fence.to_be_bytes().to_vec());
        }
        self.write(RunTree::Runs, seq_key(name, seq), &view.record);
        Ok(view)
    }

    /// The run `id`, live if active.
    pub fn get(&self, id: &str) -> Result<RunView, RunError> {
        self.sweep(Instant::now());
        let (name, seq) = split_id(id).ok_or(RunError::UnknownRun)?;
        let reg = self.lock();
        let slot = reg.slots.get(name).ok_or(RunError::UnknownRun)?;
        if let Some(a) = slot.active.as_ref().filter(|a| a.record.id == id) {
            return Ok(RunView {
                record: a.snapshot(),
                lease_expires_unix_ms: Some(ms_from(Instant::now(), a.lease_until)),
            });
        }
        if let Some(r) = reg.ended.get(id) {
            return Ok(RunView {
                record: r.clone(),
                lease_expires_unix_ms: None,
            });
        }
        let stored = self
            .store
            .as_ref()
            .and_then(|s| s.get(RunTree::Runs, &seq_key(name, seq)))
            .and_then(|v| serde_json::from_slice::<RunRecord>(&v).ok())
            .ok_or(RunError::UnknownRun)?;
        Ok(RunView {
            record: stored,
            lease_expires_unix_ms: None,
        })
    }

    /// `name`'s runs, newest first, at most `limit`.
    pub fn history(&self, name: &str, limit: usize) -> Result<Vec<RunRecord>, RunError> {
        self.sweep(Instant::now());
        let reg = self.lock();
        let slot = reg.slots.get(name).ok_or(RunError::UnknownCollector)?;
        let mut out = Vec::new();
        if let Some(a) = &slot.active {
            out.push(a.snapshot());
        }
        match &self.store {
            Some(store) => {
                for (_, v) in store.scan_newest(RunTree::Runs, &prefix(name)) {
                    if out.len() >= limit {
                        break;
                    }
                    if let Ok(r) = serde_json::from_slice::<RunRecord>(&v) {
                        if !out.iter().any(|o| o.id == r.id) {
                            out.push(r);
                        }
                    }
                }
            }
            None => {
                let mut ended: Vec<_> = reg
                    .ended
                    .values()
                    .filter(|r| r.collector == name)
                    .cloned()
                    .collect();
                ended.sort_by_key(|r| std::cmp::Reverse(r.started_unix_ms));
                out.extend(ended);
            }
        }
        out.truncate(limit);
        Ok(out)
    }

    /// Renews the lease of the active run `id`.
    pub fn heartbeat(&self, id: &str) -> Result<RunView, RunError> {
        let now = Instant::now();
        self.sweep(now);
        let mut reg = self.lock();
        let ttl = reg.lease_ttl;
        let active = self.active(&mut reg, id)?;
        active.lease_until = now + ttl;
        active.lease_written_ms = ms_from(now, active.lease_until);
        let record = active.snapshot();
        let name = record.collector.clone();
        if let Some((_, seq)) = split_id(&record.id) {
            self.write(RunTree::Runs, seq_key(&name, seq), &record);
        }
        Ok(RunView {
            record,
            lease_expires_unix_ms: Some(ms_from(now, active.lease_until)),
        })
    }

    /// Finishes the active run `id`: its summary.
    pub fn finish(&self, id: &str) -> Result<RunRecord, RunError> {
        self.sweep(Instant::now());
        let mut reg = self.lock();
        self.active(&mut reg, id)?;
        let name = split_id(id).map(|(n, _)| n.to_string()).unwrap_or_default();
        self.settle(&mut reg, &name);
        let record = self
            .end(&mut reg, &name, Phase::Finished)
            .ok_or(RunError::UnknownRun)?;
        self.flush_soon();
        Ok(record)
    }

    /// The run a request from proxy user `user` belongs to, if its
    /// collector has one active; the request renews the lease. When the
    /// attempts made near the end of the block reserved on disk, the next
    /// block is written and flushed before the request goes on (R-RN10):
    /// a crash never gives back attempts that were made.
    pub async fn attach(&self, user: &str) -> Option<RunHandle> {
        let now = Instant::now();
        let (handle, reserved) = {
            let mut reg = self.lock();
            let ttl = reg.lease_ttl;
            let active = reg.slots.get_mut(user)?.active.as_mut()?;
            if active.lease_until <= now {
                return None;
            }
            active.lease_until = now + ttl;
            active.attached += 1;
            let used = active.handle.attempts().max(active.attached);
            let reserve = used + RESERVE_MARGIN >= active.reserved;
            if reserve {
                active.reserved = used + RESERVE_BLOCK;
            }
            // The lease is written when it moved a quarter of its length.
            let lease_ms = ms_from(now, active.lease_until);
            let lease = lease_ms >= active.lease_written_ms + ttl.as_millis() as u64 / 4;
            if reserve || lease {
                active.lease_written_ms = lease_ms;
                let record = active.snapshot();
                if let Some((_, seq)) = split_id(&record.id) {
                    self.write(RunTree::Runs, seq_key(user, seq), &record);
                }
            }
            (active.handle.clone(), reserve)
        };
        if reserved && self.writer.is_some() {
            if let Err(e) = self.flush().await {
                tracing::warn!(collector = %user, error = %e, "a run's attempt reservation was not made durable");
            }
        }
        Some(handle)
    }

    /// After a run's request: counts sluice's refusal, if it was one, and
    /// writes the gap records if the run has stopped.
    pub fn after(&self, user: &str, run: &RunHandle, error: Option<&Cause>) {
        let mut reg = self.lock();
        let Some(active) = reg
            .slots
            .get_mut(user)
            .and_then(|s| s.active.as_mut())
            .filter(|a| a.handle.same(run))
        else {
            return;
        };
        let refusal = match error {
            Some(Cause::RunStopped(s)) => Some(s.reason.label()),
            Some(Cause::CircuitOpen(_)) => Some("circuit_open"),
            Some(Cause::RateLimited(_)) => Some("rate_limited"),
            Some(Cause::BulkheadFull(_)) => Some("bulkhead_full"),
            Some(Cause::AttemptTimeout | Cause::Upstream(_)) | None => None,
        };
        if let Some(r) = refusal {
            *active.record.refusals.entry(r.to_string()).or_default() += 1;
        }
        self.count_attempts(user, active);
        self.settle(&mut reg, user);
    }

    /// Commits a checkpoint for the active run `id` (R-RN5): answered once
    /// the store has flushed it.
    pub async fn checkpoint(
        &self,
        id: &str,
        stream: &str,
        mode: Mode,
        slice: u64,
        cursor: String,
        fencing_token: u64,
    ) -> Result<Checkpoint, RunError> {
        self.sweep(Instant::now());
        let (name, key, previous, checkpoint) = {
            let mut reg = self.lock();
            let active = self.active(&mut reg, id)?;
            if active.record.fencing_token != fencing_token {
                return Err(RunError::StaleFence(active.record.fencing_token));
            }
            if active.record.mode != mode {
                return Err(RunError::WrongMode {
                    run: active.record.mode.label(),
                    given: mode.label(),
                });
            }
            let name = active.record.collector.clone();
            let index = (name.clone(), mode, stream.to_string());
            if let Some(stored) = reg.checkpoints.get(&index) {
                if slice <= stored.slice {
                    return Err(RunError::SliceNotAdvancing {
                        given: slice,
                        stored: stored.slice,
                    });
                }
            }
            if self.writer.is_none() {
                return Err(RunError::NotDurable("no state store".into()));
            }
            let checkpoint = Checkpoint {
                slice,
                cursor,
                run: id.to_string(),
                at_unix_ms: unix_ms_now(),
            };
            let key = checkpoint_key(&name, mode, stream);
            if !self.write(RunTree::Checkpoints, key.clone(), &checkpoint) {
                // Dropped before the disk: not committed, nothing changed.
                return Err(RunError::NotDurable(
                    "the store's write queue is full; try again".into(),
                ));
            }
            let previous = reg.checkpoints.insert(index, checkpoint.clone());
            if let Some(active) = reg.slots.get_mut(&name).and_then(|s| s.active.as_mut()) {
                active.streams.insert(stream.to_string());
            }
            (name, key, previous, checkpoint)
        };
        if let Err(e) = self.flush().await {
            // Not durable: not committed.
            let mut reg = self.lock();
            let index = (name, mode, stream.to_string());
            if reg.checkpoints.get(&index) == Some(&checkpoint) {
                match previous {
                    Some(p) => {
                        self.write(RunTree::Checkpoints, key, &p);
                        reg.checkpoints.insert(index, p);
                    }
                    None => {
                        reg.checkpoints.remove(&index);
                        if let Some(w) = &self.writer {
                            w.remove(RunTree::Checkpoints, key);
                        }
                    }
                }
            }
            return Err(e);
        }
        if let Some(m) = &self.metrics {
            m.checkpoint_commits.with_label_values(&[&name]).inc();
        }
        self.resolve_by_commit(&name, mode, stream, &checkpoint);
        Ok(checkpoint)
    }

    /// A later run's commit past a stop's gap resolves it: the work it
    /// deferred is being done. A `*` gap (the stopped run checkpointed
    /// nothing) is resolved by any later commit in its mode (R-RN12).
    fn resolve_by_commit(&self, name: &str, mode: Mode, stream: &str, c: &Checkpoint) {
        let mut reg = self.lock();
        let past: Vec<GapKey> = reg
            .stop_gaps
            .iter()
            .filter(|((n, m, s, _), g)| {
                n == name
                    && *m == mode
                    && (s == stream || s == "*")
                    && g.run.as_deref() != Some(c.run.as_str())
                    && (s == "*" || g.slice.is_none_or(|at| c.slice > at))
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut resolved = Vec::new();
        for key in past {
            if let Some(g) = reg.stop_gaps.remove(&key) {
                resolved.push(g.id);
            }
        }
        for id in &resolved {
            self.drop_gap(&mut reg, name, id);
        }
        drop(reg);
        if !resolved.is_empty() {
            self.flush_soon();
        }
    }

    /// `name`'s committed checkpoints.
    pub fn checkpoints(&self, name: &str) -> Result<Vec<(Mode, String, Checkpoint)>, RunError> {
        let reg = self.lock();
        if !reg.slots.contains_key(name) {
            return Err(RunError::UnknownCollector);
        }
        Ok(reg
            .checkpoints
            .iter()
            .filter(|((c, _, _), _)| c == name)
            .map(|((_, m, s), cp)| (*m, s.clone(), cp.clone()))
            .collect())
    }

    /// Resets one stream's checkpoint in one mode; `true` if there was one.
    pub async fn reset_checkpoint(
        &self,
        name: &str,
        stream: &str,
        mode: Mode,
    ) -> Result<bool, RunError> {
        let removed = {
            let mut reg = self.lock();
            if !reg.slots.contains_key(name) {
                return Err(RunError::UnknownCollector);
            }
            reg.checkpoints
                .remove(&(name.to_string(), mode, stream.to_string()))
                .is_some()
        };
        if removed {
            if let Some(w) = &self.writer {
                w.remove(RunTree::Checkpoints, checkpoint_key(name, mode, stream));
            }
            self.flush().await?;
        }
        Ok(removed)
    }

    /// Records a gap for the active run `id` (R-RN6); answered once
    /// flushed. `reason` must be one of [`GAP_REASONS`] (checked by the
    /// caller, which names the field).
    pub async fn add_gap(
        &self,
        id: &str,
        stream: String,
        cursor: Option<String>,
        reason: String,
        detail: Option<String>,
    ) -> Result<Gap, RunError> {
        debug_assert!(GAP_REASONS.contains(&reason.as_str()));
        self.sweep(Instant::now());
        let gap = {
            let mut reg = self.lock();
            let active = self.active(&mut reg, id)?;
            let (name, mode) = (active.record.collector.clone(), active.record.mode);
            if self.writer.is_none() {
                return Err(RunError::NotDurable("no state store".into()));
            }
            let seq = self.next_seq(&mut reg);
            let gap = Gap {
                id: format!("{name}.{seq}"),
                stream,
                cursor,
                reason,
                detail,
                run: Some(id.to_string()),
                provider: None,
                mode: Some(mode),
                slice: None,
                stop: false,
                at_unix_ms: unix_ms_now(),
            };
            if !self.write(RunTree::Gaps, seq_key(&name, seq), &gap) {
                return Err(RunError::NotDurable(
                    "the store's write queue is full; try again".into(),
                ));
            }
            if let Some(slot) = reg.slots.get_mut(&name) {
                slot.pending_gaps += 1;
            }
            gap
        };
        self.flush().await?;
        Ok(gap)
    }

    /// One page of `name`'s pending gaps after `after` (a previous page's
    /// `next`), at most `max_bytes` of serialized records — except that a
    /// record larger than that comes alone, so paging always advances.
    pub fn gaps(
        &self,
        name: &str,
        max_bytes: usize,
        after: Option<&str>,
    ) -> Result<GapPage, RunError> {
        if !self.is_collector(name) {
            return Err(RunError::UnknownCollector);
        }
        let Some(store) = &self.store else {
            return Ok(GapPage {
                gaps: Vec::new(),
                next: None,
            });
        };
        let start = match after.and_then(split_id) {
            Some((_, seq)) => seq_key(name, seq.saturating_add(1)),
            None => prefix(name),
        };
        let mut gaps = Vec::new();
        let mut used = 0;
        let mut more = false;
        for (_, value) in store.scan(RunTree::Gaps, &prefix(name), &start) {
            let Ok(gap) = serde_json::from_slice::<Gap>(&value) else {
                continue;
            };
            let size = serde_json::to_vec(&gap).map_or(0, |v| v.len());
            if !gaps.is_empty() && used + size > max_bytes {
                more = true;
                break;
            }
            used += size;
            gaps.push(gap);
            if used >= max_bytes {
                // A lone oversize record, or exactly full: the next page
                // starts after it (if there is one).
                more = true;
                break;
            }
        }
        let next = if more {
            gaps.last().map(|g| g.id.clone())
        } else {
            None
        };
        Ok(GapPage { gaps, next })
    }

    /// Resolves a gap record: it is no longer pending.
    pub async fn resolve_gap(&self, id: &str) -> Result<(), RunError> {
        let (name, seq) = split_id(id).ok_or(RunError::UnknownGap)?;
        let exists = self
            .store
            .as_ref()
            .and_then(|s| s.get(RunTree::Gaps, &seq_key(name, seq)))
            .is_some();
        if !exists {
            return Err(RunError::UnknownGap);
        }
        if let Some(w) = &self.writer {
            w.remove(RunTree::Gaps, seq_key(name, seq));
        }
        self.flush().await?;
        let mut reg = self.lock();
        reg.stop_gaps.retain(|_, g| g.id != id);
        if let Some(slot) = reg.slots.get_mut(name) {
            slot.pending_gaps = slot.pending_gaps.saturating_sub(1);
        }
        Ok(())
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
            active: slot.active.as_ref().map(|a| RunView {
                record: a.snapshot(),
                lease_expires_unix_ms: Some(ms_from(now, a.lease_until)),
            }),
            last: slot.last.clone(),
            checkpoints,
            pending_gaps: slot.pending_gaps,
        })
    }

    /// On shutdown: active runs are written as they stand, to go on after
    /// the restart (R-RN10).
    pub fn suspend_all(&self) {
        // Runs outlive sluice (R-RN10): an active run is written as it
        // stands — counters, reservation, lease — and goes on after a
        // restart while its lease holds; a lease that lapses while sluice
        // is down ends it (interrupted) at the next start.
        let reg = self.lock();
        for (name, slot) in &reg.slots {
            if let Some(active) = &slot.active {
                let record = active.snapshot();
                if let Some((_, seq)) = split_id(&record.id) {
                    self.write(RunTree::Runs, seq_key(name, seq), &record);
                }
            }
        }
    }
}

/// An active run read back from the store (R-RN10): its budgets, its
/// attempts counted from the reservation (never fewer than were made), its
/// stops, and the rest of its lease.
fn resume(record: RunRecord, now_ms: u64, max_cooldown_waits: u32) -> Active {
    let now = Instant::now();
    let at = |unix_ms: u64| now + Duration::from_millis(unix_ms.saturating_sub(now_ms));
    let deadline = record
        .deadline_s
        .map(|s| at(record.started_unix_ms + (s * 1000.0) as u64));
    let reason = |label: &str| StopReason::ALL.into_iter().find(|r| r.label() == label);
    let attempts = record.attempts_reserved.max(record.attempts);
    let mut state = RunState::new(Envelope {
        request_cap: record.request_cap,
        deadline,
        retry_budget: None,
        retry_ratio: record.retry_ratio,
        max_cooldown_waits,
    });
    state.attempts = attempts;
    state.retries = record.retries;
    state.waits_total = record.cooldown_waits;
    state.stopped = record.stop_reason.as_deref().and_then(reason);
    for (provider, p) in &record.providers {
        state.providers.insert(
            provider.clone(),
            ProviderWaits {
                attempts: p.attempts,
                waits: p.waits,
                stopped: p.stopped.as_deref().and_then(reason),
                ..ProviderWaits::default()
            },
        );
    }
    for (provider, r) in &record.provider_stops {
        state.providers.entry(provider.clone()).or_default().stopped = reason(r);
    }
    let lease_ms = record.lease_until_unix_ms.unwrap_or(now_ms);
    Active {
        settled: record.stop_reason.is_some(),
        settled_providers: record.provider_stops.keys().cloned().collect(),
        streams: record.streams.iter().cloned().collect(),
        handle: RunHandle::resume(state),
        lease_until: at(lease_ms),
        counted: attempts,
        reserved: attempts,
        attached: attempts,
        lease_written_ms: lease_ms,
        record,
    }
}

fn fence_key(name: &str) -> Vec<u8> {
    let mut k = b"fence\0".to_vec();
    k.extend_from_slice(name.as_bytes());
    k
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
                token_file: "/dev/null".into(),
                token: "t".into(),
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
