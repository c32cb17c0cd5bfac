//! Relay benchmark: commit-to-publish latency at a steady write rate (LISTEN/NOTIFY on
//! and off), and the drain rate of a large backlog, against SNS (moto, or whatever the
//! AWS SDK's chain points at) and against a publisher that acknowledges at once (the
//! relay's own cost). Prints numbers; asserts nothing.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres AWS_ENDPOINT_URL=http://127.0.0.1:4566 \
//! AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test \
//!   cargo run --release --example relay_bench -- [latency|drain|all]
//! ```
//! Each scenario runs in a scratch database of its own, dropped afterwards.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use orderd::{
    auth::TenantId,
    config::OutboxConfig,
    orders::{NewOrder, store},
    outbox::{
        publisher::{Message, Outcomes, Publisher},
        relay::Relay,
        sns::SnsPublisher,
    },
};
use sqlx::{Connection, Executor, PgConnection, PgPool};
use tokio::sync::watch;
use uuid::Uuid;

/// Acknowledges everything at once: what the relay costs without the network.
struct Immediate;

impl Publisher for Immediate {
    fn publish<'a>(
        &'a self,
        messages: &'a [Message],
    ) -> Pin<Box<dyn Future<Output = Outcomes> + Send + 'a>> {
        Box::pin(async move { vec![Ok(()); messages.len()] })
    }
}

async fn scratch_db(admin: &str) -> (String, String) {
    let name = format!("orderd_bench_{}", Uuid::new_v4().simple());
    let mut conn = PgConnection::connect(admin).await.unwrap();
    conn.execute(sqlx::AssertSqlSafe(format!(r#"CREATE DATABASE "{name}""#)))
        .await
        .unwrap();
    let url = match admin.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => panic!("DATABASE_URL must end in /DBNAME"),
    };
    let pool = PgPool::connect(&url).await.unwrap();
    orderd::MIGRATOR.run(&pool).await.unwrap();
    pool.close().await;
    (name, url)
}

async fn drop_db(admin: &str, name: &str) {
    let mut conn = PgConnection::connect(admin).await.unwrap();
    let _ = conn
        .execute(sqlx::AssertSqlSafe(format!(
            r#"DROP DATABASE "{name}" WITH (FORCE)"#
        )))
        .await;
}

fn config(batch: u32) -> OutboxConfig {
    OutboxConfig {
        batch_size: batch,
        poll: Duration::from_millis(1000),
        ..OutboxConfig::default()
    }
}

async fn sns_topic() -> (Arc<dyn Publisher>, String) {
    let aws = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    let client = aws_sdk_sns::Client::new(&aws);
    let arn = client
        .create_topic()
        .name(format!("bench-{}", Uuid::new_v4().simple()))
        .send()
        .await
        .unwrap()
        .topic_arn()
        .unwrap()
        .to_string();
    (
        Arc::new(SnsPublisher::new(
            client,
            arn.clone(),
            Duration::from_secs(10),
        )),
        arn,
    )
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p).ceil() as usize)
        .saturating_sub(1)
        .min(sorted.len() - 1)]
}

/// Writes orders at `rate`/s for `seconds` through the orders module (one transaction
/// each, as the API does) while one relay publishes; reports commit-to-publish latency
/// from the database clock.
async fn latency(
    admin: &str,
    publisher: Arc<dyn Publisher>,
    listen: bool,
    rate: u32,
    seconds: u32,
    label: &str,
) {
    let (name, url) = scratch_db(admin).await;
    let pool = orderd::db::connect(&url, 8).await.unwrap();
    let (stop, stopped) = watch::channel(false);
    let relay = Relay::new(pool.clone(), publisher, config(100));
    let relay = if listen {
        relay
    } else {
        relay.without_listen()
    };
    let task = tokio::spawn(relay.run(stopped));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let tenant = TenantId(Uuid::new_v4());
    let new = NewOrder {
        sku: "BENCH-1".into(),
        quantity: 1,
        customer_ref: None,
    };
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    let total = rate * seconds;
    for _ in 0..total {
        tick.tick().await;
        let mut tx = pool.begin().await.unwrap();
        store::create(&mut tx, tenant, &new).await.unwrap();
        tx.commit().await.unwrap();
    }
    loop {
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox_event WHERE status <> 'PUBLISHED'")
                .fetch_one(&pool)
                .await
                .unwrap();
        if pending == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut lags: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM published_at - occurred_at)::float8 * 1000 FROM outbox_event",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    lags.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "latency {label}: {total} events at {rate}/s, commit-to-publish p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        percentile(&lags, 0.5),
        percentile(&lags, 0.99),
        lags.last().unwrap()
    );
    stop.send(true).unwrap();
    task.await.unwrap();
    pool.close().await;
    drop_db(admin, &name).await;
}

/// Inserts `events` pending rows, then lets one relay drain them.
async fn drain(admin: &str, publisher: Arc<dyn Publisher>, events: i64, label: &str) {
    let (name, url) = scratch_db(admin).await;
    let pool = orderd::db::connect(&url, 8).await.unwrap();
    sqlx::query(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
         SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 1, 'OrderCreated',
                jsonb_build_object('event_type', 'OrderCreated', 'order', jsonb_build_object('sku', 'BENCH-1', 'quantity', 1)), now(), now()
         FROM generate_series(1, $1)",
    )
    .bind(events)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE outbox_event")
        .execute(&pool)
        .await
        .unwrap();
    let relay = Relay::new(pool.clone(), publisher, config(500));
    let started = Instant::now();
    let mut published = 0usize;
    loop {
        let round = relay.round().await.unwrap();
        if round.claimed == 0 {
            break;
        }
        published += round.published;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "drain {label}: {published} of {events} events in {secs:.1} s = {:.0} events/s",
        published as f64 / secs
    );
    pool.close().await;
    drop_db(admin, &name).await;
}

#[tokio::main]
async fn main() {
    let admin = std::env::var("DATABASE_URL")
        .expect("DATABASE_URL (a server where databases may be created)");
    let what = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    let backlog: i64 = std::env::var("BENCH_BACKLOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    if what == "latency" || what == "all" {
        let (sns, _) = sns_topic().await;
        latency(
            &admin,
            sns.clone(),
            true,
            100,
            20,
            "SNS (moto), LISTEN/NOTIFY",
        )
        .await;
        latency(
            &admin,
            sns,
            false,
            100,
            20,
            "SNS (moto), polling every 1000 ms",
        )
        .await;
        latency(
            &admin,
            Arc::new(Immediate),
            true,
            100,
            20,
            "immediate ack, LISTEN/NOTIFY",
        )
        .await;
    }
    if what == "drain" || what == "all" {
        drain(&admin, Arc::new(Immediate), backlog, "immediate ack").await;
        let (sns, _) = sns_topic().await;
        drain(&admin, sns, backlog, "SNS (moto)").await;
    }
}
