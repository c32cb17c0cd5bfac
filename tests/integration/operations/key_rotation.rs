//! Rotating the keys that seal stored responses (docs/contract.md §12), as an operator
//! does it, against the real binary: write under k1; restart with `k2,k1`; replays
//! work; `orderd keys rewrap`; restart with `k2` alone; replays still work; restart
//! with a key nobody wrote under: 503, and no new order. Rewraps run beside live
//! traffic and beside each other, and one killed midway finishes when run again.

use std::{process::Command, time::Duration};

use orderd::idempotency::{
    seal::{OldLayouts, Sealer},
    store::SealedRecord,
};
use serde_json::json;
use uuid::Uuid;

use crate::support::{KillOnDrop, ServeProcess, TestDb, new_key, sealer, spawn_app_on};

const BIN: &str = env!("CARGO_BIN_EXE_orderd");
/// 32 bytes of 0x01, 0x02 and 0x03.
const K1: &str = "k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";
const K2: &str = "k2:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=";
const K3: &str = "k3:AwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwM=";

fn keys(value: &str) -> Vec<(&'static str, String)> {
    vec![("ORDERD_RESPONSE_KEYS", value.to_string())]
}

/// One create against `serve`: status and body bytes.
async fn create(serve: &ServeProcess, token: &str, key: &str, n: usize) -> (u16, Vec<u8>) {
    let response = reqwest::Client::new()
        .post(format!("{}/v1/orders", serve.base))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&json!({"sku": format!("ROT-{n}"), "quantity": 1, "customer_ref": format!("customer {n}")}))
        .send()
        .await
        .unwrap();
    (
        response.status().as_u16(),
        response.bytes().await.unwrap().to_vec(),
    )
}

/// `orderd keys rewrap` with `keys`: exit status and stdout.
fn rewrap(db: &TestDb, keys: &str, batch: &str) -> (bool, String) {
    let out = Command::new(BIN)
        .args(["keys", "rewrap", "--batch", batch])
        .env("DATABASE_URL", &db.url)
        .env("ORDERD_RESPONSE_KEYS", keys)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// How many completed records there are for each value of `column`, nulls first.
async fn completed_by<T>(db: &TestDb, column: &str) -> Vec<(Option<T>, i64)>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    // `column` is one of this file's own names.
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {column}, count(*) FROM idempotency_record WHERE state = 'COMPLETED'
         GROUP BY 1 ORDER BY 1 NULLS FIRST"
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// How many completed records are sealed under each key (`None`: in clear).
async fn sealed_under(db: &TestDb) -> Vec<(Option<String>, i64)> {
    completed_by(db, "response_key_id").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_keys_keeps_every_replay_byte_exact_and_an_unknown_key_answers_503() {
    let db = TestDb::new().await;
    let tenant = Uuid::new_v4();
    let mut written = Vec::new();
    {
        let serve = ServeProcess::start(&db, &keys(K1));
        let token = serve.token(tenant);
        for n in 0..5 {
            let key = new_key();
            let (status, body) = create(&serve, &token, &key, n).await;
            assert_eq!(status, 201);
            written.push((key, n, body));
        }
    }
    assert_eq!(sealed_under(&db).await, [(Some("k1".into()), 5)]);

    // A new key first, the old one still there: old records replay, new ones seal under k2.
    {
        let serve = ServeProcess::start(&db, &keys(&format!("{K2},{K1}")));
        let token = serve.token(tenant);
        for (key, n, body) in &written {
            assert_eq!(create(&serve, &token, key, *n).await, (201, body.clone()));
        }
        for n in 5..7 {
            let key = new_key();
            let (status, body) = create(&serve, &token, &key, n).await;
            assert_eq!(status, 201);
            written.push((key, n, body));
        }
    }
    assert_eq!(
        sealed_under(&db).await,
        [(Some("k1".into()), 5), (Some("k2".into()), 2)]
    );
    let (ok, out) = rewrap(&db, &format!("{K2},{K1}"), "2");
    assert!(ok, "{out}");
    assert!(
        out.starts_with(
            "resealed 5 stored responses under key `k2` (0 of them were stored in clear)"
        ),
        "{out}"
    );
    assert_eq!(sealed_under(&db).await, [(Some("k2".into()), 7)]);

    // The old key gone: everything still replays.
    {
        let serve = ServeProcess::start(&db, &keys(K2));
        let token = serve.token(tenant);
        for (key, n, body) in &written {
            assert_eq!(create(&serve, &token, key, *n).await, (201, body.clone()));
        }
    }

    // A key nobody wrote under: every replay is a 503, no order is created.
    {
        let serve = ServeProcess::start(&db, &keys(K3));
        let token = serve.token(tenant);
        let (key, n, _) = &written[0];
        let (status, body) = create(&serve, &token, key, *n).await;
        assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem["type"], "/problems/service-unavailable");
        assert!(!String::from_utf8_lossy(&body).contains("customer"));
        // The log is read from the process's stderr by a thread: give it a moment.
        let mut logs = String::new();
        for _ in 0..100 {
            logs = serve.logs.lock().unwrap().join("\n");
            if logs.contains("cannot be opened") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let line = logs
            .lines()
            .find(|l| l.contains("cannot be opened"))
            .unwrap_or_else(|| panic!("no log line of the failure: {logs}"));
        assert!(line.contains(r#""key_id":"k2""#), "{line}");
    }
    // No keys at all: the same; and a new answer is stored as it is.
    {
        let serve = ServeProcess::start(&db, &[]);
        let token = serve.token(tenant);
        let (key, n, _) = &written[1];
        assert_eq!(create(&serve, &token, key, *n).await.0, 503);
        assert_eq!(create(&serve, &token, &new_key(), 99).await.0, 201);
    }
    assert_eq!(db.count("orders").await, 8);
    assert_eq!(sealed_under(&db).await, [(None, 1), (Some("k2".into()), 7)]);
    let (ok, out) = rewrap(&db, K3, "100");
    assert!(!ok);
    assert!(
        out.contains("7 records are sealed under key `k2`, which is not configured")
            && out.starts_with("resealed 1 stored responses under key `k3` (1 of them"),
        "{out}"
    );
}

/// `count` completed records stored in clear, as a release without keys left them,
/// each body `body-N`.
async fn clear_records(db: &TestDb, count: i64) {
    sqlx::query(
        "INSERT INTO idempotency_record (tenant_id, endpoint, idem_key, fingerprint, state, response_status,
                                         response_body, created_at, completed_at, expires_at)
         SELECT gen_random_uuid(), 'POST /v1/orders', 'key-' || lpad(n::text, 16, '0'),
                sha256(n::text::bytea), 'COMPLETED', 201, convert_to('body-' || n, 'UTF8'),
                now(), now(), now() + interval '1 day'
         FROM generate_series(1, $1) n",
    )
    .bind(count)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// The records of [`clear_records`], as they are stored now.
async fn written_records(db: &TestDb) -> Vec<SealedRecord> {
    sqlx::query_as(
        "SELECT tenant_id, endpoint, idem_key, response_key_id, response_seal_version, response_body,
                response_status, response_location, response_content_type, resource_id, expires_at
         FROM idempotency_record WHERE state = 'COMPLETED' AND idem_key ~ '^key-[0-9]{16}$'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// Every completed record opens under `sealer` to the body it was written with (the
/// ones from [`clear_records`]: `body-N` for key N); returns how many were checked.
async fn every_record_opens(db: &TestDb, sealer: &Sealer) -> usize {
    let rows = written_records(db).await;
    for row in &rows {
        let opened = sealer
            .open(
                row.binding(),
                row.response_body.clone(),
                row.response_key_id.as_deref(),
                row.response_seal_version,
            )
            .unwrap();
        let n: u64 = row.idem_key.trim_start_matches("key-").parse().unwrap();
        assert_eq!(opened, format!("body-{n}").into_bytes(), "{}", row.idem_key);
    }
    rows.len()
}

/// `count` completed records as the release before this one sealed them under k1:
/// layout 3, a random nonce under the configured key; each body `body-N` for key N.
async fn layout_3_records(db: &TestDb, count: i64) {
    clear_records(db, count).await;
    let k1 = sealer(K1);
    for row in &written_records(db).await {
        let sealed = k1
            .seal_in_layout(row.binding(), &row.response_body, 3)
            .unwrap();
        // One tenant's row at a time: a statement each shard can take alone.
        sqlx::query(
            "UPDATE idempotency_record SET response_body = $1, response_key_id = 'k1',
                    response_seal_version = 3
             WHERE tenant_id = $2 AND endpoint = $3 AND idem_key = $4",
        )
        .bind(&sealed.bytes)
        .bind(row.tenant_id)
        .bind(&row.endpoint)
        .bind(&row.idem_key)
        .execute(&db.pool)
        .await
        .unwrap();
    }
}

/// How many completed records are in each layout (`None`: in clear or the first).
async fn in_layouts(db: &TestDb) -> Vec<(Option<i16>, i64)> {
    completed_by(db, "response_seal_version").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrap_under_the_same_key_moves_layout_3_records_to_a_key_per_record() {
    let db = TestDb::new().await;
    layout_3_records(&db, 300).await;
    assert_eq!(in_layouts(&db).await, [(Some(3), 300)]);
    let refusing = sealer(K1).with_old_layouts(OldLayouts::Refuse);
    assert_eq!(every_record_opens(&db, &sealer(K1)).await, 300);

    // Nothing but the layout tells them from what the rewrap seals: same key, same
    // answers. It moves every one, in batches.
    let (ok, out) = rewrap(&db, K1, "7");
    assert!(ok, "{out}");
    assert!(
        out.starts_with(
            "resealed 300 stored responses under key `k1` (0 of them were stored in clear)"
        ),
        "{out}"
    );
    assert_eq!(in_layouts(&db).await, [(Some(4), 300)]);
    assert_eq!(sealed_under(&db).await, [(Some("k1".into()), 300)]);
    // Each opens to its own body with the older layouts refused, and each under a salt
    // of its own.
    assert_eq!(every_record_opens(&db, &refusing).await, 300);
    let salts: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT substr(response_body, 1, 32)) FROM idempotency_record",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(salts, 300);
    // Run again, it finds nothing to move.
    let (ok, out) = rewrap(&db, K1, "7");
    assert!(ok, "{out}");
    assert!(out.starts_with("resealed 0 stored responses"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rewraps_beside_live_writes_seal_every_record_once_under_the_first_key() {
    let db = TestDb::new().await;
    clear_records(&db, 20_000).await;
    let url = db.url.clone();
    let both = format!("{K2},{K1}");
    // Live traffic on the same database while both rewraps run.
    let app = spawn_app_on(
        db.handle().await,
        &[("ORDERD_RESPONSE_KEYS", both.as_str())],
    )
    .await;
    let token = app.token(Uuid::new_v4());
    let writer = {
        let (base, token) = (app.base.clone(), token.clone());
        tokio::spawn(async move {
            let mut written = 0;
            for n in 0..200 {
                let body = json!({"sku": format!("LIVE-{n}"), "quantity": 1});
                let response =
                    crate::support::post_order(&base, &token, &new_key(), &body, None).await;
                assert_eq!(response.status(), 201);
                written += 1;
            }
            written
        })
    };
    // Each walk visits 20,000 tenants, which on a loaded machine takes longer than the
    // default wait: the rewrap that finishes first must still have time to look again
    // after the other's last batch commits.
    let rewraps: Vec<_> = (0..2)
        .map(|_| {
            Command::new(BIN)
                .args(["keys", "rewrap", "--batch", "100", "--wait", "300"])
                .env("DATABASE_URL", &url)
                .env("ORDERD_RESPONSE_KEYS", &both)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut resealed = 0;
    for rewrap in rewraps {
        let out = rewrap.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        resealed += stdout
            .strip_prefix("resealed ")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<i64>().ok())
            .unwrap_or_else(|| panic!("{stdout}"));
    }
    assert_eq!(writer.await.unwrap(), 200);
    // Each record resealed by exactly one of them, each exactly once, all under k2.
    assert_eq!(resealed, 20_000);
    assert_eq!(sealed_under(&db).await, [(Some("k2".into()), 20_200)]);
    assert_eq!(every_record_opens(&db, &sealer(K2)).await, 20_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrap_killed_midway_finishes_the_rest_when_run_again() {
    let db = TestDb::new().await;
    clear_records(&db, 20_000).await;
    // Named, so that the test can see its sessions end.
    let named = format!("{}?application_name=killed-rewrap", db.url);
    let first = KillOnDrop(
        Command::new(BIN)
            .args(["keys", "rewrap", "--batch", "20"])
            .env("DATABASE_URL", &named)
            .env("ORDERD_RESPONSE_KEYS", K1)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    db.until_count(
        "SELECT least(count(*), 1000) FROM idempotency_record WHERE response_key_id = 'k1'",
        1000,
    )
    .await;
    drop(first); // SIGKILL, mid-batch as likely as not
    // A COMMIT the process sent just before it died still runs in its server session:
    // count only once that session is gone.
    db.until_count(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'killed-rewrap'",
        0,
    )
    .await;
    let done: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_record WHERE response_key_id = 'k1'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!((1000..20_000).contains(&done), "{done}");
    // Whole batches only: what is done is sealed, the rest is in clear.
    assert_eq!(
        sealed_under(&db).await,
        [(None, 20_000 - done), (Some("k1".into()), done)]
    );

    tokio::time::sleep(Duration::from_millis(100)).await;
    let (ok, out) = rewrap(&db, K1, "500");
    assert!(ok, "{out}");
    let rest = 20_000 - done;
    assert!(
        out.starts_with(&format!(
            "resealed {rest} stored responses under key `k1` ({rest} of them were stored in clear)"
        )),
        "{out}"
    );
    assert_eq!(sealed_under(&db).await, [(Some("k1".into()), 20_000)]);
    assert_eq!(every_record_opens(&db, &sealer(K1)).await, 20_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrap_beside_held_records_exits_0_only_once_it_sealed_them_too() {
    let db = TestDb::new().await;
    let tenant = Uuid::new_v4();
    let mut written = Vec::new();
    {
        let serve = ServeProcess::start(&db, &keys(K1));
        let token = serve.token(tenant);
        for n in 0..30 {
            let key = new_key();
            let (status, body) = create(&serve, &token, &key, n).await;
            assert_eq!(status, 201);
            written.push((key, n, body));
        }
    }
    // Live traffic holds five records in a transaction, as a reclaim or a forget does.
    let held: Vec<&str> = written[..5].iter().map(|(k, ..)| k.as_str()).collect();
    let mut holder = db.pool.begin().await.unwrap();
    let locked: Vec<String> = sqlx::query_scalar(
        "SELECT idem_key FROM idempotency_record WHERE tenant_id = $2 AND idem_key = ANY($1) FOR UPDATE",
    )
    .bind(&held)
    .bind(tenant)
    .fetch_all(&mut *holder)
    .await
    .unwrap();
    assert_eq!(locked.len(), 5);

    // Held for the whole wait: it says so, names them, and exits non-zero.
    let out = Command::new(BIN)
        .args(["keys", "rewrap", "--batch", "7", "--wait", "1"])
        .env("DATABASE_URL", &db.url)
        .env("ORDERD_RESPONSE_KEYS", format!("{K2},{K1}"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.starts_with("resealed 25 stored responses under key `k2`"),
        "{stdout}"
    );
    assert!(
        stdout.contains("5 completed records are not sealed under key `k2`"),
        "{stdout}"
    );
    assert!(
        stdout.contains("5 records were held by other transactions"),
        "{stdout}"
    );
    for key in &held {
        assert!(stdout.contains(key), "{key} is not named: {stdout}");
    }
    assert_eq!(
        sealed_under(&db).await,
        [(Some("k1".into()), 5), (Some("k2".into()), 25)]
    );

    // Released while a rewrap waits: it seals them and exits 0.
    let rewrap = Command::new(BIN)
        .args(["keys", "rewrap", "--batch", "7", "--wait", "60"])
        .env("DATABASE_URL", &db.url)
        .env("ORDERD_RESPONSE_KEYS", format!("{K2},{K1}"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    holder.rollback().await.unwrap();
    let out = rewrap.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.starts_with("resealed 5 stored responses under key `k2`"),
        "{stdout}"
    );
    assert_eq!(sealed_under(&db).await, [(Some("k2".into()), 30)]);

    // The old key dropped, as an operator may once the rewrap exited 0: every replay is
    // the first answer, byte for byte.
    let serve = ServeProcess::start(&db, &keys(K2));
    let token = serve.token(tenant);
    for (key, n, body) in &written {
        assert_eq!(
            create(&serve, &token, key, *n).await,
            (201, body.clone()),
            "{key}"
        );
    }
    assert_eq!(db.count("orders").await, 30);
}
