//! The relay is fair across tenants: one tenant's backlog, laid down by SQL as a bulk
//! import or a re-drive would leave it, does not hold back another tenant's events. Each
//! backlog is laid down **without** `ANALYZE`, as users meet it, and the assertions are
//! read from the database, not from a clock: a quiet tenant's event goes out within the
//! next two claim rounds after it committed, so at most two batches of the backlog are
//! published between its commit and its own publication. An event's `published_at` is
//! the database time at which the round that published it began, so "in between" counts
//! the rounds that began after the commit and before the quiet event's own; a round
//! already under way at the commit, whichever lane marks it first, is not one of them.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::support::{
    ServeProcess, TestApp, TestDb, new_key, order_body, post_order, sample,
    sns::{Topic, aws_env, bare_topic, moto_endpoint, start_moto},
    spawn_publishing_app_on,
};

/// Events a relay claims per round (`ORDERD_OUTBOX_BATCH_SIZE`'s default).
const BATCH: i64 = 100;

/// Lays down `count` due events of `tenant`, one order each, due `due` (an SQL time).
async fn backlog(db: &TestDb, tenant: Uuid, count: i64, due: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
         SELECT $1, gen_random_uuid(), gen_random_uuid(), 1, 'OrderCreated',
                jsonb_build_object('event_type', 'OrderCreated', 'schema_version', 1, 'tenant_id', $1::text),
                now(), {due}
         FROM generate_series(1, $2)"
    )))
    .bind(tenant)
    .bind(count)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// The most events of `backlog_of` published after one of the `committed` orders'
/// create had committed (the database's time read once its answer had come back) and
/// before that order's event was published.
async fn most_published_in_between(
    db: &TestDb,
    committed: &[(Uuid, DateTime<Utc>)],
    backlog_of: Uuid,
) -> i64 {
    let (orders, times): (Vec<Uuid>, Vec<DateTime<Utc>>) = committed.iter().copied().unzip();
    // Read apart and counted here: a distributed database joins these only on the
    // tenant, and the quiet orders' tenant is not the backlog's.
    let quiet: Vec<(Uuid, Option<DateTime<Utc>>)> = sqlx::query_as(
        "SELECT aggregate_id, published_at FROM outbox_event WHERE aggregate_id = ANY ($1)",
    )
    .bind(&orders)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let mut backlog: Vec<DateTime<Utc>> = sqlx::query_scalar(
        "SELECT published_at FROM outbox_event WHERE tenant_id = $1 AND status = 'PUBLISHED'",
    )
    .bind(backlog_of)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    backlog.sort();
    let between = |from: DateTime<Utc>, to: DateTime<Utc>| {
        let first = backlog.partition_point(|at| *at <= from);
        let last = backlog.partition_point(|at| *at < to);
        last.saturating_sub(first) as i64
    };
    orders
        .iter()
        .zip(&times)
        .filter_map(|(order, at)| {
            let published = quiet.iter().find(|(id, _)| id == order)?.1?;
            Some(between(*at, published))
        })
        .max()
        .unwrap_or(0)
}

/// Creates an order for `tenant` every 100 ms, `count` times, while the relay works:
/// each order's id, and the database's time read after its answer came back, by which
/// its create had committed.
async fn create_slowly(app: &TestApp, tenant: Uuid, count: usize) -> Vec<(Uuid, DateTime<Utc>)> {
    let token = app.token(tenant);
    let mut committed = Vec::new();
    for i in 0..count {
        let created = app
            .create(&token, &new_key(), &order_body(&format!("QUIET-{i}"), 1))
            .await;
        assert_eq!(created.status, 201);
        let order: serde_json::Value = serde_json::from_slice(&created.body).unwrap();
        let id = Uuid::parse_str(order["id"].as_str().unwrap()).unwrap();
        let at: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
        committed.push((id, at));
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    committed
}

/// A quiet tenant's twenty orders, one every 100 ms, beside `busy`'s due backlog: at
/// most two rounds' worth of the backlog is published between any of their commits and
/// their publication.
async fn a_quiet_tenant_goes_out_within_two_rounds(app: &TestApp, busy: Uuid) {
    let quiet = Uuid::new_v4();
    let committed = create_slowly(app, quiet, 20).await;
    published_of(&app.db, &[quiet], 20).await;
    let between = most_published_in_between(&app.db, &committed, busy).await;
    println!(
        "at most {between} of the due backlog published between a quiet event's commit and its publication"
    );
    assert!(
        between <= 2 * BATCH,
        "{between} of the due backlog went first"
    );
}

async fn published_of(db: &TestDb, tenants: &[Uuid], want: i64) {
    let list = tenants
        .iter()
        .map(|t| format!("'{t}'"))
        .collect::<Vec<_>>()
        .join(",");
    db.until_count(
        &format!(
            "SELECT count(*) FROM outbox_event WHERE tenant_id IN ({list}) AND status = 'PUBLISHED'"
        ),
        want,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_tenant_goes_out_within_two_rounds_beside_a_backlog_of_60_000_with_stale_statistics()
 {
    // moto takes about a thousand messages a second, so the backlog outlasts the test;
    // a topic of its own, without a queue, on a moto of its own.
    let moto = start_moto();
    let arn = bare_topic(&moto, "fairness").await;
    let db = TestDb::new().await;
    let noisy = Uuid::new_v4();
    backlog(&db, noisy, 60_000, "now()").await;
    // The default settings: two lanes, each with a round in flight when the event
    // commits; the next round to start carries it.
    let app = spawn_publishing_app_on(db, &moto, &arn, &[]).await;

    let quiet = Uuid::new_v4();
    let committed = create_slowly(&app, quiet, 20).await;
    published_of(&app.db, &[quiet], 20).await;
    let between = most_published_in_between(&app.db, &committed, noisy).await;
    println!(
        "at most {between} of the backlog published between a quiet event's commit and its publication"
    );
    assert!(between <= 2 * BATCH, "{between} of the backlog went first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_with_sequential_ids_are_all_visited_beside_the_lowest_ones_backlog() {
    let moto = start_moto();
    let arn = bare_topic(&moto, "fairness-sequential").await;
    let db = TestDb::new().await;
    // Forty tenants whose ids sit together (as sequential or time-ordered ids do), more
    // than one round visits: the lowest has the backlog, the 39 others one event each.
    let tenant = |n: u128| Uuid::from_u128(0x0000_0000_0000_7000_8000_0000_0000_0000 + n);
    let noisy = tenant(1);
    backlog(&db, noisy, 20_000, "now()").await;
    let quiet: Vec<Uuid> = (2..=40).map(tenant).collect();
    for &q in &quiet {
        backlog(&db, q, 1, "now()").await;
    }
    let app = spawn_publishing_app_on(db, &moto, &arn, &[]).await;

    published_of(&app.db, &quiet, 39).await;
    let before_last: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_event
         WHERE tenant_id = $1 AND status = 'PUBLISHED'
           AND published_at < (SELECT max(published_at) FROM outbox_event WHERE tenant_id = ANY ($2))",
    )
    .bind(noisy)
    .bind(&quiet)
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    println!("{before_last} of the backlog published before the last of the 39 quiet tenants");
    assert!(
        before_last <= 2 * BATCH,
        "{before_last} of the backlog went first"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_in_backoff_and_behind_dead_heads_neither_delays_others_nor_loses_an_event() {
    let moto = start_moto();
    let arn = bare_topic(&moto, "fairness-waiting").await;
    let db = TestDb::new().await;
    let noisy = Uuid::new_v4();
    // 50,000 events in retry backoff for an hour, and 500 orders whose first event is
    // DEAD with ten more events waiting behind each: 5,000 due rows that must wait.
    backlog(&db, noisy, 50_000, "now() + interval '1 hour'").await;
    sqlx::query(
        "WITH orders AS (SELECT gen_random_uuid() AS id FROM generate_series(1, 500))
         INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload,
                                   occurred_at, next_attempt_at, status, attempts, last_error)
         SELECT $1, gen_random_uuid(), o.id, s, 'OrderCreated',
                jsonb_build_object('event_type', 'OrderCreated', 'schema_version', 1, 'seq', s),
                now(), now(), CASE WHEN s = 1 THEN 'DEAD' ELSE 'PENDING' END,
                CASE WHEN s = 1 THEN 1 ELSE 0 END, CASE WHEN s = 1 THEN 'refused' END
         FROM orders o CROSS JOIN generate_series(1, 11) s",
    )
    .bind(noisy)
    .execute(&db.pool)
    .await
    .unwrap();
    // Beside them, another tenant's due backlog that keeps every round full.
    let busy = Uuid::new_v4();
    backlog(&db, busy, 20_000, "now()").await;
    let app = spawn_publishing_app_on(db, &moto, &arn, &[]).await;
    a_quiet_tenant_goes_out_within_two_rounds(&app, busy).await;
    // The waiting rows are parked out of the due range (a lease at a time behind a
    // DEAD event), none of them published.
    app.db
        .until_count(
            &format!(
                "SELECT count(*) FROM outbox_event WHERE tenant_id = '{noisy}' AND status = 'PENDING'
                   AND aggregate_seq > 1 AND next_attempt_at > now()"
            ),
            5_000,
        )
        .await;
    let published: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_event WHERE tenant_id = $1 AND status = 'PUBLISHED'",
    )
    .bind(noisy)
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    assert_eq!(published, 0);

    // Re-driving one DEAD event brings its order back: all eleven go out, in order.
    let (head, order): (Uuid, Uuid) = sqlx::query_as(
        "SELECT event_id, aggregate_id FROM outbox_event
         WHERE tenant_id = $1 AND status = 'DEAD' LIMIT 1",
    )
    .bind(noisy)
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    sqlx::query(orderd::outbox::store::REDRIVE_ONE)
        .bind(head)
        .execute(&app.db.pool)
        .await
        .unwrap();
    app.db
        .until_count(
            &format!(
                "SELECT count(*) FROM outbox_event WHERE aggregate_id = '{order}' AND status = 'PUBLISHED'"
            ),
            11,
        )
        .await;
    let out_of_order: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_event a JOIN outbox_event b
           ON b.tenant_id = a.tenant_id AND b.aggregate_id = a.aggregate_id
          AND b.aggregate_seq = a.aggregate_seq + 1
         WHERE a.aggregate_id = $1 AND b.published_at < a.published_at",
    )
    .bind(order)
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    assert_eq!(out_of_order, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_spread_over_many_tenants_drains_round_after_round_without_waiting_for_the_poll()
{
    let moto = start_moto();
    let arn = bare_topic(&moto, "fairness-spread").await;
    let db = TestDb::new().await;
    // 2,000 tenants with one due event each, laid down before any relay listens (no
    // notification names them; the relay's first look finds them): every round visits
    // at most 100 tenants and claims one event of each. The poll is a minute away, so
    // only rounds that follow each other drain this before the wait below gives up.
    let tenants: Vec<Uuid> = (0..2_000).map(|_| Uuid::new_v4()).collect();
    sqlx::query(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
         SELECT t, gen_random_uuid(), gen_random_uuid(), 1, 'OrderCreated',
                jsonb_build_object('event_type', 'OrderCreated', 'schema_version', 1, 'tenant_id', t::text),
                now(), now()
         FROM unnest($1::uuid[]) t",
    )
    .bind(&tenants)
    .execute(&db.pool)
    .await
    .unwrap();
    let app = spawn_publishing_app_on(db, &moto, &arn, &[("ORDERD_OUTBOX_POLL_MS", "60000")]).await;
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            tenants.len() as i64,
        )
        .await;
    let rounds: i64 = sqlx::query_scalar("SELECT count(DISTINCT published_at) FROM outbox_event")
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    println!(
        "{} events of as many tenants in {rounds} rounds",
        tenants.len()
    );
    let per_round = tenants_per_round();
    assert!(
        rounds >= tenants.len() as i64 / per_round,
        "{rounds} rounds"
    );
}

/// How many tenants a round visits at most in the layout under test.
fn tenants_per_round() -> i64 {
    orderd::db::Layout::of(crate::support::on_citus())
        .pick(&orderd::outbox::store::TENANTS_PER_ROUND) as i64
}

/// Lays down one due event for each of `tenants`, due `due` (an SQL time).
async fn one_event_each(db: &TestDb, tenants: &[Uuid], due: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
         SELECT t, gen_random_uuid(), gen_random_uuid(), 1, 'OrderCreated',
                jsonb_build_object('event_type', 'OrderCreated', 'schema_version', 1, 'tenant_id', t::text),
                now(), {due}
         FROM unnest($1::uuid[]) t"
    )))
    .bind(tenants)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// Rounds one relay runs at once (`ORDERD_OUTBOX_PARALLEL_ROUNDS`'s default).
const PARALLEL_ROUNDS: f64 = 2.0;

/// The claim rounds that asked the database: a round that knows no tenant with due
/// events asks nothing and is not counted.
fn claim_rounds(metrics: &str) -> f64 {
    sample(metrics, "outbox_claim_duration_seconds_count").unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_tenant_goes_out_within_two_rounds_beside_20_000_tenants_in_backoff() {
    let topic = Topic::create(false).await;
    let db = TestDb::new().await;
    // 20,000 tenants whose one event waits out a backoff for an hour (a sink refused
    // them a minute ago).
    let waiting: Vec<Uuid> = (0..20_000).map(|_| Uuid::new_v4()).collect();
    one_event_each(&db, &waiting, "now() + interval '1 hour'").await;
    // A process of its own: its claim rounds are counted by its own metrics.
    let mut env = aws_env(&moto_endpoint());
    env.extend([
        ("ORDERD_RELAY", "on".to_string()),
        ("ORDERD_SNS_TOPIC_ARN", topic.arn.clone()),
    ]);
    let serve = ServeProcess::start(&db, &env);
    let quiet = Uuid::new_v4();
    let token = serve.token(quiet);
    let mut most = 0.0f64;
    for i in 0..10i64 {
        let before = claim_rounds(&serve.metrics().await);
        let created = post_order(
            &serve.base,
            &token,
            &new_key(),
            &order_body(&format!("QUIET-{i}"), 1),
            None,
        )
        .await;
        assert_eq!(created.status(), 201);
        published_of(&db, &[quiet], i + 1).await;
        let rounds = claim_rounds(&serve.metrics().await) - before;
        most = most.max(rounds);
    }
    // Each of the relay's rounds may visit the quiet tenant once; the walk over every
    // tenant with a pending row took hundreds.
    println!("at most {most} claim rounds from a quiet event's create to its publication");
    assert!(
        most <= 2.0 * PARALLEL_ROUNDS,
        "{most} claim rounds before a quiet event went out"
    );
    let untouched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_event
         WHERE tenant_id = ANY ($1) AND status = 'PENDING' AND claimed_by IS NULL",
    )
    .bind(&waiting)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(untouched, 20_000, "no round claimed an event in backoff");
}

/// Counts the statements that reach the outbox: an `UPDATE` statement trigger of the
/// test's own (a mark, two `UPDATE`s in one statement, counts two), on the table on one
/// server and on each shard on a distributed database (what the coordinator sends the
/// workers; Citus's own `citus_stat_counters` took in other databases' executions when
/// a backend slot changed hands).
struct OutboxStatements;

/// The counter, its function, and the trigger on `%s` (the table or a shard).
const COUNTER: &str = "CREATE TABLE outbox_statements (n bigint NOT NULL)";
const COUNTER_ROW: &str = "INSERT INTO outbox_statements VALUES (0)";
const COUNTING: &str =
    "CREATE FUNCTION count_outbox_statement() RETURNS trigger LANGUAGE plpgsql AS $f$
     BEGIN UPDATE outbox_statements SET n = n + 1; RETURN NULL; END $f$";
const TRIGGER: &str = "CREATE TRIGGER count_outbox_statement AFTER UPDATE ON %s
     FOR EACH STATEMENT EXECUTE FUNCTION count_outbox_statement()";

impl OutboxStatements {
    async fn count_on(db: &TestDb) -> Self {
        let on_citus = crate::support::on_citus();
        for statement in [COUNTER, COUNTER_ROW, COUNTING, TRIGGER] {
            let (sql, argument) = match (on_citus, statement == TRIGGER) {
                (false, _) => (statement.replace("%s", "outbox_event"), None),
                (true, false) => (
                    "SELECT success FROM run_command_on_workers($1)".to_string(),
                    Some(statement),
                ),
                (true, true) => (
                    "SELECT success FROM run_command_on_shards('outbox_event', $1)".to_string(),
                    Some(statement),
                ),
            };
            match argument {
                None => {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&db.pool)
                        .await
                        .unwrap();
                }
                Some(command) => {
                    // Local objects of each worker: Citus would otherwise send the DDL
                    // on, or refuse it on a worker.
                    let command = format!("SET citus.enable_ddl_propagation TO off; {command}");
                    let done: Vec<bool> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                        .bind(&command)
                        .fetch_all(&db.pool)
                        .await
                        .unwrap();
                    assert!(done.iter().all(|ok| *ok), "{command}");
                }
            }
        }
        Self
    }

    async fn so_far(&self, db: &TestDb) -> i64 {
        let read = if crate::support::on_citus() {
            "SELECT sum(result::bigint)::bigint
             FROM run_command_on_workers('SELECT n FROM outbox_statements')"
        } else {
            "SELECT n FROM outbox_statements"
        };
        sqlx::query_scalar(read).fetch_one(&db.pool).await.unwrap()
    }
}

/// `count` new tenant ids; on a distributed database all in one shard, so that what a
/// round sends to the shards is one statement per step, as on one server.
async fn tenants_of_one_shard(db: &TestDb, count: usize) -> Vec<Uuid> {
    if !crate::support::on_citus() {
        return (0..count).map(|_| Uuid::new_v4()).collect();
    }
    let mut found: Vec<Uuid> = Vec::new();
    while found.len() < count {
        let candidates: Vec<Uuid> = (0..20_000).map(|_| Uuid::new_v4()).collect();
        let shard_of = found.first().copied().unwrap_or(candidates[0]);
        let same: Vec<Uuid> = sqlx::query_scalar(
            "SELECT t FROM unnest($1::uuid[]) t
             WHERE get_shard_id_for_distribution_column('outbox_event', t)
                 = get_shard_id_for_distribution_column('outbox_event', $2::uuid)",
        )
        .bind(&candidates)
        .bind(shard_of)
        .fetch_all(&db.pool)
        .await
        .unwrap();
        found.extend(same);
    }
    found.truncate(count);
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_s_statements_do_not_grow_with_the_number_of_its_tenants() {
    let moto = start_moto();
    let arn = bare_topic(&moto, "fairness-statements").await;
    let db = TestDb::new().await;
    let statements = OutboxStatements::count_on(&db).await;
    // 1,000 tenants with one due event each (on a distributed database, of one shard).
    let tenants = tenants_of_one_shard(&db, 1_000).await;
    one_event_each(&db, &tenants, "now()").await;
    let before = statements.so_far(&db).await;
    let app = spawn_publishing_app_on(db, &moto, &arn, &[]).await;
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            tenants.len() as i64,
        )
        .await;
    let sent = statements.so_far(&app.db).await - before;
    let rounds: i64 = sqlx::query_scalar("SELECT count(DISTINCT published_at) FROM outbox_event")
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    println!(
        "{} tenants' events in {rounds} rounds, {sent} statements to the outbox",
        tenants.len()
    );
    // A round visits up to 100 tenants (32 on Citus), and its claim, park, second
    // claim and mark are a handful of statements whatever its tenants: far fewer than
    // one per tenant (a statement or two per tenant, as before, cost two thousand and
    // more here). On Citus the count also takes in the service's own reads (its gauges,
    // its looks).
    assert!(
        rounds <= 10 * tenants.len() as i64 / tenants_per_round(),
        "{rounds} rounds: few tenants in each"
    );
    assert!(
        sent <= tenants.len() as i64 / 5,
        "{sent} statements for {rounds} rounds of {} tenants",
        tenants.len()
    );
}
