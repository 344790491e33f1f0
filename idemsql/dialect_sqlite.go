package idemsql

import "github.com/idem-go/idem/idemmigrate"

// sqliteNow is SQLite's clock as integer Unix microseconds. 'now' is the
// same for every use within one statement, so a statement may repeat it.
// SQLite keeps milliseconds; integers compare exactly and need no time
// zone, unlike SQLite's text dates.
const sqliteNow = `CAST(round(unixepoch('subsec') * 1000000) AS INTEGER)`

var sqliteDialect = &dialect{
	name:    "sqlite",
	kind:    kindSQLite,
	migrate: idemmigrate.SQLite,

	// The WHERE of DO UPDATE decides the takeover on the existing row
	// (idem_keys.*) against the new one (excluded.*, whose created_at is
	// now): past retention whatever the fingerprint, or in flight with an
	// ended lease and the same fingerprint (IS: NULL-safe equality).
	claim: compile(`INSERT INTO idem_keys (tenant_id, idem_key, fingerprint, state, lease_token,
    locked_until, storage_mode, created_at, expires_at)
VALUES (@tenant, @key, @fingerprint, 'in_flight', @token,
    `+sqliteNow+` + @lease, 0, `+sqliteNow+`, `+sqliteNow+` + @retention)
ON CONFLICT (tenant_id, idem_key) DO UPDATE SET
    fingerprint = excluded.fingerprint, state = 'in_flight', lease_token = excluded.lease_token,
    locked_until = excluded.locked_until, storage_mode = 0, status_code = NULL,
    response_headers = NULL, response_body = NULL, resource_ref = NULL,
    created_at = excluded.created_at, completed_at = NULL, expires_at = excluded.expires_at
WHERE idem_keys.expires_at <= excluded.created_at
   OR (idem_keys.state = 'in_flight' AND idem_keys.locked_until <= excluded.created_at
       AND idem_keys.fingerprint IS excluded.fingerprint)
RETURNING lease_token`, numbered),
	claimReturns: true,

	get: compile(`SELECT `+recordColumns+` FROM idem_keys WHERE tenant_id = @tenant AND idem_key = @key`, numbered),

	complete: compile(`UPDATE idem_keys SET state = 'complete', storage_mode = @mode,
    status_code = @status, response_headers = @headers, response_body = @body,
    resource_ref = @ref, completed_at = `+sqliteNow+`
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'`, numbered),

	extend: compile(`UPDATE idem_keys SET locked_until = `+sqliteNow+` + @lease,
    expires_at = max(expires_at, `+sqliteNow+` + @lease)
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'`, numbered),

	held: compile(`SELECT 1 FROM idem_keys
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'`, numbered),

	release: compile(`DELETE FROM idem_keys
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'`, numbered),

	// One statement, so SQLite's single write lock is held for one bounded
	// batch; the subquery walks idem_keys_expires_at_idx.
	purge: compile(`DELETE FROM idem_keys WHERE rowid IN (
    SELECT rowid FROM idem_keys
    WHERE expires_at <= `+sqliteNow+`
      AND NOT (state = 'in_flight' AND locked_until > `+sqliteNow+`)
    ORDER BY expires_at LIMIT @limit)`, numbered),
}
