//! The Kafka side of the tests: tansu (a Kafka-compatible broker) on loopback, a topic
//! per test created through the admin API, and a consumer that reads every partition
//! back from the start, all through librdkafka.

use std::{collections::HashMap, process::Command, sync::OnceLock, time::Duration};

use rdkafka::{
    ClientConfig, Message, Offset, TopicPartitionList,
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    consumer::{BaseConsumer, Consumer},
    message::Headers,
};
use serde_json::Value;
use uuid::Uuid;

use super::KillOnDrop;

/// The broker binary: `ORDERD_TEST_TANSU` (set by `.ci/test`, which builds it), else
/// `tansu` on the `PATH`.
fn tansu() -> String {
    std::env::var("ORDERD_TEST_TANSU").unwrap_or_else(|_| "tansu".into())
}

/// A broker of a test's own, killed on drop; it can be killed and started again on the
/// same port (with memory storage it then forgets its topics and producer ids, as a
/// broker that lost its disk would).
pub struct Broker {
    pub port: u16,
    process: Option<KillOnDrop>,
}

impl Broker {
    pub fn start() -> Self {
        let port = super::free_port();
        let mut broker = Self {
            port,
            process: None,
        };
        broker.restart();
        broker
    }

    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the broker (SIGKILL: no goodbye to its clients).
    pub fn kill(&mut self) {
        self.process = None;
    }

    /// Starts it (again) on its port and waits until it accepts connections.
    pub fn restart(&mut self) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let child = Command::new(tansu())
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("tansu (run the suite with .ci/test, which builds it)");
        self.process = Some(KillOnDrop(child));
        wait_for_port(self.port);
    }
}

fn wait_for_port(port: u16) {
    for _ in 0..600 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the broker did not listen on port {port}");
}

/// The broker the tests share (a topic each), started once for this test binary and
/// stopped with it.
pub fn shared_brokers() -> String {
    static BROKERS: OnceLock<String> = OnceLock::new();
    BROKERS
        .get_or_init(|| {
            let port = super::free_port();
            let url = format!("tcp://127.0.0.1:{port}");
            let script = format!(
                "{tansu} broker --listener-url {url} --advertised-listener-url {url} \
                 --storage-engine memory://tansu/ >/dev/null 2>&1 & b=$!; \
                 while kill -0 {parent} 2>/dev/null; do sleep 1; done; kill $b",
                tansu = tansu(),
                parent = std::process::id()
            );
            // The watcher ends when this process does, and takes the broker with it.
            #[allow(clippy::zombie_processes)]
            Command::new("sh")
                .args(["-c", &script])
                .spawn()
                .expect("sh");
            wait_for_port(port);
            format!("127.0.0.1:{port}")
        })
        .clone()
}

/// A topic name no other test uses.
pub fn unique_topic() -> String {
    format!("orders-{}", Uuid::new_v4().simple())
}

/// Creates `topic` with `partitions` partitions through the admin API.
pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let mut last = String::new();
    // A broker that has just started may not take admin requests at once.
    for _ in 0..100 {
        let results = admin
            .create_topics(
                &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(5))),
            )
            .await;
        match results {
            Ok(results) if results.iter().all(Result::is_ok) => return,
            Ok(results) => last = format!("{results:?}"),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("cannot create topic {topic}: {last}");
}

/// One record as a consumer sees it.
#[derive(Debug, Clone)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    pub value: Value,
    pub headers: HashMap<String, String>,
}

impl Record {
    pub fn event_id(&self) -> String {
        self.value["event_id"].as_str().unwrap().to_string()
    }
}

/// Reads `topic`'s partitions from the beginning until `count` records arrived (or a
/// generous deadline passed), in partition and offset order.
pub async fn consume(brokers: &str, topic: &str, count: usize) -> Vec<Record> {
    let (brokers, topic) = (brokers.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || consume_blocking(&brokers, &topic, count))
        .await
        .unwrap()
}

fn consume_blocking(brokers: &str, topic: &str, count: usize) -> Vec<Record> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("tests-{}", Uuid::new_v4().simple()))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("topic metadata");
    let mut assignment = TopicPartitionList::new();
    for partition in metadata.topics()[0].partitions() {
        assignment
            .add_partition_offset(topic, partition.id(), Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).expect("assign");
    let mut records = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while records.len() < count && std::time::Instant::now() < deadline {
        let Some(received) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = received.expect("a record");
        let headers = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|h| {
                        let value = String::from_utf8(h.value.unwrap_or_default().to_vec());
                        (h.key.to_string(), value.unwrap())
                    })
                    .collect()
            })
            .unwrap_or_default();
        records.push(Record {
            partition: message.partition(),
            offset: message.offset(),
            key: String::from_utf8(message.key().unwrap_or_default().to_vec()).unwrap(),
            value: serde_json::from_slice(message.payload().unwrap_or_default()).unwrap(),
            headers,
        });
    }
    records
}

/// The production publisher for `topic` on `brokers`, with `timeout` per delivery.
pub async fn publisher(
    brokers: &str,
    topic: &str,
    timeout: Duration,
) -> std::sync::Arc<orderd::outbox::sink::kafka::KafkaPublisher> {
    let kafka = orderd::outbox::sink::kafka::KafkaConfig {
        brokers: brokers.to_string(),
        topic: topic.to_string(),
        properties: Vec::new(),
    };
    orderd::outbox::sink::kafka::KafkaPublisher::connect(&kafka, timeout)
        .await
        .expect("the Kafka publisher starts")
}
