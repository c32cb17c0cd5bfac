//! The hot-path statements use the indexes they were designed for: EXPLAIN of the very
//! statements the code runs (their SQL constants, with typical parameters), on tables
//! big enough that the planner would rather not scan them.

use orderd::{
    idempotency::{IdempotencyKey, store as idem},
    orders::store as orders,
    outbox::store as outbox,
    reconcile,
    service::Endpoint,
    tenant::TenantId,
};
use sqlx::{Postgres, postgres::PgArguments, query::Query};
use uuid::Uuid;

use crate::support::TestDb;

/// `EXPLAIN` of `sql`, with the parameters `bind` adds.
async fn plan<'q>(
    db: &TestDb,
    sql: &str,
    bind: impl FnOnce(Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments>,
) -> String {
    let query = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")));
    let rows: Vec<String> = bind(query)
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .into_iter()
        .map(|row| sqlx::Row::get(&row, 0))
        .collect();
    rows.join("\n")
}

const TENANT: Uuid = Uuid::from_u128(1);

async fn seeded() -> TestDb {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "INSERT INTO idempotency_record (tenant_id, endpoint, idem_key, fingerprint, state, owner_token, lease_until,
                                         response_status, response_body, created_at, completed_at, expires_at)
         SELECT gen_random_uuid(), 'POST /v1/orders', 'key-' || g, sha256(g::text::bytea),
                CASE WHEN g % 50 = 0 THEN 'PROCESSING' ELSE 'COMPLETED' END,
                CASE WHEN g % 50 = 0 THEN gen_random_uuid() END,
                CASE WHEN g % 50 = 0 THEN now() + interval '30 seconds' END,
                CASE WHEN g % 50 = 0 THEN NULL ELSE 201 END,
                CASE WHEN g % 50 = 0 THEN NULL ELSE '\\x7b7d'::bytea END,
                now(), now(),
                CASE WHEN g % 50 = 0 THEN NULL ELSE now() + (g % 1000) * interval '1 minute' END
         FROM generate_series(1, 20000) g;
         INSERT INTO orders (tenant_id, id, sku, quantity, status, created_at, updated_at)
         SELECT ('00000000-0000-0000-0000-0000000000' || lpad((g % 50)::text, 2, '0'))::uuid, gen_random_uuid(), 'S', 1, 'CREATED',
                now() - g * interval '1 second', now()
         FROM generate_series(1, 20000) g;
         INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload,
                                   occurred_at, next_attempt_at, status, published_at)
         SELECT tenant_id, gen_random_uuid(), id, 1, 'OrderCreated', '{}', now(), now(), 'PUBLISHED', now()
         FROM orders;
         ANALYZE idempotency_record; ANALYZE orders; ANALYZE outbox_event;",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    db
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_replay_purge_and_list_statements_use_their_indexes() {
    if crate::support::one_server_only(
        "EXPLAIN of one server's plans; on Citus each shard is planned on its worker (database::citus checks the routing)",
    ) {
        return;
    }
    let db = seeded().await;
    let endpoint = Endpoint::CreateOrder.as_str();
    let claim = plan(&db, idem::CLAIM_OR_READ, |q| {
        q.bind(TENANT)
            .bind(endpoint)
            .bind("key-1")
            .bind(vec![0u8; 32])
            .bind(Uuid::new_v4())
            .bind(30_000i64)
    })
    .await;
    assert!(
        claim.contains("Conflict Arbiter Indexes: idempotency_record_pkey"),
        "{claim}"
    );
    for (name, sql) in [("read", idem::READ), ("release", idem::RELEASE)] {
        let by_key = plan(&db, sql, |q| {
            let q = q.bind(TENANT).bind(endpoint).bind("key-1");
            if name == "release" {
                q.bind(Uuid::new_v4())
            } else {
                q
            }
        })
        .await;
        assert!(
            by_key.contains("idempotency_record_pkey"),
            "{name}: {by_key}"
        );
    }
    // The completion's parameters, bound as the code binds them.
    let scope = idem::Scope {
        tenant: TenantId(TENANT),
        endpoint: Endpoint::CreateOrder.as_str(),
        key: IdempotencyKey::parse(Some("key-0000000000000001")).unwrap(),
    };
    let fence = idem::Fence {
        scope: &scope,
        owner: Uuid::new_v4(),
        ttl_secs: 60,
        at: chrono::Utc::now(),
        sealer: &orderd::idempotency::seal::Sealer::PLAIN,
    };
    let response = orderd::idempotency::StoredResponse {
        status: 201,
        location: None,
        content_type: None,
        body: vec![0u8].into(),
        resource: None,
    };
    let completion = idem::Completion::new(&fence, &response).unwrap();
    let complete = plan(&db, &idem::COMPLETE, |q| completion.clone().bind(q)).await;
    assert!(complete.contains("idempotency_record_pkey"), "{complete}");
    // A create completes its record by key in the same statement.
    // The order's six values, then the event row's nine.
    let order_id = Uuid::new_v4();
    let create = plan(&db, &orders::CREATE, |q| {
        completion
            .clone()
            .bind(q)
            .bind(TENANT)
            .bind(order_id)
            .bind("SKU-1")
            .bind(1i32)
            .bind(None::<String>)
            .bind(chrono::Utc::now())
            .bind(TENANT)
            .bind(Uuid::new_v4())
            .bind(order_id)
            .bind(1i32)
            .bind("OrderCreated")
            .bind(serde_json::json!({}))
            .bind(chrono::Utc::now())
            .bind(None::<String>)
            .bind(None::<String>)
    })
    .await;
    assert!(create.contains("idempotency_record_pkey"), "{create}");

    assert_idempotency_purges_use_their_indexes(&db).await;

    let first = plan(&db, orders::LIST_FIRST, |q| q.bind(TENANT).bind(21i64)).await;
    assert!(first.contains("orders_tenant_newest"), "{first}");
    let after = plan(&db, orders::LIST_AFTER, |q| {
        q.bind(TENANT)
            .bind(chrono::Utc::now())
            .bind(Uuid::nil())
            .bind(21i64)
    })
    .await;
    assert!(after.contains("orders_tenant_newest"), "{after}");

    let epoch = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
    let orders = plan(&db, reconcile::ORDERS_PAGE_SQL, |q| {
        q.bind(86_400f64)
            .bind(epoch)
            .bind(Uuid::nil())
            .bind(Uuid::nil())
            .bind(1000i64)
    })
    .await;
    assert!(
        orders.contains("Index Scan using orders_updated"),
        "{orders}"
    );
    let page = (vec![Uuid::new_v4(); 100], vec![Uuid::new_v4(); 100]);
    let events = plan(&db, reconcile::EVENTS_OF_PAGE, |q| {
        q.bind(page.0.clone())
            .bind(page.1.clone())
            .bind(vec![1i32; 100])
            .bind(vec!["OrderCreated"; 100])
    })
    .await;
    assert!(
        events.contains("outbox_event_tenant_id_aggregate_id_aggregate_seq_key"),
        "{events}"
    );
    let keys = plan(&db, reconcile::KEYS_PAGE_SQL, |q| {
        q.bind(epoch)
            .bind(Uuid::nil())
            .bind("")
            .bind("")
            .bind(1000i64)
    })
    .await;
    assert!(keys.contains("idempotency_record_expired"), "{keys}");
    let named = plan(&db, reconcile::ORDERS_OF_PAGE, |q| {
        q.bind(page.0.clone()).bind(page.1.clone())
    })
    .await;
    assert!(named.contains("orders_pkey"), "{named}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_claim_and_the_outbox_gauges_stay_on_partial_indexes_among_many_published_rows() {
    if crate::support::one_server_only(
        "EXPLAIN of one server's plans; on Citus each shard is planned on its worker (database::citus checks the routing)",
    ) {
        return;
    }
    let db = TestDb::new().await;
    // 200,000 published rows, a handful pending and dead: the shape of a healthy outbox.
    sqlx::raw_sql(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at,
                                   next_attempt_at, status, published_at)
         SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 1, 'OrderCreated', '{}', now(), now(),
                CASE WHEN g % 20000 = 0 THEN 'PENDING' WHEN g % 50000 = 1 THEN 'DEAD' ELSE 'PUBLISHED' END,
                CASE WHEN g % 20000 = 0 OR g % 50000 = 1 THEN NULL ELSE now() END
         FROM generate_series(1, 200000) g;
         ANALYZE outbox_event;",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let stats = plan(&db, outbox::STATS, |q| q).await;
    assert!(!stats.contains("Seq Scan"), "{stats}");
    assert!(
        stats.contains("outbox_event_pending") && stats.contains("outbox_event_dead"),
        "{stats}"
    );

    let look = look_plan(&db).await;
    // A handful of pending rows: any partial index of pending rows will do.
    assert!(!look.contains("Seq Scan"), "{look}");
    assert!(look.contains("outbox_event_pending"), "{look}");
    let claim = claim_plan(&db).await;
    assert!(
        !claim.contains("Seq Scan") && !claim.contains("Tid"),
        "{claim}"
    );

    let dead = plan(&db, outbox::DEAD_TENANTS, |q| q).await;
    assert!(!dead.contains("Seq Scan"), "{dead}");
    // Either index that starts with the tenant will do for one tenant's DEAD rows.
    let redrive = plan(&db, outbox::REDRIVE_TENANT, |q| q.bind(TENANT)).await;
    assert!(!redrive.contains("Seq Scan"), "{redrive}");
    assert_outbox_purge_uses_its_indexes(&db).await;
}

/// The purge of published events: the oldest found by their partial index, then each
/// tenant's deleted by primary key.
async fn assert_outbox_purge_uses_its_indexes(db: &TestDb) {
    let oldest = plan(db, outbox::PURGEABLE_PUBLISHED, |q| {
        q.bind(86_400i64).bind(1000i64)
    })
    .await;
    assert!(oldest.contains("outbox_event_published"), "{oldest}");
    assert!(!oldest.contains("Seq Scan"), "{oldest}");
    let purge = plan(db, outbox::PURGE_PUBLISHED, |q| {
        q.bind(TENANT)
            .bind(vec![Uuid::new_v4(), Uuid::new_v4()])
            .bind(chrono::Utc::now())
    })
    .await;
    assert!(purge.contains("outbox_event_pkey"), "{purge}");
    assert!(!purge.contains("Seq Scan"), "{purge}");
}

/// The purges of expired keys and abandoned claims: the oldest found by their partial
/// indexes, then each tenant's deleted by primary key.
async fn assert_idempotency_purges_use_their_indexes(db: &TestDb) {
    let expired = plan(db, &idem::PURGEABLE_EXPIRED, |q| q.bind(1000i64)).await;
    assert!(expired.contains("idempotency_record_expired"), "{expired}");
    let abandoned = plan(db, &idem::PURGEABLE_ABANDONED, |q| {
        q.bind(3600i64).bind(1000i64)
    })
    .await;
    assert!(
        abandoned.contains("idempotency_record_abandoned"),
        "{abandoned}"
    );
    for delete in [&*idem::PURGE_EXPIRED, &*idem::PURGE_ABANDONED] {
        let purge = plan(db, delete, |q| {
            q.bind(TENANT)
                .bind(vec!["POST /v1/orders".to_string(); 2])
                .bind(vec!["key-1".to_string(), "key-2".to_string()])
                .bind(chrono::Utc::now())
        })
        .await;
        assert!(purge.contains("idempotency_record_pkey"), "{purge}");
        assert!(!purge.contains("Seq Scan"), "{purge}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_export_erasure_and_rewrap_walk_the_keys_the_tenant_leads() {
    if crate::support::one_server_only(
        "EXPLAIN of one server's plans; on Citus each shard is planned on its worker (database::citus checks the routing)",
    ) {
        return;
    }
    let db = seeded().await;
    // A page smaller than the tenant, as an export of a large tenant reads them (with
    // a page larger than all of a small tenant's orders, sorting them is cheaper).
    let first = plan(&db, orders::EXPORT_FIRST, |q| q.bind(TENANT).bind(50i64)).await;
    assert!(first.contains("orders_tenant_newest"), "{first}");
    let after = plan(&db, orders::EXPORT_AFTER, |q| {
        q.bind(TENANT)
            .bind(chrono::Utc::now() - chrono::TimeDelta::hours(1))
            .bind(Uuid::nil())
            .bind(50i64)
    })
    .await;
    assert!(after.contains("orders_tenant_newest"), "{after}");
    // By primary key, both to find a batch and to delete it: no row address.
    for (sql, index) in [
        (orders::ERASE_TENANT_BATCH, "orders_pkey"),
        (idem::ERASE_TENANT_BATCH, "idempotency_record_pkey"),
        (outbox::ERASE_TENANT_BATCH, "outbox_event_pkey"),
    ] {
        // The events' batch also takes the relays' lease.
        let with_lease = sql == outbox::ERASE_TENANT_BATCH;
        let erase = plan(&db, sql, |q| {
            let q = q.bind(TENANT).bind(1000i64);
            if with_lease { q.bind(16_000i64) } else { q }
        })
        .await;
        assert!(!erase.contains("Seq Scan"), "{erase}");
        assert!(!erase.contains("Tid Scan"), "{erase}");
        assert!(erase.contains(index), "{erase}");
    }
    let next = plan(&db, idem::NEXT_TENANT_NOT_SEALED, |q| {
        q.bind("k2").bind(2i16).bind(Uuid::nil())
    })
    .await;
    assert!(next.contains("idempotency_record_pkey"), "{next}");
    assert!(!next.contains("Sort"), "{next}");
    let rewrap = plan(&db, idem::NOT_SEALED_UNDER, |q| {
        q.bind("k2")
            .bind(TENANT)
            .bind("")
            .bind("")
            .bind(500i64)
            .bind(2i16)
    })
    .await;
    assert!(rewrap.contains("idempotency_record_pkey"), "{rewrap}");
    assert!(!rewrap.contains("Sort"), "{rewrap}");
}

/// The plan of a round's claim: the tenant's share of 50 and another's.
async fn claim_plan(db: &TestDb) -> String {
    plan(db, outbox::CLAIM_TENANTS, |q| {
        q.bind(vec![TENANT, Uuid::new_v4()])
            .bind(chrono::Utc::now())
            .bind(vec![50i64, 50])
            .bind(16_000i64)
            .bind(Uuid::new_v4())
            .bind(outbox::PARK_WINDOW)
    })
    .await
}

/// The plan of a look at what fell due in the last minute.
async fn look_plan(db: &TestDb) -> String {
    plan(db, outbox::DUE_TENANTS, |q| {
        q.bind(Some(chrono::Utc::now() - chrono::TimeDelta::minutes(1)))
            .bind(chrono::Utc::now())
    })
    .await
}

/// The claim reads each tenant's due rows as an index range (tenant and
/// `next_attempt_at`, the round's time passed as a value), checks each row's order on
/// the index of unpublished rows, and updates by primary key; the mark does too.
async fn assert_claim_uses_its_range(db: &TestDb) {
    let claim = claim_plan(db).await;
    assert!(!claim.contains("Seq Scan"), "{claim}");
    assert!(!claim.contains("Tid"), "{claim}");
    let range = claim
        .lines()
        .skip_while(|line| !line.contains("outbox_event_pending_by_tenant"))
        .find(|line| line.contains("Index Cond"))
        .unwrap_or_default();
    assert!(
        range.contains("tenant_id >= ") && range.contains("next_attempt_at <= "),
        "{claim}"
    );
    assert!(
        claim.contains("outbox_event_unpublished_by_order"),
        "{claim}"
    );
    assert!(claim.contains("outbox_event_pkey"), "{claim}");

    let park = plan(db, outbox::PARK_TENANTS, |q| {
        q.bind(vec![TENANT, Uuid::new_v4()])
            .bind(chrono::Utc::now())
            .bind(16_000i64)
            .bind(outbox::PARK_WINDOW)
    })
    .await;
    assert!(!park.contains("Seq Scan"), "{park}");
    assert!(park.contains("outbox_event_pending_by_tenant"), "{park}");
    assert!(park.contains("outbox_event_pkey"), "{park}");

    let mark = plan(db, outbox::MARK_PUBLISHED, |q| {
        q.bind(vec![TENANT, Uuid::new_v4()])
            .bind(vec![Uuid::new_v4(), Uuid::new_v4()])
            .bind(Uuid::new_v4())
            .bind(chrono::Utc::now())
    })
    .await;
    assert!(!mark.contains("Seq Scan"), "{mark}");
    assert!(mark.contains("outbox_event_pkey"), "{mark}");
    assert!(mark.contains("outbox_event_unpublished_by_order"), "{mark}");
    assert!(!mark.contains("outbox_event_pending_by_tenant"), "{mark}");
}

/// A backlog laid down after the last `ANALYZE` (a bulk import, a re-drive), as users
/// meet it: the statistics still say the table is empty. The relay's statements keep
/// their index ranges all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_statements_keep_their_ranges_with_stale_statistics() {
    if crate::support::one_server_only(
        "EXPLAIN of one server's plans; on Citus each shard is planned on its worker (database::citus checks the routing)",
    ) {
        return;
    }
    let db = TestDb::new().await;
    sqlx::query("ANALYZE outbox_event")
        .execute(&db.pool)
        .await
        .unwrap();
    // 100,000 due events of one tenant, 100,000 of the same tenant in retry backoff, and
    // a few other tenants with one event each; no ANALYZE afterwards.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at,
                                   next_attempt_at)
         SELECT '{TENANT}', gen_random_uuid(), gen_random_uuid(), 1, 'OrderCreated', '{{}}', now(),
                CASE WHEN g % 2 = 0 THEN now() ELSE now() + interval '1 hour' END
         FROM generate_series(1, 200000) g;
         INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at,
                                   next_attempt_at)
         SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 1, 'OrderCreated', '{{}}', now(), now()
         FROM generate_series(1, 40);"
    )))
    .execute(&db.pool)
    .await
    .unwrap();
    // The look reads what fell due in its range of the index by due time, not the
    // backlog in backoff.
    let look = look_plan(&db).await;
    assert!(!look.contains("Seq Scan"), "{look}");
    let range = look
        .lines()
        .find(|line| line.contains("Index Cond"))
        .unwrap_or_default();
    assert!(
        look.contains("outbox_event_pending ") && range.contains("next_attempt_at >"),
        "{look}"
    );
    assert_claim_uses_its_range(&db).await;
    assert_outbox_purge_uses_its_indexes(&db).await;
}

/// The same for the idempotency purges: 100,000 records (expired keys and abandoned
/// claims among them) laid down after the last `ANALYZE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purges_keep_their_ranges_with_stale_statistics() {
    if crate::support::one_server_only(
        "EXPLAIN of one server's plans; on Citus each shard is planned on its worker (database::citus checks the routing)",
    ) {
        return;
    }
    let db = TestDb::new().await;
    sqlx::query("ANALYZE idempotency_record")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::raw_sql(
        "INSERT INTO idempotency_record (tenant_id, endpoint, idem_key, fingerprint, state, owner_token, lease_until,
                                         response_status, response_body, created_at, completed_at, expires_at)
         SELECT ('00000000-0000-7000-8000-0000000000' || lpad((g % 40)::text, 2, '0'))::uuid,
                'POST /v1/orders', 'key-' || g, sha256(g::text::bytea),
                CASE WHEN g % 10 = 0 THEN 'PROCESSING' ELSE 'COMPLETED' END,
                CASE WHEN g % 10 = 0 THEN gen_random_uuid() END,
                CASE WHEN g % 10 = 0 THEN now() - interval '2 hours' END,
                CASE WHEN g % 10 = 0 THEN NULL ELSE 201 END,
                CASE WHEN g % 10 = 0 THEN NULL ELSE '\\x7b7d'::bytea END,
                now(), now(),
                CASE WHEN g % 10 = 0 THEN NULL ELSE now() + (g % 3 - 1) * interval '1 day' END
         FROM generate_series(1, 100000) g",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    assert_idempotency_purges_use_their_indexes(&db).await;
}
