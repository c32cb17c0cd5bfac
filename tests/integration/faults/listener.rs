//! A listening session whose packets are dropped silently looks exactly like a quiet
//! one. `orderd idempotency forget` and `orderd tenant erase` return only once
//! `ORDERD_LISTEN_BOUND_MS` has passed since their commit, and a process trusts its
//! replay cache only while its sessions answered a round trip within that bound; so
//! once either command has returned, the next request with the key runs afresh in a
//! process that cannot know it went deaf.

use std::process::Command;

use uuid::Uuid;

use crate::support::{
    Reply, ServeProcess, TestDb, new_key, order_body, post_order,
    proxy::{Mode, Proxy, in_front_of_db},
};

const BIN: &str = env!("CARGO_BIN_EXE_orderd");

/// The bound the processes and the commands agree on in these tests.
const BOUND_MS: &str = "1000";

fn replayed(reply: &Reply) -> bool {
    reply.header("idempotent-replayed").as_deref() == Some("true")
}

/// A `serve` process whose listening sessions (and only they) go through a proxy, with
/// a warm replay cache holding `key`'s stored 201, gone deaf: the process, its token,
/// and the proxy (silent while it lives).
async fn deafened_after_warming(
    db: &TestDb,
    tenant: Uuid,
    key: &str,
) -> (ServeProcess, String, Proxy) {
    let serve_env = |direct: String| {
        [
            ("ORDERD_DATABASE_DIRECT_URL", direct),
            ("ORDERD_LISTEN_BOUND_MS", BOUND_MS.to_string()),
        ]
    };
    let (proxy, direct) = in_front_of_db(&db.url).await;
    let serve = ServeProcess::start(db, &serve_env(direct));
    let token = serve.token(tenant);
    let body = order_body("DEAF-1", 1);
    let first = Reply::read(post_order(&serve.base, &token, key, &body, None).await).await;
    assert_eq!(first.status, 201);
    // Read from the database once, then kept: the second replay comes from memory.
    for _ in 0..2 {
        let again = Reply::read(post_order(&serve.base, &token, key, &body, None).await).await;
        assert!(replayed(&again));
    }
    // Packets dropped from now on: nothing tells the process.
    proxy.set(Mode::Silent);
    (serve, token, proxy)
}

/// `orderd <args>` against `db` with the tests' bound; panics unless it exits 0.
fn operator(db: &TestDb, args: &[&str]) {
    let out = Command::new(BIN)
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env("ORDERD_LISTEN_BOUND_MS", BOUND_MS)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_forgotten_while_a_process_is_deaf_is_not_replayed_from_its_memory() {
    let db = TestDb::new().await;
    let (tenant, key) = (Uuid::new_v4(), new_key());
    let (serve, token, _deaf) = deafened_after_warming(&db, tenant, &key).await;
    let tenant_arg = tenant.to_string();
    operator(
        &db,
        &[
            "idempotency",
            "forget",
            "--force",
            "--tenant",
            &tenant_arg,
            "--endpoint",
            "POST /v1/orders",
            "--key",
            &key,
        ],
    );
    let body = order_body("DEAF-1", 1);
    let after = Reply::read(post_order(&serve.base, &token, &key, &body, None).await).await;
    assert_eq!(after.status, 201);
    assert!(
        !replayed(&after),
        "the forgotten answer was replayed from memory by a process that went deaf"
    );
    assert_eq!(db.count("orders").await, 2, "the retry ran afresh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erased_tenant_is_not_replayed_from_the_memory_of_a_deaf_process() {
    let db = TestDb::new().await;
    let (tenant, key) = (Uuid::new_v4(), new_key());
    let (serve, token, _deaf) = deafened_after_warming(&db, tenant, &key).await;
    let tenant_arg = tenant.to_string();
    operator(&db, &["tenant", "erase", "--tenant", &tenant_arg]);
    let body = order_body("DEAF-1", 1);
    // A deaf process reads the marks again every quarter of the bound: it may refuse
    // the tenant for that long after the erase (a refusal, with Retry-After), never
    // replay it.
    let mut after = Reply::read(post_order(&serve.base, &token, &key, &body, None).await).await;
    for _ in 0..20 {
        if after.status != 409 {
            break;
        }
        after.assert_problem(409, "tenant-erasure-in-progress");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        after = Reply::read(post_order(&serve.base, &token, &key, &body, None).await).await;
    }
    assert!(
        !replayed(&after),
        "the erased tenant's stored answer (personal data included) was replayed: {} {}",
        after.status,
        String::from_utf8_lossy(&after.body)
    );
    assert_eq!(
        after.status, 201,
        "the tenant's tokens work again and find nothing"
    );
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE tenant_id = $1")
        .bind(tenant)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(orders, 1, "only the order made after the erasure");
}
