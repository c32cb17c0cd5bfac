//! A small load generator for orderd, the Rust twin of the k6 scenarios, for
//! measurements from one process. It talks to a running orderd over HTTP and prints
//! throughput and latency percentiles; it asserts nothing about time.
//!
//! ```sh
//! cargo run --release --example loadgen -- create  --base http://127.0.0.1:8080 --token "$TOKEN" --requests 5000 --concurrency 16
//! cargo run --release --example loadgen -- replay  --base ... --token ... --requests 5000 --concurrency 16
//! cargo run --release --example loadgen -- race    --base ... --token ... --requests 50  --rounds 20
//! ```
//!
//! `create` sends unique keys (every request executes), `replay` sends one key over and
//! over (every request after the first is a replay), `race` fires `--requests` identical
//! requests at once per round and counts the answers.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use clap::{Parser, ValueEnum};
use futures::{StreamExt, stream};

#[derive(Parser)]
struct Args {
    #[arg(value_enum)]
    mode: Mode,
    /// Where orderd listens.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    base: String,
    /// A token with the `orders:write` scope.
    #[arg(long, env = "TOKEN")]
    token: String,
    /// Requests in all (`create`, `replay`) or per round (`race`).
    #[arg(long, default_value_t = 1000)]
    requests: usize,
    /// Requests in flight at once (`create`, `replay`).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Rounds of identical requests (`race`).
    #[arg(long, default_value_t = 10)]
    rounds: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Create,
    Replay,
    Race,
}

fn unique_key() -> String {
    format!("load-{}", uuid::Uuid::new_v4().simple())
}

async fn post(client: &reqwest::Client, args: &Args, key: &str) -> (u16, Duration) {
    let started = Instant::now();
    let status = client
        .post(format!("{}/v1/orders", args.base))
        .bearer_auth(&args.token)
        .header("Idempotency-Key", key)
        .header("content-type", "application/json")
        .body(r#"{"sku":"LOAD-1","quantity":1}"#)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0);
    (status, started.elapsed())
}

fn report(label: &str, results: &[(u16, Duration)], wall: Duration) {
    let mut latencies: Vec<Duration> = results.iter().map(|r| r.1).collect();
    latencies.sort();
    let pct = |p: f64| {
        latencies[((latencies.len() as f64 * p).ceil() as usize)
            .saturating_sub(1)
            .min(latencies.len() - 1)]
    };
    let mut statuses = BTreeMap::new();
    for (status, _) in results {
        *statuses.entry(*status).or_insert(0usize) += 1;
    }
    println!(
        "{label}: {} requests in {:.2}s = {:.0} req/s; p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; statuses {:?}",
        results.len(),
        wall.as_secs_f64(),
        results.len() as f64 / wall.as_secs_f64(),
        pct(0.50).as_secs_f64() * 1000.0,
        pct(0.99).as_secs_f64() * 1000.0,
        latencies.last().unwrap().as_secs_f64() * 1000.0,
        statuses
    );
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency.max(64))
        .build()
        .unwrap();
    match args.mode {
        Mode::Create | Mode::Replay => {
            let fixed = unique_key();
            let replay = args.mode == Mode::Replay;
            if replay {
                post(&client, &args, &fixed).await;
            }
            let started = Instant::now();
            let results: Vec<(u16, Duration)> = stream::iter(0..args.requests)
                .map(|_| {
                    let key = if replay { fixed.clone() } else { unique_key() };
                    let (client, args) = (&client, &args);
                    async move { post(client, args, &key).await }
                })
                .buffer_unordered(args.concurrency)
                .collect()
                .await;
            report(
                if replay { "replay" } else { "create" },
                &results,
                started.elapsed(),
            );
        }
        Mode::Race => {
            let mut all = Vec::new();
            let started = Instant::now();
            let mut executed = 0;
            for _ in 0..args.rounds {
                let key = unique_key();
                let round: Vec<(u16, Duration)> = futures::future::join_all(
                    (0..args.requests).map(|_| post(&client, &args, &key)),
                )
                .await;
                executed += round.iter().filter(|r| r.0 == 201).count().min(1);
                all.extend(round);
            }
            report("race", &all, started.elapsed());
            println!(
                "race: {} rounds, {} with a 201; no status other than 201/409 expected",
                args.rounds, executed
            );
        }
    }
}
