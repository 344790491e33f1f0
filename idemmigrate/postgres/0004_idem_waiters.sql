-- idem: wake the duplicates that wait for an execution in flight
-- (idem.Operation.WaitInFlight), across processes, without making the
-- executions nobody waits for pay for it.
--
-- A waiter sets waiters on the in-flight record it waits for, then
-- listens. When a record so marked completes, is released, has its lease
-- ended or is taken over, the triggers below send a notification on the
-- channel idem_keys_<oid of this table>, whose payload is the md5 of the
-- tenant (hex) followed by the key. Records nobody waits for send none:
-- pg_notify makes every transaction that calls it queue for one global
-- lock at commit, which the fast path must not pay.
--
-- The flag is unindexed, so setting it is a HOT update, as the completion
-- is. A row deleted or created again starts without it.
ALTER TABLE idem_keys ADD COLUMN IF NOT EXISTS waiters boolean NOT NULL DEFAULT false;

CREATE OR REPLACE FUNCTION idem_keys_notify_waiters() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_notify('idem_keys_' || TG_RELID::text, md5(OLD.tenant_id) || OLD.idem_key);
    RETURN NULL;
END
$$;

-- A completion changes the state, a takeover the token, a release that
-- keeps the record (it holds recovery points) ends the lease: a heartbeat,
-- which moves the lease's end later, wakes nobody.
DROP TRIGGER IF EXISTS idem_keys_waiters_update ON idem_keys;
CREATE TRIGGER idem_keys_waiters_update
    AFTER UPDATE ON idem_keys
    FOR EACH ROW
    WHEN (OLD.waiters AND (OLD.state <> NEW.state
                           OR OLD.lease_token <> NEW.lease_token
                           OR NEW.locked_until < OLD.locked_until))
    EXECUTE FUNCTION idem_keys_notify_waiters();

DROP TRIGGER IF EXISTS idem_keys_waiters_delete ON idem_keys;
CREATE TRIGGER idem_keys_waiters_delete
    AFTER DELETE ON idem_keys
    FOR EACH ROW
    WHEN (OLD.waiters)
    EXECUTE FUNCTION idem_keys_notify_waiters();
