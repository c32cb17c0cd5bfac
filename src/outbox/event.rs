//! The event's wire format: the message body that consumers parse, on SNS or Kafka.
//!
//! Plain serde types owned by this module, so that no web framework's rendering can
//! change what consumers receive; a golden test pins the JSON. Fields are only ever
//! added; a change that could break a consumer needs a new schema version.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Serialize, Serializer};
use uuid::Uuid;

use crate::{metrics::label_enum, tenant::TenantId, trace_context::TraceContext};

label_enum! {
    /// The kinds of event: `outbox_event.event_type`, the `event_type` field and message
    /// attribute (SNS) or header (Kafka), and the `outbox_published_total{event_type}` label.
    pub EventType {
        OrderCreated => "OrderCreated",
        OrderCancelled => "OrderCancelled",
    }
}

label_enum! {
    /// The `event_type` label of `outbox_published_total`: the types this release
    /// knows, and `other` for one it does not (a newer release's), so that a stored
    /// string never becomes a label value.
    pub TypeLabel {
        OrderCreated => "OrderCreated",
        OrderCancelled => "OrderCancelled",
        Other => "other",
    }
}

impl TypeLabel {
    /// The label of a stored `event_type`.
    pub fn of(stored: &str) -> Self {
        Self::parse(stored).unwrap_or(Self::Other)
    }
}

/// The version of the event format. Fields are only ever added within a version; a
/// change that could break a consumer (a field removed, renamed or retyped, a meaning
/// changed) needs the next one.
pub const SCHEMA_VERSION: u32 = 1;

/// One committed change, as published.
#[derive(Debug, Clone, Serialize)]
pub struct Event<'a> {
    pub event_id: Uuid,
    #[serde(serialize_with = "event_type")]
    pub event_type: EventType,
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// When the change committed (the order's `updated_at`), RFC 3339.
    #[serde(serialize_with = "rfc3339")]
    pub occurred_at: DateTime<Utc>,
    pub tenant_id: Uuid,
    /// The order as it is after the change.
    pub order: &'a OrderState,
}

/// An order inside an event: the same fields and spellings as the API's `Order`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OrderState {
    pub id: Uuid,
    pub sku: String,
    pub quantity: i32,
    pub customer_ref: Option<String>,
    /// `CREATED` or `CANCELLED`.
    pub status: &'static str,
    #[serde(serialize_with = "rfc3339")]
    pub created_at: DateTime<Utc>,
    #[serde(serialize_with = "rfc3339")]
    pub updated_at: DateTime<Utc>,
}

/// What the writer appends for one change.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub tenant: TenantId,
    pub event_type: EventType,
    /// The order the event is about: its events are published in `aggregate_seq` order.
    pub aggregate_id: Uuid,
    pub aggregate_seq: i32,
    pub occurred_at: DateTime<Utc>,
    pub order: OrderState,
    /// The trace context of the request that made the change, published with it.
    pub trace: Option<TraceContext>,
}

impl NewEvent {
    /// The message body for this event under `event_id`, bound as `jsonb` and
    /// serialised straight into the statement (no intermediate JSON tree).
    pub fn body(&self, event_id: Uuid) -> sqlx::types::Json<Event<'_>> {
        sqlx::types::Json(Event {
            event_id,
            event_type: self.event_type,
            schema_version: SCHEMA_VERSION,
            occurred_at: self.occurred_at,
            tenant_id: self.tenant.0,
            order: &self.order,
        })
    }
}

fn event_type<S: Serializer>(value: &EventType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(value.as_str())
}

/// RFC 3339 with as many fractional digits as needed and a `+00:00` offset: the
/// spelling the API uses for the same instants, so one order reads the same in a
/// response and in an event.
fn rfc3339<S: Serializer>(value: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&value.to_rfc3339_opts(SecondsFormat::AutoSi, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_matches_the_golden_json() {
        let at = DateTime::parse_from_rfc3339("2026-11-29T19:35:23.428432Z")
            .unwrap()
            .with_timezone(&Utc);
        let event = NewEvent {
            tenant: TenantId(Uuid::from_u128(0x0a)),
            event_type: EventType::OrderCancelled,
            aggregate_id: Uuid::from_u128(0x0b),
            aggregate_seq: 2,
            occurred_at: at,
            trace: None,
            order: OrderState {
                id: Uuid::from_u128(0x0b),
                sku: "BOOK-42".into(),
                quantity: 1,
                customer_ref: None,
                status: "CANCELLED",
                created_at: at,
                updated_at: at,
            },
        };
        let golden = serde_json::json!({
            "event_id": "00000000-0000-0000-0000-00000000000c",
            "event_type": "OrderCancelled",
            "schema_version": 1,
            "occurred_at": "2026-11-29T19:35:23.428432+00:00",
            "tenant_id": "00000000-0000-0000-0000-00000000000a",
            "order": {
                "id": "00000000-0000-0000-0000-00000000000b",
                "sku": "BOOK-42",
                "quantity": 1,
                "customer_ref": null,
                "status": "CANCELLED",
                "created_at": "2026-11-29T19:35:23.428432+00:00",
                "updated_at": "2026-11-29T19:35:23.428432+00:00"
            }
        });
        let body = serde_json::to_value(event.body(Uuid::from_u128(0x0c)).0).unwrap();
        assert_eq!(body, golden);
    }

    #[test]
    fn every_known_type_is_its_own_label_and_anything_else_is_other() {
        for known in EventType::ALL {
            assert_eq!(TypeLabel::of(known.as_str()).as_str(), known.as_str());
        }
        assert_eq!(TypeLabel::of("OrderRefunded"), TypeLabel::Other);
        assert_eq!(TypeLabel::of("orderrefunded\nline"), TypeLabel::Other);
    }
}
