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
use std::sync::Mutex;

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

impl From<postgres::Error> for StoreError {
    fn from(e: postgres::Error) -> Self {
        StoreError::Db(e.to_string())
    }
}

/// The directory's persistent state. Methods block; servers call them from
/// a blocking thread.
pub trait Store: Send + Sync {
    /// Registers a depot or refreshes its heartbeat and figures. Returns
    /// its previous heartbeat time, `None` for a depot new to the directory.
    fn upsert(&self, reg: &Registration, now: i64) -> Result<Option<i64>, StoreError>;
    /// Removes a depot (it left on its own) and the rates reported for it;
    /// whether it was listed.
    fn remove(&self, addr: &str) -> Result<bool, StoreError>;
    /// Every depot.
    fn list(&self) -> Result<Vec<DepotRecord>, StoreError>;
    /// Drops depots silent since before `cutoff`, and rates of depots no
    /// longer listed or not reported since `cutoff`; returns the dropped
    /// depots' addresses.
    fn drop_silent(&self, cutoff: i64) -> Result<Vec<String>, StoreError>;
    /// Folds a measured rate into the (client network, depot) forecast;
    /// `false` (nothing stored) when `depot` is not registered, so reports
    /// cannot grow the directory with made-up names.
    fn record_rate(
        &self,
        client: &str,
        depot: &str,
        bps: f64,
        now: i64,
    ) -> Result<bool, StoreError>;
    /// Forecast state for a client network, by depot address.
    fn forecasts(&self, client: &str) -> Result<HashMap<String, Forecaster>, StoreError>;
    /// The depots of `addrs` that are listed (a missing one has left).
    fn get(&self, addrs: &[String]) -> Result<Vec<DepotRecord>, StoreError>;
    /// Starts announcing on `changes` what other processes change in this
    /// store: the address of each depot they register, refresh or remove,
    /// and [`Change::Reload`] whenever some may have been missed (at the
    /// start, after a lost connection, after `changes` was full). `false`:
    /// this store is no one else's, there is nothing to watch.
    fn watch(&self, changes: tokio::sync::mpsc::Sender<Change>) -> Result<bool, StoreError> {
        drop(changes);
        Ok(false)
    }
    /// For logs: which backend and where.
    fn describe(&self) -> String;
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
";

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

impl Store for SqliteStore {
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

    fn describe(&self) -> String {
        format!("SQLite {}", self.path)
    }
}

/// PostgreSQL: several L-Bone instances behind one database.
pub struct PostgresStore {
    db: Mutex<postgres::Client>,
    schema: String,
    url: String,
    /// The `NOTIFY` channel: one per schema.
    channel: String,
    /// This store's server process: its own announcements are not news.
    pid: i32,
}

impl PostgresStore {
    /// Connects (`postgres://user@host:port/db`) and creates the tables in
    /// `schema` if needed.
    pub fn open(url: &str, schema: &str) -> Result<PostgresStore, StoreError> {
        if schema.is_empty()
            || !schema
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(StoreError::Db(format!(
                "schema name {schema:?}: use lowercase letters, digits and _"
            )));
        }
        let mut db = postgres::Client::connect(url, postgres::NoTls)?;
        // Several instances may start at once: create under an advisory lock.
        let mut tx = db.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock(6767)", &[])?;
        tx.batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {schema}; SET LOCAL search_path TO {schema}; {SCHEMA}"
        ))?;
        tx.commit()?;
        db.batch_execute(&format!("SET search_path TO {schema}"))?;
        let pid: i32 = db.query_one("SELECT pg_backend_pid()", &[])?.get(0);
        Ok(PostgresStore {
            db: Mutex::new(db),
            schema: schema.to_owned(),
            url: url.to_owned(),
            channel: format!("lors_lbone_{schema}"),
            pid,
        })
    }

    fn db(&self) -> std::sync::MutexGuard<'_, postgres::Client> {
        self.db.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Store for PostgresStore {
    fn upsert(&self, reg: &Registration, now: i64) -> Result<Option<i64>, StoreError> {
        // The CTE reads the row as it was before the statement; the
        // announcement goes out when the statement commits.
        let row = self.db().query_one(
            "WITH old AS (SELECT last_seen FROM depots WHERE addr = $1),
             up AS (
                 INSERT INTO depots (addr, reg, first_seen, last_seen) VALUES ($1, $2, $3, $3)
                 ON CONFLICT (addr) DO UPDATE SET reg = EXCLUDED.reg, last_seen = EXCLUDED.last_seen
                 RETURNING addr)
             SELECT (SELECT last_seen FROM old), pg_notify($4, (SELECT addr FROM up))",
            &[&reg.addr(), &encode(reg), &now, &self.channel],
        )?;
        Ok(row.get(0))
    }

    fn remove(&self, addr: &str) -> Result<bool, StoreError> {
        let mut db = self.db();
        let mut tx = db.transaction()?;
        tx.execute("DELETE FROM rates WHERE depot = $1", &[&addr])?;
        let known = tx.execute("DELETE FROM depots WHERE addr = $1", &[&addr])? > 0;
        tx.execute("SELECT pg_notify($1, $2)", &[&self.channel, &addr])?;
        tx.commit()?;
        Ok(known)
    }

    fn list(&self) -> Result<Vec<DepotRecord>, StoreError> {
        self.db()
            .query(
                "SELECT addr, reg, first_seen, last_seen FROM depots ORDER BY addr",
                &[],
            )?
            .iter()
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

    fn drop_silent(&self, cutoff: i64) -> Result<Vec<String>, StoreError> {
        let mut db = self.db();
        let mut tx = db.transaction()?;
        let mut gone: Vec<String> = tx
            .query(
                "DELETE FROM depots WHERE last_seen < $1 RETURNING addr",
                &[&cutoff],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect();
        tx.execute(
            "DELETE FROM rates WHERE updated < $1 OR depot NOT IN (SELECT addr FROM depots)",
            &[&cutoff],
        )?;
        tx.commit()?;
        gone.sort();
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
        let mut tx = db.transaction()?;
        // Make the row exist (for a listed depot only), then lock it:
        // concurrent reports from other instances queue up instead of
        // overwriting each other.
        tx.execute(
            "INSERT INTO rates (client, depot, state, updated)
             SELECT $1, $2, $3, $4 WHERE EXISTS (SELECT 1 FROM depots WHERE addr = $2)
             ON CONFLICT (client, depot) DO NOTHING",
            &[&client, &depot, &encode(&Forecaster::default()), &now],
        )?;
        let Some(row) = tx.query_opt(
            "SELECT state FROM rates WHERE client = $1 AND depot = $2 FOR UPDATE",
            &[&client, &depot],
        )?
        else {
            return Ok(false);
        };
        let mut f = decode_fc(depot, row.get(0))?;
        f.update(bps);
        tx.execute(
            "UPDATE rates SET state = $3, updated = $4 WHERE client = $1 AND depot = $2",
            &[&client, &depot, &encode(&f), &now],
        )?;
        tx.commit()?;
        Ok(true)
    }

    fn forecasts(&self, client: &str) -> Result<HashMap<String, Forecaster>, StoreError> {
        let mut out = HashMap::new();
        for r in self.db().query(
            "SELECT depot, state FROM rates WHERE client = $1",
            &[&client],
        )? {
            let depot: String = r.get(0);
            let f = decode_fc(&depot, r.get(1))?;
            out.insert(depot, f);
        }
        Ok(out)
    }

    fn get(&self, addrs: &[String]) -> Result<Vec<DepotRecord>, StoreError> {
        let addrs = &addrs[..addrs.len().min(GET_BATCH)];
        self.db()
            .query(
                "SELECT addr, reg, first_seen, last_seen FROM depots WHERE addr = ANY($1)",
                &[&addrs],
            )?
            .iter()
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

    fn watch(&self, changes: tokio::sync::mpsc::Sender<Change>) -> Result<bool, StoreError> {
        let (url, channel, own) = (self.url.clone(), self.channel.clone(), self.pid);
        std::thread::Builder::new()
            .name("lbone-listen".into())
            .spawn(move || listen(&url, &channel, own, &changes))
            .map_err(|e| StoreError::Db(format!("starting the listener: {e}")))?;
        Ok(true)
    }

    fn describe(&self) -> String {
        format!("PostgreSQL (schema {})", self.schema)
    }
}

/// The PostgreSQL listener: on its own connection, `LISTEN`s to `channel`
/// and passes on what other processes than `own` announce, until
/// `changes` is closed. A lost connection is made again (every second at
/// first, backing off to 30 s), followed by a [`Change::Reload`].
fn listen(url: &str, channel: &str, own: i32, changes: &tokio::sync::mpsc::Sender<Change>) {
    use tokio::sync::mpsc::error::TrySendError;
    let mut backoff = std::time::Duration::from_secs(1);
    // A full queue drops changes: the next thing sent is a reload.
    let mut missed = false;
    let send = |c: Change, missed: &mut bool| -> bool {
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
    while !changes.is_closed() {
        let mut db = match postgres::Client::connect(url, postgres::NoTls)
            .and_then(|mut db| db.batch_execute(&format!("LISTEN {channel}")).map(|()| db))
        {
            Ok(db) => db,
            Err(e) => {
                tracing::warn!("L-Bone change listener: {e}; again in {backoff:?}");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(std::time::Duration::from_secs(30));
                continue;
            }
        };
        backoff = std::time::Duration::from_secs(1);
        // What changed while nobody listened.
        if !send(Change::Reload, &mut missed) {
            return;
        }
        loop {
            // A fresh iterator per quiet second: one whose time ran out
            // would return at once from then on.
            let mut n = db.notifications();
            let mut it = n.timeout_iter(std::time::Duration::from_secs(1));
            let quiet = loop {
                match postgres::fallible_iterator::FallibleIterator::next(&mut it) {
                    Ok(Some(note)) if note.process_id() == own => {}
                    Ok(Some(note)) => {
                        if !send(Change::Depot(note.payload().to_owned()), &mut missed) {
                            return;
                        }
                    }
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e),
                }
            };
            drop(it);
            drop(n);
            match quiet {
                Ok(()) if db.is_closed() => {
                    tracing::warn!("L-Bone change listener lost its connection");
                    break;
                }
                Ok(()) if changes.is_closed() => return,
                // A quiet second: pass on a reload owed for a full queue.
                Ok(()) => {
                    if missed && !send(Change::Reload, &mut missed) {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!("L-Bone change listener lost its connection: {e}");
                    break;
                }
            }
        }
    }
}
