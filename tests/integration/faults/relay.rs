//! A relay stopped between its claim and its publish. A publish cannot be fenced at the
//! bus, so an erasure waits for the relays' claims to run out before it returns; a relay
//! whose claim committed, and which then heard nothing until after that (a paused
//! process, a stalled answer), must not start publishing what it claimed: the events
//! may have been deleted, and their tenant erased, meanwhile.

use std::{process::Command, time::Duration};

use uuid::Uuid;

use crate::support::{
    new_key, on_citus, order_body,
    proxy::{Mode, database_behind_network},
    sns::{Topic, moto_endpoint},
    spawn_publishing_app_on,
};

const BIN: &str = env!("CARGO_BIN_EXE_orderd");

/// The relay's claim commits, then its answers are held (on one server the claim is a
/// statement that commits on its own; on Citus a transaction with a `COMMIT`): the
/// relay is stuck between claim and publish. `orderd tenant erase` deletes the claimed
/// event, waits out the claim's lease and exits 0. Released, the relay must not publish
/// the erased tenant's event; it goes on publishing others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_held_between_claim_and_publish_past_its_lease_publishes_nothing_an_erase_removed()
{
    let topic = Topic::create(false).await;
    // On Citus the relay claims on the tenant's node: the hold is in front of every
    // node.
    let (db, network, through) = database_behind_network().await;
    let (tenant, other) = (Uuid::new_v4(), Uuid::new_v4());
    // The tenant's order and its pending event, before any relay runs.
    db.backlog(tenant, 1).await;

    // The first statement through the proxy that binds the tenant (16 bytes, uuid's
    // binary form) is the relay's claim of its event.
    let marker: &'static [u8] = Box::leak(Box::new(*tenant.as_bytes()));
    network.set(if on_citus() {
        Mode::HoldAtCommitAfter(marker)
    } else {
        Mode::HoldAfter(marker)
    });
    // Publishes time out after 1 s: claims last 2.5 s. The statement timeout is far
    // longer than the hold, so the stalled call itself does not fail.
    let app = spawn_publishing_app_on(
        db.handle().await,
        &moto_endpoint(),
        &topic.arn,
        &[
            ("DATABASE_URL", &through),
            ("ORDERD_OUTBOX_PUBLISH_TIMEOUT_MS", "1000"),
            ("ORDERD_DB_STATEMENT_TIMEOUT_MS", "60000"),
        ],
    )
    .await;
    db.until_count(
        &format!(
            "SELECT count(*) FROM outbox_event WHERE tenant_id = '{tenant}' AND claimed_by IS NOT NULL"
        ),
        1,
    )
    .await;

    let out = Command::new(BIN)
        .args(["tenant", "erase", "--tenant", &tenant.to_string()])
        .env("DATABASE_URL", &db.url)
        .env("ORDERD_OUTBOX_PUBLISH_TIMEOUT_MS", "1000")
        .env("ORDERD_LISTEN_BOUND_MS", "500")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    network.set(Mode::Forward);

    // The relay goes on: another tenant's event goes out. Everything the held round
    // would have published went out before it.
    let created = app
        .create(&app.token(other), &new_key(), &order_body("AFTER-1", 1))
        .await;
    assert_eq!(created.status, 201, "{}", created.json());
    let mut received = Vec::new();
    for _ in 0..100 {
        received.extend(topic.collect(1).await);
        if received
            .iter()
            .any(|m| m.body["tenant_id"] == other.to_string())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tenants: Vec<String> = received
        .iter()
        .map(|m| m.body["tenant_id"].as_str().unwrap_or("?").to_string())
        .collect();
    assert_eq!(
        tenants,
        vec![other.to_string()],
        "only the other tenant's event reached the bus, none of the erased tenant's"
    );
}
