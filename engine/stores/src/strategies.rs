//! The seeds' stock-deduction strategies on the raw stores, for `seckill bench` to measure beside
//! the engine's own paths: MySQL (`SELECT ... FOR UPDATE`, a conditional `UPDATE`, an optimistic
//! version, bucket rows) and Redis (GET then DECR, WATCH/MULTI on one key or on sub-keys, Lua on
//! one key or on buckets). Here because they speak SQL and Redis commands, which only this crate
//! does.

use crate::redis::RedisConn;
use futures::future::BoxFuture;
use seckill_core::adapters::script::Reply;
use seckill_core::domain::{BucketRouter, UserId};
use sqlx::mysql::MySqlPool;

/// Buckets of the bucketed strategies (as the seeds' 100k design).
pub const BUCKETS: u32 = 32;

/// One attempt to take a unit: `Ok(true)` took one, `Ok(false)` sold out (or gave up on
/// conflicts), `Err` failed.
pub type Attempt = Result<bool, String>;

/// A strategy: set up `stock` units, then attempts by any worker.
pub trait Strategy: Send + Sync {
    fn name(&self) -> String;
    fn setup(&self, stock: u64) -> BoxFuture<'_, Result<(), String>>;
    fn attempt(&self, worker: usize, user: u64) -> BoxFuture<'_, Attempt>;
    /// Operations one attempt stands for (a pipeline of several commands counts each).
    fn per_attempt(&self) -> u64 {
        1
    }
}

// ---------------------------------------------------------------------------------------------
// MySQL strategies: one table of their own, created on demand.

pub struct Mysql {
    pool: MySqlPool,
    kind: MysqlKind,
    table: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum MysqlKind {
    SelectForUpdate,
    ConditionalUpdate,
    OptimisticVersion,
    Buckets,
}

impl Mysql {
    pub fn new(pool: MySqlPool, kind: MysqlKind, run: u64) -> Mysql {
        Mysql {
            pool,
            kind,
            table: format!("bench_stock_{run}"),
        }
    }
}

fn sql(e: sqlx::Error) -> String {
    e.to_string()
}

impl Strategy for Mysql {
    fn name(&self) -> String {
        match self.kind {
            MysqlKind::SelectForUpdate => "mysql: SELECT ... FOR UPDATE, one row",
            MysqlKind::ConditionalUpdate => "mysql: conditional UPDATE, one row",
            MysqlKind::OptimisticVersion => "mysql: optimistic version, one row",
            MysqlKind::Buckets => "mysql: conditional UPDATE, 32 bucket rows",
        }
        .into()
    }

    fn setup(&self, stock: u64) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let t = &self.table;
            let create = format!(
                "CREATE TABLE IF NOT EXISTS {t} (id INT PRIMARY KEY, remaining BIGINT NOT NULL, version BIGINT NOT NULL) ENGINE=InnoDB"
            );
            sqlx::query(sqlx::AssertSqlSafe(create))
                .execute(&self.pool)
                .await
                .map_err(sql)?;
            sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {t}")))
                .execute(&self.pool)
                .await
                .map_err(sql)?;
            let rows = if self.kind == MysqlKind::Buckets {
                BUCKETS as u64
            } else {
                1
            };
            for i in 0..rows {
                let share = stock / rows + u64::from(i < stock % rows);
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO {t} (id, remaining, version) VALUES (?, ?, 0)"
                )))
                .bind(i)
                .bind(share as i64)
                .execute(&self.pool)
                .await
                .map_err(sql)?;
            }
            Ok(())
        })
    }

    fn attempt(&self, _worker: usize, user: u64) -> BoxFuture<'_, Attempt> {
        Box::pin(async move {
            let t = &self.table;
            match self.kind {
                MysqlKind::SelectForUpdate => {
                    let mut tx = self.pool.begin().await.map_err(sql)?;
                    let (left,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                        "SELECT remaining FROM {t} WHERE id = 0 FOR UPDATE"
                    )))
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(sql)?;
                    if left <= 0 {
                        return Ok(false);
                    }
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "UPDATE {t} SET remaining = remaining - 1 WHERE id = 0"
                    )))
                    .execute(&mut *tx)
                    .await
                    .map_err(sql)?;
                    tx.commit().await.map_err(sql)?;
                    Ok(true)
                }
                MysqlKind::ConditionalUpdate | MysqlKind::Buckets => {
                    let id = if self.kind == MysqlKind::Buckets {
                        BucketRouter::route(UserId(user), BUCKETS).0
                    } else {
                        0
                    };
                    let n = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "UPDATE {t} SET remaining = remaining - 1 WHERE id = ? AND remaining > 0"
                    )))
                    .bind(id)
                    .execute(&self.pool)
                    .await
                    .map_err(sql)?
                    .rows_affected();
                    // A drained bucket row is "sold out" for its users (the seeds' buckets have
                    // no fallback in SQL).
                    Ok(n == 1)
                }
                MysqlKind::OptimisticVersion => {
                    // Read, then write only if nobody wrote in between; retry a few times.
                    for _ in 0..3 {
                        let (left, version): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                            "SELECT remaining, version FROM {t} WHERE id = 0"
                        )))
                        .fetch_one(&self.pool)
                        .await
                        .map_err(sql)?;
                        if left <= 0 {
                            return Ok(false);
                        }
                        let n = sqlx::query(sqlx::AssertSqlSafe(format!(
                            "UPDATE {t} SET remaining = remaining - 1, version = version + 1 WHERE id = 0 AND version = ?"
                        )))
                        .bind(version)
                        .execute(&self.pool)
                        .await
                        .map_err(sql)?
                        .rows_affected();
                        if n == 1 {
                            return Ok(true);
                        }
                    }
                    Err("version conflict 3 times".into())
                }
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Redis strategies, on keys of their own.

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum RedisKind {
    /// GET, then DECR in a second call: the race the seeds warn about (oversells).
    NaiveGetDecr,
    WatchOneKey,
    /// Seed 004: a parent key and sub-keys; WATCH a random non-empty sub-key.
    WatchSubKeys,
    LuaOneKey,
    LuaBuckets,
}

pub struct Redis {
    /// One connection per worker: WATCH state belongs to a connection.
    conns: Vec<RedisConn>,
    kind: RedisKind,
    prefix: String,
    cluster: bool,
}

const TAKE_ONE: &str = "local n = tonumber(redis.call('GET', KEYS[1]) or '0') \
                        if n <= 0 then return 0 end redis.call('DECR', KEYS[1]) return 1";

impl Redis {
    pub fn new(conns: Vec<RedisConn>, kind: RedisKind, run: u64, cluster: bool) -> Redis {
        Redis {
            conns,
            kind,
            prefix: format!("bench:{run}"),
            cluster,
        }
    }

    fn key(&self, i: u32) -> String {
        match self.kind {
            // Each bucket its own hash tag: spread over a cluster like the engine's buckets.
            RedisKind::LuaBuckets | RedisKind::WatchSubKeys => format!("{}:{{b{i}}}", self.prefix),
            _ => format!("{}:{{one}}", self.prefix),
        }
    }

    fn subkeys(&self) -> u32 {
        match self.kind {
            RedisKind::LuaBuckets => BUCKETS,
            RedisKind::WatchSubKeys => 16,
            _ => 1,
        }
    }
}

async fn q(c: &RedisConn, cmd: &redis::Cmd) -> Result<Reply, String> {
    match c.query("bench", cmd).await {
        Ok(Reply::Error(e)) => Err(e),
        Ok(r) => Ok(r),
        Err(e) => Err(e.to_string()),
    }
}

fn int(r: &Reply) -> i64 {
    match r {
        Reply::Int(i) => *i,
        Reply::Bulk(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

impl Strategy for Redis {
    fn name(&self) -> String {
        let on = if self.cluster { "redis cluster" } else { "redis" };
        let what = match self.kind {
            RedisKind::NaiveGetDecr => "GET then DECR (no atomicity)",
            RedisKind::WatchOneKey => "WATCH/MULTI, one key",
            RedisKind::WatchSubKeys => "WATCH/MULTI, parent + 16 sub-keys",
            RedisKind::LuaOneKey => "Lua, one key",
            RedisKind::LuaBuckets => "Lua, 32 buckets",
        };
        format!("{on}: {what}")
    }

    fn setup(&self, stock: u64) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let c = &self.conns[0];
            let n = self.subkeys();
            for i in 0..n {
                let share = stock / n as u64 + u64::from((i as u64) < stock % n as u64);
                q(c, redis::cmd("SET").arg(self.key(i)).arg(share)).await?;
            }
            if self.kind == RedisKind::WatchSubKeys {
                q(
                    c,
                    redis::cmd("SET")
                        .arg(format!("{}:parent", self.prefix))
                        .arg(stock),
                )
                .await?;
            }
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(TAKE_ONE);
            for conn in &self.conns {
                conn.query_nodes("bench", &load)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        })
    }

    fn attempt(&self, worker: usize, user: u64) -> BoxFuture<'_, Attempt> {
        Box::pin(async move {
            let c = &self.conns[worker % self.conns.len()];
            let sha = seckill_core::adapters::script::sha1_hex(TAKE_ONE);
            match self.kind {
                RedisKind::NaiveGetDecr => {
                    let left = int(&q(c, redis::cmd("GET").arg(self.key(0))).await?);
                    if left <= 0 {
                        return Ok(false);
                    }
                    q(c, redis::cmd("DECR").arg(self.key(0))).await?;
                    Ok(true)
                }
                RedisKind::LuaOneKey | RedisKind::LuaBuckets => {
                    let i = BucketRouter::route(UserId(user), self.subkeys()).0;
                    Ok(int(&q(c, redis::cmd("EVALSHA").arg(&sha).arg(1).arg(self.key(i))).await?) == 1)
                }
                RedisKind::WatchOneKey | RedisKind::WatchSubKeys => {
                    // Up to 3 tries (on a collision another sub-key is picked, seed 004).
                    for attempt in 0..3u64 {
                        let i = match self.kind {
                            RedisKind::WatchSubKeys => {
                                BucketRouter::route(
                                    UserId(user.wrapping_mul(31).wrapping_add(attempt)),
                                    self.subkeys(),
                                )
                                .0
                            }
                            _ => 0,
                        };
                        let key = self.key(i);
                        q(c, redis::cmd("WATCH").arg(&key)).await?;
                        let left = int(&q(c, redis::cmd("GET").arg(&key)).await?);
                        if left <= 0 {
                            q(c, &redis::cmd("UNWATCH")).await?;
                            if self.kind == RedisKind::WatchSubKeys {
                                let parent =
                                    int(&q(c, redis::cmd("GET").arg(format!("{}:parent", self.prefix)))
                                        .await?);
                                if parent > 0 {
                                    continue;
                                }
                            }
                            return Ok(false);
                        }
                        let mut tx = redis::pipe();
                        tx.atomic().cmd("DECR").arg(&key);
                        let done = match c {
                            RedisConn::Single(m) => {
                                let mut m = m.clone();
                                tx.query_async::<Option<Vec<i64>>>(&mut m)
                                    .await
                                    .map_err(|e| e.to_string())?
                            }
                            RedisConn::Cluster(_) => return Err("WATCH/MULTI runs on one server".into()),
                        };
                        if done.is_some() {
                            if self.kind == RedisKind::WatchSubKeys {
                                q(c, redis::cmd("DECR").arg(format!("{}:parent", self.prefix))).await?;
                            }
                            return Ok(true);
                        }
                    }
                    Err("WATCH collision 3 times".into())
                }
            }
        })
    }
}
