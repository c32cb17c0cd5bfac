//! The `orderd` command line: the subcommands and what each one does.
//!
//! The long-running commands are composed in `app`; the one-shot commands are small
//! enough to live here, each in a function of its own.

use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use uuid::Uuid;

use crate::{
    api, app, app::Config, auth, auth::JwtConfig, citus, db, idempotency, lifecycle, outbox,
    reconcile, retention, service, telemetry, tenant::TenantId,
};

#[derive(Debug, Parser)]
#[command(
    name = "orderd",
    version,
    about = "Idempotent multi-tenant order service with a transactional outbox"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// HTTP API plus background jobs; applies pending migrations first unless ORDERD_MIGRATE=false.
    Serve,
    /// The outbox relay alone (scale it apart from the API).
    Relay,
    /// Apply pending migrations and exit.
    Migrate,
    /// Run one pass of the idempotency retention purge (expired keys, abandoned claims) and exit.
    Purge,
    /// One reconciliation pass: orders without their event, stored successes without
    /// their order; prints the findings and exits 1 when there is any.
    Reconcile,
    /// Mint a development JWT signed with ORDERD_JWT_HS256_SECRET; prints only the token.
    Token {
        /// The tenant the token is for.
        #[arg(long)]
        tenant: Uuid,
        /// Space-separated scopes.
        #[arg(long, default_value = "orders:read orders:write")]
        scope: String,
        /// Lifetime, e.g. 30s, 15m, 1h, 7d.
        #[arg(long, default_value = "1h", value_parser = parse_ttl)]
        ttl: Duration,
        /// The `sub` claim: who is calling.
        #[arg(long, default_value = "dev")]
        sub: String,
    },
    /// Print the OpenAPI document the server serves (JSON, or YAML with --yaml).
    Openapi {
        #[arg(long)]
        yaml: bool,
    },
    /// Operate the outbox.
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// The keys that seal stored responses (ORDERD_RESPONSE_KEYS).
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// A tenant's data as a whole.
    Tenant {
        #[command(subcommand)]
        command: TenantCommand,
    },
    /// One idempotency record, named by tenant, endpoint and key.
    Idempotency {
        #[command(subcommand)]
        command: IdempotencyCommand,
    },
    /// The database on a Citus cluster (docs/scaling.md).
    Citus {
        #[command(subcommand)]
        command: CitusCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum CitusCommand {
    /// Distribute the tables of a database that already holds data, in place, without
    /// blocking writes while rows are copied; resumes where a stopped run ended. Needs
    /// the citus extension on every node, the workers registered and wal_level =
    /// logical. Restart every orderd process afterwards.
    Distribute,
    /// The rollback: bring every table back onto the coordinator (blocks writes to each
    /// table while it is copied) with the single-server trigger and index.
    Undistribute,
}

#[derive(Debug, Subcommand)]
pub enum IdempotencyCommand {
    /// Print the record: state, times, stored status and resource, fingerprint, the key
    /// its body is sealed under; never the body unless --body. Exits 1 when there is no
    /// such record.
    Show {
        #[command(flatten)]
        record: RecordName,
        /// Print the stored body too (opened with ORDERD_RESPONSE_KEYS when sealed).
        #[arg(long)]
        body: bool,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Delete the record, so that the client's next retry runs afresh, and make every
    /// process drop it from its replay cache. Refuses a live claim, and a stored
    /// success unless --force. Logs who did it.
    Forget {
        #[command(flatten)]
        record: RecordName,
        /// Forget a stored success too (the next retry then creates anew).
        #[arg(long)]
        force: bool,
        /// Who asks, logged with what was forgotten; default the operating-system user.
        #[arg(long)]
        actor: Option<String>,
    },
}

/// The primary key of an idempotency record, as an operator spells it.
#[derive(Debug, Args)]
pub struct RecordName {
    #[arg(long)]
    tenant: Uuid,
    /// The operation, as stored: `POST /v1/orders` or `POST /v1/orders/{id}/cancel`.
    #[arg(long)]
    endpoint: String,
    /// The Idempotency-Key as the client sent it (a UUID in any case, or quoted).
    #[arg(long)]
    key: String,
}

impl RecordName {
    /// The record's scope, or a line saying what is wrong with the name.
    fn scope(&self) -> anyhow::Result<idempotency::Scope> {
        let endpoint = service::Endpoint::parse(&self.endpoint).ok_or_else(|| {
            let known: Vec<_> = service::Endpoint::ALL.iter().map(|e| e.as_str()).collect();
            anyhow::anyhow!(
                "--endpoint `{}` is not an idempotent operation; one of: {}",
                self.endpoint,
                known.join(", ")
            )
        })?;
        let key = idempotency::IdempotencyKey::parse(Some(&self.key))
            .map_err(|e| anyhow::anyhow!("--key: {e}"))?;
        Ok(idempotency::Scope {
            tenant: TenantId(self.tenant),
            endpoint: endpoint.as_str(),
            key,
        })
    }
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Seal every stored response not under the first of ORDERD_RESPONSE_KEYS (in clear,
    /// under another key, or with an older layout) under it, in batches; safe beside
    /// live traffic and another rewrap, resumable. Exits 0 only when no completed
    /// record is left unsealed; otherwise 1, saying how many and which.
    Rewrap {
        /// Records per batch (one short transaction each).
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..=10_000))]
        batch: i64,
        /// How long to keep retrying records that other transactions hold, in seconds.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=3600))]
        wait: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Write the tenant's orders to stdout as JSON lines (the API's Order), oldest first.
    Export {
        #[arg(long)]
        tenant: Uuid,
    },
    /// Delete the tenant's orders, idempotency records and events in batches, refusing
    /// its writes in every process meanwhile; publishes nothing; resumable. Exits 0 only
    /// when no row of the tenant is left; afterwards its tokens work and find nothing.
    Erase {
        #[arg(long)]
        tenant: Uuid,
        /// Rows per statement.
        #[arg(long, default_value_t = lifecycle::ERASE_BATCH, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        batch: u32,
        /// Rows deleted per second at most, so that other tenants do not notice; 0: as
        /// fast as the database goes.
        #[arg(long, default_value_t = lifecycle::ERASE_ROWS_PER_SEC, value_parser = clap::value_parser!(u32).range(0..=10_000_000))]
        rows_per_sec: u32,
        /// Who asks, kept with the erasure's mark and logged; default the operating-system
        /// user.
        #[arg(long)]
        actor: Option<String>,
        /// How long to wait for the transactions that were running when the tenant was
        /// marked; past it the erase stops with exit 1, the mark left (run it again).
        #[arg(long, default_value_t = lifecycle::ERASE_WAIT_SECS, value_parser = clap::value_parser!(u64).range(1..=86_400))]
        wait_secs: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Put DEAD events back in line for publishing.
    Redrive {
        /// One event, by its event_id.
        #[arg(
            long,
            conflicts_with = "all_dead",
            required_unless_present = "all_dead"
        )]
        id: Option<Uuid>,
        /// Every DEAD event.
        #[arg(long)]
        all_dead: bool,
    },
    /// Print pending count, oldest pending age and dead count.
    Stats,
}

/// Runs one subcommand to completion, then exports the spans still buffered.
pub async fn run(command: Command) -> anyhow::Result<()> {
    let done = run_command(command).await;
    telemetry::flush().await;
    done
}

async fn run_command(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve => app::serve(configured()?).await,
        Command::Relay => app::relay(configured()?).await,
        Command::Migrate => migrate(configured()?).await,
        Command::Purge => purge(configured()?).await,
        Command::Reconcile => reconcile(configured()?).await,
        Command::Outbox { command } => outbox_command(configured()?, command).await,
        Command::Keys {
            command: KeysCommand::Rewrap { batch, wait },
        } => rewrap(configured()?, batch, Duration::from_secs(wait)).await,
        Command::Tenant { command } => tenant_command(configured()?, command).await,
        Command::Idempotency { command } => idempotency_command(configured()?, command).await,
        Command::Citus { command } => citus_command(configured()?, command).await,
        Command::Token {
            tenant,
            scope,
            ttl,
            sub,
        } => token(tenant, &scope, ttl, &sub),
        Command::Openapi { yaml } => {
            print!(
                "{}",
                if yaml {
                    api::spec::yaml()
                } else {
                    api::spec::json()
                }
            );
            Ok(())
        }
    }
}

/// The whole configuration, with logging set up as it asks.
fn configured() -> anyhow::Result<Config> {
    let config = Config::from_env()?;
    telemetry::init(config.log.json);
    Ok(config)
}

async fn migrate(config: Config) -> anyhow::Result<()> {
    db::migrate(&config.db).await?;
    tracing::info!("migrations applied");
    Ok(())
}

async fn purge(config: Config) -> anyhow::Result<()> {
    let db = db::db_of_size(&config.db, 2).await?;
    let report = retention::purge_idempotency_once(&db, retention::PURGE_BATCH).await?;
    println!(
        "purged {} expired keys and {} abandoned claims",
        report.expired_keys, report.abandoned_claims
    );
    Ok(())
}

async fn reconcile(config: Config) -> anyhow::Result<()> {
    let db = db::db_of_size(&config.db, 2).await?;
    let window = config.outbox.retention;
    let started = std::time::Instant::now();
    let report = reconcile::reconcile_once(&db, window, reconcile::RECONCILE_BATCH).await?;
    println!(
        "checked {} orders changed in the last {} s and {} completed keys in {:.2} s",
        report.orders_checked,
        window.as_secs(),
        report.keys_checked,
        started.elapsed().as_secs_f64()
    );
    println!("orders without event: {}", report.orders_without_event);
    for order in &report.orders {
        println!(
            "  tenant {} order {} is {} but has no {}",
            order.tenant_id,
            order.order_id,
            order.status,
            order.missing_event()
        );
    }
    println!("keys without order: {}", report.keys_without_order);
    for key in &report.keys {
        println!(
            "  tenant {} {} Idempotency-Key {:?} answered a success naming a missing order",
            key.tenant_id, key.endpoint, key.idem_key
        );
    }
    let shown = report.orders.len() as u64 + report.keys.len() as u64;
    if shown < report.orders_without_event + report.keys_without_order {
        println!(
            "  (the first {} of each kind are listed)",
            reconcile::KEPT_FINDINGS
        );
    }
    if !report.complete() {
        println!(
            "unreadable shards: {} (their worker did not answer; they were not checked)",
            report.unreadable_shards
        );
    }
    anyhow::ensure!(
        report.complete(),
        "reconciliation left {} shards unchecked: not a clean pass",
        report.unreadable_shards
    );
    anyhow::ensure!(
        report.clean(),
        "reconciliation found {} orders without event and {} keys without order",
        report.orders_without_event,
        report.keys_without_order
    );
    Ok(())
}

async fn outbox_command(config: Config, command: OutboxCommand) -> anyhow::Result<()> {
    let db = db::db_of_size(&config.db, 2).await?;
    match command {
        OutboxCommand::Redrive { id: Some(id), .. } => {
            let n = db
                .run(async |c| outbox::store::redrive_one(c, id).await)
                .await?;
            println!("re-drove {n} dead events");
        }
        OutboxCommand::Redrive { id: None, .. } => {
            let n = db
                .run(async |c| outbox::store::redrive_all_dead(c).await)
                .await?;
            println!("re-drove {n} dead events");
        }
        OutboxCommand::Stats => {
            let stats = db.run(async |c| outbox::store::stats(c).await).await?;
            println!("pending {}", stats.pending);
            println!(
                "oldest_pending_age_seconds {:.3}",
                stats.oldest_pending_age_secs
            );
            println!("dead {}", stats.dead);
            if stats.unreadable_shards > 0 {
                // The figures above leave these out: say so, and fail.
                println!("unreadable_shards {}", stats.unreadable_shards);
                anyhow::bail!(
                    "{} shards were not read: a worker did not answer",
                    stats.unreadable_shards
                );
            }
        }
    }
    Ok(())
}

async fn citus_command(config: Config, command: CitusCommand) -> anyhow::Result<()> {
    let mut conn = db::direct_session(&config.db).await?;
    let started = std::time::Instant::now();
    let report = |step: &citus::Step| match step.took {
        Some(took) => println!("{:<60} {:>9.2} s", step.what, took.as_secs_f64()),
        None => println!("{:<60} {:>9}", step.what, "done before"),
    };
    let (held, now) = match command {
        CitusCommand::Distribute => (citus::distribute(&mut conn, report).await?, "distributed"),
        CitusCommand::Undistribute => (
            citus::undistribute(&mut conn, report).await?,
            "back on the coordinator",
        ),
    };
    match held {
        Some(held) => println!(
            "{now} in {:.2} s, writes to the tables held back for {:.2} s; restart every orderd process (serve, relay) so that each runs the statements of this layout",
            started.elapsed().as_secs_f64(),
            held.as_secs_f64()
        ),
        None => println!("{now} already: nothing to do"),
    }
    Ok(())
}

async fn rewrap(config: Config, batch: i64, wait: Duration) -> anyhow::Result<()> {
    use idempotency::{rewrap::Why, seal};
    let db = db::db_of_size(&config.db, 2).await?;
    // Records in clear are what a rewrap seals: it reads them whatever replays do.
    let sealer = seal::Sealer::new(&config.idempotency.response_keys, seal::ClearRecords::Serve);
    let mut reported = std::time::Instant::now();
    let report = idempotency::rewrap::rewrap(&db, &sealer, batch, wait, |so_far| {
        if reported.elapsed().as_secs() >= 5 {
            reported = std::time::Instant::now();
            eprintln!("  ... {} resealed so far", so_far.resealed);
        }
    })
    .await?;
    let under = sealer.sealing_key().unwrap_or_default();
    println!(
        "resealed {} stored responses under key `{under}` ({} of them were stored in clear) in {:.1} s, {:.0} records/s",
        report.resealed,
        report.were_clear,
        report.seconds,
        report.resealed as f64 / report.seconds.max(1e-9)
    );
    if report.complete() {
        println!("every completed record is sealed under key `{under}`");
        return Ok(());
    }
    println!(
        "{} completed records are not sealed under key `{under}`:",
        report.left
    );
    for (key, count) in report.unknown_keys() {
        println!(
            "  {count} records are sealed under key `{key}`, which is not configured: left as they are"
        );
    }
    let unreadable = report.count(&Why::Unreadable);
    if unreadable > 0 {
        println!(
            "  {unreadable} records do not open under the key they name: left as they are (see the log)"
        );
    }
    let held = report.count(&Why::Held);
    if held > 0 {
        println!(
            "  {held} records were held by other transactions for the whole wait ({} s): run it again",
            wait.as_secs()
        );
    }
    for left in report.named.iter().take(20) {
        let (tenant, endpoint, key) = &left.record;
        println!(
            "  - tenant {tenant}, `{endpoint}`, key `{key}`: {:?}",
            left.why
        );
    }
    anyhow::bail!(
        "{} stored responses are not sealed under `{under}`: keep the other keys configured",
        report.left
    )
}

async fn tenant_command(config: Config, command: TenantCommand) -> anyhow::Result<()> {
    let db = db::db_of_size(&config.db, 2).await?;
    match command {
        TenantCommand::Export { tenant } => {
            let started = std::time::Instant::now();
            let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
            let mut session = db::direct_session(&config.db).await?;
            let written = lifecycle::export(&db, &mut session, TenantId(tenant), &mut out).await?;
            let secs = started.elapsed().as_secs_f64();
            eprintln!(
                "exported {written} orders of tenant {tenant} in {secs:.1} s, {:.0} orders/s",
                written as f64 / secs.max(1e-9)
            );
        }
        TenantCommand::Erase {
            tenant,
            batch,
            rows_per_sec,
            actor,
            wait_secs,
        } => {
            let mut reported = std::time::Instant::now();
            let plan = lifecycle::ErasePlan {
                batch,
                rows_per_sec: std::num::NonZeroU32::new(rows_per_sec),
                actor: actor.unwrap_or_else(os_user),
                relay_lease: outbox::relay::claim_lease(config.outbox.publish_timeout),
                heard_within: config.db.listen_bound,
                wait_for_running: std::time::Duration::from_secs(wait_secs),
            };
            tracing::info!(tenant = %tenant, actor = %plan.actor, "tenant erasure started");
            let erased = lifecycle::erase(&db, TenantId(tenant), &plan, |so_far| {
                if reported.elapsed().as_secs() >= 5 {
                    reported = std::time::Instant::now();
                    eprintln!("  ... {} rows deleted so far", so_far.rows());
                }
            })
            .await?;
            println!(
                "erased tenant {tenant}: {} orders, {} idempotency records, {} events in {:.1} s \
                 ({} passes; deleting at {:.0} rows/s); no row of the tenant is left",
                erased.orders,
                erased.records,
                erased.events,
                erased.seconds,
                erased.passes,
                erased.rows() as f64 / erased.deleting_seconds.max(1e-9)
            );
        }
    }
    Ok(())
}

async fn idempotency_command(config: Config, command: IdempotencyCommand) -> anyhow::Result<()> {
    use idempotency::{
        operator::{self, Refused},
        seal,
    };
    let db = db::db_of_size(&config.db, 1).await?;
    match command {
        IdempotencyCommand::Show { record, body, json } => {
            let scope = record.scope()?;
            let sealer = body.then(|| {
                seal::Sealer::new(&config.idempotency.response_keys, seal::ClearRecords::Serve)
            });
            let shown = match operator::show(&db, &scope, sealer.as_ref()).await {
                Err(Refused::Missing) => anyhow::bail!(
                    "no idempotency record for tenant {}, `{}`, key `{}`",
                    scope.tenant.0,
                    scope.endpoint,
                    scope.key.as_str()
                ),
                shown => shown?,
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&shown)?);
            } else {
                print!("{}", render(&shown));
            }
        }
        IdempotencyCommand::Forget {
            record,
            force,
            actor,
        } => {
            let scope = record.scope()?;
            let actor = actor.unwrap_or_else(os_user);
            match operator::forget(&db, &scope, force, &actor, config.db.listen_bound).await {
                Ok(was) => println!(
                    "forgot the {} record of tenant {}, `{}`, key `{}`{}: the next request with this key runs afresh in every process",
                    was.state,
                    scope.tenant.0,
                    scope.endpoint,
                    scope.key.as_str(),
                    was.status
                        .map(|s| format!(" (stored {s})"))
                        .unwrap_or_default()
                ),
                Err(Refused::Missing) => anyhow::bail!(
                    "no idempotency record for tenant {}, `{}`, key `{}`: nothing to forget",
                    scope.tenant.0,
                    scope.endpoint,
                    scope.key.as_str()
                ),
                Err(e) => anyhow::bail!("not forgotten: {e}"),
            }
        }
    }
    Ok(())
}

/// A record as text, one `name: value` line each, the body (when shown) last.
fn render(shown: &idempotency::operator::Shown) -> String {
    let time = |at: Option<chrono::DateTime<chrono::Utc>>| {
        at.map_or_else(
            || "-".to_string(),
            |at| at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        )
    };
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
    let expires = match shown.expires_at {
        Some(_) if shown.record.is_expired() => format!("{} (passed)", time(shown.expires_at)),
        at => time(at),
    };
    let lease = match shown.lease_until {
        Some(_) if shown.record.live_lease().is_some() => {
            format!("{} (live)", time(shown.lease_until))
        }
        Some(_) => format!("{} (passed)", time(shown.lease_until)),
        None => "-".to_string(),
    };
    let sealed = match (&shown.sealed_with, shown.seal_version) {
        (Some(key), Some(version)) => format!("key `{key}` (layout {version})"),
        (Some(key), None) => format!("key `{key}`"),
        (None, _) => "in clear".to_string(),
    };
    let mut out = String::new();
    for (name, value) in [
        ("tenant", shown.tenant_id.to_string()),
        ("endpoint", shown.endpoint.clone()),
        ("key", shown.key.clone()),
        ("state", shown.state.clone()),
        ("created", time(Some(shown.created_at))),
        ("completed", time(shown.completed_at)),
        ("expires", expires),
        ("lease", lease),
        ("status", or_dash(shown.status.map(|s| s.to_string()))),
        (
            "resource",
            or_dash(shown.resource_id.map(|id| id.to_string())),
        ),
        ("location", or_dash(shown.location.clone())),
        ("content type", or_dash(shown.content_type.clone())),
        ("fingerprint", format!("sha256:{}", shown.fingerprint)),
        ("sealed", sealed),
        (
            "body bytes",
            or_dash(shown.body_bytes.map(|n| n.to_string())),
        ),
        ("read at", time(Some(shown.read_at))),
    ] {
        out.push_str(&format!("{name:<13} {value}\n"));
    }
    if let Some(body) = &shown.body {
        out.push_str(&format!("\n{body}\n"));
    }
    out
}

/// The operating-system user running this command, for audit lines.
pub fn os_user() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| format!("uid {}", numeric_uid()))
}

/// The numeric user id, read from `/proc` (no `libc` call needed).
fn numeric_uid() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().next().map(String::from))
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Mints a dev token: needs only the JWT settings, no database.
fn token(tenant: Uuid, scope: &str, ttl: Duration, sub: &str) -> anyhow::Result<()> {
    let jwt = JwtConfig::from_env()?;
    let secret = jwt
        .signing_secret()
        .context("ORDERD_JWT_HS256_SECRET must be set to mint a token")?;
    let token = auth::mint_hs256(&secret, tenant, sub, scope, ttl, jwt.issuer, jwt.audience)?;
    println!("{token}");
    Ok(())
}

/// Parses `<number><s|m|h|d>` (a bare number is seconds).
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a duration like 90s, 15m, 1h or 7d"))?;
    let unit_secs = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("`{text}`: the unit must be s, m, h or d")),
    };
    let secs = n
        .checked_mul(unit_secs)
        .filter(|&s| s <= 366 * 86_400)
        .ok_or_else(|| format!("`{text}`: at most a year"))?;
    if secs == 0 {
        return Err("the lifetime must be positive".into());
    }
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_parse_with_units() {
        assert_eq!(parse_ttl("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_ttl("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_ttl("7d"), Ok(Duration::from_secs(604_800)));
        assert!(parse_ttl("1w").is_err() && parse_ttl("0s").is_err() && parse_ttl("h").is_err());
    }
}
