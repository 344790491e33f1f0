-- idem: the idempotency records. One row per (tenant, key).
-- Same columns and meaning as postgres/0001_idem_keys.sql. Times are integer
-- Unix microseconds (UTC) computed by SQLite itself from 'now', never by an
-- app server: integers compare exactly, sort in the expires_at index, and
-- carry no time zone.
CREATE TABLE IF NOT EXISTS idem_keys (
    tenant_id        TEXT    NOT NULL,
    idem_key         TEXT    NOT NULL CHECK (length(idem_key) BETWEEN 1 AND 255),
    -- SHA-256 of what the request asked for; NULL when not fingerprinted.
    fingerprint      BLOB,
    state            TEXT    NOT NULL CHECK (state IN ('in_flight', 'complete')),
    -- Fencing token of the execution holding (or last holding) the lease.
    lease_token      INTEGER NOT NULL,
    locked_until     INTEGER NOT NULL,
    -- 0 full response, 1 resource reference, 2 marker (idem.StorageMode).
    storage_mode     INTEGER NOT NULL DEFAULT 0,
    status_code      INTEGER,
    -- JSON object of string arrays (idem.MarshalHeader).
    response_headers TEXT,
    response_body    BLOB,
    resource_ref     TEXT,
    created_at       INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000000) AS INTEGER)),
    completed_at     INTEGER,
    -- End of retention, counted from the claim: past it the key is absent.
    expires_at       INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, idem_key)
);
-- A rowid table (not WITHOUT ROWID): Purge deletes by rowid in bounded batches.

-- Purge walks this index in bounded batches.
CREATE INDEX IF NOT EXISTS idem_keys_expires_at_idx ON idem_keys (expires_at);
