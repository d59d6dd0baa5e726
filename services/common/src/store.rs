//! The relational store: one sqlx pool over SQLite or PostgreSQL, chosen from the URL scheme, with the
//! versioned migrations of `migrations/sqlite` and `migrations/postgres`.
//!
//! Queries are written once with `$1`-style bound parameters, which both engines accept, and use only
//! types both engines share (TEXT, BIGINT), so every service store runs unchanged on either engine.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::migrate::Migrator;
use sqlx::{Any, AnyPool, Transaction};

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("../../migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("../../migrations/postgres");

/// WAL size (bytes) past which a SQLite commit checkpoints (see `Database::pool_options`).
const CHECKPOINT_WAL_BYTES: i64 = 1024 * 1024;

/// The database engine behind a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

/// Why the store could not be opened, migrated or queried.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unsupported database url `{0}`: expected sqlite:// or postgres://")]
    UnsupportedUrl(String),
    #[error("could not connect to the database: {0}")]
    Connect(#[source] sqlx::Error),
    #[error("could not apply migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database schema is behind (pending migrations: {0}); run `brainstorm migrate`")]
    SchemaBehind(String),
    #[error("database error: {0}")]
    Query(#[from] sqlx::Error),
    #[error("could not create the data directory: {0}")]
    DataDir(#[from] std::io::Error),
}

/// A connection pool and the engine it talks to.
#[derive(Debug, Clone)]
pub struct Database {
    pool: AnyPool,
    /// The steady batch writers' pool (see [`Database::writer`]).
    writer: AnyPool,
    engine: Engine,
}

impl Database {
    /// Connects to `sqlite://...` (the file is created if missing) or `postgres://...`.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let engine = engine_of(url)?;
        let url = match engine {
            Engine::Sqlite if !url.contains("mode=") => {
                let separator = if url.contains('?') { '&' } else { '?' };
                format!("{url}{separator}mode=rwc")
            }
            Engine::Sqlite | Engine::Postgres => url.to_string(),
        };
        let options = AnyConnectOptions::from_str(&url).map_err(StoreError::Connect)?;
        let pool = Self::pool_options(engine, 4).connect_with(options.clone()).await.map_err(StoreError::Connect)?;
        if engine == Engine::Sqlite {
            // WAL lets readers proceed while one writer commits; it persists in the file.
            sqlx::query("PRAGMA journal_mode=WAL").execute(&pool).await?;
        }
        let writer = match engine {
            // A SQLite connection drops its whole page cache when another connection committed
            // since its last transaction: with the consumers' batches taking turns on pooled
            // connections, every batch started cold and read its pages back from the WAL. One
            // connection for them keeps its cache (SQLite has one writer at a time anyway). An
            // in-memory database is private to its connection, so it keeps one pool.
            Engine::Sqlite if !url.contains(":memory:") && !url.contains("mode=memory") => {
                Self::pool_options(engine, 1).connect_with(options).await.map_err(StoreError::Connect)?
            }
            Engine::Sqlite | Engine::Postgres => pool.clone(),
        };
        Ok(Database { pool, writer, engine })
    }

    fn pool_options(engine: Engine, sqlite_connections: u32) -> AnyPoolOptions {
        let pool_options = match engine {
            // One writer at a time is SQLite's model; a few connections let reads proceed. In WAL
            // mode `synchronous = NORMAL` syncs at checkpoints instead of at every commit: a process
            // crash loses nothing, a power cut may lose the last commits (PostgreSQL is the durable
            // store of the distributed shape).
            // sqlx pings a pooled connection before handing it out; a SQLite connection is a file
            // handle that cannot drop away like a socket, and each ping is a round trip to the
            // connection's thread, so embedded pools skip it (the ping on release stays).
            Engine::Sqlite => {
                AnyPoolOptions::new().max_connections(sqlite_connections).test_before_acquire(false).after_connect(|connection, _| {
                    Box::pin(async move {
                        sqlx::Executor::execute(&mut *connection, "PRAGMA synchronous = NORMAL").await?;
                        // Statement journals (a multi-row insert that may fail part-way) in memory, not
                        // in temporary files; a page cache that holds the chain's hot index pages.
                        sqlx::Executor::execute(&mut *connection, "PRAGMA temp_store = MEMORY").await?;
                        sqlx::Executor::execute(&mut *connection, "PRAGMA cache_size = -8192").await?;
                        // A checkpoint copies the WAL back into the database in one go on the
                        // committing connection's thread, which shares the gateway's CPU: at 1,000
                        // 4 KiB pages (the default) that held the CPU 1-3 ms several times a second and
                        // set the p99 of requests at 2,000 req/s. Each checkpoint also has a cost of
                        // its own whatever its size (two `fsync`s, the WAL index): checkpoints four
                        // times larger than 400 KiB took a sixth off SQLite's thread time per request.
                        // 1 MiB (counted in the database's own pages) holds the CPU a quarter as long
                        // as the default and checkpoints 2.5 times less often than 400 KiB.
                        let page_size: i64 = sqlx::query_scalar("PRAGMA page_size").fetch_one(&mut *connection).await?;
                        let pages = (CHECKPOINT_WAL_BYTES / page_size.max(512)).max(1);
                        sqlx::Executor::execute(&mut *connection, format!("PRAGMA wal_autocheckpoint = {pages}").as_str()).await?;
                        Ok(())
                    })
                })
            }
            Engine::Postgres => AnyPoolOptions::new().max_connections(16),
        };
        pool_options.acquire_timeout(Duration::from_secs(10))
    }

    /// Opens (creating if needed) the embedded SQLite database inside `data_dir`.
    pub async fn open_embedded(data_dir: &Path) -> Result<Self, StoreError> {
        tokio::fs::create_dir_all(data_dir).await?;
        let path = data_dir.join("brainstorm.db");
        Self::connect(&format!("sqlite://{}", path.display())).await
    }

    /// Applies every pending migration (idempotent; PostgreSQL takes an advisory lock).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.migrator().run(&self.pool).await?;
        Ok(())
    }

    /// Fails unless every migration this binary knows has been applied.
    pub async fn ensure_migrated(&self) -> Result<(), StoreError> {
        // No bookkeeping table yet means nothing was ever applied.
        let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success = $1")
            .bind(true)
            .fetch_all(&self.pool)
            .await
            .unwrap_or_default();
        let pending: Vec<String> = self
            .migrator()
            .iter()
            .filter(|migration| !applied.contains(&migration.version))
            .map(|migration| migration.version.to_string())
            .collect();
        if pending.is_empty() { Ok(()) } else { Err(StoreError::SchemaBehind(pending.join(", "))) }
    }

    /// The pool, for service stores.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// The pool for the batches written all the time (the consumers' chain, ledger and interception
    /// batches): on a SQLite file one connection of its own, so its page cache stays valid between
    /// its transactions; on PostgreSQL the one pool.
    pub fn writer(&self) -> &AnyPool {
        &self.writer
    }

    /// Begins a transaction on the pool that may write. On SQLite it is `BEGIN IMMEDIATE`: the
    /// write lock is taken (waiting out the busy timeout) before the first read, because a deferred
    /// transaction that reads and then writes fails at once with `SQLITE_BUSY` when another
    /// connection committed in between (WAL cannot move its snapshot forward), where waiting would
    /// have succeeded. PostgreSQL begins as usual.
    pub async fn begin(&self) -> Result<Transaction<'static, Any>, sqlx::Error> {
        Self::begin_on(self.engine, &self.pool).await
    }

    /// [`Database::begin`] on the batch writers' pool ([`Database::writer`]).
    pub async fn begin_writer(&self) -> Result<Transaction<'static, Any>, sqlx::Error> {
        Self::begin_on(self.engine, &self.writer).await
    }

    async fn begin_on(engine: Engine, pool: &AnyPool) -> Result<Transaction<'static, Any>, sqlx::Error> {
        match engine {
            Engine::Sqlite => pool.begin_with("BEGIN IMMEDIATE").await,
            Engine::Postgres => pool.begin().await,
        }
    }

    /// Which engine this is.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Placeholders for statements built at run time on this engine.
    pub fn placeholders(&self) -> Placeholders {
        Placeholders { engine: self.engine }
    }

    /// Closes every connection (at shutdown, after in-flight work finished).
    pub async fn close(&self) {
        self.writer.close().await;
        self.pool.close().await;
    }

    fn migrator(&self) -> &'static Migrator {
        match self.engine {
            Engine::Sqlite => &SQLITE_MIGRATIONS,
            Engine::Postgres => &POSTGRES_MIGRATIONS,
        }
    }
}

/// PostgreSQL's `character_not_in_repertoire`: text it cannot hold, which for valid UTF-8 means a
/// NUL (U+0000).
const CHARACTER_NOT_IN_REPERTOIRE: &str = "22021";

/// Maps a database failure for a service: an unreachable database is retryable (`Unavailable`),
/// text the database cannot hold (a NUL, on PostgreSQL) is the client's to fix (`invalid_text`),
/// anything else is a bug, logged here and reported without its details.
pub fn store_failure(service: &str, error: sqlx::Error) -> brainstorm_proto::ServiceError {
    use brainstorm_proto::ServiceError;
    match error {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => {
            tracing::warn!(%error, service, "store unavailable");
            ServiceError::unavailable("database_unavailable", format!("the {service} store is unavailable; retry shortly"))
        }
        sqlx::Error::Database(database_error) if database_error.code().as_deref() == Some(CHARACTER_NOT_IN_REPERTOIRE) => {
            tracing::warn!(error = %database_error, service, "text the store cannot hold");
            ServiceError::invalid("invalid_text", "text must not contain the NUL character (U+0000)")
        }
        other => {
            tracing::error!(error = %other, service, "store error");
            ServiceError::internal(format!("{service} store error"))
        }
    }
}

/// Whether a SQL error is a unique-constraint violation (on either engine).
pub fn is_unique_violation(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(database_error) => database_error.is_unique_violation(),
        _ => false,
    }
}

/// Rows one multi-row statement carries at most: well inside both engines' bound-parameter limits
/// (PostgreSQL 65,535; SQLite 32,766) for the widest row a store writes (17 columns). On SQLite each
/// statement runs on the connection's own thread, which shares the requests' core where the process
/// has one: 64 rows keep each run short enough not to hold a waking request back (256 set the p99 at
/// 2,000 req/s on one core by 0.1-0.2 ms with a 100 ms linger), at a few more statements per batch.
const MAX_ROWS_PER_STATEMENT: usize = 64;

/// `items` cut into runs for multi-row statements: largest power of two first, at most
/// `MAX_ROWS_PER_STATEMENT` rows each (50 rows: 32, 16, 2). Run sizes recur from batch to batch, so
/// a statement built for one keeps its text and the connection's prepared-statement cache spares
/// parsing it again (a statement per distinct row count would be parsed every time).
pub fn statement_chunks<T>(items: &[T]) -> impl Iterator<Item = &[T]> {
    let mut rest = items;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let size = (1_usize << rest.len().ilog2()).min(MAX_ROWS_PER_STATEMENT);
        let (run, after) = rest.split_at(size);
        rest = after;
        Some(run)
    })
}

/// The engine's dialect for statements built at run time (multi-row inserts, `IN` lists): their
/// bound-parameter placeholders and the verb of a batch insert. PostgreSQL numbers placeholders
/// (`$1`); SQLite gets anonymous `?`s, bound in order: SQLite looks a numbered name up by walking the
/// statement's list of names, so binding thousands of `$n` costs quadratic time. A statement uses
/// one style throughout, and takes its parameters in text order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placeholders {
    engine: Engine,
}

impl Placeholders {
    /// The `n`th parameter (from 1).
    pub fn nth(self, n: usize) -> String {
        match self.engine {
            Engine::Postgres => format!("${n}"),
            Engine::Sqlite => "?".to_string(),
        }
    }

    /// `INSERT OR FAIL` on SQLite, `INSERT` on PostgreSQL: the verb of a multi-row insert in a
    /// transaction that the caller rolls back on any error. A SQLite statement that writes several
    /// rows and may stop at a constraint (ABORT, the default) first copies every page it changes
    /// into a statement journal, to undo itself alone; FAIL stops the statement where it is, and
    /// the rollback undoes the rest, so no page is copied (about 8 KB per request in the consumers'
    /// batches). An upsert's `ON CONFLICT` clause still decides for its own constraint.
    pub fn batch_insert(self) -> &'static str {
        match self.engine {
            Engine::Postgres => "INSERT",
            Engine::Sqlite => "INSERT OR FAIL",
        }
    }

    /// `(p1, .., pc), (pc+1, ..)`: the VALUES list of `rows` rows of `columns` parameters, numbered
    /// from `first`.
    pub fn values(self, rows: usize, columns: usize, first: usize) -> String {
        let mut list = String::with_capacity(rows * columns * 5);
        for row in 0..rows {
            list.push_str(if row == 0 { "(" } else { ", (" });
            for column in 0..columns {
                if column > 0 {
                    list.push_str(", ");
                }
                match self.engine {
                    Engine::Postgres => {
                        list.push('$');
                        list.push_str(&(first + row * columns + column).to_string());
                    }
                    Engine::Sqlite => list.push('?'),
                }
            }
            list.push(')');
        }
        list
    }
}

fn engine_of(url: &str) -> Result<Engine, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Engine::Sqlite)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Engine::Postgres)
    } else {
        Err(StoreError::UnsupportedUrl(url.split('@').next_back().unwrap_or_default().to_string()))
    }
}

/// Declares each named `async fn(Database) -> TestResult` of the calling test file as two tests,
/// `sqlite::<name>` and `postgres::<name>`, each on a fresh, migrated database of its engine (the
/// file defines `TestResult`).
#[macro_export]
macro_rules! on_both_engines {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $test() -> super::TestResult {
                    super::$test($crate::store::testing::fresh_sqlite().await?).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $test() -> super::TestResult {
                    super::$test($crate::store::testing::fresh_postgres().await?).await
                }
            )*
        }
    };
}

/// Test support: fresh, isolated databases on both engines.
pub mod testing {
    use super::*;

    /// Where store tests find PostgreSQL; `BR_TEST_POSTGRES_URL` overrides.
    pub fn postgres_admin_url() -> String {
        std::env::var("BR_TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
    }

    /// A new SQLite database in a fresh temporary directory, migrated.
    pub async fn fresh_sqlite() -> Result<Database, StoreError> {
        let directory = std::env::temp_dir().join(format!("brainstorm-test-{}", uuid::Uuid::new_v4().simple()));
        let database = Database::open_embedded(&directory).await?;
        database.migrate().await?;
        Ok(database)
    }

    /// A new PostgreSQL database (`brainstorm_test_<random>`) on the test server, migrated.
    pub async fn fresh_postgres() -> Result<Database, StoreError> {
        let admin_url = postgres_admin_url();
        let admin = Database::connect(&admin_url).await?;
        let name = format!("brainstorm_test_{}", uuid::Uuid::new_v4().simple());
        // The name is generated above from hex digits only, so it is safe to splice into DDL.
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(admin.pool()).await?;
        admin.close().await;
        let (base, _) = admin_url.rsplit_once('/').unwrap_or((admin_url.as_str(), ""));
        let database = Database::connect(&format!("{base}/{name}")).await?;
        database.migrate().await?;
        Ok(database)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statement_chunks_are_powers_of_two_that_cover_every_item_in_order() {
        for length in 0..700_usize {
            let items: Vec<usize> = (0..length).collect();
            let chunks: Vec<&[usize]> = statement_chunks(&items).collect();
            assert!(chunks.iter().all(|chunk| chunk.len().is_power_of_two() && chunk.len() <= MAX_ROWS_PER_STATEMENT));
            assert!(chunks.windows(2).all(|pair| pair[0].len() >= pair[1].len()), "largest first");
            assert_eq!(chunks.concat(), items);
        }
        let sizes: Vec<usize> = statement_chunks(&[0; 50]).map(<[i32]>::len).collect();
        assert_eq!(sizes, [32, 16, 2]);
    }

    #[test]
    fn values_lists_number_every_parameter_once() {
        let postgres = Placeholders { engine: Engine::Postgres };
        assert_eq!(postgres.values(1, 2, 1), "($1, $2)");
        assert_eq!(postgres.values(2, 3, 2), "($2, $3, $4), ($5, $6, $7)");
        assert_eq!(postgres.values(0, 3, 1), "");
        assert_eq!(postgres.nth(3), "$3");
        let sqlite = Placeholders { engine: Engine::Sqlite };
        assert_eq!(sqlite.values(2, 2, 5), "(?, ?), (?, ?)");
        assert_eq!(sqlite.nth(1), "?");
    }

    #[tokio::test]
    async fn embedded_connections_checkpoint_after_a_mebibyte_of_wal() -> Result<(), StoreError> {
        let directory = std::env::temp_dir().join(format!("brainstorm-store-{}", uuid::Uuid::new_v4().simple()));
        let database = Database::open_embedded(&directory).await?;
        for pool in [database.pool(), database.writer()] {
            let mut connection = pool.acquire().await?;
            let page_size: i64 = sqlx::query_scalar("PRAGMA page_size").fetch_one(&mut *connection).await?;
            let pages: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint").fetch_one(&mut *connection).await?;
            assert_eq!(pages * page_size, CHECKPOINT_WAL_BYTES);
        }
        drop(database);
        let _ = std::fs::remove_dir_all(directory);
        Ok(())
    }

    #[test]
    fn engine_follows_the_url_scheme() {
        assert_eq!(engine_of("sqlite:///tmp/x.db").ok(), Some(Engine::Sqlite));
        assert_eq!(engine_of("postgres://u@h/db").ok(), Some(Engine::Postgres));
        assert_eq!(engine_of("postgresql://u@h/db").ok(), Some(Engine::Postgres));
        let error = engine_of("mysql://user:secret@host/db").err().map(|error| error.to_string()).unwrap_or_default();
        assert!(error.contains("unsupported"));
        assert!(!error.contains("secret"), "the password must not appear in {error}");
    }

    #[tokio::test]
    async fn a_fresh_sqlite_store_is_migrated_and_a_new_one_is_behind() -> Result<(), StoreError> {
        let database = testing::fresh_sqlite().await?;
        database.ensure_migrated().await?;
        let directory = std::env::temp_dir().join(format!("brainstorm-test-{}", uuid::Uuid::new_v4().simple()));
        let unmigrated = Database::open_embedded(&directory).await?;
        assert!(matches!(unmigrated.ensure_migrated().await, Err(StoreError::SchemaBehind(_))));
        Ok(())
    }

    #[tokio::test]
    async fn an_embedded_store_writes_batches_on_one_connection_that_sees_the_other_pool() -> Result<(), StoreError> {
        let database = testing::fresh_sqlite().await?;
        assert_eq!(database.writer().options().get_max_connections(), 1);
        assert_eq!(database.pool().options().get_max_connections(), 4);
        // The same file: what one pool commits, the other reads.
        sqlx::query("CREATE TABLE probe (value BIGINT)").execute(database.writer()).await?;
        sqlx::query("INSERT INTO probe (value) VALUES ($1)").bind(7_i64).execute(database.writer()).await?;
        let read: i64 = sqlx::query_scalar("SELECT value FROM probe").fetch_one(database.pool()).await?;
        assert_eq!(read, 7);
        Ok(())
    }

    /// A transaction that reads and then writes while another connection commits a write in
    /// between: begun deferred, SQLite fails its write at once with `SQLITE_BUSY` (its snapshot is
    /// stale); begun by `Database::begin`, it holds the write lock from the start, the other writer
    /// waits its turn, and both writes land.
    #[tokio::test]
    async fn a_transaction_that_reads_then_writes_is_not_failed_by_a_concurrent_commit() -> Result<(), StoreError> {
        let database = testing::fresh_sqlite().await?;
        sqlx::query("CREATE TABLE probe (value BIGINT)").execute(database.pool()).await?;
        sqlx::query("INSERT INTO probe (value) VALUES (1)").execute(database.pool()).await?;
        let interleave = |mut transaction: Transaction<'static, Any>| {
            let pool = database.pool().clone();
            async move {
                let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM probe").fetch_one(&mut *transaction).await?;
                let other = tokio::spawn(async move { sqlx::query("INSERT INTO probe (value) VALUES (2)").execute(&pool).await });
                tokio::time::sleep(Duration::from_millis(100)).await;
                let own = sqlx::query("INSERT INTO probe (value) VALUES (3)").execute(&mut *transaction).await;
                let own = match own {
                    Ok(_) => transaction.commit().await,
                    Err(error) => Err(error),
                };
                let other = other.await.map_err(|error| sqlx::Error::Protocol(error.to_string()))?;
                Ok::<_, sqlx::Error>((own.is_ok(), other.is_ok()))
            }
        };
        let deferred = database.pool().begin().await?;
        assert_eq!(interleave(deferred).await?, (false, true), "a deferred transaction's write fails after another commit");
        let immediate = database.begin().await?;
        assert_eq!(interleave(immediate).await?, (true, true));
        let values: Vec<i64> = sqlx::query_scalar("SELECT value FROM probe ORDER BY value").fetch_all(database.pool()).await?;
        assert_eq!(values, [1, 2, 2, 3]);
        Ok(())
    }

    /// A batch insert skips what its `ON CONFLICT` clause names, stops at any other constraint, and
    /// a rolled-back transaction keeps none of its rows, on both engines.
    async fn batch_insert_keeps_upserts_and_rolls_back_whole(database: Database) -> Result<(), StoreError> {
        let placeholders = database.placeholders();
        sqlx::query("CREATE TABLE probe (id BIGINT PRIMARY KEY, name TEXT NOT NULL UNIQUE)").execute(database.writer()).await?;
        sqlx::query("INSERT INTO probe (id, name) VALUES (1, 'one')").execute(database.writer()).await?;
        let insert = |rows: usize| {
            format!(
                "{} INTO probe (id, name) VALUES {} ON CONFLICT (name) DO NOTHING",
                placeholders.batch_insert(),
                placeholders.values(rows, 2, 1)
            )
        };
        // The clause's own constraint: the repeat is skipped, the rest written.
        let sql = insert(2);
        let written = sqlx::query(&sql).bind(2_i64).bind("two").bind(3_i64).bind("one").execute(database.writer()).await?;
        assert_eq!(written.rows_affected(), 1);
        // Another constraint (the primary key) in the statement's third row: it fails, and the
        // transaction's rollback undoes its first rows and what came before it.
        let mut transaction = database.begin_writer().await?;
        sqlx::query("INSERT INTO probe (id, name) VALUES (10, 'ten')").execute(&mut *transaction).await?;
        let sql = insert(3);
        let failed =
            sqlx::query(&sql).bind(4_i64).bind("four").bind(5_i64).bind("five").bind(1_i64).bind("uno").execute(&mut *transaction).await;
        assert!(failed.as_ref().is_err_and(is_unique_violation), "{failed:?}");
        drop(transaction);
        let names: Vec<String> = sqlx::query_scalar("SELECT name FROM probe ORDER BY id").fetch_all(database.pool()).await?;
        assert_eq!(names, ["one", "two"]);
        Ok(())
    }

    mod batch_insert {
        type TestResult = Result<(), super::StoreError>;
        use super::batch_insert_keeps_upserts_and_rolls_back_whole;
        crate::on_both_engines!(batch_insert_keeps_upserts_and_rolls_back_whole);
    }

    #[tokio::test]
    async fn a_fresh_postgres_store_is_migrated() -> Result<(), StoreError> {
        let database = testing::fresh_postgres().await?;
        database.ensure_migrated().await?;
        // Applying again is a no-op.
        database.migrate().await?;
        Ok(())
    }
}
