//! The one writer of `outbox_event`: appends an event through the caller's
//! transaction, or lends its `INSERT` to a statement that writes the change and its
//! event at once (a create).
//!
//! Must only ever be used with the transaction that made the change: that is the
//! whole guarantee (the change and its event commit together, or neither does).

use std::sync::LazyLock;

use sqlx::{Postgres, postgres::PgArguments, query::Query};
use uuid::Uuid;

use super::event::NewEvent;

use crate::db::{Placeholders, Sql};

/// The columns an event row binds, in [`EventRow::bind`]'s order (`next_attempt_at`
/// is the statement's time).
const COLUMNS: [&str; 9] = [
    "tenant_id",
    "event_id",
    "aggregate_id",
    "aggregate_seq",
    "event_type",
    "payload",
    "occurred_at",
    "trace_parent",
    "trace_state",
];

/// One event row, as a part of a statement: its `INSERT` takes its parameters as the
/// composing statement hands them out, and [`EventRow::bind`] binds them in that
/// order.
#[derive(Debug, Clone, Copy)]
pub struct EventRow<'a> {
    pub event: &'a NewEvent,
    pub event_id: Uuid,
}

impl<'a> EventRow<'a> {
    /// The row of `event`, with a fresh `event_id`.
    pub fn new(event: &'a NewEvent) -> Self {
        Self {
            event,
            event_id: Uuid::now_v7(),
        }
    }

    /// The `INSERT`, its parameters taken from `p` in the order [`EventRow::bind`]
    /// binds them (the columns' order). With `only_if`, the row is inserted once for
    /// each row of that CTE (one, or none when the change it belongs to was not made);
    /// without, it is inserted as it is.
    pub fn insert_sql(p: &mut Placeholders, only_if: Option<&str>) -> String {
        let values = COLUMNS.map(|_| p.param()).join(", ");
        let source = match only_if {
            Some(cte) => format!("SELECT {values}, statement_timestamp() FROM {cte}"),
            None => format!("VALUES ({values}, statement_timestamp())"),
        };
        format!(
            "INSERT INTO outbox_event ({}, next_attempt_at)\n     {source}",
            COLUMNS.join(", ")
        )
    }

    /// Binds the parameters of [`EventRow::insert_sql`], after those bound before.
    pub fn bind(self, query: Query<'a, Postgres, PgArguments>) -> Query<'a, Postgres, PgArguments> {
        query
            .bind(self.event.tenant.0)
            .bind(self.event_id)
            .bind(self.event.aggregate_id)
            .bind(self.event.aggregate_seq)
            .bind(self.event.event_type.as_str())
            .bind(self.event.body(self.event_id))
            .bind(self.event.occurred_at)
            .bind(self.event.trace.as_ref().map(|t| t.traceparent.as_str()))
            .bind(
                self.event
                    .trace
                    .as_ref()
                    .and_then(|t| t.tracestate.as_deref()),
            )
    }
}

/// One event alone, in the caller's transaction.
pub static APPEND: LazyLock<String> =
    LazyLock::new(|| EventRow::insert_sql(&mut Placeholders::new(), None));

/// Writes one event, and tells the relays of it at the commit; returns its `event_id`.
pub async fn append(sql: &mut Sql<'_>, event: &NewEvent) -> sqlx::Result<Uuid> {
    let row = EventRow::new(event);
    row.bind(sql.query(APPEND.as_str()))
        .execute(sql.conn())
        .await?;
    super::wake::in_transaction(sql, event.tenant).await?;
    Ok(row.event_id)
}
