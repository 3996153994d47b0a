//! Where the directory lives: the [`Store`] trait and its SQLite (embedded
//! default) and PostgreSQL (shared by several L-Bone instances) backends.
//!
//! Both keep the same two tables: `depots` (one row per `host:port`, the
//! registration as JSON, first and last heartbeat) and `rates` (one
//! [`Forecaster`] per client network and depot). Every change is one
//! statement or one transaction, so instances sharing a PostgreSQL database
//! never lose each other's updates.
//!
//! An L-Bone answers queries from the directory in its memory, not from
//! the store. Instances sharing a PostgreSQL database keep theirs coherent
//! through [`Store::watch`]: every registration, heartbeat and departure
//! is announced with `NOTIFY` in the transaction that makes it, delivered
//! to every other instance when it commits, in commit order; each fetches
//! the depots named ([`Store::get`]) and applies them.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::OptionalExtension as _;

use crate::forecast::Forecaster;
use crate::model::{DepotRecord, Registration};

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or failed.
    #[error("database error: {0}")]
    Db(String),
    /// A row did not decode (written by something else?).
    #[error("stored record for {addr} is unreadable: {why}")]
    Corrupt {
        /// Which row.
        addr: String,
        /// Why.
        why: String,
    },
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Db(e.to_string())
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        // The server's own message says more than the driver's summary.
        match e.as_db_error() {
            Some(db) => StoreError::Db(db.message().to_owned()),
            None => StoreError::Db(e.to_string()),
        }
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        StoreError::Db(format!("no connection to PostgreSQL: {e}"))
    }
}

/// How long one store operation may take before it counts as failed (the
/// L-Bone answers 503 rather than hold a request).
pub const STORE_TIMEOUT: Duration = Duration::from_secs(10);

/// The directory's persistent state: SQLite (embedded, its blocking calls
/// on blocking threads) or PostgreSQL (async, pooled, shared by several
/// instances).
#[derive(Clone)]
pub enum Store {
    /// One file, one instance.
    Sqlite(Arc<SqliteStore>),
    /// One database, any number of instances.
    Postgres(Arc<PostgresStore>),
}

impl From<SqliteStore> for Store {
    fn from(s: SqliteStore) -> Store {
        Store::Sqlite(Arc::new(s))
    }
}

impl From<PostgresStore> for Store {
    fn from(s: PostgresStore) -> Store {
        Store::Postgres(Arc::new(s))
    }
}

/// Runs a SQLite call on a blocking thread.
async fn blocking<T: Send + 'static>(
    s: &Arc<SqliteStore>,
    f: impl FnOnce(&SqliteStore) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let s = s.clone();
    tokio::task::spawn_blocking(move || f(&s))
        .await
        .map_err(|e| StoreError::Db(format!("the store's thread failed: {e}")))?
}

/// A PostgreSQL call, bounded by [`STORE_TIMEOUT`].
async fn bounded<T>(
    work: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(STORE_TIMEOUT, work)
        .await
        .map_err(|_| {
            StoreError::Db(format!(
                "PostgreSQL did not answer within {STORE_TIMEOUT:?}"
            ))
        })?
}

impl Store {
    /// Registers a depot or refreshes its heartbeat and figures. Returns
    /// its previous heartbeat time, `None` for a depot new to the directory.
    pub async fn upsert(&self, reg: &Registration, now: i64) -> Result<Option<i64>, StoreError> {
        match self {
            Store::Sqlite(s) => {
                let reg = reg.clone();
                blocking(s, move |s| s.upsert(&reg, now)).await
            }
            Store::Postgres(p) => bounded(p.upsert(reg, now)).await,
        }
    }

    /// Removes a depot (it left on its own) and the rates reported for it;
    /// whether it was listed.
    pub async fn remove(&self, addr: &str) -> Result<bool, StoreError> {
        match self {
            Store::Sqlite(s) => {
                let addr = addr.to_owned();
                blocking(s, move |s| s.remove(&addr)).await
            }
            Store::Postgres(p) => bounded(p.remove(addr)).await,
        }
    }

    /// Every depot.
    pub async fn list(&self) -> Result<Vec<DepotRecord>, StoreError> {
        match self {
            Store::Sqlite(s) => blocking(s, SqliteStore::list).await,
            Store::Postgres(p) => bounded(p.list()).await,
        }
    }

    /// Drops depots silent since before `cutoff`, and rates of depots no
    /// longer listed or not reported since `cutoff`; returns the dropped
    /// depots' addresses.
    pub async fn drop_silent(&self, cutoff: i64) -> Result<Vec<String>, StoreError> {
        match self {
            Store::Sqlite(s) => blocking(s, move |s| s.drop_silent(cutoff)).await,
            Store::Postgres(p) => bounded(p.drop_silent(cutoff)).await,
        }
    }

    /// Folds measured rates (depot, bytes/s) into the client network's
    /// forecasts; reports of depots not registered are not stored, so they
    /// cannot grow the directory with made-up names. Returns how many were.
    pub async fn record_rates(
        &self,
        client: &str,
        rates: Vec<(String, f64)>,
        now: i64,
    ) -> Result<usize, StoreError> {
        match self {
            Store::Sqlite(s) => {
                let client = client.to_owned();
                blocking(s, move |s| {
                    let mut n = 0;
                    for (d, bps) in &rates {
                        n += usize::from(s.record_rate(&client, d, *bps, now)?);
                    }
                    Ok(n)
                })
                .await
            }
            Store::Postgres(p) => {
                bounded(async {
                    let mut n = 0;
                    for (d, bps) in &rates {
                        n += usize::from(p.record_rate(client, d, *bps, now).await?);
                    }
                    Ok(n)
                })
                .await
            }
        }
    }

    /// Forecast state for a client network, by depot address.
    pub async fn forecasts(&self, client: &str) -> Result<HashMap<String, Forecaster>, StoreError> {
        match self {
            Store::Sqlite(s) => {
                let client = client.to_owned();
                blocking(s, move |s| s.forecasts(&client)).await
            }
            Store::Postgres(p) => bounded(p.forecasts(client)).await,
        }
    }

    /// The depots of `addrs` that are listed (a missing one has left), at
    /// most [`GET_BATCH`] of them.
    pub async fn get(&self, addrs: &[String]) -> Result<Vec<DepotRecord>, StoreError> {
        let addrs = addrs[..addrs.len().min(GET_BATCH)].to_vec();
        match self {
            Store::Sqlite(s) => blocking(s, move |s| s.get(&addrs)).await,
            Store::Postgres(p) => bounded(p.get(&addrs)).await,
        }
    }

    /// Records the directory's figures for a minute: they replace the
    /// minute's, the rate reports add to it; samples past [`HISTORY`] go.
    pub async fn add_sample(&self, x: crate::model::Sample) -> Result<(), StoreError> {
        match self {
            Store::Sqlite(s) => blocking(s, move |s| s.add_sample(&x)).await,
            Store::Postgres(p) => bounded(p.add_sample(&x)).await,
        }
    }

    /// The samples since `since`, oldest first.
    pub async fn samples(&self, since: i64) -> Result<Vec<crate::model::Sample>, StoreError> {
        match self {
            Store::Sqlite(s) => blocking(s, move |s| s.samples(since)).await,
            Store::Postgres(p) => bounded(p.samples(since)).await,
        }
    }

    /// Starts announcing on `changes` what other instances change in this
    /// store: the address of each depot they register, refresh or remove,
    /// and [`Change::Reload`] whenever some may have been missed (at the
    /// start, after a lost connection, after `changes` was full). `false`:
    /// this store is no one else's, there is nothing to watch.
    pub fn watch(&self, changes: tokio::sync::mpsc::Sender<Change>) -> bool {
        match self {
            Store::Sqlite(_) => false,
            Store::Postgres(p) => {
                tokio::spawn(p.clone().listen(changes));
                true
            }
        }
    }

    /// For logs: which backend and where.
    pub fn describe(&self) -> String {
        match self {
            Store::Sqlite(s) => format!("SQLite {}", s.path),
            Store::Postgres(p) => format!("PostgreSQL (schema {})", p.schema),
        }
    }
}

/// A change another instance made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// This depot registered, heartbeat or left.
    Depot(String),
    /// Changes may have been missed: read the whole directory again.
    Reload,
}

/// Most depots fetched by one [`Store::get`].
pub const GET_BATCH: usize = 1000;

fn decode_reg(addr: &str, json: &str) -> Result<Registration, StoreError> {
    serde_json::from_str(json).map_err(|e| StoreError::Corrupt {
        addr: addr.to_owned(),
        why: e.to_string(),
    })
}

fn decode_fc(addr: &str, json: &str) -> Result<Forecaster, StoreError> {
    serde_json::from_str(json).map_err(|e| StoreError::Corrupt {
        addr: addr.to_owned(),
        why: e.to_string(),
    })
}

fn encode<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("plain structs serialize")
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS depots (
    addr TEXT PRIMARY KEY,
    reg TEXT NOT NULL,
    first_seen BIGINT NOT NULL,
    last_seen BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS rates (
    client TEXT NOT NULL,
    depot TEXT NOT NULL,
    state TEXT NOT NULL,
    updated BIGINT NOT NULL,
    PRIMARY KEY (client, depot)
);
CREATE TABLE IF NOT EXISTS samples (
    t BIGINT PRIMARY KEY,
    depots BIGINT NOT NULL,
    online BIGINT NOT NULL,
    hard_total BIGINT NOT NULL,
    hard_free BIGINT NOT NULL,
    reported_sum DOUBLE PRECISION NOT NULL,
    reports BIGINT NOT NULL
);
";

/// Adds a sample: the directory's figures replace the minute's, the rate
/// reports add to it (each instance counts the reports it took). Samples
/// older than a day and an hour go.
const ADD_SAMPLE: &str = "
INSERT INTO samples (t, depots, online, hard_total, hard_free, reported_sum, reports)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (t) DO UPDATE SET depots = excluded.depots, online = excluded.online,
    hard_total = excluded.hard_total, hard_free = excluded.hard_free,
    reported_sum = samples.reported_sum + excluded.reported_sum,
    reports = samples.reports + excluded.reports";

/// How long samples are kept.
pub const HISTORY: i64 = 86_400 + 3_600;

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// SQLite in one file: the embedded default.
pub struct SqliteStore {
    db: Mutex<rusqlite::Connection>,
    path: String,
}

impl SqliteStore {
    /// Opens (creating) the database file.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let db = rusqlite::Connection::open(path)?;
        // WAL: readers do not block the heartbeat writer; NORMAL sync is
        // durable across process crashes, which is what a directory needs
        // (depots re-register within a heartbeat anyway).
        db.pragma_update(None, "journal_mode", "WAL")?;
        db.pragma_update(None, "synchronous", "NORMAL")?;
        db.busy_timeout(std::time::Duration::from_secs(5))?;
        db.execute_batch(SCHEMA)?;
        Ok(SqliteStore {
            db: Mutex::new(db),
            path: path.display().to_string(),
        })
    }

    fn db(&self) -> std::sync::MutexGuard<'_, rusqlite::Connection> {
        self.db.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The SQLite calls; [`Store`] runs them on blocking threads.
impl SqliteStore {
    fn add_sample(&self, x: &crate::model::Sample) -> Result<(), StoreError> {
        let db = self.db();
        db.execute(
            &ADD_SAMPLE.replace('$', "?"),
            rusqlite::params![
                x.t,
                i64_of(x.depots),
                i64_of(x.online),
                i64_of(x.hard_total),
                i64_of(x.hard_free),
                x.reported_sum,
                i64_of(x.reports)
            ],
        )?;
        db.execute("DELETE FROM samples WHERE t < ?1", [x.t - HISTORY])?;
        Ok(())
    }

    fn samples(&self, since: i64) -> Result<Vec<crate::model::Sample>, StoreError> {
        let db = self.db();
        let mut st = db.prepare(
            "SELECT t, depots, online, hard_total, hard_free, reported_sum, reports
             FROM samples WHERE t >= ?1 ORDER BY t",
        )?;
        st.query_map([since], |r| {
            Ok(crate::model::Sample {
                t: r.get(0)?,
                depots: r.get::<_, i64>(1)?.max(0) as u64,
                online: r.get::<_, i64>(2)?.max(0) as u64,
                hard_total: r.get::<_, i64>(3)?.max(0) as u64,
                hard_free: r.get::<_, i64>(4)?.max(0) as u64,
                reported_sum: r.get(5)?,
                reports: r.get::<_, i64>(6)?.max(0) as u64,
            })
        })?
        .collect::<Result<_, _>>()
        .map_err(StoreError::from)
    }

    fn upsert(&self, reg: &Registration, now: i64) -> Result<Option<i64>, StoreError> {
        let mut db = self.db();
        let tx = db.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let addr = reg.addr();
        let before: Option<i64> = tx
            .query_row(
                "SELECT last_seen FROM depots WHERE addr = ?1",
                [&addr],
                |r| r.get(0),
            )
            .optional()?;
        tx.execute(
            "INSERT INTO depots (addr, reg, first_seen, last_seen) VALUES (?1, ?2, ?3, ?3)
             ON CONFLICT (addr) DO UPDATE SET reg = excluded.reg, last_seen = excluded.last_seen",
            rusqlite::params![addr, encode(reg), now],
        )?;
        tx.commit()?;
        Ok(before)
    }

    fn remove(&self, addr: &str) -> Result<bool, StoreError> {
        let mut db = self.db();
        let tx = db.transaction()?;
        tx.execute("DELETE FROM rates WHERE depot = ?1", [addr])?;
        let known = tx.execute("DELETE FROM depots WHERE addr = ?1", [addr])? > 0;
        tx.commit()?;
        Ok(known)
    }

    fn list(&self) -> Result<Vec<DepotRecord>, StoreError> {
        let db = self.db();
        let mut st =
            db.prepare("SELECT addr, reg, first_seen, last_seen FROM depots ORDER BY addr")?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })?;
        rows.map(|row| {
            let (addr, json, first_seen, last_seen) = row?;
            Ok(DepotRecord {
                reg: decode_reg(&addr, &json)?,
                first_seen,
                last_seen,
            })
        })
        .collect()
    }

    fn drop_silent(&self, cutoff: i64) -> Result<Vec<String>, StoreError> {
        let mut db = self.db();
        let tx = db.transaction()?;
        let gone: Vec<String> = {
            let mut st =
                tx.prepare("SELECT addr FROM depots WHERE last_seen < ?1 ORDER BY addr")?;
            st.query_map([cutoff], |r| r.get(0))?
                .collect::<Result<_, _>>()?
        };
        tx.execute("DELETE FROM depots WHERE last_seen < ?1", [cutoff])?;
        tx.execute(
            "DELETE FROM rates WHERE updated < ?1 OR depot NOT IN (SELECT addr FROM depots)",
            [cutoff],
        )?;
        tx.commit()?;
        Ok(gone)
    }

    fn record_rate(
        &self,
        client: &str,
        depot: &str,
        bps: f64,
        now: i64,
    ) -> Result<bool, StoreError> {
        let mut db = self.db();
        let tx = db.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let listed = tx
            .query_row("SELECT 1 FROM depots WHERE addr = ?1", [depot], |_| Ok(()))
            .optional()?;
        if listed.is_none() {
            return Ok(false);
        }
        let old: Option<String> = tx
            .query_row(
                "SELECT state FROM rates WHERE client = ?1 AND depot = ?2",
                [client, depot],
                |r| r.get(0),
            )
            .optional()?;
        let mut f = match old {
            Some(j) => decode_fc(depot, &j)?,
            None => Forecaster::default(),
        };
        f.update(bps);
        tx.execute(
            "INSERT INTO rates (client, depot, state, updated) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (client, depot) DO UPDATE SET state = excluded.state, updated = excluded.updated",
            rusqlite::params![client, depot, encode(&f), now],
        )?;
        tx.commit()?;
        Ok(true)
    }

    fn forecasts(&self, client: &str) -> Result<HashMap<String, Forecaster>, StoreError> {
        let db = self.db();
        let mut st = db.prepare("SELECT depot, state FROM rates WHERE client = ?1")?;
        let rows = st.query_map([client], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })?;
        let mut out = HashMap::new();
        for row in rows {
            let (depot, json) = row?;
            let f = decode_fc(&depot, &json)?;
            out.insert(depot, f);
        }
        Ok(out)
    }

    fn get(&self, addrs: &[String]) -> Result<Vec<DepotRecord>, StoreError> {
        let db = self.db();
        let mut st =
            db.prepare_cached("SELECT reg, first_seen, last_seen FROM depots WHERE addr = ?1")?;
        let mut out = Vec::new();
        for addr in addrs.iter().take(GET_BATCH) {
            let row = st
                .query_row([addr], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })
                .optional()?;
            if let Some((json, first_seen, last_seen)) = row {
                out.push(DepotRecord {
                    reg: decode_reg(addr, &json)?,
                    first_seen,
                    last_seen,
                });
            }
        }
        Ok(out)
    }
}

/// PostgreSQL: several L-Bone instances behind one database, on a pool of
/// connections (a broken one is replaced, so a database restart costs the
/// requests in flight, not the instance).
pub struct PostgresStore {
    pool: deadpool_postgres::Pool,
    config: tokio_postgres::Config,
    schema: String,
    /// The `NOTIFY` channel: one per schema.
    channel: String,
    /// This instance's mark on what it announces: its own are not news.
    instance: String,
}

/// Connections a PostgreSQL store keeps at most.
const POOL_SIZE: usize = 16;

impl PostgresStore {
    /// Connects (`postgres://user@host:port/db`) and creates the tables in
    /// `schema` if needed.
    pub async fn open(url: &str, schema: &str) -> Result<PostgresStore, StoreError> {
        if schema.is_empty()
            || !schema
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(StoreError::Db(format!(
                "schema name {schema:?}: use lowercase letters, digits and _"
            )));
        }
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StoreError::Db(format!("{url}: {e}")))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(STORE_TIMEOUT);
        }
        config.options(format!("-c search_path={schema}"));
        let manager = deadpool_postgres::Manager::from_config(
            config.clone(),
            tokio_postgres::NoTls,
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(STORE_TIMEOUT))
            .create_timeout(Some(STORE_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Db(e.to_string()))?;
        let mut instance = [0u8; 8];
        getrandom::fill(&mut instance).map_err(|e| StoreError::Db(e.to_string()))?;
        let store = PostgresStore {
            pool,
            config,
            schema: schema.to_owned(),
            channel: format!("lors_lbone_{schema}"),
            instance: lors_ibp::hex::encode(&instance),
        };
        bounded(async {
            let mut db = store.pool.get().await?;
            // Several instances may start at once: create under a lock.
            let tx = db.transaction().await?;
            tx.execute("SELECT pg_advisory_xact_lock(6767)", &[])
                .await?;
            tx.batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {schema}; SET LOCAL search_path TO {schema}; {SCHEMA}"
            ))
            .await?;
            tx.commit().await?;
            Ok(())
        })
        .await?;
        Ok(store)
    }

    async fn add_sample(&self, x: &crate::model::Sample) -> Result<(), StoreError> {
        let db = self.pool.get().await?;
        db.execute(
            ADD_SAMPLE,
            &[
                &x.t,
                &i64_of(x.depots),
                &i64_of(x.online),
                &i64_of(x.hard_total),
                &i64_of(x.hard_free),
                &x.reported_sum,
                &i64_of(x.reports),
            ],
        )
        .await?;
        db.execute("DELETE FROM samples WHERE t < $1", &[&(x.t - HISTORY)])
            .await?;
        Ok(())
    }

    async fn samples(&self, since: i64) -> Result<Vec<crate::model::Sample>, StoreError> {
        let db = self.pool.get().await?;
        let rows = db
            .query(
                "SELECT t, depots, online, hard_total, hard_free, reported_sum, reports
                 FROM samples WHERE t >= $1 ORDER BY t",
                &[&since],
            )
            .await?;
        let u = |v: i64| v.max(0) as u64;
        Ok(rows
            .iter()
            .map(|r| crate::model::Sample {
                t: r.get(0),
                depots: u(r.get(1)),
                online: u(r.get(2)),
                hard_total: u(r.get(3)),
                hard_free: u(r.get(4)),
                reported_sum: r.get(5),
                reports: u(r.get(6)),
            })
            .collect())
    }

    async fn upsert(&self, reg: &Registration, now: i64) -> Result<Option<i64>, StoreError> {
        // The CTE reads the row as it was before the statement; the
        // announcement goes out when the statement commits.
        let db = self.pool.get().await?;
        let st = db
            .prepare_cached(
                "WITH old AS (SELECT last_seen FROM depots WHERE addr = $1),
                 up AS (
                     INSERT INTO depots (addr, reg, first_seen, last_seen) VALUES ($1, $2, $3, $3)
                     ON CONFLICT (addr) DO UPDATE SET reg = EXCLUDED.reg, last_seen = EXCLUDED.last_seen
                     RETURNING addr)
                 SELECT (SELECT last_seen FROM old), pg_notify($4, $5 || ' ' || (SELECT addr FROM up))",
            )
            .await?;
        let row = db
            .query_one(
                &st,
                &[
                    &reg.addr(),
                    &encode(reg),
                    &now,
                    &self.channel,
                    &self.instance,
                ],
            )
            .await?;
        Ok(row.get(0))
    }

    async fn remove(&self, addr: &str) -> Result<bool, StoreError> {
        let mut db = self.pool.get().await?;
        let tx = db.transaction().await?;
        tx.execute("DELETE FROM rates WHERE depot = $1", &[&addr])
            .await?;
        let known = tx
            .execute("DELETE FROM depots WHERE addr = $1", &[&addr])
            .await?
            > 0;
        tx.execute(
            "SELECT pg_notify($1, $2 || ' ' || $3)",
            &[&self.channel, &self.instance, &addr],
        )
        .await?;
        tx.commit().await?;
        Ok(known)
    }

    fn records(rows: &[tokio_postgres::Row]) -> Result<Vec<DepotRecord>, StoreError> {
        rows.iter()
            .map(|r| {
                let addr: String = r.get(0);
                Ok(DepotRecord {
                    reg: decode_reg(&addr, r.get(1))?,
                    first_seen: r.get(2),
                    last_seen: r.get(3),
                })
            })
            .collect()
    }

    async fn list(&self) -> Result<Vec<DepotRecord>, StoreError> {
        let db = self.pool.get().await?;
        let rows = db
            .query(
                "SELECT addr, reg, first_seen, last_seen FROM depots ORDER BY addr",
                &[],
            )
            .await?;
        Self::records(&rows)
    }

    async fn get(&self, addrs: &[String]) -> Result<Vec<DepotRecord>, StoreError> {
        let db = self.pool.get().await?;
        let st = db
            .prepare_cached(
                "SELECT addr, reg, first_seen, last_seen FROM depots WHERE addr = ANY($1)",
            )
            .await?;
        Self::records(&db.query(&st, &[&addrs]).await?)
    }

    async fn drop_silent(&self, cutoff: i64) -> Result<Vec<String>, StoreError> {
        let mut db = self.pool.get().await?;
        let tx = db.transaction().await?;
        let mut gone: Vec<String> = tx
            .query(
                "DELETE FROM depots WHERE last_seen < $1 RETURNING addr",
                &[&cutoff],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        tx.execute(
            "DELETE FROM rates WHERE updated < $1 OR depot NOT IN (SELECT addr FROM depots)",
            &[&cutoff],
        )
        .await?;
        tx.commit().await?;
        gone.sort();
        Ok(gone)
    }

    async fn record_rate(
        &self,
        client: &str,
        depot: &str,
        bps: f64,
        now: i64,
    ) -> Result<bool, StoreError> {
        let mut db = self.pool.get().await?;
        let tx = db.transaction().await?;
        // Make the row exist (for a listed depot only), then lock it:
        // concurrent reports from other instances queue up instead of
        // overwriting each other.
        tx.execute(
            "INSERT INTO rates (client, depot, state, updated)
             SELECT $1, $2, $3, $4 WHERE EXISTS (SELECT 1 FROM depots WHERE addr = $2)
             ON CONFLICT (client, depot) DO NOTHING",
            &[&client, &depot, &encode(&Forecaster::default()), &now],
        )
        .await?;
        let Some(row) = tx
            .query_opt(
                "SELECT state FROM rates WHERE client = $1 AND depot = $2 FOR UPDATE",
                &[&client, &depot],
            )
            .await?
        else {
            return Ok(false);
        };
        let mut f = decode_fc(depot, row.get(0))?;
        f.update(bps);
        tx.execute(
            "UPDATE rates SET state = $3, updated = $4 WHERE client = $1 AND depot = $2",
            &[&client, &depot, &encode(&f), &now],
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn forecasts(&self, client: &str) -> Result<HashMap<String, Forecaster>, StoreError> {
        let db = self.pool.get().await?;
        let mut out = HashMap::new();
        for r in db
            .query(
                "SELECT depot, state FROM rates WHERE client = $1",
                &[&client],
            )
            .await?
        {
            let depot: String = r.get(0);
            let f = decode_fc(&depot, r.get(1))?;
            out.insert(depot, f);
        }
        Ok(out)
    }

    /// On a connection of its own, `LISTEN`s to the schema's channel and
    /// passes on what other instances announce, until `changes` is closed.
    /// A lost connection is made again (every second at first, backing off
    /// to 30 s), followed by a [`Change::Reload`].
    async fn listen(self: Arc<Self>, changes: tokio::sync::mpsc::Sender<Change>) {
        let mut backoff = Duration::from_secs(1);
        // A full queue drops changes: the next thing sent is a reload.
        let mut missed = false;
        let send = |c: Change, missed: &mut bool| -> bool {
            use tokio::sync::mpsc::error::TrySendError;
            let c = if std::mem::take(missed) {
                Change::Reload
            } else {
                c
            };
            match changes.try_send(c) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    *missed = true;
                    true
                }
                Err(TrySendError::Closed(_)) => false,
            }
        };
        let mine = format!("{} ", self.instance);
        while !changes.is_closed() {
            let (db, mut conn) = match self.config.connect(tokio_postgres::NoTls).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("L-Bone change listener: {e}; again in {backoff:?}");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = changes.closed() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue;
                }
            };
            let listen = format!("LISTEN {}", self.channel);
            let mut subscribe = std::pin::pin!(db.batch_execute(&listen));
            let mut subscribed = false;
            loop {
                tokio::select! {
                    r = &mut subscribe, if !subscribed => {
                        if let Err(e) = r {
                            tracing::warn!("L-Bone change listener: LISTEN: {e}");
                            break;
                        }
                        subscribed = true;
                        backoff = Duration::from_secs(1);
                        // What changed while nobody listened.
                        if !send(Change::Reload, &mut missed) {
                            return;
                        }
                    }
                    m = std::future::poll_fn(|cx| conn.poll_message(cx)) => match m {
                        Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                            let Some((from, addr)) = n.payload().split_once(' ') else {
                                continue;
                            };
                            if n.payload().starts_with(&mine) || from.is_empty() {
                                continue;
                            }
                            if !send(Change::Depot(addr.to_owned()), &mut missed) {
                                return;
                            }
                        }
                        Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            tracing::warn!("L-Bone change listener lost its connection: {e}");
                            break;
                        }
                        None => {
                            tracing::warn!("L-Bone change listener lost its connection");
                            break;
                        }
                    },
                    // A quiet second: pass on a reload owed for a full queue.
                    () = tokio::time::sleep(Duration::from_secs(1)), if missed => {
                        if !send(Change::Reload, &mut missed) {
                            return;
                        }
                    }
                    () = changes.closed() => return,
                }
            }
        }
    }
}
