package idemsql

import "github.com/idem-go/idem/idemmigrate"

// postgresMicros turns a number of microseconds into an interval.
const postgresMicros = `::bigint * interval '1 microsecond'`

var postgresDialect = &dialect{
	name:         "postgres",
	storeName:    "postgresql",
	placeholders: numbered,
	rules:        postgresRules,
	migrate:      idemmigrate.Postgres,

	// One statement decides: it inserts a new record, or replaces one
	// past its retention (whatever its fingerprint) or one in flight
	// whose lease ended (same fingerprint only), or changes nothing and
	// returns no row. Under READ COMMITTED, a claim meeting a row that
	// another transaction is changing waits for it and evaluates the
	// WHERE against the committed row.
	//
	// A record past retention loses its recovery points with the rest; one
	// taken over keeps them, and RETURNING reads them from the row the
	// claim updated, the latest committed one. Whether the claim took over
	// an in-flight record is read from the statement's snapshot (prev): a
	// row there still within its retention stays so, since nothing but a
	// claim shortens a retention, so a won claim that saw one took it over.
	// (A record inserted after the snapshot and taken over at once, its
	// lease already ended, would be reported as a fresh claim: that takes
	// a lease shorter than the statement.)
	claim: compile(`WITH prev AS (
    SELECT expires_at > now() AS live FROM idem_keys WHERE tenant_id = @tenant AND idem_key = @key)
INSERT INTO idem_keys (tenant_id, idem_key, fingerprint, state, lease_token,
    locked_until, storage_mode, created_at, expires_at)
VALUES (@tenant, @key, @fingerprint, 'in_flight', @token,
    now() + @lease`+postgresMicros+`, 0, now(), now() + @retention`+postgresMicros+`)
ON CONFLICT (tenant_id, idem_key) DO UPDATE SET
    fingerprint = excluded.fingerprint, state = 'in_flight', lease_token = excluded.lease_token,
    locked_until = excluded.locked_until, storage_mode = 0, status_code = NULL,
    response_headers = NULL, response_body = NULL, resource_ref = NULL,
    created_at = excluded.created_at, completed_at = NULL, expires_at = excluded.expires_at,
    steps = CASE WHEN idem_keys.expires_at <= excluded.created_at THEN NULL ELSE idem_keys.steps END
WHERE idem_keys.expires_at <= excluded.created_at
   OR (idem_keys.state = 'in_flight' AND idem_keys.locked_until <= excluded.created_at
       AND idem_keys.fingerprint IS NOT DISTINCT FROM excluded.fingerprint)
RETURNING lease_token, steps, coalesce((SELECT live FROM prev), false)`, numbered),
	claimReturns: true,

	peek: compile(`SELECT `+recordColumns+`, state = 'complete' AND expires_at > now()
FROM idem_keys WHERE tenant_id = @tenant AND idem_key = @key`, numbered),

	get:   compile(`SELECT `+recordColumns+` FROM idem_keys WHERE tenant_id = @tenant AND idem_key = @key`, numbered),
	state: compile(`SELECT `+stateColumns+` FROM idem_keys WHERE tenant_id = @tenant AND idem_key = @key`, numbered),

	// Only unindexed columns change: a HOT update. clock_timestamp(), not
	// now(): inside the handler's transaction now() is when it began.
	complete: compile(`UPDATE idem_keys SET state = 'complete', storage_mode = @mode,
    status_code = @status, response_headers = @headers::jsonb, response_body = @body,
    resource_ref = @ref, completed_at = clock_timestamp()
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'`, numbered),
	// In the handler's transaction, the completion also matches only
	// while idem.unit holds the value the unit set with SET LOCAL when it
	// began: SET LOCAL lasts until the transaction ends, so a transaction
	// the handler ended itself (COMMIT sent as SQL) stores nothing.
	completeUnit: compile(`UPDATE idem_keys SET state = 'complete', storage_mode = @mode,
    status_code = @status, response_headers = @headers::jsonb, response_body = @body,
    resource_ref = @ref, completed_at = clock_timestamp()
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'
  AND current_setting('idem.unit', true) = @unit`, numbered),

	extend: compile(`UPDATE idem_keys SET locked_until = now() + @lease`+postgresMicros+`,
    expires_at = greatest(expires_at, now() + @lease`+postgresMicros+`)
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'`, numbered),

	held: compile(`SELECT 1 FROM idem_keys
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'`, numbered),

	// Deletes the record, or ends its lease when it holds recovery points,
	// in one statement; the two conditions exclude each other, so the row
	// is never touched twice. Should a step be saved between the
	// statement's snapshot and its row lock, the delete, re-checked on the
	// newest row, deletes nothing, and the record stays held until its
	// lease ends, then is taken over with that step.
	release: compile(`WITH gone AS (
    DELETE FROM idem_keys
    WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'
      AND steps IS NULL)
UPDATE idem_keys SET locked_until = now()
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'
  AND steps IS NOT NULL`, numbered),

	// Appends without reading the column: the encoding of a list of steps
	// is the concatenation of theirs. An unindexed column: a HOT update.
	saveStep: compile(`UPDATE idem_keys SET steps = COALESCE(steps, ''::bytea) || @step::bytea
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'`, numbered),

	// ctid = ANY(ARRAY(…)) is a TID scan of the batch the subquery found
	// through idem_keys_expires_at_idx; SKIP LOCKED passes over rows a
	// claim is taking over, so the purge never waits for, nor blocks, a
	// claim.
	purge: compile(`DELETE FROM idem_keys WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM idem_keys
    WHERE expires_at <= now()
      AND NOT (state = 'in_flight' AND locked_until > now())
    ORDER BY expires_at LIMIT @limit
    FOR UPDATE SKIP LOCKED))`, numbered),
}
