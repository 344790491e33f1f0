package idemsql

import "github.com/idem-go/idem/idemmigrate"

// sqliteNow is SQLite's clock as integer Unix microseconds. 'now' is the
// same for every use within one statement, so a statement may repeat it.
// SQLite keeps milliseconds; integers compare exactly and need no time
// zone, unlike SQLite's text dates.
const sqliteNow = `CAST(round(unixepoch('subsec') * 1000000) AS INTEGER)`

// sqliteCompleteSQL is the completion (see sqliteDialect.complete), kept
// as source so that the unit's completion (sqliteSealedComplete) embeds
// it.
const sqliteCompleteSQL = `UPDATE idem_keys SET state = 'complete', storage_mode = @mode,
    status_code = @status, response_headers = @headers, response_body = @body,
    resource_ref = @ref, completed_at = ` + sqliteNow + `
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'`

// sqliteSealedComplete is the completion in the unit's transaction: the
// release of the savepoint that marks it (which fails when SQLite ended
// the transaction: see sealSavepoint) and the completion, in one call;
// the driver runs the statements of the text in order, stopping at the
// first error, and reports the changes of the last.
var sqliteSealedComplete = compile(`RELEASE SAVEPOINT `+savepoint+`; `+sqliteCompleteSQL, numbered)

var sqliteDialect = &dialect{
	name:         "sqlite",
	storeName:    "sqlite",
	placeholders: numbered,
	rules:        sqliteRules,
	migrate:      idemmigrate.SQLite,

	// A claim of a key without a record is this one statement, which
	// inserts or, when a record exists, does nothing and returns no row.
	// A key with a record is claimed in a transaction that holds the write
	// lock (see Store.claimSQLite): claimRead reads the record, and
	// claimReplace replaces it when it is past retention, or in flight
	// with an ended lease and the same fingerprint (a takeover, which
	// keeps the recovery points).
	claim: compile(`INSERT INTO idem_keys (tenant_id, idem_key, fingerprint, state, lease_token,
    locked_until, storage_mode, created_at, expires_at)
VALUES (@tenant, @key, @fingerprint, 'in_flight', @token,
    `+sqliteNow+` + @lease, 0, `+sqliteNow+`, `+sqliteNow+` + @retention)
ON CONFLICT (tenant_id, idem_key) DO NOTHING
RETURNING lease_token`, numbered),
	claimReturns: true,

	// The record, whether it is past retention, and whether it is in
	// flight with an ended lease and the same fingerprint (IS: NULL-safe
	// equality), on one reading of the clock.
	claimRead: compile(`SELECT `+recordColumns+`,
    expires_at <= `+sqliteNow+`,
    state = 'in_flight' AND locked_until <= `+sqliteNow+` AND fingerprint IS @fingerprint
FROM idem_keys WHERE tenant_id = @tenant AND idem_key = @key`, numbered),
	claimReplace: compile(`UPDATE idem_keys SET fingerprint = @fingerprint, state = 'in_flight',
    lease_token = @token, locked_until = `+sqliteNow+` + @lease, storage_mode = 0, status_code = NULL,
    response_headers = NULL, response_body = NULL, resource_ref = NULL,
    created_at = `+sqliteNow+`, completed_at = NULL, expires_at = `+sqliteNow+` + @retention, steps = @steps
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @old`, numbered),

	// A read of the last commit: in WAL mode it neither takes nor waits
	// for the write lock.
	peek: compile(`SELECT `+recordColumns+`, state = 'complete' AND expires_at > `+sqliteNow+`
FROM idem_keys WHERE tenant_id = @tenant AND idem_key = @key`, numbered),

	get:   compile(`SELECT `+recordColumns+` FROM idem_keys WHERE tenant_id = @tenant AND idem_key = @key`, numbered),
	state: compile(`SELECT `+stateColumns+` FROM idem_keys WHERE tenant_id = @tenant AND idem_key = @key`, numbered),

	complete: compile(sqliteCompleteSQL, numbered),

	extend: compile(`UPDATE idem_keys SET locked_until = `+sqliteNow+` + @lease,
    expires_at = max(expires_at, `+sqliteNow+` + @lease)
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'`, numbered),

	held: compile(`SELECT 1 FROM idem_keys
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'`, numbered),

	// Store.Release runs release, then releaseKeep when release deleted
	// nothing. Both are fenced: after a takeover neither matches.
	release: compile(`DELETE FROM idem_keys
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'
  AND steps IS NULL`, numbered),
	releaseKeep: compile(`UPDATE idem_keys SET locked_until = `+sqliteNow+`
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'
  AND steps IS NOT NULL`, numbered),

	// || makes text of two blobs, byte for byte; the CAST keeps the
	// column a blob.
	saveStep: compile(`UPDATE idem_keys SET steps = CAST(coalesce(steps, x'') || @step AS BLOB)
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'`, numbered),

	// One statement, so SQLite's single write lock is held for one bounded
	// batch; the subquery walks idem_keys_expires_at_idx.
	purge: compile(`DELETE FROM idem_keys WHERE rowid IN (
    SELECT rowid FROM idem_keys
    WHERE expires_at <= `+sqliteNow+`
      AND NOT (state = 'in_flight' AND locked_until > `+sqliteNow+`)
    ORDER BY expires_at LIMIT @limit)`, numbered),
}
