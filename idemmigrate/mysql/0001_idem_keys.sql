-- idem: the idempotency records. One row per (tenant, key).
-- Same columns and meaning as postgres/0001_idem_keys.sql.
--
-- tenant_id and idem_key are VARBINARY so that they compare byte for byte:
-- a case-insensitive or PAD SPACE collation would make 'Abc' and 'abc', or
-- a tenant 't' and 't ', the same record. Tenants are limited to 512 bytes.
--
-- Times are DATETIME(6) holding UTC, written from UTC_TIMESTAMP(6) (the
-- database clock, whatever the session time zone), never by an app server.
CREATE TABLE IF NOT EXISTS idem_keys (
    tenant_id        VARBINARY(512) NOT NULL,
    idem_key         VARBINARY(255) NOT NULL,
    -- SHA-256 of what the request asked for; NULL when not fingerprinted.
    fingerprint      BLOB,
    state            VARCHAR(16)    NOT NULL,
    -- Fencing token of the execution holding (or last holding) the lease.
    lease_token      BIGINT         NOT NULL,
    locked_until     DATETIME(6)    NOT NULL,
    -- 0 full response, 1 resource reference, 2 marker (idem.StorageMode).
    storage_mode     SMALLINT       NOT NULL DEFAULT 0,
    status_code      INT,
    -- JSON object of string arrays (idem.MarshalHeader). MariaDB's JSON is
    -- LONGTEXT checked by JSON_VALID; MySQL's is its binary JSON type.
    response_headers JSON,
    response_body    LONGBLOB,
    resource_ref     TEXT,
    created_at       DATETIME(6)    NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    completed_at     DATETIME(6),
    -- End of retention, counted from the claim: past it the key is absent.
    expires_at       DATETIME(6)    NOT NULL,
    PRIMARY KEY (tenant_id, idem_key),
    -- Purge walks this index in bounded batches.
    KEY idem_keys_expires_at_idx (expires_at),
    CONSTRAINT idem_keys_key_length CHECK (LENGTH(idem_key) BETWEEN 1 AND 255),
    CONSTRAINT idem_keys_state CHECK (state IN ('in_flight', 'complete'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
