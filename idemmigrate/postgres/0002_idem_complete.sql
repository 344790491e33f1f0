-- idem: the completion, fenced by the lease token, as one function call.
--
-- idempg sends SELECT idem_complete(...) and COMMIT in one round trip.
-- When the lease was lost (another execution took the key over, or it was
-- released), the function raises SQLSTATE 'IDL01': the server aborts the
-- transaction and skips the COMMIT, and idempg rolls it back, the business
-- writes included. idempg maps 'IDL01' to idem.ErrLeaseLost.
--
-- The update touches unindexed columns only, so it is a HOT update.
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
       AND state       = 'in_flight';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idem: lease lost on key %', p_key
            USING ERRCODE = 'IDL01',
                  HINT = 'another execution took the key over or it was released; the transaction is rolled back';
    END IF;
END
$$;
