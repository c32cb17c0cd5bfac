//! Relay benchmark: commit-to-publish latency at a given write rate, and the drain rate
//! of a large backlog, against SNS (moto, or wherever the AWS SDK's chain points), Kafka
//! (`ORDERD_KAFKA_BROKERS` and an existing `ORDERD_KAFKA_TOPIC`) or a publisher that
//! acknowledges at once (the relay's own cost). Prints numbers; asserts nothing.
//!
//! ```sh
//! AWS_ENDPOINT_URL=http://127.0.0.1:4566 AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test \
//!   cargo run --release --example relay_bench -- --database-url postgres://postgres@127.0.0.1/bench \
//!   latency --rate 1000 --seconds 10 --publisher immediate
//! cargo run --release --example relay_bench -- --database-url ... drain --events 100000 --publisher immediate
//! cargo run --release --example relay_bench -- --database-url ... fairness --events 1000000 --rate 10
//! ORDERD_KAFKA_BROKERS=127.0.0.1:9092 ORDERD_KAFKA_TOPIC=bench \
//!   cargo run --release --example relay_bench -- --database-url ... drain --publisher kafka
//! ```
//! The database is the benchmark's own: it is migrated and its orders and outbox are
//! emptied before each run.

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use clap::{Parser, Subcommand, ValueEnum};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use orderd::db::Db;
use orderd::{
    app::Config,
    idempotency::{Fingerprint, Guard, IdempotencyKey, Scope, StoredResponse},
    orders::{NewOrder, Order, store},
    outbox::{
        publisher::{Message, Outcome, Outcomes, Publisher},
        relay::Relay,
        sink::sns::SnsPublisher,
    },
    service::Endpoint,
    supervisor::Jobs,
    tenant::TenantId,
};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[derive(Parser)]
struct Args {
    /// A database this benchmark may empty.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// Commit-to-publish latency while orders are written at a steady rate.
    Latency {
        /// Orders written per second.
        #[arg(long, default_value_t = 100)]
        rate: u32,
        #[arg(long, default_value_t = 20)]
        seconds: u32,
        #[arg(long, value_enum, default_value_t = Target::Sns)]
        publisher: Target,
        /// Poll only, without LISTEN/NOTIFY.
        #[arg(long)]
        poll_only: bool,
        /// The tenants the orders are written for, in turn.
        #[arg(long, default_value_t = 1)]
        tenants: u32,
    },
    /// How fast one relay drains a backlog of pending events.
    Drain {
        #[arg(long, default_value_t = 100_000)]
        events: i64,
        #[arg(long, value_enum, default_value_t = Target::Immediate)]
        publisher: Target,
        /// The tenants the events are spread over, each event an order of its own
        /// (default: a tenant per event).
        #[arg(long)]
        tenants: Option<i64>,
    },
    /// A quiet tenant's writes beside many tenants whose events wait: `waiting` tenants
    /// with one event in retry backoff for an hour and as many with an event behind a
    /// DEAD one. Reports the quiet tenant's commit-to-publish latency and the claim
    /// rounds' times.
    Waiting {
        #[arg(long, default_value_t = 20_000)]
        waiting: i64,
        /// The quiet tenant's orders per second.
        #[arg(long, default_value_t = 10)]
        rate: u32,
        #[arg(long, default_value_t = 30)]
        seconds: u32,
        #[arg(long, value_enum, default_value_t = Target::Immediate)]
        publisher: Target,
    },
    /// One tenant's backlog and another tenant's writes: how soon the writes are
    /// published, and the backlog's drain rate beside them against alone.
    Fairness {
        #[arg(long, default_value_t = 1_000_000)]
        events: i64,
        /// The other tenant's orders per second.
        #[arg(long, default_value_t = 10)]
        rate: u32,
        /// Alternating pairs of drains, alone and beside the writes.
        #[arg(long, default_value_t = 3)]
        pairs: u32,
        #[arg(long, value_enum, default_value_t = Target::Immediate)]
        publisher: Target,
        /// What else lies in the table beside the backlog, and whose ids.
        #[arg(long, value_enum, default_value_t = Condition::Due)]
        condition: Condition,
        /// Events in backoff beside the backlog in the `waiting` condition (default: as
        /// many as the backlog).
        #[arg(long)]
        waiting: Option<i64>,
        /// Events claimed per round (`ORDERD_OUTBOX_BATCH_SIZE`; the service's default).
        #[arg(long, default_value_t = 100)]
        batch: u32,
    },
}

/// The conditions the fairness scenario is run in; none runs `ANALYZE` after laying
/// the backlog down, as none of the operators' backlogs (an import, a re-drive, a
/// refusing sink) is followed by one.
#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum Condition {
    /// The backlog alone, all of it due.
    Due,
    /// Forty tenants whose ids are sequential: the lowest has the backlog, and the
    /// writes go to the other 39 in turn.
    Sequential,
    /// Beside the due backlog, as many events again in retry backoff for an hour and a
    /// tenth of that waiting behind DEAD events (ten behind each), all of one tenant.
    Waiting,
}

#[derive(Clone, Copy, ValueEnum)]
enum Target {
    /// A new topic on the SNS endpoint of the AWS SDK's configuration chain.
    Sns,
    /// The Kafka topic of `ORDERD_KAFKA_BROKERS` and `ORDERD_KAFKA_TOPIC` (it must exist).
    Kafka,
    /// Acknowledges everything at once: the relay's own cost.
    Immediate,
}

/// Acknowledges everything at once: what the relay costs without the network.
struct Immediate;

impl Publisher for Immediate {
    fn publish<'a>(
        &'a self,
        messages: &'a [Message],
    ) -> Pin<Box<dyn Future<Output = Outcomes> + Send + 'a>> {
        Box::pin(async move { vec![Outcome::Published; messages.len()] })
    }
}

/// Notes when the publisher it wraps acknowledged each order's event, on this process's
/// monotonic clock. With the instant each writer saw its commit, that gives the relay's
/// own share of the latency: from a commit to its event's acknowledgement, without the
/// write's own time (the claim, the statement, the fsync), which the database clock
/// would include (an order's `occurred_at` is its claim's time).
struct Stamped {
    inner: Arc<dyn Publisher>,
    acknowledged: Mutex<HashMap<Uuid, Instant>>,
}

impl Publisher for Stamped {
    fn publish<'a>(
        &'a self,
        messages: &'a [Message],
    ) -> Pin<Box<dyn Future<Output = Outcomes> + Send + 'a>> {
        Box::pin(async move {
            let outcomes = self.inner.publish(messages).await;
            let now = Instant::now();
            let mut acknowledged = self.acknowledged.lock().expect("not poisoned");
            for (message, outcome) in messages.iter().zip(&outcomes) {
                if *outcome == Outcome::Published {
                    // At least once: the first acknowledgement is the one that counts.
                    acknowledged.entry(message.aggregate_id).or_insert(now);
                }
            }
            outcomes
        })
    }
}

async fn publisher(target: Target, config: &Config) -> Arc<dyn Publisher> {
    match target {
        Target::Immediate => Arc::new(Immediate),
        Target::Kafka => {
            let kafka = config
                .kafka
                .as_ref()
                .expect("ORDERD_KAFKA_BROKERS and ORDERD_KAFKA_TOPIC are set");
            orderd::outbox::sink::kafka::KafkaPublisher::connect(
                kafka,
                config.outbox.publish_timeout,
            )
            .await
            .expect("the Kafka publisher starts")
        }
        Target::Sns => {
            let aws = aws_config::defaults(aws_config::BehaviorVersion::latest())
                .load()
                .await;
            let client = aws_sdk_sns::Client::new(&aws);
            let arn = client
                .create_topic()
                .name(format!("bench-{}", Uuid::new_v4().simple()))
                .send()
                .await
                .expect("create a topic (is AWS_ENDPOINT_URL set?)")
                .topic_arn()
                .unwrap_or_default()
                .to_string();
            Arc::new(SnsPublisher::new(client, arn, Duration::from_secs(10)))
        }
    }
}

/// The production configuration (defaults and the environment) on the benchmark's
/// database, with `batch` events per round.
fn config(database_url: &str, batch: u32) -> Config {
    let batch = batch.to_string();
    Config::from_lookup(&|name| match name {
        "DATABASE_URL" => Some(database_url.to_string()),
        "ORDERD_OUTBOX_BATCH_SIZE" => Some(batch.clone()),
        other => std::env::var(other).ok(),
    })
    .expect("a valid configuration")
}

/// A migrated, empty database.
/// Also a plain pool of its own, for the benchmark's own statements.
async fn fresh(config: &Config) -> (Db, sqlx::PgPool) {
    orderd::db::migrate(&config.db).await.expect("migrations");
    let db = orderd::db::db_of_size(&config.db, 8)
        .await
        .expect("database");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(config.db.url.expose())
        .await
        .expect("a pool of the benchmark's own");
    sqlx::query("TRUNCATE orders, outbox_event, idempotency_record")
        .execute(&pool)
        .await
        .expect("empty the tables");
    (db, pool)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p).ceil() as usize)
        .saturating_sub(1)
        .min(sorted.len() - 1)]
}

/// Writes orders at `rate`/s for `seconds` as a create request writes them (the guard's
/// claim, then one statement) while one relay publishes. Reports the latency from each
/// commit, as its writer saw it, to the publisher's acknowledgement of its event (see
/// [`Stamped`]), and for comparison the database clock's claim-to-mark time.
async fn latency(
    config: Config,
    publisher: Arc<dyn Publisher>,
    listen: bool,
    rate: u32,
    seconds: u32,
    tenants: u32,
) {
    let (db, pool) = fresh(&config).await;
    let stop = CancellationToken::new();
    let stamped = Arc::new(Stamped {
        inner: publisher,
        acknowledged: Mutex::new(HashMap::new()),
    });
    let task = start_relay(&config, stamped.clone(), listen, &stop).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let total = rate * seconds;
    let started = Instant::now();
    let writers: Vec<TenantId> = (0..tenants.max(1))
        .map(|_| TenantId(Uuid::new_v4()))
        .collect();
    let committed = write_orders(&db, &config, writers, rate, total).await;
    let write_secs = started.elapsed().as_secs_f64();
    until_published(&pool, None).await;
    let shares = commit_to_ack(&stamped, &committed);
    let mut lags: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM published_at - occurred_at)::float8 * 1000 FROM outbox_event",
    )
    .fetch_all(&pool)
    .await
    .expect("lags");
    lags.sort_by(|a, b| a.total_cmp(b));
    println!(
        "latency: {total} events of {tenants} tenants at {rate}/s (achieved {:.0}/s), listen {listen}: commit-to-publish p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; claim-to-mark on the database clock p50 {:.1} ms, p99 {:.1} ms",
        total as f64 / write_secs,
        percentile(&shares, 0.5),
        percentile(&shares, 0.99),
        shares.last().copied().unwrap_or_default(),
        percentile(&lags, 0.5),
        percentile(&lags, 0.99),
    );
    stop.cancel();
    task.await.expect("relay");
}

/// One relay over the benchmark's database, on connections of its own as in
/// `orderd serve`, publishing through `publisher`, until `stop`.
async fn start_relay(
    config: &Config,
    publisher: Arc<dyn Publisher>,
    listen: bool,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let listen_on = orderd::db::direct_options(&config.db).expect("a URL");
    let relay_db = orderd::db::connect_relay_db(&config.db, config.outbox.parallel_rounds)
        .await
        .expect("database");
    let relay = Relay::new(relay_db, listen_on, publisher, config.outbox.clone());
    let relay = if listen {
        relay
    } else {
        relay.without_listen()
    };
    tokio::spawn(relay.run(stop.clone()))
}

/// Writes `total` orders of `tenant` at `rate`/s, each as a create request writes it
/// (through the guard: the claim, then one statement); returns each order's id with
/// the instant its writer saw the commit.
async fn write_orders(
    db: &Db,
    config: &Config,
    tenants: Vec<TenantId>,
    rate: u32,
    total: u32,
) -> Vec<(Uuid, Instant)> {
    let guard = Guard::new(db.clone(), config.idempotency.clone(), Jobs::default());
    let new = NewOrder::parse(
        serde_json::json!({"sku": "BENCH-1", "quantity": 1})
            .as_object()
            .unwrap(),
    )
    .unwrap();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut writers = tokio::task::JoinSet::new();
    for i in 0..total {
        tick.tick().await;
        let (guard, new) = (guard.clone(), new.clone());
        let tenant = tenants[i as usize % tenants.len()];
        writers.spawn(async move {
            let scope = Scope {
                tenant,
                endpoint: Endpoint::CreateOrder.as_str(),
                key: IdempotencyKey::parse(Some(&Uuid::new_v4().to_string())).expect("a key"),
            };
            let fingerprint = Fingerprint::of(&new);
            let answer = guard
                .run_in_one_statement(&scope, fingerprint, move |mut sql, fence| {
                    Box::pin(async move {
                        let order = Order::created(&new, fence.at);
                        let response = StoredResponse {
                            status: 201,
                            location: None,
                            content_type: None,
                            body: order.id.to_string().into_bytes().into(),
                            resource: Some(order.id),
                        };
                        let written =
                            store::create(&mut sql, &fence, &response, &order, None).await?;
                        Ok::<_, sqlx::Error>(written.then_some(response))
                    })
                })
                .await
                .expect("create");
            let committed = Instant::now();
            let order_id = std::str::from_utf8(&answer.response.body)
                .ok()
                .and_then(|id| Uuid::parse_str(id).ok())
                .expect("the response body is the order id");
            (order_id, committed)
        });
    }
    writers.join_all().await
}

/// From each commit to its event's first acknowledgement, in milliseconds, sorted.
fn commit_to_ack(stamped: &Stamped, committed: &[(Uuid, Instant)]) -> Vec<f64> {
    let acknowledged = stamped.acknowledged.lock().expect("not poisoned");
    let mut shares: Vec<f64> = committed
        .iter()
        .map(|(order_id, at)| {
            let acked = acknowledged
                .get(order_id)
                .expect("every event was published");
            // Zero when the relay's acknowledgement came before the writer's task ran again.
            acked.saturating_duration_since(*at).as_secs_f64() * 1000.0
        })
        .collect();
    shares.sort_by(|a, b| a.total_cmp(b));
    shares
}

/// Waits until no event is left to publish.
/// Waits until every event is published, or every event of `tenants` when given (the
/// rest of the table may hold rows that never will: DEAD ones, and those waiting behind
/// them).
async fn until_published(pool: &sqlx::PgPool, tenants: Option<&[Uuid]>) {
    loop {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbox_event
             WHERE status <> 'PUBLISHED' AND ($1::uuid[] IS NULL OR tenant_id = ANY ($1))",
        )
        .bind(tenants)
        .fetch_one(pool)
        .await
        .expect("count");
        if left == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A transaction of the benchmark's pool without a statement timeout: laying down a
/// million rows takes longer than the one orderd's pools start with.
async fn without_timeout(pool: &sqlx::PgPool) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.expect("a transaction");
    sqlx::query("SET LOCAL statement_timeout = 0")
        .execute(&mut *tx)
        .await
        .expect("no timeout");
    tx
}

/// Lays down `events` pending events, each of its own order: of `tenant`, or each of
/// a tenant of its own.
async fn seed_backlog(pool: &sqlx::PgPool, events: i64, tenant: Option<Uuid>) {
    seed_spread(pool, events, tenant.map(|t| vec![t])).await
}

/// Lays down `events` pending events, each of its own order, of `tenants` in turn, or
/// each of a tenant of its own.
async fn seed_spread(pool: &sqlx::PgPool, events: i64, tenants: Option<Vec<Uuid>>) {
    let mut tx = without_timeout(pool).await;
    sqlx::query(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
         SELECT coalesce(($2::uuid[])[1 + g % cardinality($2::uuid[])], gen_random_uuid()), gen_random_uuid(),
                gen_random_uuid(), 1, 'OrderCreated',
                jsonb_build_object('event_type', 'OrderCreated', 'order', jsonb_build_object('sku', 'BENCH-1', 'quantity', 1)), now(), now()
         FROM generate_series(1, $1) g",
    )
    .bind(events)
    .bind(tenants)
    .execute(&mut *tx)
    .await
    .expect("seed the backlog");
    tx.commit().await.expect("commit the backlog");
}

/// What the `waiting` condition lays down beside the backlog, of `tenant`: `events` in
/// backoff for an hour, and `events / 10` behind DEAD events, ten behind each.
async fn seed_waiting(pool: &sqlx::PgPool, events: i64, tenant: Uuid) {
    let mut tx = without_timeout(pool).await;
    sqlx::query(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at, attempts)
         SELECT $2, gen_random_uuid(), gen_random_uuid(), 1, 'OrderCreated', '{\"event_type\": \"OrderCreated\"}', now(),
                now() + interval '1 hour', 1
         FROM generate_series(1, $1)",
    )
    .bind(events)
    .bind(tenant)
    .execute(&mut *tx)
    .await
    .expect("seed the backoff");
    sqlx::query(
        "WITH heads AS (SELECT gen_random_uuid() AS id FROM generate_series(1, $1 / 100))
         INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at,
                                   next_attempt_at, status, attempts, last_error)
         SELECT $2, gen_random_uuid(), h.id, s, 'OrderCreated', '{\"event_type\": \"OrderCreated\"}', now(), now(),
                CASE WHEN s = 1 THEN 'DEAD' ELSE 'PENDING' END, CASE WHEN s = 1 THEN 1 ELSE 0 END,
                CASE WHEN s = 1 THEN 'refused' END
         FROM heads h CROSS JOIN generate_series(1, 11) s",
    )
    .bind(events)
    .bind(tenant)
    .execute(&mut *tx)
    .await
    .expect("seed the dead heads");
    tx.commit().await.expect("commit the waiting rows");
}

/// What a scenario lays down: `events` due, with what `condition` adds (`waiting` in
/// backoff and a tenth of that behind DEAD events, for [`Condition::Waiting`]).
#[derive(Clone, Copy)]
struct Backlog {
    events: i64,
    condition: Condition,
    waiting: i64,
}

/// The backlog (see [`seed_backlog`]), of `tenant` or of a tenant per event.
async fn lay_down(pool: &sqlx::PgPool, backlog: Backlog, tenant: Option<Uuid>) {
    seed_backlog(pool, backlog.events, tenant).await;
    if let (Condition::Waiting, Some(tenant)) = (backlog.condition, tenant) {
        seed_waiting(pool, backlog.waiting, tenant).await;
    }
}

/// A tenant id of the `sequential` condition.
fn sequential(n: u128) -> Uuid {
    Uuid::from_u128(0x0000_0000_0000_7000_8000_0000_0000_0000 + n)
}

/// Waits, cheaply, until no event that may go is PENDING and due: an existence check on
/// the pending index, every 10 ms, which does not take the database's CPU away from the
/// relay (counting PUBLISHED rows this often would). Events behind a DEAD one (the
/// `waiting` condition's, second and later of their order) may not go and are not
/// waited for: a relay that parks them and one that leaves them due are timed alike.
/// Returns the seconds since `started`. Polls every 10 ms, or ten times the last
/// check's time when longer: on a distributed database the check reads every shard
/// (tens of milliseconds), and polled back to back it took a worker's core from the
/// relay it measures.
async fn until_drained(pool: &sqlx::PgPool, started: Instant) -> f64 {
    let mut pause = Duration::from_millis(10);
    loop {
        tokio::time::sleep(pause).await;
        let checking = Instant::now();
        let pending: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM outbox_event
                            WHERE status = 'PENDING' AND next_attempt_at <= now() AND aggregate_seq = 1)",
        )
        .fetch_one(pool)
        .await
        .expect("pending?");
        if !pending {
            return started.elapsed().as_secs_f64();
        }
        pause = Duration::from_millis(10).max(checking.elapsed() * 10);
    }
}

/// A fresh database with `backlog` (see [`lay_down`]) drained by one relay, nothing
/// else running; returns its pool and the seconds the drain took.
async fn drain_once(
    config: &Config,
    publisher: Arc<dyn Publisher>,
    backlog: Backlog,
    tenant: Option<Uuid>,
) -> (sqlx::PgPool, f64) {
    let (_db, pool) = fresh(config).await;
    lay_down(&pool, backlog, tenant).await;
    let stop = CancellationToken::new();
    let started = Instant::now();
    let running = start_relay(config, publisher, true, &stop).await;
    let secs = until_drained(&pool, started).await;
    stop.cancel();
    running.await.expect("the relay stops");
    (pool, secs)
}

/// Inserts `events` pending rows (spread over `tenants`, or each of a tenant of its
/// own), then lets one relay drain them.
async fn drain(config: Config, publisher: Arc<dyn Publisher>, events: i64, tenants: Option<i64>) {
    let (_db, pool) = fresh(&config).await;
    let spread = tenants.map(|n| (0..n.max(1)).map(|_| Uuid::new_v4()).collect());
    seed_spread(&pool, events, spread).await;
    let stop = CancellationToken::new();
    let started = Instant::now();
    let running = start_relay(&config, publisher, true, &stop).await;
    let secs = until_drained(&pool, started).await;
    stop.cancel();
    running.await.expect("the relay stops");
    let published: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'")
            .fetch_one(&pool)
            .await
            .expect("count");
    println!(
        "drain: {published} of {events} events of {} tenants in {secs:.1} s = {:.0} events/s ({} rounds at once)",
        tenants.unwrap_or(events),
        published as f64 / secs,
        config.outbox.parallel_rounds
    );
}

/// Fairness: the drain of one tenant's backlog of `events` alone, then the same
/// backlog again while another tenant writes `rate` orders a second until it drained,
/// `pairs` times alternating (the drain rate spreads by a fifth from run to run here).
/// Reports the quiet tenant's commit-to-acknowledgement latency over all its writes,
/// and the backlog's drain rate beside them against alone, pair by pair.
async fn fairness(
    config: Config,
    publisher: Arc<dyn Publisher>,
    backlog: Backlog,
    rate: u32,
    pairs: u32,
    claims: &PrometheusHandle,
) {
    let Backlog {
        events, condition, ..
    } = backlog;
    let (noisy, quiet) = match condition {
        Condition::Sequential => (
            sequential(1),
            (2..=40).map(|n| TenantId(sequential(n))).collect(),
        ),
        _ => (Uuid::new_v4(), vec![TenantId(Uuid::new_v4())]),
    };
    let mut ratios = Vec::new();
    let mut rates = Vec::new();
    let mut shares = Vec::new();
    for _ in 0..pairs {
        let (_, secs) = drain_once(&config, publisher.clone(), backlog, Some(noisy)).await;
        let alone = events as f64 / secs;
        let (db, pool) = fresh(&config).await;
        lay_down(&pool, backlog, Some(noisy)).await;
        let stamped = Arc::new(Stamped {
            inner: publisher.clone(),
            acknowledged: Mutex::new(HashMap::new()),
        });
        let stop = CancellationToken::new();
        let started = Instant::now();
        let running = start_relay(&config, stamped.clone(), true, &stop).await;
        // The quiet tenant writes while the backlog drains (about as long as it drained
        // alone), then the backlog's drain time is taken.
        let seconds = (events as f64 / alone).max(1.0);
        let total = ((seconds * rate as f64) as u32).max(1);
        let writes = tokio::spawn({
            let (db, config, quiet) = (db.clone(), config.clone(), quiet.clone());
            async move { write_orders(&db, &config, quiet, rate, total).await }
        });
        let secs = until_drained(&pool, started).await;
        let committed = writes.await.expect("the writer");
        let quiet_ids: Vec<Uuid> = quiet.iter().map(|t| t.0).collect();
        until_published(&pool, Some(&quiet_ids)).await;
        stop.cancel();
        running.await.expect("the relay stops");
        shares.extend(commit_to_ack(&stamped, &committed));
        let beside = (events + total as i64) as f64 / secs;
        rates.push(format!("{alone:.0}/{beside:.0}"));
        ratios.push(beside / alone);
    }
    shares.sort_by(|a, b| a.total_cmp(b));
    let counts = claim_counts(claims);
    let mut sorted = ratios.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    println!(
        "fairness ({}): a backlog of {events} events of one tenant, drained alone and while another tenant writes at {rate}/s, {pairs} pairs: drain rate beside/alone median x{:.2} (pairs, events/s alone/beside: {}); the other tenant's {} orders: {}",
        condition
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default(),
        sorted[sorted.len() / 2],
        rates.join(", "),
        shares.len(),
        quiet_and_claims(&shares, &counts),
    );
}

/// A quiet tenant writes `rate` orders a second for `seconds` beside `count` tenants
/// with one event each in retry backoff for an hour and `count` tenants each with an
/// event behind a DEAD one (parked by the relay, back each lease until a re-drive),
/// laid down before the relay starts, as a sink that refused them leaves them.
async fn waiting(
    config: Config,
    publisher: Arc<dyn Publisher>,
    count: i64,
    rate: u32,
    seconds: u32,
    claims: &PrometheusHandle,
) {
    let (db, pool) = fresh(&config).await;
    let mut tx = without_timeout(&pool).await;
    sqlx::query(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at,
                                   next_attempt_at, attempts)
         SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 1, 'OrderCreated',
                '{\"event_type\": \"OrderCreated\"}', now(), now() + interval '1 hour', 1
         FROM generate_series(1, $1)",
    )
    .bind(count)
    .execute(&mut *tx)
    .await
    .expect("seed the backoff");
    sqlx::query(
        "WITH heads AS (SELECT gen_random_uuid() AS tenant, gen_random_uuid() AS id FROM generate_series(1, $1))
         INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at,
                                   next_attempt_at, status, attempts, last_error)
         SELECT h.tenant, gen_random_uuid(), h.id, s, 'OrderCreated', '{\"event_type\": \"OrderCreated\"}', now(), now(),
                CASE WHEN s = 1 THEN 'DEAD' ELSE 'PENDING' END, CASE WHEN s = 1 THEN 1 ELSE 0 END,
                CASE WHEN s = 1 THEN 'refused' END
         FROM heads h CROSS JOIN generate_series(1, 2) s",
    )
    .bind(count)
    .execute(&mut *tx)
    .await
    .expect("seed the dead heads");
    tx.commit().await.expect("commit the waiting rows");
    let stamped = Arc::new(Stamped {
        inner: publisher,
        acknowledged: Mutex::new(HashMap::new()),
    });
    let stop = CancellationToken::new();
    let running = start_relay(&config, stamped.clone(), true, &stop).await;
    let quiet = vec![TenantId(Uuid::new_v4())];
    let committed = write_orders(&db, &config, quiet.clone(), rate, rate * seconds).await;
    until_published(&pool, Some(&[quiet[0].0])).await;
    stop.cancel();
    running.await.expect("the relay stops");
    let mut shares = commit_to_ack(&stamped, &committed);
    shares.sort_by(|a, b| a.total_cmp(b));
    let counts = claim_counts(claims);
    let parked: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_event WHERE status = 'PENDING' AND aggregate_seq = 2 AND next_attempt_at > now()",
    )
    .fetch_one(&pool)
    .await
    .expect("parked");
    println!(
        "waiting: a quiet tenant's {} orders at {rate}/s beside {count} tenants in backoff and {count} behind DEAD events ({parked} parked at the end): {}",
        shares.len(),
        quiet_and_claims(&shares, &counts),
    );
}

/// The quiet tenant's commit-to-publish latency (`shares`, sorted) and the claim
/// rounds' times, as the fairness and waiting scenarios print them.
fn quiet_and_claims(shares: &[f64], counts: &(u64, Vec<(f64, u64)>)) -> String {
    format!(
        "commit-to-publish p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; claim rounds: {} timed, p50 at most {} ms, p99 at most {} ms, all within {} ms, {} over 50 ms",
        percentile(shares, 0.5),
        percentile(shares, 0.99),
        shares.last().copied().unwrap_or_default(),
        counts.0,
        claim_ms(counts, 0.5),
        claim_ms(counts, 0.99),
        claim_ms(counts, 1.0),
        claims_over(counts, 50.0),
    )
}

/// Bounds (seconds) of the bench's own histogram of claim rounds: fine enough to read
/// a p99 off to within a few milliseconds.
const CLAIM_BOUNDS: [f64; 25] = [
    0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.010, 0.012, 0.015, 0.020, 0.025, 0.030,
    0.040, 0.050, 0.060, 0.080, 0.100, 0.150, 0.200, 0.300, 0.500, 1.0, 2.0, 5.0,
];

/// A recorder for this process that keeps the relay's claim durations as a histogram
/// with [`CLAIM_BOUNDS`], so that a scenario can print a claim round's time. (The
/// exporter's summaries were tried first: their p99 came out at 84 ms where 4 rounds of
/// 6,006 took more than 50 ms.)
fn record_claims() -> PrometheusHandle {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(
                orderd::metrics::OUTBOX_CLAIM_DURATION.to_string(),
            ),
            &CLAIM_BOUNDS,
        )
        .expect("bounds")
        .install_recorder()
        .expect("no other recorder in this process")
}

/// The claim rounds timed so far: how many, and how many ended by each bound.
fn claim_counts(handle: &PrometheusHandle) -> (u64, Vec<(f64, u64)>) {
    let name = orderd::metrics::OUTBOX_CLAIM_DURATION;
    let rendered = handle.render();
    let mut total = 0;
    let mut buckets = Vec::new();
    for line in rendered.lines() {
        if let Some(rest) = line.strip_prefix(&format!("{name}_count ")) {
            total = rest.trim().parse().unwrap_or_default();
        } else if let Some(rest) = line.strip_prefix(&format!("{name}_bucket{{le=\"")) {
            let mut parts = rest.splitn(2, "\"} ");
            let (Some(le), Some(count)) = (parts.next(), parts.next()) else {
                continue;
            };
            if let (Ok(le), Ok(count)) = (le.parse::<f64>(), count.trim().parse::<u64>()) {
                buckets.push((le, count));
            }
        }
    }
    (total, buckets)
}

/// The bound (ms) by which a `quantile` of the claim rounds had ended: the p99 is
/// "at most this".
fn claim_ms(counts: &(u64, Vec<(f64, u64)>), quantile: f64) -> f64 {
    let (total, buckets) = counts;
    let needed = (*total as f64 * quantile).ceil() as u64;
    buckets
        .iter()
        .find(|(_, count)| *count >= needed)
        .map(|(le, _)| le * 1000.0)
        .unwrap_or(f64::INFINITY)
}

/// How many claim rounds took longer than `ms`.
fn claims_over(counts: &(u64, Vec<(f64, u64)>), ms: f64) -> u64 {
    let (total, buckets) = counts;
    let within = buckets
        .iter()
        .find(|(le, _)| (le * 1000.0 - ms).abs() < 1e-6)
        .map(|(_, count)| *count)
        .unwrap_or(*total);
    total - within
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    match args.scenario {
        Scenario::Latency {
            rate,
            seconds,
            publisher: target,
            poll_only,
            tenants,
        } => {
            let config = config(&args.database_url, 100);
            let publisher = publisher(target, &config).await;
            latency(config, publisher, !poll_only, rate, seconds, tenants).await;
        }
        Scenario::Drain {
            events,
            publisher: target,
            tenants,
        } => {
            let config = config(&args.database_url, 500);
            let publisher = publisher(target, &config).await;
            drain(config, publisher, events, tenants).await;
        }
        Scenario::Waiting {
            waiting: count,
            rate,
            seconds,
            publisher: target,
        } => {
            let claims = record_claims();
            let config = config(&args.database_url, 100);
            let publisher = publisher(target, &config).await;
            waiting(config, publisher, count, rate, seconds, &claims).await;
        }
        Scenario::Fairness {
            events,
            rate,
            pairs,
            publisher: target,
            condition,
            waiting,
            batch,
        } => {
            let claims = record_claims();
            let config = config(&args.database_url, batch);
            let publisher = publisher(target, &config).await;
            let backlog = Backlog {
                events,
                condition,
                waiting: waiting.unwrap_or(events),
            };
            fairness(config, publisher, backlog, rate, pairs.max(1), &claims).await;
        }
    }
}
