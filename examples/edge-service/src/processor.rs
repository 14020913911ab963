//! A simulated payment processor: the downstream system whose side effects must happen once.
//!
//! It deduplicates on the idempotency key it is given (as real processors do), keeps every
//! charge in a ledger file that survives restarts, counts its side effects, and sometimes
//! "times out": it makes the charge but its answer is lost, so the caller cannot know.
//!
//! Several service instances may share one ledger file (`--processor-ledger`), as they share
//! one real processor: each charge and lookup locks the file, reads what other processes
//! appended since, and only then decides.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use serde::{Deserialize, Serialize};

/// One charge the processor made.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ProcessorCharge {
    pub(crate) id: String,
    pub(crate) key: String,
    /// The merchant account charged for (a processor knows its merchants).
    #[serde(default)]
    pub(crate) tenant: String,
    pub(crate) amount: u64,
    pub(crate) currency: String,
    pub(crate) customer: String,
}

/// What a charge request came to.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// A new charge: one side effect.
    Charged(ProcessorCharge),
    /// The key was charged before (an earlier attempt): no new side effect.
    AlreadyCharged(ProcessorCharge),
    /// The charge was made but the answer was lost on the way back.
    TimedOut,
    /// The processor could not take the charge (its ledger could not be written): nothing
    /// was charged, so the request may simply be tried again.
    Unavailable(String),
}

struct Ledger {
    file: File,
    by_key: HashMap<String, ProcessorCharge>,
    /// The ledger's path, to read other processes' appends.
    path: PathBuf,
    /// How far into the file `by_key` has read.
    read_to: u64,
    rng: u64,
}

/// The processor; cheap to clone.
#[derive(Clone)]
pub(crate) struct Processor {
    ledger: Arc<Mutex<Ledger>>,
    timeout_rate: f64,
    latency: Duration,
    /// Calls to `charge` and to `lookup`, for the tests and the operator's stats.
    calls: Arc<Calls>,
}

/// The processor's side effects, as `/stats` shows them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SideEffects {
    pub(crate) all: u64,
    pub(crate) of_tenant: u64,
}

/// How often each processor API was called.
#[derive(Debug, Default)]
pub(crate) struct Calls {
    pub(crate) charges: AtomicU64,
    pub(crate) lookups: AtomicU64,
}

impl Processor {
    /// Opens (or creates) the ledger at `path`.
    pub(crate) fn open(
        path: &Path,
        timeout_rate: f64,
        latency: Duration,
    ) -> std::io::Result<Processor> {
        let mut by_key = HashMap::new();
        if let Ok(file) = File::open(path) {
            for line in BufReader::new(file).lines() {
                let line = line?;
                // A torn last line (a crash mid-append) is not a charge the caller ever saw.
                if let Ok(charge) = serde_json::from_str::<ProcessorCharge>(&line) {
                    by_key.insert(charge.key.clone(), charge);
                }
            }
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let read_to = file.metadata()?.len();
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64 | 1);
        Ok(Processor {
            ledger: Arc::new(Mutex::new(Ledger {
                file,
                by_key,
                path: path.to_owned(),
                read_to,
                rng: seed,
            })),
            timeout_rate,
            latency,
            calls: Arc::default(),
        })
    }

    /// Charges `amount` once per `key`.
    pub(crate) async fn charge(
        &self,
        tenant: &str,
        key: &str,
        amount: u64,
        currency: &str,
        customer: &str,
    ) -> Outcome {
        self.calls.charges.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(self.latency).await; // the network round trip
        let (ledger, rate) = (self.ledger.clone(), self.timeout_rate);
        let charge = ProcessorCharge {
            id: String::new(),
            key: key.to_owned(),
            tenant: tenant.to_owned(),
            amount,
            currency: currency.to_owned(),
            customer: customer.to_owned(),
        };
        // The ledger append is synced: a blocking call, kept off the runtime's workers.
        let charged = tokio::task::spawn_blocking(move || {
            let mut ledger = ledger.lock();
            // Other processes sharing the file: wait for theirs, read what they charged.
            if let Err(e) = ledger.file.lock().and_then(|()| ledger.catch_up()) {
                let _ = ledger.file.unlock();
                return Outcome::Unavailable(format!("the processor's ledger: {e}"));
            }
            let outcome = ledger.charge_locked(charge, rate);
            let _ = ledger.file.unlock();
            outcome
        })
        .await;
        charged.unwrap_or_else(|e| Outcome::Unavailable(format!("the processor failed: {e}")))
    }

    /// The charge made for `key`, if any: a read, with no side effect (real processors let a
    /// merchant look a charge up by its idempotency key).
    pub(crate) async fn lookup(&self, key: &str) -> Option<ProcessorCharge> {
        self.calls.lookups.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(self.latency).await;
        let key = key.to_owned();
        self.reading(move |ledger| ledger.by_key.get(&key).cloned())
            .await
            .flatten()
    }

    /// `read` on the ledger caught up with every process's appends, off the runtime's
    /// workers: it waits for the file's lock, which another instance holds across a sync.
    async fn reading<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Ledger) -> T + Send + 'static,
    ) -> Option<T> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || read(&this.caught_up()))
            .await
            .inspect_err(|e| tracing::error!(error = %e, "reading the processor's ledger failed"))
            .ok()
    }

    /// The ledger with every process's appends read: the file shared by all instances is the
    /// processor's truth, not this process's memory of it.
    fn caught_up(&self) -> parking_lot::MutexGuard<'_, Ledger> {
        let mut ledger = self.ledger.lock();
        if ledger
            .file
            .lock_shared()
            .and_then(|()| ledger.catch_up())
            .is_err()
        {
            tracing::warn!("the processor's ledger could not be read; answering from memory");
        }
        let _ = ledger.file.unlock();
        ledger
    }

    /// How often `charge` and `lookup` were called.
    pub(crate) fn calls(&self) -> (u64, u64) {
        (
            self.calls.charges.load(Ordering::Relaxed),
            self.calls.lookups.load(Ordering::Relaxed),
        )
    }

    /// Charges made since the ledger was created, by any instance sharing it (the side
    /// effects that happened), in all and for `tenant`; `None` if the ledger cannot be read.
    pub(crate) async fn side_effects(&self, tenant: Option<&str>) -> Option<SideEffects> {
        let tenant = tenant.map(str::to_owned);
        self.reading(move |ledger| SideEffects {
            all: ledger.by_key.len() as u64,
            of_tenant: tenant.map_or(0, |tenant| {
                ledger
                    .by_key
                    .values()
                    .filter(|c| c.tenant == tenant)
                    .count() as u64
            }),
        })
        .await
    }
}

impl Ledger {
    /// With the file locked: the charge for `charge.key`, made now unless it exists.
    fn charge_locked(&mut self, charge: ProcessorCharge, rate: f64) -> Outcome {
        if let Some(existing) = self.by_key.get(&charge.key) {
            return Outcome::AlreadyCharged(existing.clone());
        }
        let charge = ProcessorCharge {
            id: format!("py_{:06}", self.by_key.len() + 1),
            ..charge
        };
        // A charge that is not in the ledger did not happen: a failed append (a full
        // disk) charges nothing, and says so.
        if let Err(e) = self.append(&charge) {
            return Outcome::Unavailable(format!("the processor's ledger: {e}"));
        }
        self.read_to = self.file.metadata().map_or(self.read_to, |m| m.len());
        self.by_key.insert(charge.key.clone(), charge.clone());
        if self.roll() < rate {
            Outcome::TimedOut
        } else {
            Outcome::Charged(charge)
        }
    }

    /// Reads the complete lines other processes appended since the last read.
    fn catch_up(&mut self) -> std::io::Result<()> {
        let mut file = File::open(&self.path)?;
        file.seek(SeekFrom::Start(self.read_to))?;
        let mut appended = Vec::new();
        file.read_to_end(&mut appended)?;
        let complete = appended
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |at| at + 1);
        for line in appended[..complete].split(|&b| b == b'\n') {
            if let Ok(charge) = serde_json::from_slice::<ProcessorCharge>(line) {
                self.by_key.insert(charge.key.clone(), charge);
            }
        }
        self.read_to += complete as u64;
        Ok(())
    }

    /// Appends a charge to the ledger file and syncs it. A failed write is truncated away, so
    /// the file never holds half a line.
    fn append(&mut self, charge: &ProcessorCharge) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(charge)?;
        line.push(b'\n');
        let before = self.file.metadata()?.len();
        let written = self
            .file
            .write_all(&line)
            .and_then(|()| self.file.sync_data());
        if written.is_err() {
            let _ = self.file.set_len(before);
        }
        written
    }

    /// A number in [0, 1) (xorshift; the example needs no better).
    fn roll(&mut self) -> f64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 11) as f64 / (1u64 << 53) as f64
    }
}
