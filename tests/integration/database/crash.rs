//! Crash safety of the asynchronously committed claim: PostgreSQL itself is killed
//! (immediate shutdown, no checkpoint, as after a power cut) around a request, and the
//! database must afterwards hold exactly one order per key once the client retries.
//!
//! This needs a server the test may kill, so it starts a throwaway cluster of its own
//! from the local PostgreSQL binaries (installed by `.ci/test`).

use std::{net::TcpListener, path::PathBuf, process::Command, time::Duration};

use uuid::Uuid;

use crate::support::{TestDb, new_key, order_body, spawn_app_on};

/// A PostgreSQL cluster in a temporary folder, stopped and removed on drop.
struct Cluster {
    bindir: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl Cluster {
    fn start() -> Self {
        let bindir = postgres_bindir();
        // Under the system temp dir, not the checkout: the postgres user must be able to
        // reach it even when the checkout lives in a private home directory.
        let dir = std::env::temp_dir().join(format!("orderd-crash-pg-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cluster = Self { bindir, dir, port };
        cluster.chown_to_postgres();
        cluster.run(
            "initdb",
            &[
                "-D",
                &cluster.data(),
                "--auth=trust",
                "--username=postgres",
                "--no-sync",
            ],
        );
        cluster.pg_ctl_start();
        cluster
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn pg_ctl_start(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("server.log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-l",
                &log,
                "-w",
                "-o",
                &options,
                "start",
            ],
        );
    }

    /// Kills the server the way a crash would: no shutdown checkpoint, unflushed WAL lost.
    fn crash(&self) {
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let program = self.bindir.join(tool);
        // initdb and postgres refuse to run as root: run them as the postgres user.
        let status = if is_root() {
            Command::new("runuser")
                .arg("-u")
                .arg("postgres")
                .arg("--")
                .arg(&program)
                .args(args)
                .status()
        } else {
            Command::new(&program).args(args).status()
        }
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
        assert!(status.success(), "{tool} {args:?} failed");
    }

    fn chown_to_postgres(&self) {
        if is_root() {
            assert!(
                Command::new("chown")
                    .args(["-R", "postgres"])
                    .arg(&self.dir)
                    .status()
                    .unwrap()
                    .success()
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bindir.join("pg_ctl"))
            .args(["-D", &self.data(), "-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false)
}

fn postgres_bindir() -> PathBuf {
    if let Ok(dir) = std::env::var("ORDERD_TEST_PG_BINDIR") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server binaries in /usr/lib/postgresql (run the suite with .ci/test)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    found.sort();
    found
        .pop()
        .expect("an initdb under /usr/lib/postgresql/*/bin")
}

/// Runs a query until the restarted server accepts connections again.
async fn until_up(db: &TestDb) {
    for _ in 0..200 {
        if sqlx::query("SELECT 1").execute(&db.pool).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the server did not come back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_crash_around_a_request_never_loses_or_doubles_an_order() {
    if crate::support::one_server_only(
        "it crashes a PostgreSQL server of its own (faults::worker stops a Citus worker)",
    ) {
        return;
    }
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster.url()).await;
    let app = spawn_app_on(
        db,
        &[("ORDERD_LEASE_SECS", "1"), ("ORDERD_INFLIGHT_WAIT_MS", "0")],
    )
    .await;
    let token = app.token(Uuid::new_v4());
    let key = new_key();
    let body = order_body("CRASH-1", 1);

    // 1. Crash between the (asynchronously committed) claim and the business commit.
    let mut blocker = app.db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let request = tokio::spawn({
        let (base, token, key, body) = (app.base.clone(), token.clone(), key.clone(), body.clone());
        async move {
            reqwest::Client::new()
                .post(format!("{base}/v1/orders"))
                .bearer_auth(token)
                .header("Idempotency-Key", key)
                .json(&body)
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    });
    app.db
        .until_count("SELECT count(*) FROM idempotency_record", 1)
        .await;
    cluster.crash();
    drop(blocker);
    let status = request.await.unwrap().expect("the server answered");
    assert!(
        status >= 500,
        "the request died with the database: {status}"
    );
    cluster.pg_ctl_start();
    until_up(&app.db).await;
    assert_eq!(
        (
            app.db.count("orders").await,
            app.db.count("outbox_event").await
        ),
        (0, 0)
    );
    // The claim survived or not (it was not flushed); either way a retry completes once.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let retry = app.create(&token, &key, &body).await;
    assert_eq!(
        retry.status,
        201,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );

    // 2. Crash right after the answer: the order, its event and the key are durable.
    cluster.crash();
    cluster.pg_ctl_start();
    until_up(&app.db).await;
    assert_eq!(
        (
            app.db.count("orders").await,
            app.db.count("outbox_event").await
        ),
        (1, 1)
    );
    // A connection used less than a second before the crash is handed out unchecked,
    // so the first request on it may answer 503; a client retries, as after any 5xx.
    let mut replay = app.create(&token, &key, &body).await;
    for _ in 0..20 {
        if replay.status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        replay = app.create(&token, &key, &body).await;
    }
    assert_eq!(
        replay.body,
        retry.body,
        "{}",
        String::from_utf8_lossy(&replay.body)
    );
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(app.db.count("orders").await, 1);
}
