//! The connection to the Redis a fleet shares its budgets through (R-DS2):
//! one server, a Redis Cluster, or the primary Sentinel names — one way to
//! run a script for any of them, and the node that answers for a key.
//!
//! - **One server**: redis-rs' `ConnectionManager`, reconnecting by itself.
//! - **Cluster**: redis-rs' async cluster client. It learns the slots from
//!   the seed nodes, sends each script to the primary of its key's slot
//!   (every provider's key is in one slot: its hash tag), loads scripts
//!   where a primary lacks them (`NOSCRIPT`), follows `MOVED` and `ASK`,
//!   and reads the slots again when a node stops answering — which is how
//!   a promoted replica is found. The slot map is also read here, for the
//!   readout's node, at most every [`SLOTS_EVERY`] and after a failure.
//! - **Sentinel**: the primary the sentinels name, over one multiplexed
//!   connection. A failed call drops it and asks the sentinels again (in the
//!   background, one search at a time): a primary that was stopped is
//!   replaced by the one they promote, a demoted one (`READONLY`) likewise.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, IntoConnectionInfo, RedisResult, ScriptInvocation, TlsMode};
use tokio::time::Instant;

use crate::config::{redact_url, ConfigError, RedisTarget, Shared};

/// The slot map (for the readout) is read again at most this often.
pub const SLOTS_EVERY: Duration = Duration::from_secs(5);

/// A Redis Cluster's slot count.
const SLOTS: u16 = 16384;

/// The slot a key is kept in on a Redis Cluster: CRC16 (XMODEM) of its
/// hash tag, the text between the first `{` and the next `}`.
pub fn slot_of(key: &str) -> u16 {
    let tag = key
        .split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map(|(tag, _)| tag)
        .filter(|t| !t.is_empty())
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % SLOTS
}

/// The primary that Sentinel named, as last found.
#[derive(Default)]
struct Found {
    conn: Option<MultiplexedConnection>,
    node: Option<String>,
}

/// The Sentinel side: the sentinels, and the primary they named.
pub(super) struct SentinelLink {
    client: tokio::sync::Mutex<SentinelClient>,
    found: Mutex<Found>,
    /// A search is under way.
    finding: AtomicBool,
    config: AsyncConnectionConfig,
    /// A search may take this long.
    find_timeout: Duration,
}

/// A Cluster's slot ranges and the primary of each, as last read.
#[derive(Default)]
pub(super) struct SlotMap {
    ranges: Vec<(u16, u16, String)>,
    read_at: Option<Instant>,
}

/// The connection to one of the three deployments.
pub(super) enum Link {
    /// One server.
    Single {
        /// Reconnects by itself.
        conn: ConnectionManager,
        /// `host:port`.
        node: String,
    },
    /// A Redis Cluster.
    Cluster {
        /// Routes by slot; clones share one connection.
        conn: ClusterConnection,
        /// For the readout.
        slots: Arc<Mutex<SlotMap>>,
        /// A read of the slots is under way.
        reading: Arc<AtomicBool>,
    },
    /// The primary Sentinel names.
    Sentinel(Arc<SentinelLink>),
}

fn tls_certificates(
    extra_ca: Option<&Path>,
) -> Result<Option<redis::TlsCertificates>, ConfigError> {
    let Some(path) = extra_ca else {
        return Ok(None);
    };
    let pem = std::fs::read(path).map_err(|e| ConfigError {
        key: "upstream.extra_ca".into(),
        reason: format!("cannot read {}: {e}", path.display()),
    })?;
    Ok(Some(redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem),
    }))
}

impl Link {
    /// Connects lazily (a Redis down at start is the degraded mode, not a
    /// failed start). `rediss://` trusts the bundled web roots, or
    /// `extra_ca` (PEM) when the upstream has one.
    pub fn new(config: &Shared, extra_ca: Option<&Path>) -> Result<Link, ConfigError> {
        let bad = |reason: String| ConfigError {
            key: "shared.redis".into(),
            reason,
        };
        let certs = if config.target.tls() {
            tls_certificates(extra_ca)?
        } else {
            None
        };
        let timeout = config.call_timeout;
        match &config.target {
            RedisTarget::Single(url) => {
                let client = match certs {
                    Some(certs) => redis::Client::build_with_tls(url.as_str(), certs),
                    None => redis::Client::open(url.as_str()),
                }
                .map_err(|e| bad(e.to_string()))?;
                let node = client.get_connection_info().addr().to_string();
                let manager = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(super::RETRY_DOWN);
                let conn = ConnectionManager::new_lazy_with_config(client, manager)
                    .map_err(|e| bad(e.to_string()))?;
                Ok(Link::Single { conn, node })
            }
            RedisTarget::Cluster(nodes) => {
                let mut builder = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    // A call is bounded by the caller's timeout: few, short
                    // retries inside it.
                    .retries(1)
                    .min_retry_wait(10)
                    .max_retry_wait(100);
                if let Some(certs) = certs {
                    builder = builder.certs(certs);
                }
                let client = builder.build().map_err(|e| bad(e.to_string()))?;
                let conn = client.get_pending_async_connection_with_config(
                    redis::cluster::ClusterConfig::new()
                        .set_connection_timeout(timeout)
                        .set_response_timeout(timeout),
                );
                Ok(Link::Cluster {
                    conn,
                    slots: Arc::default(),
                    reading: Arc::default(),
                })
            }
            RedisTarget::Sentinel {
                sentinels,
                master,
                tls,
                username,
                password,
                db,
            } => {
                let addrs = sentinels
                    .iter()
                    .map(|s| {
                        s.as_str()
                            .into_connection_info()
                            .map(|i| i.addr().clone())
                            .map_err(|e| bad(format!("{}: {e}", redact_url(s))))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let mut builder =
                    SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)
                        .map_err(|e| bad(e.to_string()))?
                        .set_client_to_redis_db(*db);
                if *tls {
                    builder = builder
                        .set_client_to_redis_tls_mode(TlsMode::Secure)
                        .set_client_to_sentinel_tls_mode(TlsMode::Secure);
                    if let Some(certs) = certs {
                        builder = builder
                            .set_client_to_redis_certificates(certs.clone())
                            .set_client_to_sentinel_certificates(certs);
                    }
                }
                if let Some(u) = username {
                    builder = builder.set_client_to_redis_username(u);
                }
                if let Some(p) = password {
                    builder = builder.set_client_to_redis_password(p);
                }
                let client = builder.build().map_err(|e| bad(e.to_string()))?;
                Ok(Link::Sentinel(Arc::new(SentinelLink {
                    client: tokio::sync::Mutex::new(client),
                    found: Mutex::default(),
                    finding: AtomicBool::new(false),
                    config: AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(timeout))
                        .set_response_timeout(Some(timeout)),
                    find_timeout: (timeout * 20).max(Duration::from_secs(1)),
                })))
            }
        }
    }

    /// Whether a failure is the key's own (a Cluster: its slot's primary)
    /// rather than the whole store's.
    pub fn fails_per_key(&self) -> bool {
        matches!(self, Link::Cluster { .. })
    }

    /// Runs a script (the caller bounds it by its call timeout).
    pub async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        match self {
            Link::Single { conn, .. } => invocation.invoke_async(&mut conn.clone()).await,
            Link::Cluster { conn, .. } => invocation.invoke_async(&mut conn.clone()).await,
            Link::Sentinel(link) => {
                let conn = link
                    .found
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .conn
                    .clone();
                let Some(mut conn) = conn else {
                    link.find();
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "no primary found through Sentinel yet",
                    )));
                };
                invocation.invoke_async(&mut conn).await
            }
        }
    }

    /// A call failed or timed out: the primary is looked for again
    /// (Sentinel), or the slots read again for the readout (Cluster).
    pub fn failed(&self) {
        match self {
            Link::Single { .. } => {}
            Link::Cluster { slots, .. } => {
                slots.lock().unwrap_or_else(|p| p.into_inner()).read_at = None;
            }
            Link::Sentinel(link) => {
                link.found.lock().unwrap_or_else(|p| p.into_inner()).conn = None;
                link.find();
            }
        }
    }

    /// The node that answers for `key` as last known (`host:port`), and
    /// for a Cluster a read of the slots if the map is old.
    pub fn node_of(&self, key: &str) -> Option<String> {
        match self {
            Link::Single { node, .. } => Some(node.clone()),
            Link::Cluster {
                conn,
                slots,
                reading,
            } => {
                let slot = slot_of(key);
                let map = slots.lock().unwrap_or_else(|p| p.into_inner());
                let stale = map.read_at.is_none_or(|at| at.elapsed() >= SLOTS_EVERY);
                let node = map
                    .ranges
                    .iter()
                    .find(|(a, b, _)| (*a..=*b).contains(&slot))
                    .map(|(_, _, n)| n.clone());
                drop(map);
                if stale && !reading.swap(true, Ordering::AcqRel) {
                    let (conn, slots, reading) = (conn.clone(), slots.clone(), reading.clone());
                    tokio::spawn(async move {
                        read_slots(conn, &slots).await;
                        reading.store(false, Ordering::Release);
                    });
                }
                node
            }
            Link::Sentinel(link) => link
                .found
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .node
                .clone(),
        }
    }
}

/// Reads `CLUSTER SLOTS` into the map (each range's primary).
async fn read_slots(mut conn: ClusterConnection, slots: &Mutex<SlotMap>) {
    let answer = tokio::time::timeout(
        Duration::from_secs(2),
        redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async::<redis::Value>(&mut conn),
    )
    .await;
    let Ok(Ok(redis::Value::Array(rows))) = answer else {
        return;
    };
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let int = |v: &redis::Value| match v {
        redis::Value::Int(i) => u16::try_from(*i).ok(),
        _ => None,
    };
    let mut ranges = Vec::new();
    for row in rows {
        let redis::Value::Array(row) = row else {
            continue;
        };
        let (Some(a), Some(b), Some(redis::Value::Array(primary))) = (
            row.first().and_then(int),
            row.get(1).and_then(int),
            row.get(2),
        ) else {
            continue;
        };
        if let (Some(host), Some(port)) =
            (primary.first().and_then(text), primary.get(1).and_then(int))
        {
            ranges.push((a, b, format!("{host}:{port}")));
        }
    }
    let mut map = slots.lock().unwrap_or_else(|p| p.into_inner());
    map.ranges = ranges;
    map.read_at = Some(Instant::now());
}

impl SentinelLink {
    /// Asks the sentinels for the primary and connects to it, in the
    /// background; one search at a time.
    fn find(self: &Arc<Self>) {
        if self.finding.swap(true, Ordering::AcqRel) {
            return;
        }
        let link = self.clone();
        tokio::spawn(async move {
            let found = tokio::time::timeout(link.find_timeout, async {
                let client = link.client.lock().await.async_get_client().await?;
                let node = client.get_connection_info().addr().to_string();
                let conn = client
                    .get_multiplexed_async_connection_with_config(&link.config)
                    .await?;
                RedisResult::Ok((conn, node))
            })
            .await;
            match found {
                Ok(Ok((conn, node))) => {
                    let mut f = link.found.lock().unwrap_or_else(|p| p.into_inner());
                    if f.node.as_deref() != Some(node.as_str()) {
                        tracing::info!(primary = %node, "shared budgets: Sentinel named the primary");
                    }
                    f.conn = Some(conn);
                    f.node = Some(node);
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "shared budgets: no primary through Sentinel")
                }
                Err(_) => tracing::debug!("shared budgets: Sentinel did not answer in time"),
            }
            link.finding.store(false, Ordering::Release);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slots Redis itself gives (`CLUSTER KEYSLOT`).
    #[test]
    fn a_key_is_in_its_hash_tags_slot() {
        assert_eq!(slot_of("somekey"), 11058);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("sluice:{p1}"), slot_of("p1"));
        assert_eq!(slot_of("foo{bar}zap"), slot_of("bar"));
        // An empty tag: the whole key.
        assert_eq!(
            slot_of("{}foo"),
            crc16::State::<crc16::XMODEM>::calculate(b"{}foo") % SLOTS
        );
        assert_ne!(slot_of("sluice:{p1}"), slot_of("sluice:{p2}"));
    }
}
