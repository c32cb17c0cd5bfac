//! The SNS side of the tests: moto's server on loopback, one topic and one subscribed
//! SQS queue per test (raw message delivery), read back through SQS's JSON protocol.

use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    sync::OnceLock,
    time::Duration,
};

use serde_json::{Value, json};
use uuid::Uuid;

/// The shared moto endpoint: `ORDERD_TEST_SNS_ENDPOINT` (started by `.ci/test`), or one
/// started here for this test binary.
pub fn moto_endpoint() -> String {
    static ENDPOINT: OnceLock<String> = OnceLock::new();
    ENDPOINT
        .get_or_init(|| std::env::var("ORDERD_TEST_SNS_ENDPOINT").unwrap_or_else(|_| start_moto()))
        .clone()
}

pub fn moto_address() -> SocketAddr {
    moto_endpoint()
        .trim_start_matches("http://")
        .parse()
        .unwrap()
}

/// Starts a moto server of its own on a free port, watched by a shell loop so that it
/// exits with this test process; returns its endpoint. moto keeps every message in
/// memory and slows down as it fills, so a high-volume test wants a fresh one.
pub fn start_moto() -> String {
    let port = super::free_port();
    let script = format!(
        "moto_server -H 127.0.0.1 -p {port} >/dev/null 2>&1 & m=$!; \
         while kill -0 {parent} 2>/dev/null; do sleep 1; done; kill $m",
        parent = std::process::id()
    );
    // The watcher outlives nothing it needs: it ends when this process does.
    #[allow(clippy::zombie_processes)]
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .expect("moto_server (pip install 'moto[server]')");
    for _ in 0..600 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return format!("http://127.0.0.1:{port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("moto_server did not start on port {port}");
}

/// Environment for the AWS SDK inside orderd when it talks to moto (directly or
/// through a proxy at `endpoint`).
pub fn aws_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint.to_string()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
    ]
}

/// A topic with an SQS queue subscribed to it.
pub struct Topic {
    pub arn: String,
    pub queue_url: String,
    /// The moto server holding topic and queue.
    pub endpoint: String,
    http: reqwest::Client,
}

/// A topic name no other test uses.
pub fn unique_name(fifo: bool) -> String {
    format!(
        "orders-{}{}",
        Uuid::new_v4().simple(),
        if fifo { ".fifo" } else { "" }
    )
}

/// The ARN moto gives a topic named `name` (account 123456789012, us-east-1), known
/// before the topic exists.
pub fn arn_of(name: &str) -> String {
    format!("arn:aws:sns:us-east-1:123456789012:{name}")
}

impl Topic {
    /// A new topic and queue with unique names; `fifo` makes both FIFO.
    pub async fn create(fifo: bool) -> Self {
        Self::create_on(&moto_endpoint(), fifo).await
    }

    /// The same on a given moto server.
    pub async fn create_on(endpoint: &str, fifo: bool) -> Self {
        Self::create_named(endpoint, &unique_name(fifo), fifo).await
    }

    /// A topic named `name` (and its queue) on the moto server at `endpoint`.
    pub async fn create_named(endpoint: &str, name: &str, fifo: bool) -> Self {
        let http = reqwest::Client::new();
        let sns = sns_client(endpoint).await;
        let mut topic = sns.create_topic().name(name);
        if fifo {
            topic = topic.attributes("FifoTopic", "true");
        }
        let arn = topic
            .send()
            .await
            .expect("create topic")
            .topic_arn()
            .unwrap()
            .to_string();
        let mut attributes = json!({});
        if fifo {
            attributes = json!({"FifoQueue": "true"});
        }
        let queue_url = sqs(
            &http,
            endpoint,
            "CreateQueue",
            json!({"QueueName": name, "Attributes": attributes}),
        )
        .await["QueueUrl"]
            .as_str()
            .unwrap()
            .to_string();
        let queue_arn = sqs(
            &http,
            endpoint,
            "GetQueueAttributes",
            json!({"QueueUrl": queue_url, "AttributeNames": ["QueueArn"]}),
        )
        .await["Attributes"]["QueueArn"]
            .as_str()
            .unwrap()
            .to_string();
        sns.subscribe()
            .topic_arn(&arn)
            .protocol("sqs")
            .endpoint(queue_arn)
            .attributes("RawMessageDelivery", "true")
            .send()
            .await
            .expect("subscribe");
        Self {
            arn,
            queue_url,
            endpoint: endpoint.to_string(),
            http,
        }
    }

    /// Receives (and deletes) everything currently in the queue.
    pub async fn drain(&self) -> Vec<Received> {
        let mut all = Vec::new();
        loop {
            let answer = sqs(
                &self.http,
                &self.endpoint,
                "ReceiveMessage",
                json!({"QueueUrl": self.queue_url, "MaxNumberOfMessages": 10,
                       "MessageAttributeNames": ["All"], "MessageSystemAttributeNames": ["All"],
                       "AttributeNames": ["All"], "WaitTimeSeconds": 0}),
            )
            .await;
            let messages = answer["Messages"].as_array().cloned().unwrap_or_default();
            if messages.is_empty() {
                return all;
            }
            let entries: Vec<Value> = messages
                .iter()
                .enumerate()
                .map(|(i, m)| json!({"Id": i.to_string(), "ReceiptHandle": m["ReceiptHandle"]}))
                .collect();
            sqs(
                &self.http,
                &self.endpoint,
                "DeleteMessageBatch",
                json!({"QueueUrl": self.queue_url, "Entries": entries}),
            )
            .await;
            all.extend(messages.iter().map(Received::from));
        }
    }

    /// Collects messages until `count` arrived (or a generous deadline passed).
    pub async fn collect(&self, count: usize) -> Vec<Received> {
        let mut all = Vec::new();
        for _ in 0..2400 {
            all.extend(self.drain().await);
            if all.len() >= count {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        all
    }
}

/// One message as a consumer of the queue sees it.
#[derive(Debug, Clone)]
pub struct Received {
    pub body: Value,
    pub attributes: Value,
    pub system: Value,
}

impl Received {
    fn from(message: &Value) -> Self {
        Self {
            body: serde_json::from_str(message["Body"].as_str().unwrap()).unwrap(),
            attributes: message["MessageAttributes"].clone(),
            system: message["Attributes"].clone(),
        }
    }

    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes[name]["StringValue"].as_str()
    }

    pub fn event_id(&self) -> String {
        self.body["event_id"].as_str().unwrap().to_string()
    }
}

/// A topic named `name` with no queue subscribed, on the moto at `endpoint`: for tests
/// whose volume moto's SQS delivery (about 100 messages/s) could not carry; what SNS
/// acknowledged is observed at the publisher instead.
pub async fn bare_topic(endpoint: &str, name: &str) -> String {
    sns_client(endpoint)
        .await
        .create_topic()
        .name(name)
        .send()
        .await
        .expect("create topic")
        .topic_arn()
        .unwrap()
        .to_string()
}

/// A real aws-sdk-sns client for moto (or a proxy in front of it), configured
/// explicitly so that parallel tests never touch the process environment.
pub async fn sns_client(endpoint: &str) -> aws_sdk_sns::Client {
    use aws_sdk_sns::config::{BehaviorVersion, Credentials, Region, timeout::TimeoutConfig};
    let config = aws_sdk_sns::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .endpoint_url(endpoint)
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(2))
                .build(),
        )
        .build();
    aws_sdk_sns::Client::from_conf(config)
}

/// One SQS call in its JSON protocol.
async fn sqs(http: &reqwest::Client, endpoint: &str, action: &str, body: Value) -> Value {
    let response = http
        .post(endpoint)
        .header("X-Amz-Target", format!("AmazonSQS.{action}"))
        .header("Content-Type", "application/x-amz-json-1.0")
        // moto routes a request to a service by the credential scope of its signature.
        .header(
            "Authorization",
            "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0",
        )
        .body(body.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("SQS {action}: {e}"));
    let status = response.status();
    let text = response.text().await.unwrap();
    assert!(status.is_success(), "SQS {action} failed: {status} {text}");
    if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap()
    }
}

/// The production publisher, pointed at `endpoint`.
pub async fn publisher(
    endpoint: &str,
    topic_arn: &str,
    config: &orderd::app::Config,
) -> std::sync::Arc<dyn orderd::outbox::publisher::Publisher> {
    std::sync::Arc::new(orderd::outbox::sink::sns::SnsPublisher::new(
        sns_client(endpoint).await,
        topic_arn.to_string(),
        config.outbox.publish_timeout,
    ))
}
