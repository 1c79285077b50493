//! What sluice learned, kept across restarts in sled (R-PS1, R-PS2).
//!
//! Two trees in `<state_dir>/store`:
//! * `learned`: per provider, the learned rate, where throttling began,
//!   the latency baseline and the breaker state, with the wall-clock time
//!   it was saved. Written every `save_interval` and on shutdown; read at
//!   start, where records older than `state_max_age` are discarded (the
//!   provider starts cold, R-AI3).
//! * `evidence`: per provider, a bounded log of breaker transitions,
//!   written and flushed as each happens, so it survives a `kill -9`.
//!
//! Records hold provider names (hosts), numbers and fixed labels only —
//! never a path, query, header value or body (R-SF4). A store that cannot
//! be opened is moved aside with a loud log line and a metric, and sluice
//! starts cold rather than refusing to run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sluice_policy::breaker::{State, Transition};
use sluice_policy::provider::LearnedState;

use prometheus::{IntCounter, IntCounterVec};

/// Transitions kept per provider.
pub const EVIDENCE_PER_PROVIDER: usize = 100;

/// Record format version.
const VERSION: u32 = 1;

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms_now() -> u64 {
    unix_ms(SystemTime::now())
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A breaker state as stored: the same words as the metrics and the
/// readout (`closed`, `open`, `half_open`). A word this version does not
/// know reads as closed — the breaker then judges the provider afresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoredBreaker {
    /// Calls flow.
    Closed,
    /// Failing fast until the reset timeout.
    Open,
    /// Probing.
    HalfOpen,
    /// A word this version does not know (never written).
    #[serde(other)]
    Unknown,
}

impl From<State> for StoredBreaker {
    fn from(s: State) -> Self {
        match s {
            State::Closed => StoredBreaker::Closed,
            State::Open => StoredBreaker::Open,
            State::HalfOpen => StoredBreaker::HalfOpen,
        }
    }
}

impl From<StoredBreaker> for State {
    fn from(s: StoredBreaker) -> Self {
        match s {
            StoredBreaker::Closed | StoredBreaker::Unknown => State::Closed,
            StoredBreaker::Open => State::Open,
            StoredBreaker::HalfOpen => State::HalfOpen,
        }
    }
}

/// A provider's learned state as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearnedRecord {
    /// Format version.
    pub v: u32,
    /// When it was last true — the provider's last use (wall clock, ms
    /// since the epoch).
    pub saved_at_unix_ms: u64,
    /// The learned rate.
    pub rate_rps: f64,
    /// Where throttling began.
    pub limit_rps: Option<f64>,
    /// TTFB baseline, ms.
    pub baseline_ms: Option<f64>,
    /// The breaker's state.
    pub breaker: StoredBreaker,
    /// Time left open, ms.
    pub open_remaining_ms: Option<u64>,
    /// When the allowance's current period began (wall clock, ms since the
    /// epoch), if one is set and begun.
    #[serde(default)]
    pub allowance_began_unix_ms: Option<u64>,
    /// Units spent in that period.
    #[serde(default)]
    pub allowance_spent: Option<f64>,
}

impl LearnedRecord {
    /// A record of `state`, last true `age` ago (the provider's last use):
    /// re-saving an idle provider's state does not make it younger.
    pub fn of(state: &LearnedState, age: Duration) -> Self {
        LearnedRecord {
            v: VERSION,
            saved_at_unix_ms: unix_ms_now().saturating_sub(age.as_millis() as u64),
            rate_rps: state.rate_rps,
            limit_rps: state.limit_rps,
            baseline_ms: state.baseline.map(|b| b.as_secs_f64() * 1000.0),
            breaker: state.breaker.into(),
            open_remaining_ms: state.open_remaining.map(|d| d.as_millis() as u64),
            allowance_began_unix_ms: state
                .allowance
                .map(|a| unix_ms_now().saturating_sub(a.elapsed.as_millis() as u64)),
            allowance_spent: state.allowance.map(|a| a.spent),
        }
    }

    /// How old it is now.
    pub fn age(&self) -> Duration {
        Duration::from_millis(unix_ms_now().saturating_sub(self.saved_at_unix_ms))
    }

    /// The state to restore, with the breaker's open time reduced by the
    /// time that passed since the save.
    pub fn state(&self) -> LearnedState {
        let age = self.age();
        let breaker = State::from(self.breaker);
        let open_remaining = self
            .open_remaining_ms
            .map(|ms| Duration::from_millis(ms).saturating_sub(age));
        LearnedState {
            rate_rps: self.rate_rps,
            limit_rps: self.limit_rps,
            baseline: self
                .baseline_ms
                .filter(|b| b.is_finite() && *b >= 0.0)
                .map(|b| Duration::from_secs_f64(b / 1000.0)),
            // An open breaker whose time ran out while sluice was down comes
            // back half-open: it probes before trusting the provider again.
            breaker: match (breaker, open_remaining) {
                (State::Open, Some(left)) if left.is_zero() => State::HalfOpen,
                (b, _) => b,
            },
            open_remaining,
            allowance: match (self.allowance_began_unix_ms, self.allowance_spent) {
                (Some(began), Some(spent)) => Some(sluice_policy::pacer::AllowanceUse {
                    elapsed: Duration::from_millis(unix_ms_now().saturating_sub(began)),
                    spent,
                }),
                _ => None,
            },
        }
    }
}

/// One breaker transition as durable evidence (R-CB2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvidenceRecord {
    /// When (wall clock, ms since the epoch).
    pub at_unix_ms: u64,
    /// State before.
    pub from: String,
    /// State after.
    pub to: String,
    /// Why.
    pub reason: String,
    /// Milliseconds in the previous state.
    pub elapsed_ms: u64,
    /// Calls counted.
    pub calls: u32,
    /// Failures among them.
    pub failures: u32,
    /// Retries left in the budget.
    pub retry_budget_left: Option<u32>,
}

impl EvidenceRecord {
    /// The evidence of `t`, which happened `ago` before now.
    pub fn of(t: &Transition, ago: Duration) -> Self {
        EvidenceRecord {
            at_unix_ms: unix_ms(SystemTime::now() - ago),
            from: t.from.label().to_string(),
            to: t.to.label().to_string(),
            reason: t.reason.label().to_string(),
            elapsed_ms: t.elapsed_ms,
            calls: t.calls,
            failures: t.failures,
            retry_budget_left: t.retry_budget_left,
        }
    }
}

/// Why a store read or write failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store's directory.
    #[error("store directory: {0}")]
    Io(#[from] std::io::Error),
    /// sled itself.
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    /// A record that could not be encoded.
    #[error("record encoding: {0}")]
    Encode(#[from] serde_json::Error),
    /// sled panicked reading the files.
    #[error("the store's files are corrupt")]
    Corrupt,
    /// The writer thread is gone, or its queue was full.
    #[error("the store writer did not take the write (queue full or writer gone)")]
    WriterUnavailable,
}

/// The trees runs keep (R-RN4–R-RN6): run records, checkpoints, gap
/// records and small counters (fencing tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunTree {
    /// `collector \0 seq` → a run record.
    Runs,
    /// `collector \0 mode \0 stream` → a checkpoint.
    Checkpoints,
    /// `collector \0 seq` → a pending gap record.
    Gaps,
    /// Counters such as `fence \0 collector`.
    Meta,
}

/// The sled store.
#[derive(Debug)]
pub struct Store {
    db: sled::Db,
    learned: sled::Tree,
    evidence: sled::Tree,
    runs: sled::Tree,
    checkpoints: sled::Tree,
    gaps: sled::Tree,
    meta: sled::Tree,
}

impl Store {
    /// Opens `<state_dir>/store`. If that fails, the directory is moved
    /// aside (`store.broken-<unix ms>`) and a fresh store is opened; if even
    /// that fails, `None`: sluice runs without lasting state.
    /// `cold_starts` counts a store moved aside (label `unreadable`),
    /// `errors` a store that could not be opened at all.
    pub fn open(
        state_dir: &Path,
        cold_starts: &IntCounterVec,
        errors: &IntCounter,
    ) -> Option<Store> {
        let path = state_dir.join("store");
        match Store::open_at(&path) {
            Ok(s) => return Some(s),
            Err(e) => {
                let aside = state_dir.join(format!("store.broken-{}", unix_ms_now()));
                tracing::error!(
                    error = %e,
                    store = %path.display(),
                    moved_to = %aside.display(),
                    "STATE STORE UNREADABLE: moved aside; starting cold (learned rates and evidence from before are not used)"
                );
                cold_starts.with_label_values(&["unreadable"]).inc();
                if let Err(e) = std::fs::rename(&path, &aside) {
                    tracing::error!(error = %e, "could not move the store aside");
                }
            }
        }
        match Store::open_at(&path) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(error = %e, "no state store: nothing learned will outlast this process");
                errors.inc();
                None
            }
        }
    }

    fn open_at(path: &PathBuf) -> Result<Store, StoreError> {
        std::fs::create_dir_all(path)?;
        // sled can panic on some corrupt files; a panic here is a broken
        // store, not a crash.
        let opened = std::panic::catch_unwind(|| sled::Config::new().path(path).open());
        let db = match opened {
            Ok(Ok(db)) => db,
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(StoreError::Corrupt),
        };
        let learned = db.open_tree("learned")?;
        let evidence = db.open_tree("evidence")?;
        let runs = db.open_tree("runs")?;
        let checkpoints = db.open_tree("checkpoints")?;
        let gaps = db.open_tree("gaps")?;
        let meta = db.open_tree("meta")?;
        // Read everything once: a store whose records cannot be read is as
        // broken as one that cannot be opened.
        for tree in [&learned, &evidence, &runs, &checkpoints, &gaps, &meta] {
            for item in tree.iter() {
                item?;
            }
        }
        Ok(Store {
            db,
            learned,
            evidence,
            runs,
            checkpoints,
            gaps,
            meta,
        })
    }

    fn tree(&self, t: RunTree) -> &sled::Tree {
        match t {
            RunTree::Runs => &self.runs,
            RunTree::Checkpoints => &self.checkpoints,
            RunTree::Gaps => &self.gaps,
            RunTree::Meta => &self.meta,
        }
    }

    /// Writes one record of a runs tree (through the [`StoreWriter`]).
    pub fn put(&self, t: RunTree, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.tree(t).insert(key, value)?;
        Ok(())
    }

    /// Removes one record of a runs tree (through the [`StoreWriter`]).
    pub fn remove(&self, t: RunTree, key: &[u8]) -> Result<(), StoreError> {
        self.tree(t).remove(key)?;
        Ok(())
    }

    /// One record of a runs tree.
    pub fn get(&self, t: RunTree, key: &[u8]) -> Option<Vec<u8>> {
        self.tree(t).get(key).ok().flatten().map(|v| v.to_vec())
    }

    /// The records of a runs tree whose keys start with `prefix`, from
    /// `start` (inclusive) on, in key order; unreadable entries skipped.
    pub fn scan(
        &self,
        t: RunTree,
        prefix: &[u8],
        start: &[u8],
    ) -> impl Iterator<Item = (Vec<u8>, Vec<u8>)> + '_ {
        let from = if start > prefix { start } else { prefix };
        let prefix = prefix.to_vec();
        self.tree(t)
            .range(from.to_vec()..)
            .filter_map(Result::ok)
            .take_while(move |(k, _)| k.starts_with(&prefix))
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
    }

    /// The records of a runs tree under `prefix`, last key first.
    pub fn scan_newest(
        &self,
        t: RunTree,
        prefix: &[u8],
    ) -> impl Iterator<Item = (Vec<u8>, Vec<u8>)> + '_ {
        self.tree(t)
            .scan_prefix(prefix)
            .rev()
            .filter_map(Result::ok)
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
    }

    /// Saves a provider's learned state.
    pub fn save_learned(&self, provider: &str, record: &LearnedRecord) -> Result<(), StoreError> {
        let value = serde_json::to_vec(record)?;
        self.learned.insert(provider.as_bytes(), value)?;
        Ok(())
    }

    /// Every saved provider state that can be read (unreadable records are
    /// skipped with a log line).
    pub fn load_learned(&self) -> Vec<(String, LearnedRecord)> {
        self.learned
            .iter()
            .filter_map(|item| {
                let (k, v) = item.ok()?;
                let name = String::from_utf8(k.to_vec()).ok()?;
                match serde_json::from_slice::<LearnedRecord>(&v) {
                    Ok(r) if r.v == VERSION => Some((name, r)),
                    _ => {
                        tracing::warn!(provider = %name, "skipping an unreadable learned-state record");
                        None
                    }
                }
            })
            .collect()
    }

    /// Deletes learned states older than `max_age`: they would be
    /// discarded at start anyway, and the tree must not grow with every
    /// host ever seen.
    pub fn prune_learned(&self, max_age: Duration) -> Result<usize, StoreError> {
        let mut removed = 0;
        for (name, record) in self.load_learned() {
            if record.age() >= max_age {
                self.learned.remove(name.as_bytes())?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Appends a transition to a provider's evidence log, keeps the log
    /// bounded, and flushes (so it survives `kill -9`).
    pub fn append_evidence(
        &self,
        provider: &str,
        record: &EvidenceRecord,
    ) -> Result<(), StoreError> {
        let id = self.db.generate_id()?;
        let mut key = provider.as_bytes().to_vec();
        key.push(0);
        key.extend_from_slice(&id.to_be_bytes());
        let value = serde_json::to_vec(record)?;
        self.evidence.insert(key, value)?;
        let keys: Vec<_> = self
            .evidence
            .scan_prefix(prefix(provider))
            .keys()
            .filter_map(Result::ok)
            .collect();
        for old in keys
            .iter()
            .take(keys.len().saturating_sub(EVIDENCE_PER_PROVIDER))
        {
            self.evidence.remove(old)?;
        }
        self.flush()
    }

    /// A provider's evidence, oldest first.
    pub fn evidence(&self, provider: &str) -> Vec<EvidenceRecord> {
        self.evidence
            .scan_prefix(prefix(provider))
            .values()
            .filter_map(|v| serde_json::from_slice(&v.ok()?).ok())
            .collect()
    }

    /// Makes everything written so far durable.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }
}

/// What the [`StoreWriter`] writes to: the sled [`Store`], or in tests a
/// stand-in whose flush can be held.
pub trait Durable: Send + Sync + 'static {
    /// See [`Store::put`].
    fn put(&self, t: RunTree, key: &[u8], value: &[u8]) -> Result<(), StoreError>;
    /// See [`Store::remove`].
    fn remove(&self, t: RunTree, key: &[u8]) -> Result<(), StoreError>;
    /// See [`Store::save_learned`].
    fn save_learned(&self, provider: &str, record: &LearnedRecord) -> Result<(), StoreError>;
    /// See [`Store::append_evidence`].
    fn append_evidence(&self, provider: &str, record: &EvidenceRecord) -> Result<(), StoreError>;
    /// See [`Store::prune_learned`].
    fn prune_learned(&self, max_age: Duration) -> Result<usize, StoreError>;
    /// See [`Store::flush`].
    fn flush(&self) -> Result<(), StoreError>;
}

impl Durable for Store {
    fn put(&self, t: RunTree, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        Store::put(self, t, key, value)
    }
    fn remove(&self, t: RunTree, key: &[u8]) -> Result<(), StoreError> {
        Store::remove(self, t, key)
    }
    fn save_learned(&self, provider: &str, record: &LearnedRecord) -> Result<(), StoreError> {
        Store::save_learned(self, provider, record)
    }
    fn append_evidence(&self, provider: &str, record: &EvidenceRecord) -> Result<(), StoreError> {
        Store::append_evidence(self, provider, record)
    }
    fn prune_learned(&self, max_age: Duration) -> Result<usize, StoreError> {
        Store::prune_learned(self, max_age)
    }
    fn flush(&self) -> Result<(), StoreError> {
        Store::flush(self)
    }
}

/// Writes queued for the writer thread; beyond it a write is dropped and
/// counted (the runtime never waits for the disk).
pub const WRITER_QUEUE: usize = 4096;

enum Op {
    Put(RunTree, Vec<u8>, Vec<u8>),
    Remove(RunTree, Vec<u8>),
    /// One save's providers, whatever their number: one slot of the queue
    /// (one each dropped a save's providers beyond the queue's 4,096).
    Learned(Vec<(String, LearnedRecord)>),
    Evidence(String, EvidenceRecord),
    Prune(Duration),
    Flush(tokio::sync::oneshot::Sender<Result<(), StoreError>>),
    Applied(tokio::sync::oneshot::Sender<()>),
}

/// The one writer of the store, on a thread of its own.
///
/// sled's flush is an fsync, and breaker transitions — each one evidence
/// that must survive `kill -9` (R-PS2) — come fastest exactly when a
/// provider is failing. Written from the breaker's sink they ran on a
/// runtime worker and stalled every provider's requests behind the disk.
/// Now every store write is a message on a bounded channel to this thread;
/// evidence is flushed as it is written; a caller that must know its writes
/// are durable before it answers awaits [`StoreWriter::flush`], which parks
/// no worker. Cheap to clone; the thread ends when the last clone is gone.
#[derive(Clone)]
pub struct StoreWriter {
    tx: std::sync::mpsc::SyncSender<Op>,
    errors: IntCounter,
}

impl std::fmt::Debug for StoreWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreWriter").finish_non_exhaustive()
    }
}

impl StoreWriter {
    /// Starts the writer thread over `store`; failures count in `errors`.
    pub fn spawn(store: Arc<dyn Durable>, errors: IntCounter) -> StoreWriter {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Op>(WRITER_QUEUE);
        let (counted, errors_saving) = (errors.clone(), errors.clone());
        let fail = move |what: &str, e: StoreError| {
            counted.inc();
            tracing::error!(error = %e, "{what}");
        };
        let spawned = std::thread::Builder::new()
            .name("sluice-store".into())
            .spawn(move || {
                for op in rx {
                    match op {
                        Op::Put(t, k, v) => {
                            if let Err(e) = store.put(t, &k, &v) {
                                fail("run record not stored", e);
                            }
                        }
                        Op::Remove(t, k) => {
                            if let Err(e) = store.remove(t, &k) {
                                fail("run record not removed", e);
                            }
                        }
                        Op::Learned(batch) => {
                            // Each failure counted, one line for the save.
                            let mut failed = 0;
                            let mut first = None;
                            for (p, r) in &batch {
                                if let Err(e) = store.save_learned(p, r) {
                                    failed += 1;
                                    first.get_or_insert(e);
                                }
                            }
                            if let Some(e) = first {
                                errors_saving.inc_by(failed);
                                tracing::error!(error = %e, failed, of = batch.len(), "learned state not saved");
                            }
                        }
                        Op::Evidence(p, r) => {
                            if let Err(e) =
                                store.append_evidence(&p, &r).and_then(|()| store.flush())
                            {
                                fail("breaker evidence not stored", e);
                            }
                        }
                        Op::Prune(age) => {
                            if let Err(e) = store.prune_learned(age) {
                                fail("pruning stale learned state failed", e);
                            }
                        }
                        Op::Flush(done) => {
                            let _ = done.send(store.flush());
                        }
                        Op::Applied(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            // Without the thread the channel's receiver is gone: every send
            // fails and is counted; sluice proxies on without lasting state.
            errors.inc();
            tracing::error!(error = %e, "no store writer thread: nothing will be saved");
        }
        StoreWriter { tx, errors }
    }

    fn send(&self, op: Op) -> bool {
        match self.tx.try_send(op) {
            Ok(()) => true,
            Err(e) => {
                self.errors.inc();
                let why = match e {
                    std::sync::mpsc::TrySendError::Full(_) => "queue full",
                    std::sync::mpsc::TrySendError::Disconnected(_) => "writer gone",
                };
                tracing::error!(why, "store write dropped");
                false
            }
        }
    }

    /// Queues a write of one runs record; [`flush`](Self::flush) makes it
    /// durable. `false`: the write was dropped (queue full, writer gone).
    pub fn put(&self, t: RunTree, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.send(Op::Put(t, key, value))
    }

    /// Queues removing one runs record.
    pub fn remove(&self, t: RunTree, key: Vec<u8>) -> bool {
        self.send(Op::Remove(t, key))
    }

    /// Queues the learned state of a save's providers, as one write.
    pub fn save_learned(&self, learned: Vec<(String, LearnedRecord)>) {
        if !learned.is_empty() {
            self.send(Op::Learned(learned));
        }
    }

    /// Queues one transition's evidence (flushed when written).
    pub fn append_evidence(&self, provider: &str, record: EvidenceRecord) {
        self.send(Op::Evidence(provider.to_string(), record));
    }

    /// Queues pruning of learned state older than `max_age`.
    pub fn prune_learned(&self, max_age: Duration) {
        self.send(Op::Prune(max_age));
    }

    /// Resolves once every write queued before it is applied to the store
    /// (readable, not yet necessarily on disk): a read after it sees them.
    pub async fn applied(&self) -> Result<(), StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if !self.send(Op::Applied(tx)) {
            return Err(StoreError::WriterUnavailable);
        }
        rx.await.map_err(|_| StoreError::WriterUnavailable)
    }

    /// Resolves once every write queued before it is on disk.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if !self.send(Op::Flush(tx)) {
            return Err(StoreError::WriterUnavailable);
        }
        rx.await.map_err(|_| StoreError::WriterUnavailable)?
    }
}

fn prefix(provider: &str) -> Vec<u8> {
    let mut p = provider.as_bytes().to_vec();
    p.push(0);
    p
}

/// A store whose flush waits until the test lets it go: a stalled disk,
/// for the tests of what must not wait on it.
#[cfg(test)]
pub(crate) struct HeldFlush {
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    /// Flushes that returned.
    pub(crate) flushed: std::sync::atomic::AtomicUsize,
}

#[cfg(test)]
impl HeldFlush {
    /// The store, and the sender whose each message lets one flush return
    /// (every flush returns once the sender is dropped).
    pub(crate) fn new() -> (Arc<HeldFlush>, std::sync::mpsc::Sender<()>) {
        let (release, held) = std::sync::mpsc::channel();
        let store = HeldFlush {
            release: std::sync::Mutex::new(held),
            flushed: Default::default(),
        };
        (Arc::new(store), release)
    }
}

#[cfg(test)]
impl Durable for HeldFlush {
    fn put(&self, _: RunTree, _: &[u8], _: &[u8]) -> Result<(), StoreError> {
        Ok(())
    }
    fn remove(&self, _: RunTree, _: &[u8]) -> Result<(), StoreError> {
        Ok(())
    }
    fn save_learned(&self, _: &str, _: &LearnedRecord) -> Result<(), StoreError> {
        Ok(())
    }
    fn append_evidence(&self, _: &str, _: &EvidenceRecord) -> Result<(), StoreError> {
        Ok(())
    }
    fn prune_learned(&self, _: Duration) -> Result<usize, StoreError> {
        Ok(0)
    }
    fn flush(&self) -> Result<(), StoreError> {
        let _ = self
            .release
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .recv();
        self.flushed
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters() -> (IntCounterVec, IntCounter) {
        (
            IntCounterVec::new(prometheus::Opts::new("cold", "cold"), &["reason"]).unwrap(),
            IntCounter::new("errors", "errors").unwrap(),
        )
    }

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sluice-store-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn learned_and_evidence_round_trip_bounded() {
        let d = dir("rt");
        let m = counters();
        {
            let s = Store::open(&d, &m.0, &m.1).unwrap();
            let state = LearnedState {
                rate_rps: 12.5,
                limit_rps: Some(13.0),
                baseline: Some(Duration::from_millis(40)),
                breaker: State::Closed,
                open_remaining: None,
                allowance: None,
            };
            s.save_learned("api.test", &LearnedRecord::of(&state, Duration::ZERO))
                .unwrap();
            let old = LearnedRecord::of(&state, Duration::from_secs(600));
            assert!(
                old.age() >= Duration::from_secs(600),
                "age kept across saves"
            );
            for i in 0..(EVIDENCE_PER_PROVIDER + 5) {
                let r = EvidenceRecord {
                    at_unix_ms: i as u64,
                    from: "closed".into(),
                    to: "open".into(),
                    reason: "failure_rate".into(),
                    elapsed_ms: 1,
                    calls: 20,
                    failures: 12,
                    retry_budget_left: Some(3),
                };
                s.append_evidence("api.test", &r).unwrap();
            }
            s.append_evidence("api.test2", &s.evidence("api.test")[0].clone())
                .unwrap();
        }
        let s = Store::open(&d, &m.0, &m.1).unwrap();
        let learned = s.load_learned();
        assert_eq!(learned.len(), 1);
        assert_eq!(s.prune_learned(Duration::from_secs(3600)).unwrap(), 0);
        assert_eq!(s.prune_learned(Duration::ZERO).unwrap(), 1);
        assert!(s.load_learned().is_empty());
        assert_eq!(learned[0].1.state().rate_rps, 12.5);
        let ev = s.evidence("api.test");
        assert_eq!(ev.len(), EVIDENCE_PER_PROVIDER);
        assert_eq!(ev[0].at_unix_ms, 5, "oldest dropped, order kept");
        assert_eq!(s.evidence("api.test2").len(), 1, "prefixes do not mix");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_corrupt_store_is_moved_aside_and_replaced() {
        let d = dir("corrupt");
        let store = d.join("store");
        std::fs::create_dir_all(&store).unwrap();
        std::fs::write(store.join("conf"), b"\xff\x00 not sled at all").unwrap();
        std::fs::write(store.join("db"), vec![0xAB; 4096]).unwrap();
        let m = counters();
        let s = Store::open(&d, &m.0, &m.1).expect("a fresh store");
        assert!(s.load_learned().is_empty());
        let aside = std::fs::read_dir(&d)
            .unwrap()
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().starts_with("store.broken-"));
        assert!(aside, "moved aside");
        assert_eq!(m.0.with_label_values(&["unreadable"]).get(), 1);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Issue 9, defect 5: with the disk stalled (a flush that does not
    /// return until released), breaker evidence is queued at once and the
    /// runtime — a single worker, as if every provider shared it — keeps
    /// serving; a caller that needs durability awaits the flush without
    /// parking the worker, and gets it once the disk comes back. Nothing
    /// here measures time: were a write synchronous, the first
    /// `append_evidence` would block this thread forever and the test would
    /// time out.
    #[test]
    fn breaker_states_are_stored_as_the_words_earlier_versions_wrote() {
        for (state, word) in [
            (State::Closed, "\"closed\""),
            (State::Open, "\"open\""),
            (State::HalfOpen, "\"half_open\""),
        ] {
            let stored = StoredBreaker::from(state);
            assert_eq!(serde_json::to_string(&stored).unwrap(), word);
            let back: StoredBreaker = serde_json::from_str(word).unwrap();
            assert_eq!(State::from(back), state);
        }
        let unknown: StoredBreaker = serde_json::from_str("\"melted\"").unwrap();
        assert_eq!(State::from(unknown), State::Closed);
    }

    #[test]
    fn a_stalled_disk_never_blocks_the_runtime() {
        let (store, release) = HeldFlush::new();
        let writer = StoreWriter::spawn(store.clone(), IntCounter::new("e", "e").unwrap());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let t = Transition {
                from: sluice_policy::breaker::State::Closed,
                to: sluice_policy::breaker::State::Open,
                reason: sluice_policy::breaker::Reason::FailureRate,
                at: tokio::time::Instant::now(),
                elapsed_ms: 1,
                calls: 20,
                failures: 20,
                retry_budget_left: Some(1),
            };
            for _ in 0..100 {
                writer.append_evidence("failing.test", EvidenceRecord::of(&t, Duration::ZERO));
            }
            // Another provider's work on the same worker goes on.
            let other = tokio::spawn(async { 7 });
            assert_eq!(other.await.unwrap(), 7);
            let durable = tokio::spawn({
                let w = writer.clone();
                async move { w.flush().await }
            });
            let other = tokio::spawn(async { 8 });
            assert_eq!(other.await.unwrap(), 8);
            assert_eq!(store.flushed.load(std::sync::atomic::Ordering::SeqCst), 0);
            // The disk comes back: every held flush returns (100 evidence
            // flushes, then the awaited one).
            for _ in 0..101 {
                release.send(()).unwrap();
            }
            tokio::time::timeout(Duration::from_secs(30), durable)
                .await
                .expect("the flush completed once released")
                .unwrap()
                .unwrap();
            assert_eq!(store.flushed.load(std::sync::atomic::Ordering::SeqCst), 101);
        });
    }

    /// A read after `applied` sees every write queued before it — the
    /// gaps a run's end just updated, read by the collector's next call
    /// (R-RN12) — without waiting for the disk.
    #[test]
    fn a_read_after_applied_sees_every_queued_write() {
        let d = dir("applied");
        let m = counters();
        let store = Arc::new(Store::open(&d, &m.0, &m.1).unwrap());
        let writer = StoreWriter::spawn(store.clone(), m.1.clone());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for i in 0..2_000u32 {
                let key = [b"c\0".as_slice(), &i.to_be_bytes()].concat();
                assert!(writer.put(RunTree::Gaps, key, vec![7; 64]));
            }
            writer.applied().await.unwrap();
            assert_eq!(store.scan(RunTree::Gaps, b"c\0", &[]).count(), 2_000);
        });
        assert_eq!(m.1.get(), 0, "no store errors");
    }
}
