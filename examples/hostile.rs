//! Measures what hostile or greedy clients do to everyone else, against a running
//! orderd. Prints numbers; asserts nothing.
//!
//! ```sh
//! cargo run --release --example hostile -- --base http://127.0.0.1:8080 --token "$TOKEN" \
//!     slow-clients --connections 2000
//! cargo run --release --example hostile -- --base http://127.0.0.1:8080 --token "$QUIET" \
//!     noisy-neighbour --noisy-token "$NOISY" --flood 300
//! ```
//!
//! `slow-clients` measures normal request latency alone, then with N connections that
//! trickle a request head one byte every two seconds, and counts how many of those the
//! server still holds after 15 s. `slow-bodies` does the same with N connections that
//! send a whole head without a token and trickle the body. `noisy-neighbour` measures one tenant's create latency
//! alone, then while another tenant keeps N creates in flight.

use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use futures::{StreamExt, stream};
use tokio::{io::AsyncWriteExt, net::TcpStream};

#[derive(Parser)]
struct Args {
    /// Where orderd listens.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    base: String,
    /// A token for the measured ("quiet") tenant.
    #[arg(long, env = "TOKEN")]
    token: String,
    /// Measured requests per phase.
    #[arg(long, default_value_t = 400)]
    requests: usize,
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// Many connections that send a request head one byte every two seconds.
    SlowClients {
        #[arg(long, default_value_t = 2000)]
        connections: usize,
    },
    /// Many connections without a token that announce a 60,000-byte create body and
    /// trickle it, one byte every two seconds.
    SlowBodies {
        #[arg(long, default_value_t = 1100)]
        connections: usize,
    },
    /// Another tenant keeps `flood` creates in flight.
    NoisyNeighbour {
        #[arg(long)]
        noisy_token: String,
        #[arg(long, default_value_t = 300)]
        flood: usize,
    },
}

fn key() -> String {
    format!("hostile-{}", uuid::Uuid::new_v4().simple())
}

async fn create(client: &reqwest::Client, base: &str, token: &str) -> (u16, Duration) {
    let started = Instant::now();
    let status = client
        .post(format!("{base}/v1/orders"))
        .bearer_auth(token)
        .header("Idempotency-Key", key())
        .header("content-type", "application/json")
        .body(r#"{"sku":"HOSTILE-1","quantity":1}"#)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0);
    (status, started.elapsed())
}

/// `requests` creates, `concurrency` at a time; prints p50/p99 and the statuses.
async fn measure(label: &str, client: &reqwest::Client, args: &Args, concurrency: usize) {
    let started = Instant::now();
    let mut results: Vec<(u16, Duration)> = stream::iter(0..args.requests)
        .map(|_| create(client, &args.base, &args.token))
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let wall = started.elapsed();
    results.sort_by_key(|r| r.1);
    let pct = |p: f64| {
        results[((results.len() as f64 * p).ceil() as usize).saturating_sub(1)]
            .1
            .as_secs_f64()
            * 1000.0
    };
    let ok = results.iter().filter(|r| r.0 == 201).count();
    println!(
        "{label}: {} creates in {:.2}s, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, {ok} x 201, {} other",
        results.len(),
        wall.as_secs_f64(),
        pct(0.50),
        pct(0.99),
        pct(1.0),
        results.len() - ok
    );
}

/// Opens a connection that sends a request head one byte every two seconds until the
/// server closes it; returns whether it is still open after `hold`.
async fn slow_connection(address: String, hold: Duration) -> bool {
    let Ok(mut stream) = TcpStream::connect(&address).await else {
        return false;
    };
    let head = b"POST /v1/orders HTTP/1.1\r\nHost: orderd\r\nX-Slow: ";
    let deadline = Instant::now() + hold;
    let mut bytes = head.iter().chain(std::iter::repeat(&b'a'));
    while Instant::now() < deadline {
        let byte = *bytes.next().unwrap_or(&b'a');
        if stream.write_all(&[byte]).await.is_err() {
            return false;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // Still writable after `hold`: the server kept it.
    stream.write_all(b"a").await.is_ok()
}

/// Opens a connection that sends a create head without a token, announcing a large body,
/// then trickles the body a byte every two seconds for `hold`.
async fn slow_body(address: String, hold: Duration) -> bool {
    let Ok(mut stream) = TcpStream::connect(&address).await else {
        return false;
    };
    let head = format!(
        "POST /v1/orders HTTP/1.1\r\nHost: orderd\r\nIdempotency-Key: {}\r\n\
         Content-Type: application/json\r\nContent-Length: 60000\r\n\r\n",
        key()
    );
    if stream.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    let deadline = Instant::now() + hold;
    while Instant::now() < deadline {
        if stream.write_all(b" ").await.is_err() {
            return false;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    true
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    match &args.scenario {
        Scenario::SlowClients { connections } => {
            measure("baseline", &client, &args, 8).await;
            let address = args.base.trim_start_matches("http://").to_string();
            let hold = Duration::from_secs(15);
            let slow = tokio::spawn({
                let connections = *connections;
                async move {
                    let tasks: Vec<_> = (0..connections)
                        .map(|_| tokio::spawn(slow_connection(address.clone(), hold)))
                        .collect();
                    let mut open = 0;
                    for task in tasks {
                        open += usize::from(task.await.unwrap_or(false));
                    }
                    open
                }
            });
            tokio::time::sleep(Duration::from_secs(2)).await;
            measure(
                &format!("with {connections} slow connections"),
                &client,
                &args,
                8,
            )
            .await;
            let still_open = slow.await.unwrap();
            println!(
                "slow connections still held by the server after 15 s: {still_open} of {connections}"
            );
        }
        Scenario::SlowBodies { connections } => {
            measure("baseline", &client, &args, 8).await;
            let address = args.base.trim_start_matches("http://").to_string();
            let hold = Duration::from_secs(12);
            let slow: Vec<_> = (0..*connections)
                .map(|_| tokio::spawn(slow_body(address.clone(), hold)))
                .collect();
            tokio::time::sleep(Duration::from_secs(2)).await;
            measure(
                &format!("with {connections} connections trickling bodies without a token"),
                &client,
                &args,
                8,
            )
            .await;
            for task in slow {
                let _ = task.await;
            }
        }
        Scenario::NoisyNeighbour { noisy_token, flood } => {
            measure("quiet tenant alone", &client, &args, 1).await;
            let stop = tokio_util::sync::CancellationToken::new();
            let noisy = tokio::spawn({
                let (stop, base, token, flood) =
                    (stop.clone(), args.base.clone(), noisy_token.clone(), *flood);
                async move {
                    let client = reqwest::Client::new();
                    let mut sent = 0usize;
                    let mut limited = 0usize;
                    let mut in_flight = stream::iter(0..)
                        .map(|_| create(&client, &base, &token))
                        .buffer_unordered(flood);
                    loop {
                        tokio::select! {
                            _ = stop.cancelled() => break,
                            next = in_flight.next() => match next {
                                Some((status, _)) => {
                                    sent += 1;
                                    limited += usize::from(status == 429);
                                }
                                None => break,
                            },
                        }
                    }
                    (sent, limited)
                }
            });
            tokio::time::sleep(Duration::from_secs(1)).await;
            measure(
                &format!("quiet tenant while another keeps {flood} in flight"),
                &client,
                &args,
                1,
            )
            .await;
            stop.cancel();
            let (sent, limited) = noisy.await.unwrap();
            println!("noisy tenant: {sent} creates answered, {limited} of them 429");
        }
    }
}
