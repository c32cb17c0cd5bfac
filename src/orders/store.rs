//! SQL of the `orders` table. Writes append their outbox event in the same transaction,
//! so the change and its event commit or vanish together: a cancel inside the caller's
//! transaction, a create as one statement that also completes its idempotency record.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sqlx::{Postgres, postgres::PgArguments, query::Query};
use uuid::Uuid;

use super::{CancelOutcome, Order};
use crate::{
    db::{self, Forms, Placeholders, Sql},
    idempotency::{Completion, Fence, StoredResponse},
    outbox::{self, EventType, event::NewEvent, writer::EventRow},
    tenant::TenantId,
    trace_context::TraceContext,
};

/// The columns of [`Order`], as a macro so that every query stays a `&'static str`
/// (sqlx refuses runtime-built SQL).
macro_rules! columns {
    () => {
        "id, sku, quantity, customer_ref, status, created_at, updated_at, version"
    };
}

/// A create in one statement (one round trip, no `BEGIN`/`COMMIT`): the fenced
/// completion of the idempotency record with the response, then the order only if the
/// completion matched, then its `OrderCreated` event only if the order was inserted.
/// One implicit transaction, so all three commit or none does. Each part is its
/// owner's ([`Completion`], the order insert here, [`EventRow`]) and takes its
/// parameters as the composition hands them out, in the order the parts are bound;
/// the response and the event are known in full before the statement runs, since the
/// order is.
pub static CREATE: LazyLock<String> = LazyLock::new(|| {
    let p = &mut Placeholders::new();
    let completion = Completion::sql(p);
    let insert = insert_order_sql(p, Some("completed"));
    let event_row = EventRow::insert_sql(p, Some("created"));
    format!(
        "WITH completed AS ({completion} RETURNING 1),
     created AS ({insert} RETURNING 1)
     {event_row}"
    )
});

/// [`CREATE`] on a distributed database: one call of the function `orderd_create`
/// (made by the migrations), which writes what [`CREATE`] writes, on the node that
/// holds the tenant's shard, and wakes that node's relays (decision 173). It writes the
/// order and its event first and the fenced completion last, and raises
/// [`FENCE_LOST`] (undoing the rest) when the fence no longer held: so a call that
/// stalls (on a lock, a slow disk) while its lease runs out locks nothing of the record
/// meanwhile, and the request that took the key over is not held up by it. [`CREATE`]
/// is correct on Citus but its `INSERT ... SELECT` from a `RETURNING` runs as steps
/// pulled through the coordinator, with a two-phase commit on every worker; its parts
/// as statements of one transaction cost six round trips and as many plannings by
/// Citus. The call takes the parameters [`CREATE`] takes, in the same order (the parts
/// bind them): [`Completion::sql`]'s, the order's and [`EventRow::insert_sql`]'s, as
/// many as the parts number here.
pub static CREATE_CALL: LazyLock<String> = LazyLock::new(|| {
    let p = &mut Placeholders::new();
    let _parts = (
        Completion::sql(p),
        insert_order_sql(p, None),
        EventRow::insert_sql(p, None),
    );
    let params: Vec<String> = (1..=p.taken()).map(|n| format!("${n}")).collect();
    format!("SELECT orderd_create({})", params.join(", "))
});

/// The SQLSTATE `orderd_create` raises, everything undone, when the fence no longer
/// held.
const FENCE_LOST: &str = "OD002";

/// How a create writes its order, its event and its completion.
#[derive(Clone, Copy, Debug)]
enum CreateWrite {
    /// [`CREATE`]: one statement.
    OneStatement,
    /// [`CREATE_CALL`]: one call, on the tenant's node.
    Call,
}

/// The create's two forms.
const CREATE_WRITE: Forms<CreateWrite> = Forms {
    one_server: CreateWrite::OneStatement,
    distributed: CreateWrite::Call,
};

/// The insert of a new order, once for each row of the CTE `only_if` (or once), its
/// parameters taken from `p` in the order [`bind_order`] binds them.
fn insert_order_sql(p: &mut Placeholders, only_if: Option<&str>) -> String {
    let (tenant, id, sku) = (p.param(), p.param(), p.param());
    let (quantity, customer_ref, at) = (p.param(), p.param(), p.param());
    let values =
        format!("{tenant}, {id}, {sku}, {quantity}, {customer_ref}, 'CREATED', {at}, {at}");
    let source = match only_if {
        Some(cte) => format!("SELECT {values} FROM {cte}"),
        None => format!("VALUES ({values})"),
    };
    format!(
        "INSERT INTO orders (tenant_id, id, sku, quantity, customer_ref, status, created_at, updated_at)
         {source}"
    )
}

fn bind_order<'q>(
    query: Query<'q, Postgres, PgArguments>,
    tenant: TenantId,
    order: &'q Order,
) -> Query<'q, Postgres, PgArguments> {
    query
        .bind(tenant.0)
        .bind(order.id)
        .bind(&order.sku)
        .bind(order.quantity)
        .bind(&order.customer_ref)
        .bind(order.created_at)
}

/// Inserts `order` (built by [`Order::created`]) and its `OrderCreated` event, and
/// completes the record `fence` names with `response`, all or nothing. False when the
/// fence no longer held (another request took the key over): nothing was written.
pub async fn create(
    sql: &mut Sql<'_>,
    fence: &Fence<'_>,
    response: &StoredResponse,
    order: &Order,
    trace: Option<&TraceContext>,
) -> sqlx::Result<bool> {
    let tenant = fence.scope.tenant;
    let event = event(tenant, EventType::OrderCreated, order, trace);
    let row = EventRow::new(&event);
    let completion = Completion::new(fence, response)?;
    let done = match sql.layout().pick(&CREATE_WRITE) {
        // The event row inserted, or nothing.
        CreateWrite::OneStatement => {
            let query = completion.bind(sql.query(CREATE.as_str()));
            row.bind(bind_order(query, tenant, order))
                .execute(sql.conn())
                .await?
                .rows_affected()
                == 1
        }
        // Everything, or nothing and an error saying the fence no longer held.
        CreateWrite::Call => {
            let query = completion.bind(sql.query(CREATE_CALL.as_str()));
            match row
                .bind(bind_order(query, tenant, order))
                .execute(sql.conn())
                .await
            {
                Ok(_) => true,
                Err(e) if db::is_sqlstate(&e, FENCE_LOST) => false,
                Err(e) => return Err(e),
            }
        }
    };
    Ok(done)
}

/// Cancels the order; a second cancel returns it unchanged and emits nothing.
pub async fn cancel(
    sql: &mut Sql<'_>,
    tenant: TenantId,
    id: Uuid,
    trace: Option<&TraceContext>,
) -> sqlx::Result<CancelOutcome> {
    // The row lock taken here serialises concurrent changes of one order, which is
    // what makes `version` (and so event order) follow commit order.
    let cancelled: Option<Order> = sql.query_as(concat!(
        "UPDATE orders SET status = 'CANCELLED', version = version + 1, updated_at = statement_timestamp()
         WHERE tenant_id = $1 AND id = $2 AND status = 'CREATED'
         RETURNING ", columns!(), ""
    ))
    .bind(tenant.0)
    .bind(id)
    .fetch_optional(sql.conn())
    .await?;
    if let Some(order) = cancelled {
        outbox::writer::append(
            sql,
            &event(tenant, EventType::OrderCancelled, &order, trace),
        )
        .await?;
        return Ok(CancelOutcome::Cancelled(order));
    }
    Ok(match get(sql, tenant, id).await? {
        Some(order) => CancelOutcome::AlreadyCancelled(order),
        None => CancelOutcome::NotFound,
    })
}

/// The event a change emits: the order as it is after the change, ordered among the
/// order's events by its version, with the trace context of the request that made it.
fn event(
    tenant: TenantId,
    event_type: EventType,
    order: &Order,
    trace: Option<&TraceContext>,
) -> NewEvent {
    NewEvent {
        trace: trace.cloned(),
        tenant,
        event_type,
        aggregate_id: order.id,
        aggregate_seq: order.version,
        occurred_at: order.updated_at,
        order: order.to_event_state(),
    }
}

/// One order of this tenant.
pub async fn get(sql: &mut Sql<'_>, tenant: TenantId, id: Uuid) -> sqlx::Result<Option<Order>> {
    sql.query_as(concat!(
        "SELECT ",
        columns!(),
        " FROM orders WHERE tenant_id = $1 AND id = $2"
    ))
    .bind(tenant.0)
    .bind(id)
    .fetch_optional(sql.conn())
    .await
}

/// Position after which a page starts: the last order of the previous page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageAfter {
    pub created_at: DateTime<Utc>,
    pub id: Uuid,
}

/// The first page of a tenant's orders, newest first.
pub const LIST_FIRST: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM orders WHERE tenant_id = $1
     ORDER BY created_at DESC, id DESC LIMIT $2"
);

/// A later page: the orders after the position `($2, $3)`.
pub const LIST_AFTER: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM orders WHERE tenant_id = $1 AND (created_at, id) < ($2, $3)
     ORDER BY created_at DESC, id DESC LIMIT $4"
);

/// Newest first, keyset-paginated on `(created_at, id)`; returns up to `limit` orders.
pub async fn list(
    sql: &mut Sql<'_>,
    tenant: TenantId,
    limit: i64,
    after: Option<PageAfter>,
) -> sqlx::Result<Vec<Order>> {
    match after {
        None => {
            sql.query_as(LIST_FIRST)
                .bind(tenant.0)
                .bind(limit)
                .fetch_all(sql.conn())
                .await
        }
        Some(after) => {
            sql.query_as(LIST_AFTER)
                .bind(tenant.0)
                .bind(after.created_at)
                .bind(after.id)
                .bind(limit)
                .fetch_all(sql.conn())
                .await
        }
    }
}

/// A tenant's first orders in `created_at` order, oldest first: the export, on the
/// index that lists them newest first, read backwards.
pub const EXPORT_FIRST: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM orders WHERE tenant_id = $1 ORDER BY created_at, id LIMIT $2"
);

/// The export's next page: the orders after the position `($2, $3)`.
pub const EXPORT_AFTER: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM orders WHERE tenant_id = $1 AND (created_at, id) > ($2, $3)
     ORDER BY created_at, id LIMIT $4"
);

/// Up to `limit` of `tenant`'s orders after `after` (oldest first; `None`: from the
/// first), for an export that holds one page at a time.
pub async fn export_page(
    sql: &mut Sql<'_>,
    tenant: TenantId,
    after: Option<PageAfter>,
    limit: i64,
) -> sqlx::Result<Vec<Order>> {
    match after {
        None => {
            sql.query_as(EXPORT_FIRST)
                .bind(tenant.0)
                .bind(limit)
                .fetch_all(sql.conn())
                .await
        }
        Some(after) => {
            sql.query_as(EXPORT_AFTER)
                .bind(tenant.0)
                .bind(after.created_at)
                .bind(after.id)
                .bind(limit)
                .fetch_all(sql.conn())
                .await
        }
    }
}

/// Up to `$2` orders of tenant `$1`, by primary key (an index scan of the key the
/// tenant leads, both to find and to delete).
pub const ERASE_TENANT_BATCH: &str = "DELETE FROM orders
     WHERE tenant_id = $1
       AND id = ANY (ARRAY(SELECT id FROM orders WHERE tenant_id = $1 LIMIT $2))";

/// How many orders of tenant `$1` are left.
pub const COUNT_TENANT: &str = "SELECT count(*) FROM orders WHERE tenant_id = $1";

/// Deletes up to `batch` of `tenant`'s rows (see [`ERASE_TENANT_BATCH`]); how many went.
pub async fn erase_tenant_batch(sql: &mut Sql<'_>, tenant: Uuid, batch: i64) -> sqlx::Result<u64> {
    sql.tenant_batch(ERASE_TENANT_BATCH, tenant, batch).await
}

/// How many rows of `tenant` are left (see [`COUNT_TENANT`]).
pub async fn count_tenant(sql: &mut Sql<'_>, tenant: Uuid) -> sqlx::Result<i64> {
    sql.tenant_count(COUNT_TENANT, tenant).await
}

#[cfg(test)]
mod tests {
    use sqlx::{Arguments, Execute};

    use super::*;
    use crate::idempotency::{IdempotencyKey, Scope, seal::Sealer};

    /// The `$n` placeholders of `sql`, in order of first appearance, deduplicated.
    fn placeholders(sql: &str) -> Vec<usize> {
        let mut found = Vec::new();
        for part in sql.split('$').skip(1) {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(n) = digits.parse::<usize>()
                && !found.contains(&n)
            {
                found.push(n);
            }
        }
        found
    }

    /// Each part of the create takes its parameters as the composition hands them
    /// out, and binds exactly as many as it takes: a column added to one part without
    /// its bind (or the other way round) fails here, not on a server.
    #[test]
    fn every_part_of_the_create_binds_the_parameters_it_numbers() {
        let p = &mut Placeholders::new();
        let mut counts = Vec::new();
        for part in [
            Completion::sql(p),
            insert_order_sql(p, Some("completed")),
            EventRow::insert_sql(p, Some("created")),
        ] {
            let before: usize = counts.iter().sum();
            let mut numbers = placeholders(&part);
            numbers.sort();
            assert_eq!(
                numbers,
                (before + 1..=before + numbers.len()).collect::<Vec<_>>(),
                "{part}"
            );
            counts.push(numbers.len());
        }
        assert_eq!(counts.iter().sum::<usize>(), p.taken());

        let tenant = TenantId(uuid::Uuid::now_v7());
        let scope = Scope {
            tenant,
            endpoint: "POST /v1/orders",
            key: IdempotencyKey::parse(Some("key-of-sixteen-bytes")).unwrap(),
        };
        let fence = Fence {
            scope: &scope,
            owner: uuid::Uuid::new_v4(),
            ttl_secs: 60,
            at: Utc::now(),
            sealer: &Sealer::PLAIN,
        };
        let fields = serde_json::json!({"sku": "A-1", "quantity": 2});
        let new = crate::orders::rules::NewOrder::parse(fields.as_object().unwrap()).unwrap();
        let order = Order::created(&new, fence.at);
        let response = StoredResponse {
            status: 201,
            location: None,
            content_type: None,
            body: bytes::Bytes::from_static(b"{}"),
            resource: Some(order.id),
        };
        let event = event(tenant, EventType::OrderCreated, &order, None);
        let row = EventRow::new(&event);
        let completion = Completion::new(&fence, &response).unwrap();
        let mut query = row.bind(bind_order(
            completion.bind(sqlx::query(CREATE.as_str())),
            tenant,
            &order,
        ));
        let bound = query.take_arguments().unwrap().unwrap().len();
        assert_eq!(bound, placeholders(&CREATE).len());
        assert_eq!(bound, p.taken());
    }
}
