-- idem: the idempotency records. One row per (tenant, key).
-- Times are written by the database clock (now()), never by an app server.
CREATE TABLE IF NOT EXISTS idem_keys (
    tenant_id        text        NOT NULL,
    idem_key         text        NOT NULL CHECK (length(idem_key) BETWEEN 1 AND 255),
    -- SHA-256 of what the request asked for; NULL when not fingerprinted.
    fingerprint      bytea,
    state            text        NOT NULL CHECK (state IN ('in_flight', 'complete')),
    -- Fencing token of the execution holding (or last holding) the lease.
    lease_token      bigint      NOT NULL,
    locked_until     timestamptz NOT NULL,
    -- 0 full response, 1 resource reference, 2 marker (idem.StorageMode).
    storage_mode     smallint    NOT NULL DEFAULT 0,
    status_code      integer,
    response_headers jsonb,
    response_body    bytea,
    resource_ref     text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    -- End of retention, counted from the claim: past it the key is absent.
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, idem_key)
) WITH (fillfactor = 80); -- room for HOT updates: the completion changes no indexed column

-- Purge walks this index in bounded batches.
CREATE INDEX IF NOT EXISTS idem_keys_expires_at_idx ON idem_keys (expires_at);
