//! Stored responses sealed at rest (docs/contract.md §12): with `ORDERD_RESPONSE_KEYS`
//! no byte of a customer's reference is left readable in `idempotency_record`, replays
//! stay byte for byte the first answer, and a sealed body that does not belong to its
//! record (moved from another one) is a 503, never the other record's answer.

use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::{TestApp, new_key, sealer, spawn_app_with};

/// `k1`: 32 bytes 0x01.
pub const K1: &str = "k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";

/// Every column of every record as text (a bytea as its hex), and the raw bytes of
/// the body and the fingerprint.
async fn every_byte_of_the_records(app: &TestApp) -> (String, Vec<Vec<u8>>) {
    let text: Vec<String> =
        sqlx::query_scalar("SELECT row_to_json(r)::text FROM idempotency_record r")
            .fetch_all(&app.db.pool)
            .await
            .unwrap();
    let raw: Vec<(Vec<u8>, Option<Vec<u8>>)> =
        sqlx::query_as("SELECT fingerprint, response_body FROM idempotency_record")
            .fetch_all(&app.db.pool)
            .await
            .unwrap();
    let bytes = raw
        .into_iter()
        .flat_map(|(fingerprint, body)| [Some(fingerprint), body])
        .flatten()
        .collect();
    (text.join("\n"), bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_reference_leaves_no_trace_in_the_record_and_the_replay_is_byte_exact() {
    let app = spawn_app_with(&[("ORDERD_RESPONSE_KEYS", K1)]).await;
    let token = app.token(Uuid::new_v4());
    let marker = format!("MARKER-{}", Uuid::new_v4().simple());
    let key = new_key();
    let body = json!({"sku": "PII-1", "quantity": 1, "customer_ref": marker});
    let first = app.create(&token, &key, &body).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.json()["customer_ref"], marker.as_str());
    let id = first.json()["id"].as_str().unwrap().to_string();
    let cancelled = app.cancel(&token, &new_key(), &id).await;
    assert_eq!(cancelled.json()["customer_ref"], marker.as_str());

    let (text, bytes) = every_byte_of_the_records(&app).await;
    let hex: String = marker.bytes().map(|b| format!("{b:02x}")).collect();
    assert!(!text.contains(&marker) && !text.contains(&hex), "{text}");
    assert!(
        !bytes
            .iter()
            .any(|b| b.windows(marker.len()).any(|w| w == marker.as_bytes())),
        "the marker is in a raw column"
    );
    let sealed: Vec<(Option<String>, Option<Uuid>)> = sqlx::query_as(
        "SELECT response_key_id, resource_id FROM idempotency_record ORDER BY endpoint",
    )
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    let order = Uuid::parse_str(&id).unwrap();
    assert_eq!(
        sealed,
        [
            (Some("k1".into()), Some(order)),
            (Some("k1".into()), Some(order))
        ]
    );

    // The replay (from the database, then from memory) is the first answer, byte for byte.
    for _ in 0..2 {
        let replay = app.create(&token, &key, &body).await;
        assert_eq!(replay.status, 201);
        assert_eq!(replay.body, first.body);
        assert_eq!(replay.header("location"), first.header("location"));
        assert_eq!(
            replay.header("idempotent-replayed").as_deref(),
            Some("true")
        );
    }
    // Reconciliation finds the order of a sealed success without opening it.
    let reconcile = async || {
        let db = app.db.direct();
        let hour = std::time::Duration::from_secs(3600);
        orderd::reconcile::reconcile_once(&db, hour, 100)
            .await
            .unwrap()
    };
    let report = reconcile().await;
    assert_eq!((report.keys_checked, report.keys_without_order), (2, 0));
    sqlx::query("DELETE FROM orders")
        .execute(&app.db.pool)
        .await
        .unwrap();
    assert_eq!(reconcile().await.keys_without_order, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_body_moved_to_another_record_answers_503_and_never_the_other_answer() {
    let app = spawn_app_with(&[("ORDERD_RESPONSE_KEYS", K1)]).await;
    let token = app.token(Uuid::new_v4());
    let (key_a, key_b) = (new_key(), new_key());
    let body_a = json!({"sku": "PII-A", "quantity": 1, "customer_ref": "alice"});
    let body_b = json!({"sku": "PII-B", "quantity": 2, "customer_ref": "bob"});
    let a = app.create(&token, &key_a, &body_a).await;
    assert_eq!(app.create(&token, &key_b, &body_b).await.status, 201);

    // Someone with write access to the table copies A's sealed answer over B's.
    let (body, key_id): (Vec<u8>, Option<String>) = sqlx::query_as(
        "SELECT response_body, response_key_id FROM idempotency_record WHERE idem_key = $1",
    )
    .bind(&key_a)
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE idempotency_record SET response_body = $1, response_key_id = $2 WHERE idem_key = $3",
    )
    .bind(body)
    .bind(key_id)
    .bind(&key_b)
    .execute(&app.db.pool)
    .await
    .unwrap();
    let replay = app.create(&token, &key_b, &body_b).await;
    replay.assert_problem(503, "service-unavailable");
    let text = String::from_utf8_lossy(&replay.body);
    assert!(
        !text.contains("alice") && !text.contains(a.json()["id"].as_str().unwrap()),
        "{text}"
    );
    // Nothing new was written: still two orders, and A still replays.
    assert_eq!(app.count("orders").await, 2);
    assert_eq!(app.create(&token, &key_a, &body_a).await.body, a.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keys_bodies_are_stored_as_they_are() {
    let app = spawn_app_with(&[]).await;
    let token = app.token(Uuid::new_v4());
    let created = app
        .create(
            &token,
            &new_key(),
            &json!({"sku": "PLAIN-1", "quantity": 1, "customer_ref": "carol"}),
        )
        .await;
    let (key_id, body): (Option<String>, Vec<u8>) =
        sqlx::query_as("SELECT response_key_id, response_body FROM idempotency_record")
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    assert_eq!(key_id, None);
    assert_eq!(body, created.body);
    let stored: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(stored["customer_ref"], "carol");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_answer_whose_status_location_resource_or_expiry_was_changed_answers_503() {
    let app = spawn_app_with(&[("ORDERD_RESPONSE_KEYS", K1)]).await;
    let token = app.token(Uuid::new_v4());
    let other = Uuid::new_v4().to_string();
    // Each change is what someone with write access to the table might try; each on a
    // record that has not been replayed yet, so that the replay reads the table.
    let changes = [
        "response_status = 200",
        "response_location = '/v1/orders/' || $2",
        "response_content_type = 'text/html'",
        "resource_id = $2::uuid",
        // What every replay announces as the key's expiry (a constant: Citus routes no
        // update that computes a time from a column).
        "expires_at = '2099-01-01T00:00:00Z'",
    ];
    for (n, change) in changes.iter().enumerate() {
        let key = new_key();
        let body = json!({"sku": format!("TAMPER-{n}"), "quantity": 1, "customer_ref": "dave"});
        assert_eq!(app.create(&token, &key, &body).await.status, 201);
        let changed = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE idempotency_record SET {change} WHERE idem_key = $1 AND $2::text <> ''"
        )))
        .bind(&key)
        .bind(&other)
        .execute(&app.db.pool)
        .await
        .unwrap();
        assert_eq!(changed.rows_affected(), 1);
        let replay = app.create(&token, &key, &body).await;
        replay.assert_problem(503, "service-unavailable");
        assert!(
            !String::from_utf8_lossy(&replay.body).contains("dave"),
            "{change}"
        );
        assert_eq!(replay.header("idempotency-key-expires"), None, "{change}");
    }
    assert_eq!(app.count("orders").await, changes.len() as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_body_is_served_by_default_and_refused_once_the_operator_refuses_clear_records() {
    let db = crate::support::TestDb::new().await;
    let tenant = Uuid::new_v4();
    let body = json!({"sku": "CLEAR-1", "quantity": 1});
    let key = new_key();
    // A record stored before keys were turned on, or a clear body written into the
    // table: its answer in clear, no key id.
    let first = {
        let app = crate::support::spawn_app_on(db.handle().await, &[]).await;
        let reply = app.create(&app.token(tenant), &key, &body).await;
        assert_eq!(reply.status, 201);
        reply
    };
    // Keys on, clear records served (the default): the answer replays as it was.
    {
        let app =
            crate::support::spawn_app_on(db.handle().await, &[("ORDERD_RESPONSE_KEYS", K1)]).await;
        let replay = app.create(&app.token(tenant), &key, &body).await;
        assert_eq!((replay.status, &replay.body), (201, &first.body));
    }
    // Clear records refused: the same record is a 503, and nothing new is written.
    {
        let app = crate::support::spawn_app_on(
            db.handle().await,
            &[
                ("ORDERD_RESPONSE_KEYS", K1),
                ("ORDERD_RESPONSE_CLEAR", "refuse"),
            ],
        )
        .await;
        let replay = app.create(&app.token(tenant), &key, &body).await;
        replay.assert_problem(503, "service-unavailable");
        // A new answer is sealed, and replays.
        let fresh = new_key();
        let created = app.create(&app.token(tenant), &fresh, &body).await;
        assert_eq!(created.status, 201);
        let replayed = app.create(&app.token(tenant), &fresh, &body).await;
        assert_eq!(replayed.body, created.body);
    }
    let stored: Vec<(Option<String>, Option<i16>)> = sqlx::query_as(
        "SELECT response_key_id, response_seal_version FROM idempotency_record ORDER BY response_key_id NULLS FIRST",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(stored, [(None, None), (Some("k1".into()), Some(4))]);
    assert_eq!(db.count("orders").await, 2);
}

/// The stored layout and body of the record of `key`.
async fn stored_layout(
    db: &crate::support::TestDb,
    tenant: Uuid,
    key: &str,
) -> (Option<i16>, Vec<u8>) {
    sqlx::query_as(
        "SELECT response_seal_version, response_body FROM idempotency_record
         WHERE tenant_id = $1 AND idem_key = $2",
    )
    .bind(tenant)
    .bind(key)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// Stores the create of `key` again as a release sealing in layout `version` under
/// [`K1`] stored it: `body` (its answer) sealed to the row's whole stored answer.
async fn reseal_in_layout(
    db: &crate::support::TestDb,
    tenant: Uuid,
    key: &str,
    body: &[u8],
    version: i16,
) {
    let row: orderd::idempotency::store::SealedRecord = sqlx::query_as(
        "SELECT tenant_id, endpoint, idem_key, response_key_id, response_seal_version, response_body,
                response_status, response_location, response_content_type, resource_id, expires_at
         FROM idempotency_record WHERE tenant_id = $1 AND idem_key = $2",
    )
    .bind(tenant)
    .bind(key)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let old = sealer(K1)
        .seal_in_layout(row.binding(), body, version)
        .unwrap();
    let changed = sqlx::query(
        "UPDATE idempotency_record SET response_body = $1, response_seal_version = $2
         WHERE tenant_id = $3 AND idem_key = $4",
    )
    .bind(&old.bytes)
    .bind(version)
    .bind(tenant)
    .bind(key)
    .execute(&db.pool)
    .await
    .unwrap();
    assert_eq!(changed.rows_affected(), 1);
}

/// `orderd keys rewrap` with [`K1`] on `db`: it exits 0; its first line.
fn rewrap_k1(db: &crate::support::TestDb) -> String {
    let rewrap = std::process::Command::new(env!("CARGO_BIN_EXE_orderd"))
        .args(["keys", "rewrap"])
        .env("DATABASE_URL", &db.url)
        .env("ORDERD_RESPONSE_KEYS", K1)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&rewrap.stdout).into_owned();
    assert!(
        rewrap.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&rewrap.stderr)
    );
    stdout.lines().next().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_sealed_in_an_older_layout_is_served_until_refused_and_a_rewrap_moves_it() {
    let db = crate::support::TestDb::new().await;
    let tenant = Uuid::new_v4();
    let (key, body) = (new_key(), json!({"sku": "LAYOUT-1", "quantity": 1}));
    let keys = [("ORDERD_RESPONSE_KEYS", K1)];
    let refusing = [
        ("ORDERD_RESPONSE_KEYS", K1),
        ("ORDERD_RESPONSE_OLD_LAYOUTS", "refuse"),
    ];
    let first = {
        let app = crate::support::spawn_app_on(db.handle().await, &keys).await;
        app.create(&app.token(tenant), &key, &body).await
    };
    assert_eq!(first.status, 201);
    // The record as an older release stored it: layout 2, which does not bind the
    // expiry.
    reseal_in_layout(&db, tenant, &key, &first.body, 2).await;
    // Served by default, byte for byte.
    {
        let app = crate::support::spawn_app_on(db.handle().await, &keys).await;
        let replay = app.create(&app.token(tenant), &key, &body).await;
        assert_eq!((replay.status, &replay.body), (201, &first.body));
    }
    // Refused once the operator refuses older layouts.
    {
        let app = crate::support::spawn_app_on(db.handle().await, &refusing).await;
        let replay = app.create(&app.token(tenant), &key, &body).await;
        replay.assert_problem(503, "service-unavailable");
    }
    // A rewrap moves it to the current layout, and it is served again.
    rewrap_k1(&db);
    let (version, _) = stored_layout(&db, tenant, &key).await;
    assert_eq!(version, Some(orderd::idempotency::seal::SEAL_VERSION));
    let app = crate::support::spawn_app_on(db.handle().await, &refusing).await;
    let replay = app.create(&app.token(tenant), &key, &body).await;
    assert_eq!((replay.status, &replay.body), (201, &first.body));
    assert_eq!(db.count("orders").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_answers_get_a_key_of_their_own_and_layout_3_is_served_refused_then_moved_to_4() {
    let db = crate::support::TestDb::new().await;
    let tenant = Uuid::new_v4();
    let keys = [("ORDERD_RESPONSE_KEYS", K1)];
    let refusing = [
        ("ORDERD_RESPONSE_KEYS", K1),
        ("ORDERD_RESPONSE_OLD_LAYOUTS", "refuse"),
    ];
    let (key3, body3) = (
        new_key(),
        json!({"sku": "LAYOUT-3", "quantity": 1, "customer_ref": "erin"}),
    );
    let (key4, body4) = (
        new_key(),
        json!({"sku": "LAYOUT-4", "quantity": 2, "customer_ref": "frank"}),
    );
    let (old, new) = {
        let app = crate::support::spawn_app_on(db.handle().await, &keys).await;
        let token = app.token(tenant);
        (
            app.create(&token, &key3, &body3).await,
            app.create(&token, &key4, &body4).await,
        )
    };
    assert_eq!((old.status, new.status), (201, 201));
    // This release stores layout 4: a 256-bit salt, the ciphertext, the 16-byte tag.
    let mut salts = Vec::new();
    for (key, answer) in [(&key3, &old), (&key4, &new)] {
        let (version, stored) = stored_layout(&db, tenant, key).await;
        assert_eq!(version, Some(4));
        assert_eq!(stored.len(), 32 + answer.body.len() + 16);
        salts.push(stored[..32].to_vec());
    }
    assert_ne!(salts[0], salts[1]);
    // One record as the release before stored it: layout 3, a random nonce under k1.
    reseal_in_layout(&db, tenant, &key3, &old.body, 3).await;
    let (version, as_3) = stored_layout(&db, tenant, &key3).await;
    assert_eq!((version, as_3.len()), (Some(3), 12 + old.body.len() + 16));
    // Served by default, byte for byte, beside the new one.
    {
        let app = crate::support::spawn_app_on(db.handle().await, &keys).await;
        let token = app.token(tenant);
        let replay = app.create(&token, &key3, &body3).await;
        assert_eq!((replay.status, &replay.body), (201, &old.body));
        assert_eq!(replay.header("location"), old.header("location"));
        let replay = app.create(&token, &key4, &body4).await;
        assert_eq!((replay.status, &replay.body), (201, &new.body));
    }
    // Older layouts refused: layout 3 is a 503 that shows nothing of the answer, and
    // layout 4 still replays.
    {
        let app = crate::support::spawn_app_on(db.handle().await, &refusing).await;
        let token = app.token(tenant);
        let refused = app.create(&token, &key3, &body3).await;
        refused.assert_problem(503, "service-unavailable");
        assert!(!String::from_utf8_lossy(&refused.body).contains("erin"));
        let replay = app.create(&token, &key4, &body4).await;
        assert_eq!((replay.status, &replay.body), (201, &new.body));
    }
    // A rewrap moves the layout-3 record, and only it, to layout 4 under a salt of its
    // own; then it replays, byte for byte, with older layouts refused.
    let said = rewrap_k1(&db);
    assert!(
        said.starts_with("resealed 1 stored responses under key `k1` (0 of them"),
        "{said}"
    );
    let (version, moved) = stored_layout(&db, tenant, &key3).await;
    assert_eq!((version, moved.len()), (Some(4), 32 + old.body.len() + 16));
    assert!(!salts.contains(&moved[..32].to_vec()));
    let app = crate::support::spawn_app_on(db.handle().await, &refusing).await;
    let token = app.token(tenant);
    let replay = app.create(&token, &key3, &body3).await;
    assert_eq!((replay.status, &replay.body), (201, &old.body));
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );
    let replay = app.create(&token, &key4, &body4).await;
    assert_eq!((replay.status, &replay.body), (201, &new.body));
    assert_eq!(db.count("orders").await, 2);
}
