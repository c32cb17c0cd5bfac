//! What the relay needs from a message bus, and how failures are classified.
//!
//! The relay talks to this trait, not to SNS directly, so that a test or a benchmark
//! can observe what is published; production uses [`super::sns::SnsPublisher`].

use std::{future::Future, pin::Pin};

use uuid::Uuid;

/// One event to publish.
#[derive(Debug, Clone)]
pub struct Message {
    pub event_id: Uuid,
    pub event_type: String,
    pub tenant_id: Uuid,
    /// The order id: the FIFO message group.
    pub aggregate_id: Uuid,
    /// The message body.
    pub body: String,
}

/// Whether retrying can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Throttling, server errors, timeouts, network: back off and try again.
    Transient,
    /// The request itself is wrong (invalid parameter, not found, authorization, KMS
    /// configuration): retrying cannot succeed, so the event goes DEAD at once.
    Permanent,
}

/// A failed publish of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishError {
    pub retry: Retry,
    /// A low-cardinality error class, usable as a metric label.
    pub reason: &'static str,
    /// Full detail for the row's `last_error` and the log.
    pub detail: String,
}

/// The outcome for each message, in the order given.
pub type Outcomes = Vec<Result<(), PublishError>>;

pub trait Publisher: Send + Sync {
    /// Publishes `messages`; the answer has exactly one outcome per message. Must not
    /// return before every message was acknowledged or failed (or timed out).
    fn publish<'a>(
        &'a self,
        messages: &'a [Message],
    ) -> Pin<Box<dyn Future<Output = Outcomes> + Send + 'a>>;
}

/// Classifies an AWS error code (SNS or KMS). Unknown codes count as transient when
/// the server took the blame and permanent when the sender did.
pub fn classify(code: &str, sender_fault: bool) -> (Retry, &'static str) {
    match code {
        "Throttling"
        | "ThrottlingException"
        | "Throttled"
        | "TooManyRequestsException"
        | "RequestLimitExceeded" => (Retry::Transient, "throttling"),
        "KMSThrottling" | "KMSThrottlingException" => (Retry::Transient, "kms_throttling"),
        "InternalError" | "InternalFailure" | "ServiceUnavailable" | "InternalServerError" => {
            (Retry::Transient, "server")
        }
        "InvalidParameter"
        | "InvalidParameterValue"
        | "ValidationError"
        | "ValidationException"
        | "BatchRequestTooLong"
        | "TooManyEntriesInBatchRequest"
        | "BatchEntryIdsNotDistinct"
        | "EmptyBatchRequest"
        | "InvalidBatchEntryId" => (Retry::Permanent, "invalid_parameter"),
        "NotFound" | "NotFoundException" | "ResourceNotFound" => (Retry::Permanent, "not_found"),
        "AuthorizationError"
        | "AccessDenied"
        | "AccessDeniedException"
        | "InvalidSecurity"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "ExpiredToken"
        | "UnrecognizedClientException" => (Retry::Permanent, "authorization"),
        "KMSDisabled" | "KMSInvalidState" | "KMSNotFound" | "KMSOptInRequired"
        | "KMSAccessDenied" => (Retry::Permanent, "kms"),
        _ if sender_fault => (Retry::Permanent, "other_client"),
        _ => (Retry::Transient, "other_server"),
    }
}

#[cfg(test)]
mod tests {
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
            (Retry::Permanent, "other_client")
        );
        assert_eq!(
            classify("SomethingNew", false),
            (Retry::Transient, "other_server")
        );
    }
}
