//! The `orderd` binary: parse the command line, set up logging, dispatch.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use orderd::{
    app, auth,
    cli::{Cli, Command, OutboxCommand},
    config::{Config, JwtConfig},
    db, maintenance, outbox, telemetry,
};

fn main() -> ExitCode {
    // A missing .env is normal; the real environment always wins over it.
    let _ = dotenvy::dotenv();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("orderd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, naming what is wrong (configuration errors name the variable).
            eprintln!("orderd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve => {
            let config = Config::from_env()?;
            if config.outbox.relay_enabled {
                config.outbox.topic_arn()?;
            }
            telemetry::init(config.log_json);
            let pool = db::connect(config.database_url.expose(), config.db_pool_size)
                .await
                .context("cannot connect to the database (DATABASE_URL)")?;
            if config.migrate_on_start {
                db::MIGRATOR.run(&pool).await.context("migrations failed")?;
            }
            let application = app::Application::build(config, pool).await?;
            application.run_until(app::shutdown_signal()).await
        }
        Command::Relay => {
            let config = Config::from_env()?;
            config.outbox.topic_arn()?;
            telemetry::init(config.log_json);
            let pool = connect(&config, config.db_pool_size).await?;
            let publisher = app::sns_publisher(&config).await?;
            app::run_relay(config, pool, publisher, app::shutdown_signal()).await
        }
        Command::Outbox { command } => {
            let config = Config::from_env()?;
            telemetry::init(config.log_json);
            let pool = connect(&config, 2).await?;
            match command {
                OutboxCommand::Redrive { id, .. } => {
                    let n = outbox::store::redrive(&pool, id).await?;
                    println!("re-drove {n} dead events");
                }
                OutboxCommand::Stats => {
                    let stats = outbox::store::stats(&pool).await?;
                    println!("pending {}", stats.pending);
                    println!(
                        "oldest_pending_age_seconds {:.3}",
                        stats.oldest_pending_age_secs
                    );
                    println!("dead {}", stats.dead);
                }
            }
            Ok(())
        }
        Command::Migrate => {
            let config = Config::from_env()?;
            telemetry::init(config.log_json);
            let pool = db::connect(config.database_url.expose(), 2)
                .await
                .context("cannot connect to the database (DATABASE_URL)")?;
            db::MIGRATOR.run(&pool).await.context("migrations failed")?;
            tracing::info!("migrations applied");
            Ok(())
        }
        Command::Purge => {
            let config = Config::from_env()?;
            telemetry::init(config.log_json);
            let pool = db::connect(config.database_url.expose(), 2)
                .await
                .context("cannot connect to the database (DATABASE_URL)")?;
            let report = maintenance::purge_once(&pool, maintenance::PURGE_BATCH).await?;
            println!(
                "purged {} expired keys and {} abandoned claims",
                report.expired_keys, report.abandoned_claims
            );
            Ok(())
        }
        Command::Token {
            tenant,
            scope,
            ttl,
            sub,
        } => {
            let jwt = JwtConfig::from_env()?;
            let secret = jwt
                .hs256_secret
                .context("ORDERD_JWT_HS256_SECRET must be set to mint a token")?;
            let token =
                auth::mint_hs256(&secret, tenant, &sub, &scope, ttl, jwt.issuer, jwt.audience)?;
            println!("{token}");
            Ok(())
        }
        Command::Openapi { yaml } => {
            print!(
                "{}",
                if yaml {
                    app::openapi_yaml()
                } else {
                    app::openapi_json()
                }
            );
            Ok(())
        }
    }
}

async fn connect(config: &Config, size: u32) -> anyhow::Result<sqlx::PgPool> {
    db::connect(config.database_url.expose(), size)
        .await
        .context("cannot connect to the database (DATABASE_URL)")
}
