//! What sluice learned, kept across restarts in sled (R-PS1, R-PS2).
//!
//! Two trees in `<state_dir>/store`:
//! * `learned`: per provider, the learned rate, where throttling began,
//!   the latency baseline and the breaker state, with the wall-clock time
//!   it was saved (a binary record of 20–76 bytes; JSON before, still read). Written every `save_interval` and on shutdown; read at
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
use sluice_policy::pacer::LimitKnown;
use sluice_policy::provider::LearnedState;

use prometheus::{IntCounter, IntCounterVec};

mod records;
mod writer;

pub use self::records::{EvidenceRecord, LearnedRecord, StoredBreaker};
#[cfg(test)]
pub(crate) use self::writer::HeldFlush;
pub use self::writer::{StoreWriter, WRITER_QUEUE};

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

/// A learned-state record of this version, or `None` with a log line.
fn readable(provider: &str, bytes: &[u8]) -> Option<LearnedRecord> {
    match LearnedRecord::decode(bytes) {
        Some(r) if r.v == VERSION => Some(r),
        _ => {
            tracing::warn!(provider = %provider, "skipping an unreadable learned-state record");
            None
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

/// sled's page cache (its default is 1 GiB, filled with every record
/// written): records are read once, at start, and written every few
/// seconds — a few MiB of cache serve that (issue 38, R-PF1). It does not
/// bound what sled keeps of its own writes: sled 0.34 alone, written one
/// key at a time as here, held 6 MB more after 10,000 records of 60 bytes
/// and 9 MB after 40,000, with this cap, 1 MiB or 16 KiB alike
/// (2026-12-07) — at 10,000 taught hosts, ~0.8 KB of each one's resident
/// cost is the store's.
const CACHE_BYTES: u64 = 8 << 20;

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
        let opened = std::panic::catch_unwind(|| {
            sled::Config::new()
                .path(path)
                .cache_capacity(CACHE_BYTES)
                .open()
        });
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
        self.learned.insert(provider.as_bytes(), record.encode())?;
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
                let record = readable(&name, &v)?;
                Some((name, record))
            })
            .collect()
    }

    /// Calls `f` with each saved provider state that can be read, one at a
    /// time: a store of a million hosts is not copied into memory.
    pub fn each_learned(&self, mut f: impl FnMut(&str, &LearnedRecord)) {
        for (k, v) in self.learned.iter().filter_map(Result::ok) {
            let Ok(name) = std::str::from_utf8(&k) else {
                continue;
            };
            if let Some(record) = readable(name, &v) {
                f(name, &record);
            }
        }
    }

    /// One provider's saved state, if there is a readable one: what a
    /// provider evicted from memory starts from when it comes back (R-PS1,
    /// issue 38).
    pub fn learned_of(&self, provider: &str) -> Option<LearnedRecord> {
        let bytes = self.learned.get(provider.as_bytes()).ok()??;
        readable(provider, &bytes)
    }

    /// Deletes learned states older than `max_age`: they would be
    /// discarded at start anyway, and the tree must not grow with every
    /// host ever seen.
    pub fn prune_learned(&self, max_age: Duration) -> Result<usize, StoreError> {
        let mut old = Vec::new();
        self.each_learned(|name, record| {
            if record.age() >= max_age {
                old.push(name.to_string());
            }
        });
        for name in &old {
            self.learned.remove(name.as_bytes())?;
        }
        Ok(old.len())
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

fn prefix(provider: &str) -> Vec<u8> {
    let mut p = provider.as_bytes().to_vec();
    p.push(0);
    p
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
                known: LimitKnown {
                    hold: Some(Duration::from_secs(1)),
                    fitted: true,
                    sharp: false,
                    steady: true,
                },
            };
            s.save_learned("api.test", &LearnedRecord::of(&state, Duration::ZERO, None))
                .unwrap();
            let old = LearnedRecord::of(&state, Duration::from_secs(600), None);
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
        let known = learned[0].1.state().known;
        assert_eq!(known.hold, Some(Duration::from_secs(1)));
        assert!(known.fitted && !known.sharp && known.steady, "{known:?}");
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

    /// A learned state's record is binary: every figure back as it was,
    /// 20 bytes with none of the optional ones and 76 with all (its JSON
    /// took about 300); a JSON record of an earlier version still reads,
    /// and a truncated or foreign value reads as nothing (skipped, R-PS2).
    #[test]
    fn a_learned_record_is_a_few_dozen_bytes_and_reads_back() {
        let full = LearnedRecord {
            v: VERSION,
            saved_at_unix_ms: 1_764_000_000_123,
            rate_rps: 19.4,
            limit_rps: Some(20.25),
            baseline_ms: Some(3.5),
            breaker: StoredBreaker::Open,
            open_remaining_ms: Some(4_000),
            allowance_began_unix_ms: Some(1_763_999_000_000),
            allowance_spent: Some(1234.5),
            hold_ms: Some(1_500),
            limit_fitted: true,
            limit_sharp: false,
            limit_steady: true,
            config: Some(u64::MAX - 7),
        };
        let bytes = full.encode();
        assert_eq!(bytes.len(), 76);
        assert_eq!(LearnedRecord::decode(&bytes), Some(full.clone()));
        let bare = LearnedRecord {
            limit_rps: None,
            baseline_ms: None,
            breaker: StoredBreaker::HalfOpen,
            open_remaining_ms: None,
            allowance_began_unix_ms: None,
            allowance_spent: None,
            hold_ms: None,
            limit_fitted: false,
            limit_steady: false,
            config: None,
            ..full.clone()
        };
        assert_eq!(bare.encode().len(), 20);
        assert_eq!(LearnedRecord::decode(&bare.encode()), Some(bare));
        let json = serde_json::to_vec(&full).unwrap();
        assert!(json.len() > 250, "{} bytes of JSON", json.len());
        assert_eq!(LearnedRecord::decode(&json), Some(full));
        assert_eq!(LearnedRecord::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(LearnedRecord::decode(&bytes[..3]), None);
        assert_eq!(LearnedRecord::decode(b""), None);
        assert_eq!(LearnedRecord::decode(b"\xb1garbage"), None);
    }

    /// A record written before how the limit is known was kept reads as
    /// knowing nothing of it (R-PS1: an upgrade loses no learned rate).
    #[test]
    fn a_record_without_how_the_limit_is_known_reads() {
        let json = r#"{"v":1,"saved_at_unix_ms":1,"rate_rps":9.5,"limit_rps":10.0,
            "baseline_ms":null,"breaker":"closed","open_remaining_ms":null}"#;
        let r: LearnedRecord = serde_json::from_str(json).unwrap();
        let state = r.state();
        assert_eq!((state.rate_rps, state.limit_rps), (9.5, Some(10.0)));
        assert_eq!(state.known, LimitKnown::default());
    }
}
