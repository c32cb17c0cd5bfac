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

use crate::db::Sql;

/// One event row, as a part of a statement: its `INSERT` numbers its own parameters
/// from wherever the composing statement puts it, and [`EventRow::bind`] binds them in
/// that order.
#[derive(Debug, Clone, Copy)]
pub struct EventRow<'a> {
    pub event: &'a NewEvent,
    pub event_id: Uuid,
}

impl<'a> EventRow<'a> {
    /// How many parameters [`EventRow::insert_sql`] uses.
    pub const PARAMS: usize = 9;

    /// The row of `event`, with a fresh `event_id`.
    pub fn new(event: &'a NewEvent) -> Self {
        Self {
            event,
            event_id: Uuid::now_v7(),
        }
    }

    /// The `INSERT`, its parameters numbered from `$first`. With `only_if`, the row is
    /// inserted once for each row of that CTE (one, or none when the change it
    /// belongs to was not made); without, it is inserted as it is.
    pub fn insert_sql(first: usize, only_if: Option<&str>) -> String {
        let values = (first..first + Self::PARAMS)
            .map(|i| format!("${i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let source = match only_if {
            Some(cte) => format!("SELECT {values}, statement_timestamp() FROM {cte}"),
            None => format!("VALUES ({values}, statement_timestamp())"),
        };
        format!(
            "INSERT INTO outbox_event
       (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at,
        trace_parent, trace_state, next_attempt_at)
     {source}"
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
pub static APPEND: LazyLock<String> = LazyLock::new(|| EventRow::insert_sql(1, None));

/// Writes one event; returns its `event_id`.
pub async fn append(sql: &mut Sql<'_>, event: &NewEvent) -> sqlx::Result<Uuid> {
    let row = EventRow::new(event);
    row.bind(sql.query(APPEND.as_str()))
        .execute(sql.conn())
        .await?;
    Ok(row.event_id)
}
