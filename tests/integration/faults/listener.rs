//! A listening session whose packets are dropped silently looks exactly like a quiet
//! one. `orderd idempotency forget` and `orderd tenant erase` return only once
//! `ORDERD_LISTEN_BOUND_MS` has passed since their commit, and a process trusts its
//! replay cache only while its sessions answered a round trip within that bound; so
//! once either command has returned, the next request with the key runs afresh in a
//! process that cannot know it went deaf. Such a process may not have read the end of an
//! erasure yet; it asks the table before it refuses the tenant, so the tenant's first
//! write after the erase returned is served.

use std::process::Command;

use uuid::Uuid;

use crate::support::{
    KillOnDrop, Reply, ServeProcess, TestDb, new_key, order_body, post_order,
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
    let after = Reply::read(post_order(&serve.base, &token, &key, &body, None).await).await;
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

/// The bound of the test below: a deaf process reads the marks from the table every
/// quarter of it (750 ms), so an end of an erasure it has not read yet would show.
const ERASE_BOUND_MS: &str = "3000";

/// A deaf process learns of an erasure by reading the marks from the table every quarter
/// of the bound, and may not have read its end when `orderd tenant erase` returns; it
/// asks the table before it refuses, so the tenant's first write after the erase
/// returned is served, not refused with 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_write_after_an_erase_returned_is_served_by_a_process_that_went_deaf() {
    let db = TestDb::new().await;
    let tenant = Uuid::new_v4();
    // Thirty rows at seven a second: the mark stands for over four seconds, longer than
    // the bound, so the erase returns as soon as it has ended the mark.
    db.backlog(tenant, 10).await;
    let (proxy, direct) = in_front_of_db(&db.url).await;
    let serve = ServeProcess::start(
        &db,
        &[
            ("ORDERD_DATABASE_DIRECT_URL", direct),
            ("ORDERD_LISTEN_BOUND_MS", ERASE_BOUND_MS.to_string()),
        ],
    );
    let token = serve.token(tenant);
    proxy.set(Mode::Silent);
    let mut erase = KillOnDrop(
        Command::new(BIN)
            .args(["tenant", "erase", "--tenant", &tenant.to_string()])
            .args(["--rows-per-sec", "7"])
            .env("DATABASE_URL", &db.url)
            .env("ORDERD_LISTEN_BOUND_MS", ERASE_BOUND_MS)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The process finds its session silent, reads the marks from the table, and holds
    // the tenant as being erased while the erase deletes.
    let learned = || {
        serve.logs.lock().unwrap().iter().any(|line| {
            serde_json::from_str::<serde_json::Value>(line).is_ok_and(|entry| {
                entry["fields"]["message"] == "tenants being erased reloaded"
                    && entry["fields"]["erasing"] == 1
            })
        })
    };
    for _ in 0..100 {
        if learned() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(learned(), "the deaf process never read the mark");
    assert!(
        erase.0.try_wait().unwrap().is_none(),
        "the erase ended before the process read its mark: the test proves nothing"
    );
    let erased = tokio::task::spawn_blocking(move || {
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut erase.0.stderr.take().unwrap(), &mut stderr).unwrap();
        (erase.0.wait().unwrap(), stderr)
    })
    .await
    .unwrap();
    assert!(erased.0.success(), "{}", erased.1);
    // At once: the erase has returned, so the tenant's tokens work again.
    let first = Reply::read(
        post_order(
            &serve.base,
            &token,
            &new_key(),
            &order_body("DEAF-2", 1),
            None,
        )
        .await,
    )
    .await;
    assert_eq!(
        first.status,
        201,
        "the first create after the erase returned: {}",
        String::from_utf8_lossy(&first.body)
    );
}
