//! Per-tenant limits (docs/contract.md §1, §5): a token bucket answered with 429 and the
//! rate-limit fields before any idempotency record is touched, and a cap on each
//! tenant's requests in flight so that one tenant's flood leaves others served.

use std::sync::Arc;

use futures::future::join_all;
use uuid::Uuid;

use crate::support::{Reply, new_key, order_body, post_order, sample, spawn_app_with};

fn rate_limited_count() -> f64 {
    sample(
        &orderd::metrics::install(&orderd::api::known_labels()).render(),
        r#"rate_limited_requests_total{route="/v1/orders"}"#,
    )
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_past_its_burst_gets_429_with_retry_after_and_ratelimit_fields_and_no_key_is_touched()
 {
    let app = spawn_app_with(&[
        ("ORDERD_TENANT_RATE_PER_SEC", "1"),
        ("ORDERD_TENANT_BURST", "3"),
    ])
    .await;
    let tenant = Uuid::new_v4();
    let token = app.token(tenant);
    for i in 0..3 {
        let reply = app
            .create(&token, &new_key(), &order_body("RL-1", i + 1))
            .await;
        assert_eq!(reply.status, 201);
    }
    let before = rate_limited_count();
    let limited = app.create(&token, &new_key(), &order_body("RL-1", 9)).await;
    limited.assert_problem(429, "rate-limited");
    let retry_after: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    assert!(retry_after >= 1);
    assert_eq!(
        limited.header("ratelimit-policy").as_deref(),
        Some("\"tenant\";q=3;w=3")
    );
    assert!(
        limited
            .header("ratelimit")
            .is_some_and(|v| v.starts_with("\"tenant\";r=0;t=")),
        "{:?}",
        limited.header("ratelimit")
    );
    assert!(rate_limited_count() > before, "counted by route");
    assert_eq!(
        app.count("idempotency_record").await,
        3,
        "the refused request touched no idempotency record"
    );
    // Another tenant has a bucket of its own.
    let other = app.token(Uuid::new_v4());
    assert_eq!(
        app.create(&other, &new_key(), &order_body("RL-2", 1))
            .await
            .status,
        201
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_flood_queues_on_its_own_permits_while_another_tenant_is_served() {
    let app = spawn_app_with(&[
        ("ORDERD_TENANT_RATE_PER_SEC", "0"),
        ("ORDERD_TENANT_MAX_IN_FLIGHT", "2"),
        ("ORDERD_DB_POOL_SIZE", "6"),
    ])
    .await;
    let base = Arc::new(app.base.clone());
    let noisy = app.token(Uuid::new_v4());
    let flood = join_all((0..120).map(|i| {
        let (base, noisy) = (base.clone(), noisy.clone());
        async move {
            let body = order_body("FLOOD", (i % 100) + 1);
            post_order(&base, &noisy, &new_key(), &body, None)
                .await
                .status()
                .as_u16()
        }
    }));
    let quiet_tenant = Uuid::new_v4();
    let quiet = app.token(quiet_tenant);
    let calm = async {
        // Let the flood start first.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut statuses = Vec::new();
        for i in 0..5 {
            let reply = Reply::read(
                post_order(&base, &quiet, &new_key(), &order_body("CALM", i + 1), None).await,
            )
            .await;
            statuses.push(reply.status);
        }
        statuses
    };
    let (flooded, calm) = tokio::join!(flood, calm);
    assert_eq!(
        calm, [201; 5],
        "the quiet tenant is served during the flood"
    );
    assert!(
        flooded.iter().all(|s| *s == 201 || *s == 429),
        "the flood sees 201 or 429, never a 5xx: {flooded:?}"
    );
    let quiet_orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE tenant_id = $1")
        .bind(quiet_tenant)
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert_eq!(quiet_orders, 5);
}
