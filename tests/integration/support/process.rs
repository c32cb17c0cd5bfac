//! orderd as a child process: its own metrics recorder, its own logs.

use std::time::Duration;

use uuid::Uuid;

use super::{
    app::{SECRET, token},
    db::TestDb,
};

/// `orderd serve` as a child process of its own (its own metrics recorder, its own
/// logs), killed on drop. `base` is its HTTP address; `logs` collects its stderr.
pub struct ServeProcess {
    pub child: std::process::Child,
    pub base: String,
    pub logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl ServeProcess {
    pub fn start(db: &TestDb, env: &[(&str, String)]) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_orderd"))
            .arg("serve")
            .env("DATABASE_URL", &db.url)
            .env("ORDERD_BIND", "127.0.0.1:0")
            .env("ORDERD_JWT_HS256_SECRET", SECRET)
            .env("ORDERD_RELAY", "off")
            .env("RUST_LOG", "info")
            .env("ORDERD_LOG_FORMAT", "json")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(address) = address_in(&line, "orderd listening") {
                    let _ = tx.send(address);
                } else if line.contains("orderd listening")
                    && let Some((_, rest)) = line.split_once("address=")
                {
                    // Text logs (`ORDERD_LOG_FORMAT=text`).
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                }
                sink.lock().unwrap().push(line);
            }
        });
        let address = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("serve logs its address");
        Self {
            child,
            base: format!("http://{address}"),
            logs,
        }
    }

    /// The `address` field of the JSON log line whose message is `message`
    /// (`"orderd listening"`, `"metrics listening"`), when one was logged.
    pub fn logged_address(&self, message: &str) -> Option<String> {
        let logs = self.logs.lock().unwrap();
        logs.iter().find_map(|line| address_in(line, message))
    }

    pub fn token(&self, tenant: Uuid) -> String {
        token(tenant, "orders:read orders:write")
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Polls `/metrics` until `done` holds (or a generous deadline passes); returns the
    /// last text read, for the caller to assert on.
    pub async fn metrics_until(&self, done: impl Fn(&str) -> bool) -> String {
        let mut text = String::new();
        for _ in 0..300 {
            text = self.metrics().await;
            if done(&text) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        text
    }
}

/// The `address` field of `line`, a JSON log line, when its message is `message`.
fn address_in(line: &str, message: &str) -> Option<String> {
    let entry: serde_json::Value = serde_json::from_str(line).ok()?;
    (entry["fields"]["message"] == message)
        .then(|| entry["fields"]["address"].as_str().map(str::to_string))?
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of one sample line `name{labels} value` of a Prometheus text page.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(series) && line[series.len()..].starts_with(' '))
        .and_then(|line| line[series.len()..].trim().parse().ok())
}

/// A child process that never outlives its test.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The sum of `outbox_publish_failures_total` over `reasons`, from this test binary's
/// recorder (shared by the in-process apps, so tests compare before and after).
pub fn failures(reasons: &[&str]) -> f64 {
    let text = orderd::metrics::install(&orderd::api::known_labels()).render();
    reasons
        .iter()
        .filter_map(|reason| {
            sample(
                &text,
                &format!("outbox_publish_failures_total{{reason=\"{reason}\"}}"),
            )
        })
        .sum()
}

/// Waits until the failure counter over `reasons` passed `from + by`.
pub async fn until_failures(reasons: &[&str], from: f64, by: f64) {
    for _ in 0..600 {
        if failures(reasons) >= from + by {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("publish failures {reasons:?} did not grow by {by}");
}
