//! The store's one writer, on a thread of its own (see [`StoreWriter`]).

use super::*;

/// Writes queued for the writer thread; beyond it a write is dropped and
/// counted (the runtime never waits for the disk).
pub const WRITER_QUEUE: usize = 4096;

enum Op {
    Put(RunTree, Vec<u8>, Vec<u8>),
    Remove(RunTree, Vec<u8>),
    /// One save's providers, whatever their number: one slot of the queue
    /// (one each dropped a save's providers beyond the queue's 4,096).
    Learned(Vec<(String, LearnedRecord)>),
    /// Boxed: the queue's slots are as wide as its widest write (a
    /// transition's evidence inline made them 144 bytes: 576 KiB resident
    /// once the ring was gone round, 256 KiB now — R-PF1, issue 38).
    Evidence(Box<(String, EvidenceRecord)>),
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
                        Op::Evidence(evidence) => {
                            let (p, r) = &*evidence;
                            if let Err(e) =
                                store.append_evidence(p, r).and_then(|()| store.flush())
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
        self.send(Op::Evidence(Box::new((provider.to_string(), record))));
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

    /// R-PF1: the queue's 4,096 slots are as wide as its widest write, and
    /// resident once the ring has gone round: a write of 56 bytes at most
    /// keeps them at 256 KiB (a transition's evidence inline made 576).
    #[test]
    fn the_queues_writes_are_narrow() {
        assert!(
            std::mem::size_of::<Op>() <= 56,
            "{}",
            std::mem::size_of::<Op>()
        );
    }
}
