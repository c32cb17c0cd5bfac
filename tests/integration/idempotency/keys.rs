//! Each row of the idempotency table of docs/contract.md §4, one test each, plus the
//! ownership rules: fencing, takeover, release on failure, retention.

use serde_json::json;
use uuid::Uuid;

use crate::support::{
    TestApp, TestDb, create_fingerprint, new_key, order_body, post_order, spawn_app, spawn_app_with,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_key_creates_the_order_and_stores_its_response() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let reply = app
        .create(
            &token,
            &new_key(),
            &json!({"sku": "ABC-1", "quantity": 2, "customer_ref": "c-9"}),
        )
        .await;

    assert_eq!(reply.status, 201);
    let order = reply.json();
    assert_eq!(order["sku"], "ABC-1");
    assert_eq!(order["quantity"], 2);
    assert_eq!(order["customer_ref"], "c-9");
    assert_eq!(order["status"], "CREATED");
    assert_eq!(
        reply.header("location"),
        Some(format!("/v1/orders/{}", order["id"].as_str().unwrap()))
    );
    assert_eq!(reply.header("idempotent-replayed"), None);
    assert_eq!(
        (app.count("orders").await, app.count("outbox_event").await),
        (1, 1)
    );
    let (state, status, body): (String, i16, Vec<u8>) =
        sqlx::query_as("SELECT state, response_status, response_body FROM idempotency_record")
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), status), ("COMPLETED", 201));
    assert_eq!(
        body, reply.body,
        "the stored body is the body that was sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_key_with_the_same_request_replays_byte_for_byte() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let key = new_key();
    let first = app.create(&token, &key, &order_body("SKU-1", 3)).await;
    let again = app.create(&token, &key, &order_body("SKU-1", 3)).await;

    assert_eq!(first.status, 201);
    assert_eq!(again.status, 201);
    assert_eq!(again.body, first.body);
    assert_eq!(again.header("location"), first.header("location"));
    assert_eq!(again.header("content-type"), first.header("content-type"));
    assert_eq!(again.header("idempotent-replayed").as_deref(), Some("true"));
    assert_eq!(
        (app.count("orders").await, app.count("outbox_event").await),
        (1, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_key_with_a_different_request_is_422() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let key = new_key();
    assert_eq!(
        app.create(&token, &key, &order_body("SKU-1", 3))
            .await
            .status,
        201
    );
    app.create(&token, &key, &order_body("SKU-1", 4))
        .await
        .assert_problem(422, "idempotency-key-reused");
    assert_eq!(app.count("orders").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processing_key_with_a_different_request_is_422() {
    let app = spawn_app().await;
    let tenant = Uuid::new_v4();
    let key = new_key();
    app.db
        .insert_processing(tenant, &key, &[0u8; 32], "30 seconds", DEAD_OWNER)
        .await;
    app.create(&app.token(tenant), &key, &order_body("SKU-1", 1))
        .await
        .assert_problem(422, "idempotency-key-reused");
    assert_eq!(app.count("orders").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processing_key_with_a_valid_lease_answers_409_with_a_short_retry_after() {
    let app = spawn_app().await;
    let tenant = Uuid::new_v4();
    let key = new_key();
    let body = order_body("SKU-1", 1);
    app.db
        .insert_processing(
            tenant,
            &key,
            &create_fingerprint(&body),
            "30 seconds",
            DEAD_OWNER,
        )
        .await;

    let reply = app.create(&app.token(tenant), &key, &body).await;
    reply.assert_problem(409, "idempotency-key-in-flight");
    let retry_after: u64 = reply
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
    assert_eq!(app.count("orders").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_twin_that_finishes_within_the_wait_is_replayed() {
    let app = spawn_app_with(&[("ORDERD_INFLIGHT_WAIT_MS", "5000")]).await;
    let tenant = Uuid::new_v4();
    let key = new_key();
    let body = order_body("SKU-1", 1);
    app.db
        .insert_processing(
            tenant,
            &key,
            &create_fingerprint(&body),
            "30 seconds",
            DEAD_OWNER,
        )
        .await;

    // The "owner" completes 300 ms later, while our request waits.
    let pool = app.db.pool.clone();
    let stored = br#"{"stored":"by the owner"}"#.to_vec();
    let finisher = tokio::spawn({
        let stored = stored.clone();
        async move {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            sqlx::query(
                "UPDATE idempotency_record SET state = 'COMPLETED', response_status = 201,
                   response_body = $1, response_content_type = 'application/json; charset=utf-8',
                   response_location = '/v1/orders/x', completed_at = now(), expires_at = now() + interval '1 day',
                   lease_until = NULL",
            )
            .bind(stored)
            .execute(&pool)
            .await
            .unwrap();
        }
    });
    let reply = app.create(&app.token(tenant), &key, &body).await;
    finisher.await.unwrap();
    assert_eq!(reply.status, 201);
    assert_eq!(reply.body, stored);
    assert_eq!(reply.header("idempotent-replayed").as_deref(), Some("true"));
    assert_eq!(
        app.count("orders").await,
        0,
        "the waiting request never executed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processing_key_whose_lease_expired_is_taken_over_and_completed_once() {
    let app = spawn_app().await;
    let tenant = Uuid::new_v4();
    let key = new_key();
    let body = order_body("SKU-1", 1);
    // Left behind by a worker that was killed after its claim.
    app.db
        .insert_processing(
            tenant,
            &key,
            &create_fingerprint(&body),
            "-1 second",
            DEAD_OWNER,
        )
        .await;

    let first = app.create(&app.token(tenant), &key, &body).await;
    assert_eq!(first.status, 201);
    let again = app.create(&app.token(tenant), &key, &body).await;
    assert_eq!(again.body, first.body);
    assert_eq!(
        (app.count("orders").await, app.count("outbox_event").await),
        (1, 1)
    );
    let owner: Option<Uuid> = sqlx::query_scalar("SELECT owner_token FROM idempotency_record")
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert_ne!(
        owner,
        Some(DEAD_OWNER),
        "the takeover replaced the owner token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_that_lost_its_lease_rolls_back_and_is_told_409() {
    let app = spawn_app_with(&[("ORDERD_LEASE_SECS", "1"), ("ORDERD_INFLIGHT_WAIT_MS", "0")]).await;
    let token = app.token(Uuid::new_v4());
    let key = new_key();
    let body = order_body("SKU-1", 1);

    // Stall every order insert by holding a lock on the table from the test, on every
    // node (on Citus the insert runs on the tenant's).
    let blocker = app.db.lock_everywhere("orders").await;

    // A claims the key and blocks on its insert.
    let a = tokio::spawn({
        let (app_base, token, key, body) =
            (app.base.clone(), token.clone(), key.clone(), body.clone());
        async move { post(&app_base, &token, &key, &body).await }
    });
    wait_for_claim(&app).await;
    // A's lease runs out; B takes the key over and blocks on its insert too.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let b = tokio::spawn({
        let (app_base, token, key, body) =
            (app.base.clone(), token.clone(), key.clone(), body.clone());
        async move { post(&app_base, &token, &key, &body).await }
    });
    wait_for_owner_change(&app).await;
    blocker.release().await;

    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(
        statuses,
        [201, 409],
        "exactly one owner commits: A={} B={}",
        a.0,
        b.0
    );
    assert_eq!(a.0, 409, "A lost its lease, so A is the one refused");
    assert_eq!(
        (app.count("orders").await, app.count("outbox_event").await),
        (1, 1)
    );
    let replay = app.create(&token, &key, &body).await;
    assert_eq!(replay.body, b.1, "the key holds B's answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_statement_whose_fence_no_longer_holds_writes_nothing() {
    use orderd::{
        idempotency::{Fence, IdempotencyKey, Scope, StoredResponse},
        orders::{NewOrder, Order, store},
        service::Endpoint,
        tenant::TenantId,
    };
    let db = TestDb::new().await;
    let tenant = Uuid::new_v4();
    let key = new_key();
    // The key belongs to another request (it took the key over from this one).
    let current_owner = Uuid::new_v4();
    db.insert_processing(tenant, &key, &[7; 32], "30 seconds", current_owner)
        .await;
    let scope = Scope {
        tenant: TenantId(tenant),
        endpoint: Endpoint::CreateOrder.as_str(),
        key: IdempotencyKey::parse(Some(&key)).unwrap(),
    };
    let new = NewOrder::parse(
        serde_json::json!({"sku": "SKU-1", "quantity": 1})
            .as_object()
            .unwrap(),
    )
    .unwrap();
    let response = StoredResponse {
        status: 201,
        location: None,
        content_type: Some("application/json".into()),
        body: b"{}".to_vec().into(),
        resource: None,
    };
    let mut fence = Fence {
        scope: &scope,
        owner: Uuid::new_v4(),
        ttl_secs: 60,
        at: chrono::Utc::now(),
        sealer: &orderd::idempotency::seal::Sealer::PLAIN,
    };
    let order = Order::created(&new, fence.at);
    let mut conn = db.pool.acquire().await.unwrap();

    let written = store::create(
        &mut orderd::db::Sql::direct(&mut conn),
        &fence,
        &response,
        &order,
        None,
    )
    .await
    .unwrap();
    assert!(!written, "a stale owner's statement reports the lost fence");
    assert_eq!(
        (db.count("orders").await, db.count("outbox_event").await),
        (0, 0),
        "and wrote no order and no event"
    );
    let (state, owner): (String, Uuid) =
        sqlx::query_as("SELECT state, owner_token FROM idempotency_record")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), owner), ("PROCESSING", current_owner));

    // The current owner's statement writes all three at once.
    fence.owner = current_owner;
    let written = store::create(
        &mut orderd::db::Sql::direct(&mut conn),
        &fence,
        &response,
        &order,
        None,
    )
    .await
    .unwrap();
    assert!(written);
    assert_eq!(
        (db.count("orders").await, db.count("outbox_event").await),
        (1, 1)
    );
    let (state, body): (String, Vec<u8>) =
        sqlx::query_as("SELECT state, response_body FROM idempotency_record")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), body), ("COMPLETED", b"{}".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unexpected_failure_releases_the_key_so_a_retry_succeeds() {
    let app = spawn_app().await;
    // The database refuses the order insert, as if it failed mid-request (a
    // constraint rather than a trigger: a distributed table takes no trigger).
    sqlx::raw_sql(
        "ALTER TABLE orders ADD CONSTRAINT injected_failure CHECK (sku <> 'SKU-1') NOT VALID",
    )
    .execute(&app.db.pool)
    .await
    .unwrap();
    let token = app.token(Uuid::new_v4());
    let key = new_key();

    let failed = app.create(&token, &key, &order_body("SKU-1", 1)).await;
    sqlx::raw_sql("ALTER TABLE orders DROP CONSTRAINT injected_failure")
        .execute(&app.db.pool)
        .await
        .unwrap();
    failed.assert_problem(500, "internal-error");
    assert!(
        !String::from_utf8_lossy(&failed.body).contains("injected"),
        "no internal detail leaks"
    );
    // The release runs right after the response; give it a moment.
    for _ in 0..100 {
        if app.count("idempotency_record").await == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        app.count("idempotency_record").await,
        0,
        "the claim was released"
    );
    assert_eq!(
        (app.count("orders").await, app.count("outbox_event").await),
        (0, 0)
    );

    let retry = app.create(&token, &key, &order_body("SKU-1", 1)).await;
    assert_eq!(retry.status, 201);
    assert_eq!(retry.header("idempotent-replayed"), None);
    assert_eq!(
        (app.count("orders").await, app.count("outbox_event").await),
        (1, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_past_its_retention_is_a_new_request() {
    // The record is expired by hand below, which a cached copy would not know about:
    // the cache is off here, and tests/integration/idempotency/replay_cache.rs lets time pass instead.
    let app = spawn_app_with(&[("ORDERD_REPLAY_CACHE_BYTES", "0")]).await;
    let token = app.token(Uuid::new_v4());
    let key = new_key();
    assert_eq!(
        app.create(&token, &key, &order_body("SKU-1", 1))
            .await
            .status,
        201
    );
    sqlx::query(
        "UPDATE idempotency_record SET expires_at = statement_timestamp() - interval '1 second'",
    )
    .execute(&app.db.pool)
    .await
    .unwrap();

    // Even a different body is no conflict any more: the key is forgotten.
    let reply = app.create(&token, &key, &order_body("SKU-2", 5)).await;
    assert_eq!(reply.status, 201);
    assert_eq!(reply.header("idempotent-replayed"), None);
    assert_eq!(reply.json()["sku"], "SKU-2");
    assert_eq!(app.count("orders").await, 2);
    assert_eq!(app.count("idempotency_record").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_completed_ttl_setting_decides_expiry() {
    let app = spawn_app_with(&[("ORDERD_IDEMPOTENCY_TTL_SECS", "7")]).await;
    let token = app.token(Uuid::new_v4());
    assert_eq!(
        app.create(&token, &new_key(), &order_body("SKU-1", 1))
            .await
            .status,
        201
    );
    // The TTL runs from the claim, the instant the request came to own the key (the
    // completion comes later: a hop later on a distributed database).
    let secs: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM expires_at - created_at)::float8 FROM idempotency_record",
    )
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    assert_eq!(secs, 7.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equivalent_json_replays_and_any_changed_value_is_422() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let key = new_key();
    let first = app
        .create_raw(
            &token,
            Some(&key),
            br#"{"sku":"AB-1","quantity":2}"#.to_vec(),
        )
        .await;
    assert_eq!(first.status, 201);

    for same in [
        "{ \"quantity\" : 2 ,\n\t\"sku\" : \"AB-1\" }",
        r#"{"sku":"\u0041B-1","quantity":2}"#,
        r#"{"sku":"AB-1","quantity":2,"customer_ref":null}"#,
    ] {
        let reply = app
            .create_raw(&token, Some(&key), same.as_bytes().to_vec())
            .await;
        assert_eq!(reply.status, 201, "{same}");
        assert_eq!(reply.body, first.body, "{same}");
        assert_eq!(reply.header("idempotent-replayed").as_deref(), Some("true"));
    }
    for changed in [
        r#"{"sku":"AB-1","quantity":3}"#,
        r#"{"sku":"AB-2","quantity":2}"#,
        r#"{"sku":"ab-1","quantity":2}"#,
        r#"{"sku":"AB-1","quantity":2,"customer_ref":"x"}"#,
        r#"{"sku":"AB-1","quantity":2,"customer_ref":""}"#,
    ] {
        app.create_raw(&token, Some(&key), changed.as_bytes().to_vec())
            .await
            .assert_problem(422, "idempotency-key-reused");
    }
    assert_eq!(app.count("orders").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_an_unknown_order_is_stored_and_replayed_like_a_success() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let key = new_key();
    let missing = Uuid::new_v4().to_string();
    let first = app.cancel(&token, &key, &missing).await;
    first.assert_problem(404, "not-found");
    let again = app.cancel(&token, &key, &missing).await;
    assert_eq!(again.status, 404);
    assert_eq!(again.body, first.body);
    assert_eq!(again.header("idempotent-replayed").as_deref(), Some("true"));
    assert_eq!(
        again.header("content-type").as_deref(),
        Some("application/problem+json")
    );
    let state: String = sqlx::query_scalar("SELECT state FROM idempotency_record")
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert_eq!(state, "COMPLETED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_fails_validation_stores_nothing() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let key = new_key();
    app.create(&token, &key, &order_body("SKU-1", 0))
        .await
        .assert_problem(400, "validation-error");
    assert_eq!(app.count("idempotency_record").await, 0);
    // The key is still free for a valid request.
    assert_eq!(
        app.create(&token, &key, &order_body("SKU-1", 1))
            .await
            .status,
        201
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_for_two_tenants_or_two_endpoints_names_unrelated_operations() {
    let app = spawn_app().await;
    let (t1, t2) = (app.token(Uuid::new_v4()), app.token(Uuid::new_v4()));
    let key = new_key();
    let a = app.create(&t1, &key, &order_body("SKU-1", 1)).await;
    let b = app.create(&t2, &key, &order_body("SKU-1", 1)).await;
    assert_eq!((a.status, b.status), (201, 201));
    assert_ne!(a.json()["id"], b.json()["id"]);
    assert_eq!(b.header("idempotent-replayed"), None);

    // The create key reused on cancel is a fresh cancel, not a 422.
    let id = a.json()["id"].as_str().unwrap().to_string();
    let cancelled = app.cancel(&t1, &key, &id).await;
    assert_eq!(cancelled.status, 200);
    assert_eq!(cancelled.json()["status"], "CANCELLED");
    assert_eq!(app.count("orders").await, 2);
    assert_eq!(app.count("idempotency_record").await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoted_and_bare_keys_and_uuid_spellings_name_the_same_operation() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let body = order_body("SKU-1", 1);
    let first = app.create(&token, "plain-token-key-0001", &body).await;
    let quoted = app.create(&token, "\"plain-token-key-0001\"", &body).await;
    assert_eq!(quoted.body, first.body);
    assert_eq!(
        quoted.header("idempotent-replayed").as_deref(),
        Some("true")
    );

    let uuid = Uuid::new_v4();
    let lower = app.create(&token, &uuid.to_string(), &body).await;
    let upper = app
        .create(&token, &uuid.to_string().to_uppercase(), &body)
        .await;
    assert_eq!(upper.body, lower.body);
    assert_eq!(upper.header("idempotent-replayed").as_deref(), Some("true"));
    // Non-UUID tokens are case-sensitive.
    let other = app.create(&token, "PLAIN-TOKEN-KEY-0001", &body).await;
    assert_eq!(other.header("idempotent-replayed"), None);
    assert_eq!(app.count("orders").await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_or_missing_keys_are_refused_before_anything_is_stored() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let body = serde_json::to_vec(&order_body("SKU-1", 1)).unwrap();
    app.create_raw(&token, None, body.clone())
        .await
        .assert_problem(400, "idempotency-key-missing");
    for bad in [
        "short-15-chars-x".get(..15).unwrap(),
        &"k".repeat(129),
        "has spaces in the key",
        "semi;colon;key;value",
        "\"unbalanced-quote-key",
    ] {
        app.create_raw(&token, Some(bad), body.clone())
            .await
            .assert_problem(400, "idempotency-key-invalid");
    }
    let cancel = app
        .cancel(&token, "short", &Uuid::new_v4().to_string())
        .await;
    cancel.assert_problem(400, "idempotency-key-invalid");
    assert_eq!(
        (
            app.count("orders").await,
            app.count("idempotency_record").await
        ),
        (0, 0)
    );
}

const DEAD_OWNER: Uuid = Uuid::from_u128(0xdead);

/// Waits until the first request has claimed its key.
async fn wait_for_claim(app: &TestApp) {
    app.db
        .until_count("SELECT count(*) FROM idempotency_record", 1)
        .await;
}

/// Waits until both requests are stuck on the locked `orders` table: in the create's
/// statement, or on Citus in its call.
async fn wait_for_owner_change(app: &TestApp) {
    app.db
        .until_count(
            &format!(
                "{} AND (query LIKE '%INSERT INTO orders%' OR query LIKE '%orderd_create(%')",
                app.db.lock_waiters()
            ),
            2,
        )
        .await;
}

async fn post(base: &str, token: &str, key: &str, body: &serde_json::Value) -> (u16, Vec<u8>) {
    let response = post_order(base, token, key, body, None).await;
    (
        response.status().as_u16(),
        response.bytes().await.unwrap().to_vec(),
    )
}

/// A takeover whose compare-and-set keeps failing after the read said the lease had
/// run out: what happens on Citus while the worker whose clock read the lease is ahead
/// of the coordinator's, which judges the takeover. Here a trigger refuses every
/// takeover and counts them (Citus takes no trigger on a distributed table, so the
/// test runs on one server). The request keeps within the in-flight wait, pausing
/// between looks, and answers 409 with `Retry-After`; it does not loop at full speed
/// for as long as the clocks disagree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_that_keeps_losing_answers_409_within_the_in_flight_wait() {
    if crate::support::on_citus() {
        return;
    }
    let app = spawn_app_with(&[("ORDERD_INFLIGHT_WAIT_MS", "300")]).await;
    let tenant = Uuid::new_v4();
    let key = new_key();
    let body = order_body("SKU-1", 1);
    app.db
        .insert_processing(
            tenant,
            &key,
            &create_fingerprint(&body),
            "-1 second",
            DEAD_OWNER,
        )
        .await;
    for statement in [
        "CREATE TABLE takeover_attempts (n int NOT NULL)",
        "INSERT INTO takeover_attempts VALUES (0)",
        "CREATE FUNCTION refuse_takeover() RETURNS trigger LANGUAGE plpgsql AS
         $$ BEGIN UPDATE takeover_attempts SET n = n + 1; RETURN NULL; END $$",
        "CREATE TRIGGER refuse_takeover BEFORE UPDATE ON idempotency_record
         FOR EACH ROW EXECUTE FUNCTION refuse_takeover()",
    ] {
        sqlx::query(statement).execute(&app.db.pool).await.unwrap();
    }
    // A hang detector, far past any wait orderd keeps.
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .unwrap();
    let response = client
        .post(format!("{}/v1/orders", app.base))
        .bearer_auth(app.token(tenant))
        .header("Idempotency-Key", &key)
        .json(&body)
        .send()
        .await
        .expect("the request answers");
    let reply = crate::support::Reply::read(response).await;
    reply.assert_problem(409, "idempotency-key-in-flight");
    assert!(reply.header("retry-after").is_some());
    let attempts: i32 = sqlx::query_scalar("SELECT n FROM takeover_attempts")
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    println!("{attempts} takeover attempts within a 300 ms in-flight wait");
    assert!(
        (1..=20).contains(&attempts),
        "{attempts} takeover attempts: a pause between them"
    );
    assert_eq!(app.count("orders").await, 0);
}
