//! The binary itself: subcommands, start-up errors and graceful shutdown.

use std::{process::Command, time::Duration};

use uuid::Uuid;

use crate::support::{SECRET, ServeProcess, TestDb, order_body};

const BIN: &str = env!("CARGO_BIN_EXE_orderd");

#[tokio::test]
async fn token_prints_a_token_alone_that_the_service_accepts() {
    let tenant = Uuid::new_v4();
    let out = Command::new(BIN)
        .args([
            "token",
            "--tenant",
            &tenant.to_string(),
            "--scope",
            "orders:read",
            "--ttl",
            "5m",
        ])
        .env("ORDERD_JWT_HS256_SECRET", SECRET)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1);
    let verifier = orderd::auth::Verifier::new(&orderd::auth::JwtConfig {
        hs256_secret: Some(orderd::config::Secret::new(SECRET)),
        ..Default::default()
    })
    .unwrap();
    let principal = verifier.verify(stdout.trim()).await.unwrap();
    assert_eq!(principal.tenant.0, tenant);
    assert!(principal.require("orders:read").is_ok() && principal.require("orders:write").is_err());
}

#[test]
fn openapi_yaml_prints_the_committed_document() {
    let out = Command::new(BIN)
        .args(["openapi", "--yaml"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        include_str!("../../../openapi/openapi.yaml")
    );
}

#[test]
fn a_missing_or_malformed_setting_stops_serve_with_one_line_naming_it() {
    let out = Command::new(BIN)
        .arg("serve")
        .env_remove("DATABASE_URL")
        .env("ORDERD_JWT_HS256_SECRET", SECRET)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("DATABASE_URL"), "{stderr}");

    let out = Command::new(BIN)
        .arg("serve")
        .env("DATABASE_URL", "postgres://127.0.0.1:1/none")
        .env("ORDERD_LEASE_SECS", "forever")
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        !out.status.success() && stderr.contains("ORDERD_LEASE_SECS"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    // A response key that is not 32 bytes, or an id given twice: named, never printed.
    let short = "c2hvcnQta2V5LXNlY3JldA==";
    let full = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";
    for (keys, says) in [
        (
            format!("k1:{short}"),
            "key `k1` is not the base64 of exactly 32 bytes",
        ),
        (format!("k1:{full},k1:{full}"), "the id `k1` is given twice"),
    ] {
        let out = Command::new(BIN)
            .arg("serve")
            .env("DATABASE_URL", "postgres://127.0.0.1:1/none")
            .env("ORDERD_JWT_HS256_SECRET", SECRET)
            .env("ORDERD_RESPONSE_KEYS", &keys)
            .output()
            .unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(!out.status.success(), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("ORDERD_RESPONSE_KEYS") && stderr.contains(says),
            "{stderr}"
        );
        assert!(
            !stderr.contains(short) && !stderr.contains(full),
            "{stderr}"
        );
    }
}

#[test]
fn database_mistakes_stop_the_process_with_one_line_saying_what_to_check() {
    let server = crate::support::admin_url();
    let (base, _) = server.rsplit_once('/').unwrap();
    for (url, hint) in [
        (
            "postgres://postgres@127.0.0.1:1/orderd".to_string(),
            "nothing accepts connections at 127.0.0.1:1",
        ),
        (
            "postgres://postgres@no-such-host.invalid/orderd".to_string(),
            "the host `no-such-host.invalid` is unknown",
        ),
        (
            format!("{base}/no_such_database_here"),
            "the database `no_such_database_here` does not exist",
        ),
        (
            "localhost:5432".to_string(),
            "is not a PostgreSQL URL like postgres://",
        ),
    ] {
        let out = Command::new(BIN)
            .arg("migrate")
            .env("DATABASE_URL", &url)
            .output()
            .unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(!out.status.success(), "{url}");
        assert_eq!(stderr.lines().count(), 1, "{url}: {stderr}");
        assert!(
            stderr.contains("DATABASE_URL") && stderr.contains(hint),
            "{url}: {stderr}"
        );
    }
}

#[test]
fn out_of_range_numbers_short_secrets_and_two_verifiers_stop_serve_naming_the_variable() {
    for (name, value, extra) in [
        ("ORDERD_IDEMPOTENCY_TTL_SECS", "18446744073709551615", None),
        ("ORDERD_LEASE_SECS", "18446744073709551615", None),
        ("ORDERD_INFLIGHT_WAIT_MS", "18446744073709551615", None),
        ("ORDERD_OUTBOX_BACKOFF_MAX_MS", "18446744073709551615", None),
        ("ORDERD_DB_POOL_SIZE", "4294967295", None),
        ("ORDERD_OUTBOX_PUBLISH_TIMEOUT_MS", "1e13", None),
        ("ORDERD_JWT_HS256_SECRET", "too-short-secret", None),
        (
            "ORDERD_JWT_JWKS_URL",
            "http://127.0.0.1:1/jwks.json",
            Some(("ORDERD_JWT_HS256_SECRET", SECRET)),
        ),
    ] {
        let mut command = Command::new(BIN);
        command
            .arg("serve")
            .env("DATABASE_URL", "postgres://127.0.0.1:1/none")
            .env("ORDERD_JWT_HS256_SECRET", SECRET)
            .env(name, value);
        if let Some((other, v)) = extra {
            command.env(other, v);
        }
        let out = command.output().unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(!out.status.success(), "{name}={value} was accepted");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(name) || stderr.contains("exactly one"),
            "{name}: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_an_in_flight_request_finish_before_exiting() {
    let db = TestDb::new().await;
    let serve = ServeProcess::start(&db, &[]);

    // Stall the request inside its transaction, then ask the server to stop.
    let mut blocker = db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let request = create_in_background(&serve, Uuid::new_v4(), "graceful-shutdown-key-1");
    db.until_count("SELECT count(*) FROM idempotency_record", 1)
        .await;
    terminate(&serve.child);
    tokio::time::sleep(Duration::from_millis(300)).await;
    blocker.rollback().await.unwrap();

    assert_eq!(
        request
            .await
            .unwrap()
            .expect("the in-flight request was answered"),
        201
    );
    let status = exited(serve).await;
    assert!(
        status.success(),
        "serve exits cleanly after SIGTERM: {status}"
    );
    let orders = db.count("orders").await;
    assert_eq!(orders, 1);
}

/// How `serve` ended, once it has.
async fn exited(mut serve: ServeProcess) -> std::process::ExitStatus {
    tokio::task::spawn_blocking(move || serve.child.wait().unwrap())
        .await
        .unwrap()
}

/// Sends SIGTERM to `child`.
fn terminate(child: &std::process::Child) {
    assert!(
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
}

/// A create of `key` sent to `serve` in the background; its status, or the transport
/// error's text when no answer came.
fn create_in_background(
    serve: &ServeProcess,
    tenant: Uuid,
    key: &'static str,
) -> tokio::task::JoinHandle<Result<u16, String>> {
    let (base, token) = (serve.base.clone(), serve.token(tenant));
    tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{base}/v1/orders"))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .json(&order_body("SIG-2", 1))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .map_err(|e| e.to_string())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_turns_readyz_503_keeps_accepting_for_the_delay_then_refuses_and_answers_what_it_took()
 {
    let db = TestDb::new().await;
    let mut serve = ServeProcess::start(&db, &[("ORDERD_SHUTDOWN_DELAY_MS", "3000".into())]);
    let address = serve.base.trim_start_matches("http://").to_string();
    let client = reqwest::Client::new();
    let readyz = format!("{}/readyz", serve.base);
    assert_eq!(client.get(&readyz).send().await.unwrap().status(), 200);

    // A request stalled inside its transaction, then the signal.
    let locks = db.lock_everywhere("orders").await;
    let tenant = Uuid::new_v4();
    let before = create_in_background(&serve, tenant, "accepted-before-the-signal");
    db.until_count("SELECT count(*) FROM idempotency_record", 1)
        .await;
    terminate(&serve.child);

    // Out of rotation as soon as the signal is handled, yet new connections are still
    // taken during the delay (each probe here is one).
    let stopping = loop {
        let probe = client.get(&readyz).send().await.unwrap();
        if probe.status() != 200 {
            break probe;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(stopping.status(), 503);
    assert_eq!(stopping.text().await.unwrap(), "shutting down");
    let during = create_in_background(&serve, tenant, "accepted-during-the-delay");
    db.until_count("SELECT count(*) FROM idempotency_record", 2)
        .await;

    // Then the listener closes while the two accepted requests are still held.
    loop {
        if tokio::net::TcpStream::connect(&address).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        serve.child.try_wait().unwrap().is_none(),
        "the process waits for the requests it accepted"
    );
    locks.release().await;
    assert_eq!(before.await.unwrap(), Ok(201));
    assert_eq!(during.await.unwrap(), Ok(201));
    let status = exited(serve).await;
    assert!(status.success(), "exit after SIGTERM: {status}");
    let orders = db.count("orders").await;
    assert_eq!(orders, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_still_held_when_the_drain_ends_is_dropped_and_its_retry_creates_one_order() {
    let db = TestDb::new().await;
    let settings = [
        ("ORDERD_SHUTDOWN_DRAIN_MS", "200".to_string()),
        ("ORDERD_DB_STATEMENT_TIMEOUT_MS", "60000".to_string()),
        ("ORDERD_LEASE_SECS", "1".to_string()),
    ];
    let serve = ServeProcess::start(&db, &settings);
    let locks = db.lock_everywhere("orders").await;
    let tenant = Uuid::new_v4();
    let held = create_in_background(&serve, tenant, "held-past-the-drain");
    db.until_count("SELECT count(*) FROM idempotency_record", 1)
        .await;
    terminate(&serve.child);
    let status = exited(serve).await;
    // It exited while its request was still waiting for the lock this test holds.
    assert!(status.success(), "exit after the drain: {status}");
    assert!(
        held.await.unwrap().is_err(),
        "a request dropped at the end of the drain gets no answer"
    );
    locks.release().await;

    // The client retries against a new process: one order, whichever way it went.
    let again = ServeProcess::start(&db, &settings);
    let status = loop {
        let status = create_in_background(&again, tenant, "held-past-the-drain")
            .await
            .unwrap()
            .unwrap();
        if status != 409 {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(status == 201 || status == 200, "retry answered {status}");
    let orders = db.count("orders").await;
    assert_eq!(orders, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_repeatable_and_purge_reports_what_it_deleted() {
    let db = TestDb::new().await;
    sqlx::query(
        "INSERT INTO idempotency_record (tenant_id, endpoint, idem_key, fingerprint, state, response_status,
                                         response_body, created_at, completed_at, expires_at)
         SELECT gen_random_uuid(), 'POST /v1/orders', 'expired-key-' || g, sha256(g::text::bytea), 'COMPLETED',
                201, '\\x7b7d'::bytea, now(), now(), now() - interval '1 minute'
         FROM generate_series(1, 3) g",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let run = |command: &'static str| {
        let url = db.url.clone();
        tokio::task::spawn_blocking(move || {
            Command::new(BIN)
                .arg(command)
                .env("DATABASE_URL", url)
                .output()
                .unwrap()
        })
    };
    let migrated = run("migrate").await.unwrap();
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let purged = run("purge").await.unwrap();
    assert!(
        purged.status.success(),
        "{}",
        String::from_utf8_lossy(&purged.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&purged.stdout).trim(),
        "purged 3 expired keys and 0 abandoned claims"
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_record")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
}
