-- Orders, the business table.
-- tenant_id leads the primary key so that every lookup is tenant-scoped by construction
-- and one tenant's rows cluster together; ids are random UUIDs, so a guessed id of
-- another tenant simply does not exist for the caller (404, never 403).
CREATE TABLE orders (
    tenant_id    uuid        NOT NULL,
    id           uuid        NOT NULL,
    sku          text        NOT NULL CHECK (sku ~ '^[A-Za-z0-9._-]{1,64}$'),
    quantity     integer     NOT NULL CHECK (quantity BETWEEN 1 AND 10000),
    customer_ref text                 CHECK (char_length(customer_ref) <= 128),
    status       text        NOT NULL CHECK (status IN ('CREATED', 'CANCELLED')),
    -- Incremented by every change; the outbox uses it to order one order's events.
    version      integer     NOT NULL DEFAULT 1,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

-- Keyset pagination of GET /v1/orders: newest first within a tenant.
CREATE INDEX orders_tenant_newest ON orders (tenant_id, created_at DESC, id DESC);
