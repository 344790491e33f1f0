-- idem: notifications that name neither the tenant nor the key.
--
-- Any role that can connect may LISTEN on any channel, with no privilege
-- on idem_keys: the notifications of 0004 (the md5 of the tenant followed
-- by the raw key) told such a role every waited key and, by a dictionary,
-- its tenant. From here a notification carries a keyed hash of the tenant
-- and the key, whose secret lives in idem_notify_secret, a table that only
-- the roles given access to idem's tables read. idempg's listener reads the
-- secret once per listening connection and computes the same hash for the
-- records it waits for: a LISTENing stranger learns that some waited record
-- changed, nothing more.
--
-- The token is sha256(secret || sha256(secret || tenant || 0x00 || key)),
-- the tenant and the key in UTF-8 (text holds no NUL, so the two cannot be
-- told apart any other way), in hex. The nested hash keeps the secret out
-- of reach of a length extension.
--
-- Compatible both ways during an upgrade: idempg falls back to the
-- payload of 0004 on a schema without this file, and a process of an
-- earlier release, whose waiters listen for that payload, is not woken by
-- the completions made here: its waiters find them by polling, a few times
-- a second, until it is upgraded too.
CREATE TABLE IF NOT EXISTS idem_notify_secret (
    -- One row: the key of the notifications' hash.
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    secret   bytea   NOT NULL CHECK (length(secret) >= 16)
);
REVOKE ALL ON idem_notify_secret FROM PUBLIC;

-- 244 bits from the server's strong random source (gen_random_uuid,
-- PostgreSQL 13 and later, draws on pg_strong_random).
INSERT INTO idem_notify_secret (secret)
VALUES (decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'))
ON CONFLICT (only_row) DO NOTHING;

-- The payload of the notifications about (p_tenant, p_key).
CREATE OR REPLACE FUNCTION idem_notify_token(p_tenant text, p_key text) RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT encode(sha256(secret || sha256(secret || convert_to(p_tenant, 'UTF8') || '\x00'::bytea || convert_to(p_key, 'UTF8'))), 'hex')
      FROM idem_notify_secret
$$;

-- The completion of 0004_idem_waiters, whose notification carries the
-- token.
CREATE OR REPLACE FUNCTION idem_complete(
    p_tenant  text,
    p_key     text,
    p_token   bigint,
    p_mode    smallint,
    p_status  integer,
    p_headers jsonb,
    p_body    bytea,
    p_ref     text
) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_waiters boolean;
BEGIN
    UPDATE idem_keys
       SET state            = 'complete',
           storage_mode     = p_mode,
           status_code      = p_status,
           response_headers = p_headers,
           response_body    = p_body,
           resource_ref     = p_ref,
           completed_at     = now()
     WHERE tenant_id   = p_tenant
       AND idem_key    = p_key
       AND lease_token = p_token
       AND state       = 'in_flight'
    RETURNING waiters INTO v_waiters;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idem: lease lost on key %', p_key
            USING ERRCODE = 'IDL01',
                  HINT = 'another execution took the key over or it was released; the transaction is rolled back';
    END IF;
    IF v_waiters THEN
        PERFORM pg_notify('idem_keys_' || 'idem_keys'::regclass::oid::text, idem_notify_token(p_tenant, p_key));
    END IF;
END
$$;
