//! The production [`Publisher`]: AWS SNS `PublishBatch` through aws-sdk-sns.
//!
//! Configuration comes from the SDK's own chain (`AWS_REGION`, `AWS_ENDPOINT_URL`,
//! credentials ...), untouched, so pointing orderd at a local SNS is one variable.

use std::{collections::HashMap, future::Future, pin::Pin, time::Duration};

use aws_sdk_sns::{
    Client,
    error::{ProvideErrorMetadata, SdkError},
    types::{MessageAttributeValue, PublishBatchRequestEntry},
};

use crate::{
    config::{Kind, parse, settings},
    outbox::publisher::{
        FailureReason, Message, Outcome, Outcomes, PublishError, Publisher, Retry,
    },
};

settings! {
    /// SNS as the relay's bus, when its topic is set.
    pub struct SnsConfig {
        topic_arn: Option<String> = parse::text [SNS_TOPIC_ARN, "ORDERD_SNS_TOPIC_ARN", None, Kind::Text, "the SNS topic the relay publishes to; a relay needs exactly one sink, this or Kafka; a `.fifo` ARN adds message group and deduplication ids"],
    }
}

/// Classifies an AWS error code (SNS or KMS) of a refused entry. Unknown codes count as
/// transient when the server took the blame and permanent when the sender did. (For a
/// call that failed as a whole the class only names the reason: see [`Outcome::NotSent`].)
pub fn classify(code: &str, sender_fault: bool) -> (Retry, FailureReason) {
    use FailureReason as R;
    match code {
        "Throttling"
        | "ThrottlingException"
        | "Throttled"
        | "TooManyRequestsException"
        | "RequestLimitExceeded" => (Retry::Transient, R::Throttling),
        "KMSThrottling" | "KMSThrottlingException" => (Retry::Transient, R::KmsThrottling),
        "InternalError" | "InternalFailure" | "ServiceUnavailable" | "InternalServerError" => {
            (Retry::Transient, R::Server)
        }
        "InvalidParameter"
        | "InvalidParameterValue"
        | "ValidationError"
        | "ValidationException"
        | "BatchRequestTooLong"
        | "TooManyEntriesInBatchRequest"
        | "BatchEntryIdsNotDistinct"
        | "EmptyBatchRequest"
        | "InvalidBatchEntryId" => (Retry::Permanent, R::InvalidParameter),
        "NotFound" | "NotFoundException" | "ResourceNotFound" => (Retry::Permanent, R::NotFound),
        "AuthorizationError"
        | "AccessDenied"
        | "AccessDeniedException"
        | "InvalidSecurity"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "ExpiredToken"
        | "UnrecognizedClientException" => (Retry::Permanent, R::Authorization),
        "KMSDisabled" | "KMSInvalidState" | "KMSNotFound" | "KMSOptInRequired"
        | "KMSAccessDenied" => (Retry::Permanent, R::Kms),
        _ if sender_fault => (Retry::Permanent, R::OtherClient),
        _ => (Retry::Transient, R::OtherServer),
    }
}

/// SNS accepts at most 10 entries per `PublishBatch` ...
pub const MAX_BATCH_ENTRIES: usize = 10;
/// ... and at most 256 KiB for all of them together (bodies and attributes).
pub const MAX_BATCH_BYTES: usize = 262_144;

pub struct SnsPublisher {
    client: Client,
    topic_arn: String,
    /// A `.fifo` topic needs a message group and a deduplication id per message.
    fifo: bool,
    /// Bound on one `PublishBatch` call, retries included; the row's claim lease is
    /// longer, so a slow call can never let another relay publish the same row meanwhile.
    timeout: Duration,
}

impl SnsPublisher {
    /// Builds the client from the SDK's standard configuration chain.
    pub async fn from_env(topic_arn: String, timeout: Duration) -> Self {
        let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .operation_timeout(timeout)
                    .connect_timeout(Duration::from_secs(2).min(timeout))
                    .build(),
            )
            .load()
            .await;
        Self::new(Client::new(&config), topic_arn, timeout)
    }

    pub fn new(client: Client, topic_arn: String, timeout: Duration) -> Self {
        let fifo = topic_arn.ends_with(".fifo");
        Self {
            client,
            topic_arn,
            fifo,
            timeout,
        }
    }

    fn entry(&self, id: usize, message: &Message) -> PublishBatchRequestEntry {
        let attribute = |value: String| {
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
                .expect("data_type is set")
        };
        let trace = [
            ("traceparent", message.trace_parent.clone()),
            ("tracestate", message.trace_state.clone()),
        ];
        let attributes: HashMap<String, MessageAttributeValue> = [
            ("event_id", message.event_id.to_string()),
            ("event_type", message.event_type.clone()),
            ("tenant_id", message.tenant_id.to_string()),
            ("aggregate_id", message.aggregate_id.to_string()),
        ]
        .into_iter()
        .chain(
            trace
                .into_iter()
                .filter_map(|(name, value)| Some((name, value?))),
        )
        .map(|(name, value)| (name.to_string(), attribute(value)))
        .collect();
        let mut entry = PublishBatchRequestEntry::builder()
            .id(id.to_string())
            .message(message.body.clone())
            .set_message_attributes(Some(attributes));
        if self.fifo {
            entry = entry
                .message_group_id(message.aggregate_id.to_string())
                .message_deduplication_id(message.event_id.to_string());
        }
        entry.build().expect("id and message are set")
    }

    /// Sends one batch; the answer has one outcome per message of `chunk`.
    ///
    /// A call refused as a whole because of what it carries (a request SNS calls
    /// invalid, such as one too large) is an entry-level refusal in disguise: a single
    /// entry is rejected on its own, and a batch is sent again one entry per call so that
    /// only the culprit pays. Any other failure of the call is not the events' fault.
    async fn send(&self, chunk: &[Message]) -> Outcomes {
        match self.call(chunk).await {
            Ok(outcomes) => outcomes,
            Err(failure)
                if failure.reason == FailureReason::InvalidParameter && chunk.len() > 1 =>
            {
                let mut outcomes = Vec::with_capacity(chunk.len());
                for message in chunk {
                    outcomes.push(self.send_alone(message).await);
                }
                outcomes
            }
            Err(failure) if failure.reason == FailureReason::InvalidParameter => {
                vec![Outcome::Rejected(failure)]
            }
            Err(failure) => vec![Outcome::NotSent(failure); chunk.len()],
        }
    }

    async fn send_alone(&self, message: &Message) -> Outcome {
        match self.call(std::slice::from_ref(message)).await {
            Ok(mut outcomes) => outcomes.pop().unwrap_or(Outcome::Published),
            Err(failure) if failure.reason == FailureReason::InvalidParameter => {
                Outcome::Rejected(failure)
            }
            Err(failure) => Outcome::NotSent(failure),
        }
    }

    /// One `PublishBatch` call: the per-entry outcomes, or why the call failed as a whole.
    async fn call(&self, chunk: &[Message]) -> Result<Outcomes, PublishError> {
        let entries: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(i, m)| self.entry(i, m))
            .collect();
        let call = self
            .client
            .publish_batch()
            .topic_arn(&self.topic_arn)
            .set_publish_batch_request_entries(Some(entries))
            .send();
        let output = match tokio::time::timeout(self.timeout, call).await {
            Err(_) => return Err(timeout_error(self.timeout)),
            Ok(Err(e)) => return Err(sdk_error(&e)),
            Ok(Ok(output)) => output,
        };
        let mut outcomes: Vec<Option<Outcome>> = vec![None; chunk.len()];
        for ok in output.successful() {
            if let Some(slot) = ok
                .id()
                .and_then(|id| id.parse::<usize>().ok())
                .and_then(|i| outcomes.get_mut(i))
            {
                *slot = Some(Outcome::Published);
            }
        }
        for failed in output.failed() {
            if let Some(slot) = failed
                .id()
                .parse::<usize>()
                .ok()
                .and_then(|i| outcomes.get_mut(i))
            {
                let (retry, reason) = classify(failed.code(), failed.sender_fault());
                *slot = Some(Outcome::Rejected(PublishError {
                    retry,
                    reason,
                    detail: format!(
                        "{}: {}",
                        failed.code(),
                        failed.message().unwrap_or_default()
                    ),
                }));
            }
        }
        // An entry SNS said nothing about was not acknowledged: try it again later.
        Ok(outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Outcome::Rejected(PublishError {
                        retry: Retry::Transient,
                        reason: FailureReason::OtherServer,
                        detail: "no result for this entry in the PublishBatch response".into(),
                    })
                })
            })
            .collect())
    }
}

impl Publisher for SnsPublisher {
    /// The topic's name (the last part of its ARN).
    fn destination(&self) -> &str {
        self.topic_arn.rsplit(':').next().unwrap_or(&self.topic_arn)
    }

    fn system(&self) -> &'static str {
        "aws_sns"
    }

    fn publish<'a>(
        &'a self,
        messages: &'a [Message],
    ) -> Pin<Box<dyn Future<Output = Outcomes> + Send + 'a>> {
        Box::pin(async move {
            // Each order has at most one event in a round, so chunks may go in parallel
            // without reordering any order's events.
            let chunks = chunk_for_sns(messages);
            let sent = futures::future::join_all(
                chunks
                    .iter()
                    .map(|range| self.send(&messages[range.clone()])),
            )
            .await;
            sent.into_iter().flatten().collect()
        })
    }
}

/// Splits messages into consecutive `PublishBatch` calls of at most 10 entries and
/// 256 KiB. An entry too large on its own gets a call of its own, for SNS to refuse.
pub fn chunk_for_sns(messages: &[Message]) -> Vec<std::ops::Range<usize>> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, message) in messages.iter().enumerate() {
        let size = entry_size(message);
        let full = i - start == MAX_BATCH_ENTRIES || (i > start && bytes + size > MAX_BATCH_BYTES);
        if full {
            chunks.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    if start < messages.len() {
        chunks.push(start..messages.len());
    }
    chunks
}

/// What SNS counts towards the size limit: the body and every attribute's name, type
/// and value.
fn entry_size(message: &Message) -> usize {
    const ATTRIBUTES: usize = "event_id".len()
        + "event_type".len()
        + "tenant_id".len()
        + "aggregate_id".len()
        + 4 * "String".len()
        + 3 * 36;
    let trace = |name: &str, value: &Option<String>| {
        value
            .as_ref()
            .map_or(0, |v| name.len() + "String".len() + v.len())
    };
    message.body.len()
        + ATTRIBUTES
        + message.event_type.len()
        + trace("traceparent", &message.trace_parent)
        + trace("tracestate", &message.trace_state)
}

fn timeout_error(timeout: Duration) -> PublishError {
    PublishError {
        retry: Retry::Transient,
        reason: FailureReason::Timeout,
        detail: format!("no answer from SNS within {timeout:?}"),
    }
}

/// Classifies a failed call (the whole batch failed alike).
fn sdk_error<E>(err: &SdkError<E, aws_sdk_sns::config::http::HttpResponse>) -> PublishError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let detail = error_chain(err);
    match err {
        SdkError::TimeoutError(_) => PublishError {
            retry: Retry::Transient,
            reason: FailureReason::Timeout,
            detail,
        },
        SdkError::DispatchFailure(_) => PublishError {
            retry: Retry::Transient,
            reason: FailureReason::Network,
            detail,
        },
        SdkError::ResponseError(_) => PublishError {
            retry: Retry::Transient,
            reason: FailureReason::Server,
            detail,
        },
        SdkError::ServiceError(service) => {
            let code = service.err().code().unwrap_or("Unknown");
            // SNS answers the sender's mistakes with 4xx, its own trouble with 5xx.
            let sender_fault = service.raw().status().is_client_error();
            let (retry, reason) = classify(code, sender_fault);
            PublishError {
                retry,
                reason,
                detail,
            }
        }
        // Could not even build the request: a bug or bad configuration, not SNS's state.
        _ => PublishError {
            retry: Retry::Permanent,
            reason: FailureReason::OtherClient,
            detail,
        },
    }
}

/// The error and its sources on one line.
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    fn message(body_len: usize) -> Message {
        Message {
            event_id: Uuid::new_v4(),
            event_type: "OrderCreated".into(),
            tenant_id: Uuid::new_v4(),
            aggregate_id: Uuid::new_v4(),
            body: "x".repeat(body_len),
            trace_parent: None,
            trace_state: None,
            schema_version: Some("1".into()),
            occurred_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn batches_hold_at_most_ten_entries() {
        let messages: Vec<_> = (0..25).map(|_| message(100)).collect();
        assert_eq!(chunk_for_sns(&messages), vec![0..10, 10..20, 20..25]);
    }

    #[test]
    fn batches_stay_within_256_kib_in_total() {
        let messages: Vec<_> = (0..6).map(|_| message(100_000)).collect();
        let chunks = chunk_for_sns(&messages);
        assert_eq!(chunks, vec![0..2, 2..4, 4..6]);
        for chunk in chunks {
            let total: usize = messages[chunk].iter().map(entry_size).sum();
            assert!(total <= MAX_BATCH_BYTES);
        }
    }

    #[test]
    fn an_oversized_entry_goes_alone() {
        let messages = vec![message(10), message(300_000), message(10)];
        assert_eq!(chunk_for_sns(&messages), vec![0..1, 1..2, 2..3]);
        assert!(chunk_for_sns(&[]).is_empty());
    }
}

#[cfg(test)]
mod classify_tests {
    use super::*;

    #[test]
    fn throttling_server_and_kms_throttling_are_transient() {
        for code in [
            "Throttled",
            "ThrottlingException",
            "InternalError",
            "KMSThrottling",
        ] {
            assert_eq!(classify(code, false).0, Retry::Transient, "{code}");
        }
    }

    #[test]
    fn invalid_not_found_authorization_and_kms_errors_are_permanent() {
        for code in [
            "InvalidParameter",
            "NotFound",
            "AuthorizationError",
            "KMSDisabled",
            "KMSAccessDenied",
            "KMSNotFound",
        ] {
            assert_eq!(classify(code, true).0, Retry::Permanent, "{code}");
        }
    }

    #[test]
    fn unknown_codes_follow_the_fault() {
        assert_eq!(
            classify("SomethingNew", true),
            (Retry::Permanent, FailureReason::OtherClient)
        );
        assert_eq!(
            classify("SomethingNew", false),
            (Retry::Transient, FailureReason::OtherServer)
        );
    }
}
