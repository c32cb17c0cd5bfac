//! Waking the relays: every transaction that writes events tells the relays, at its
//! commit, which tenants it wrote them for (`NOTIFY` is transactional: delivered at
//! commit, dropped at rollback), so a relay visits the tenants it hears of instead of
//! walking the table (`known`).
//!
//! On a single server the insert trigger on `outbox_event` sends it, per row, naming
//! the row's tenant; PostgreSQL folds a transaction's identical notifications, so a
//! tenant is named once a transaction (a row trigger reads only the new row, where a
//! statement trigger's transition table cost a create more than its notification). On
//! a distributed database (Citus) a trigger would fire on the worker that holds the
//! tenant's shard, where no relay listens, and a table with a trigger cannot be
//! distributed at all; so there the writer sends it itself, on the node the
//! transaction runs on: the tenant's, with routing, where each relay listens too
//! (decision 171), or the coordinator. The create's function does it as its last step
//! (decision 173); a cancel sends it as one more statement of its transaction
//! ([`in_transaction`]). Either way the
//! notification reaches the relays before the client has its answer. A re-drive,
//! which inserts nothing, names its tenants with [`notify`].

use uuid::Uuid;

use crate::{
    db::{Forms, Sql},
    tenant::TenantId,
};

/// The channel the relays listen on; the payload names tenants (see [`payload`]).
pub const CHANNEL: &str = "outbox_event";

/// The tenant ids that fit in one notification's payload (PostgreSQL takes up to 8000
/// bytes: 36 for an id and a comma each).
const TENANTS_PER_NOTIFICATION: usize = 200;

/// Sends one notification: channel `$1`, payload `$2`.
const NOTIFY: &str = "SELECT pg_notify($1, $2)";

/// Whether a writer notifies itself (where no trigger does).
const WRITER_NOTIFIES: Forms<bool> = Forms {
    one_server: false,
    distributed: true,
};

/// Within the transaction that wrote events of `tenant`: tells the relays at its
/// commit, where no trigger does (see the module's doc).
pub async fn in_transaction(sql: &mut Sql<'_>, tenant: TenantId) -> sqlx::Result<()> {
    if sql.layout().pick(&WRITER_NOTIFIES) {
        notify(sql, &[tenant.0]).await?;
    }
    Ok(())
}

/// Tells the relays of `tenants` through `sql` (at its commit, when in a
/// transaction): one notification per [`TENANTS_PER_NOTIFICATION`].
pub async fn notify(sql: &mut Sql<'_>, tenants: &[Uuid]) -> sqlx::Result<()> {
    for chunk in tenants.chunks(TENANTS_PER_NOTIFICATION) {
        sql.query(NOTIFY)
            .bind(CHANNEL)
            .bind(payload(chunk))
            .execute(sql.conn())
            .await?;
    }
    Ok(())
}

/// The payload naming `tenants`: their ids, comma-separated.
pub fn payload(tenants: &[Uuid]) -> String {
    tenants
        .iter()
        .map(Uuid::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The tenants a notification names: none for an empty payload (an earlier release's
/// trigger, which only said that something committed), and none for one that cannot be
/// read.
pub fn tenants_of(payload: &str) -> Vec<Uuid> {
    payload
        .split(',')
        .filter_map(|id| Uuid::parse_str(id.trim()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_names_its_tenants_and_fits_a_notification() {
        let tenants: Vec<Uuid> = (0..TENANTS_PER_NOTIFICATION)
            .map(|_| Uuid::new_v4())
            .collect();
        let text = payload(&tenants);
        assert!(text.len() < 8000, "{} bytes", text.len());
        assert_eq!(tenants_of(&text), tenants);
        assert!(
            tenants_of("").is_empty(),
            "the trigger's payload names none"
        );
        assert!(tenants_of("not-a-uuid").is_empty());
    }
}
