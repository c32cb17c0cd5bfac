//! The `orderd` command line (contract section 1).

use std::time::Duration;

use clap::{Parser, Subcommand};
use uuid::Uuid;

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
    /// Run one pass of the idempotency retention purge and exit.
    Purge,
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
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(format!("`{text}`: the unit must be s, m, h or d")),
    };
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
