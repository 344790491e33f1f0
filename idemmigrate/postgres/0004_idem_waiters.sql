-- idem: wake the duplicates that wait for an execution in flight
-- (idem.Operation.WaitInFlight), across processes, without making the
-- executions nobody waits for pay for it.
--
-- A waiter sets waiters on the in-flight record it waits for, after it
-- started listening on the channel idem_keys_<oid of this table>. The
-- completion (idem_complete, below) and idempg's release notify that
-- channel when, and only when, the record they change has the flag; the
-- payload is the md5 of the tenant (hex) followed by the key. pg_notify
-- makes the transaction that calls it queue for one global lock at
-- commit: the executions nobody waits for never call it. (A trigger would
-- have kept the statements as they were, but an AFTER UPDATE trigger, even
-- one whose WHEN is false, makes every completion fetch the old row again
-- and compile the WHEN: measured, a quarter more server time per
-- completion.)
--
-- The flag is unindexed, so setting it is a HOT update, as the completion
-- is. A row deleted and claimed again starts without it; a row taken over
-- keeps it, and its next completion notifies once for nothing.
ALTER TABLE idem_keys ADD COLUMN IF NOT EXISTS waiters boolean NOT NULL DEFAULT false;

-- The completion of 0002_idem_complete, which also tells the waiters.
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
        PERFORM pg_notify('idem_keys_' || 'idem_keys'::regclass::oid::text, md5(p_tenant) || p_key);
    END IF;
END
$$;
