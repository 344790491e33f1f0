package idemsql

import (
	"database/sql"

	"github.com/idem-go/idem/idemmigrate"
)

// mysqlExpired is true when the existing row is past its retention: it
// counts as absent, and any claim replaces it. UTC_TIMESTAMP(6) is
// evaluated once per statement, whatever the session time zone.
const mysqlExpired = `expires_at <= UTC_TIMESTAMP(6)`

// mysqlEnded is true when the existing row is in flight with an ended
// lease and the same fingerprint (<=>: NULL-safe equality): a claim takes
// it over, with its recovery points.
const mysqlEnded = `(state = 'in_flight' AND locked_until <= UTC_TIMESTAMP(6) AND fingerprint <=> @fingerprint)`

// mysqlTakeover is true when the existing row may be replaced by the
// claim.
const mysqlTakeover = `(` + mysqlExpired + ` OR ` + mysqlEnded + `)`

// mysqlWon is the replacement decision as seen by the assignments after
// the first. MySQL runs the assignments of an UPDATE left to right, each
// seeing the values already assigned, while MariaDB's
// SIMULTANEOUS_ASSIGNMENT mode lets each see the old row. lease_token is
// assigned first, from the untouched row; afterwards it
// holds our token exactly when the claim won, and when it does not,
// nothing has changed, so mysqlTakeover still reads the old row. Either
// way every assignment sees the same decision.
const mysqlWon = `(lease_token = @token OR ` + mysqlTakeover + `)`

// mysqlClaimSQL is the claim statement (see mysqlDialect.claim), kept as
// source so that MariaDB's folded claims (mariadb.go) embed it.
const mysqlClaimSQL = `INSERT INTO idem_keys (tenant_id, idem_key, fingerprint, state, lease_token,
    locked_until, storage_mode, created_at, expires_at)
VALUES (@tenant, @key, @fingerprint, IF(LAST_INSERT_ID(1), 'in_flight', 'in_flight'), @token,
    UTC_TIMESTAMP(6) + INTERVAL @lease MICROSECOND, 0, UTC_TIMESTAMP(6),
    UTC_TIMESTAMP(6) + INTERVAL @retention MICROSECOND)
ON DUPLICATE KEY UPDATE
    lease_token      = IF(` + mysqlExpired + `, IF(LAST_INSERT_ID(1), @token, @token),
                       IF(` + mysqlEnded + `, IF(LAST_INSERT_ID(2), @token, @token),
                       IF(LAST_INSERT_ID(0), lease_token, lease_token))),
    steps            = IF(` + mysqlExpired + `, NULL, steps),
    fingerprint      = IF(` + mysqlWon + `, @fingerprint, fingerprint),
    state            = IF(` + mysqlWon + `, 'in_flight', state),
    locked_until     = IF(` + mysqlWon + `, UTC_TIMESTAMP(6) + INTERVAL @lease MICROSECOND, locked_until),
    storage_mode     = IF(` + mysqlWon + `, 0, storage_mode),
    status_code      = IF(` + mysqlWon + `, NULL, status_code),
    response_headers = IF(` + mysqlWon + `, NULL, response_headers),
    response_body    = IF(` + mysqlWon + `, NULL, response_body),
    resource_ref     = IF(` + mysqlWon + `, NULL, resource_ref),
    created_at       = IF(` + mysqlWon + `, UTC_TIMESTAMP(6), created_at),
    completed_at     = IF(` + mysqlWon + `, NULL, completed_at),
    expires_at       = IF(` + mysqlWon + `, UTC_TIMESTAMP(6) + INTERVAL @retention MICROSECOND, expires_at)`

// mysqlDialect lacks errorNumber: MySQLDialect copies it with one.
var mysqlDialect = &dialect{
	name:         "mysql",
	storeName:    "mysql",
	placeholders: positional,
	rules:        mysqlRules,
	migrate:      idemmigrate.MySQL,

	// The statement's last insert id tells the outcome, whatever the
	// rows affected say: LAST_INSERT_ID(x) makes the server report x as
	// the insert id of the statement that calls it (for a table without
	// AUTO_INCREMENT, the last x the statement set). The VALUES call it
	// with 1 for every claim; the first assignment calls it again with 1
	// when it replaces a record past retention, 2 when it takes over an
	// in-flight one, 0 when it keeps the row (IF runs only the branch it
	// picks). Rows affected would not do: with the driver's
	// clientFoundRows on, a kept row counts 1, as an inserted one does.
	//
	// steps is assigned second, while expires_at still holds the old
	// row's value on MySQL as on MariaDB: a record past retention loses
	// its recovery points with the rest, one taken over keeps them.
	//
	// The session's LAST_INSERT_ID() is left at 0, 1 or 2: harmless, since
	// a program reads it on the connection of its own insert, right after.
	claim: compile(mysqlClaimSQL, positional),

	// Read after a takeover, which holds the key under @token: no other
	// execution can change the steps until the lease ends.
	stepsOf: compile(`SELECT steps FROM idem_keys
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token`, positional),

	// A plain consistent read: it takes no lock and waits for none.
	peek: compile(`SELECT `+recordColumns+`, state = 'complete' AND expires_at > UTC_TIMESTAMP(6)
FROM idem_keys WHERE tenant_id = @tenant AND idem_key = @key`, positional),

	get:   compile(`SELECT `+recordColumns+` FROM idem_keys WHERE tenant_id = @tenant AND idem_key = @key`, positional),
	state: compile(`SELECT `+stateColumns+` FROM idem_keys WHERE tenant_id = @tenant AND idem_key = @key`, positional),

	// An UPDATE reads the latest committed row and locks it, under
	// REPEATABLE READ as under READ COMMITTED: a takeover committed since
	// the transaction began makes it match nothing, and a takeover that
	// comes later waits for this transaction and then finds the record
	// complete.
	complete: compile(`UPDATE idem_keys SET state = 'complete', storage_mode = @mode,
    status_code = @status, response_headers = @headers, response_body = @body,
    resource_ref = @ref, completed_at = UTC_TIMESTAMP(6)
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'`, positional),
	extend: compile(`UPDATE idem_keys SET locked_until = UTC_TIMESTAMP(6) + INTERVAL @lease MICROSECOND,
    expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL @lease MICROSECOND)
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'`, positional),

	held: compile(`SELECT 1 FROM idem_keys
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'`, positional),

	// Store.Release runs release, then releaseKeep when release deleted
	// nothing. Both are fenced: after a takeover neither matches.
	release: compile(`DELETE FROM idem_keys
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'
  AND steps IS NULL`, positional),
	releaseKeep: compile(`UPDATE idem_keys SET locked_until = UTC_TIMESTAMP(6)
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight'
  AND steps IS NOT NULL`, positional),

	// The step is never empty, so the row always changes and rows
	// affected count it whether the driver counts found or changed rows.
	// CONCAT answers NULL, with a mere warning when the session is not
	// strict, once its result would outgrow max_allowed_packet: that
	// would erase every step recorded before under a success. The last
	// condition refuses such a step instead (SaveStep then says why).
	// Written without compile, which keeps "@" for its own markers.
	saveStep: query{
		text: `UPDATE idem_keys SET steps = CONCAT(COALESCE(steps, X''), ?)
WHERE tenant_id = ? AND idem_key = ? AND lease_token = ? AND state = 'in_flight'
  AND COALESCE(LENGTH(steps), 0) + ? <= @@max_allowed_packet`,
		names: []string{"step", "tenant", "key", "token", "step_len"},
	},

	// The pick walks idem_keys_expires_at_idx (whose entries end with the
	// primary key, hence the deterministic order), locks the batch and
	// skips rows another session holds (SKIP LOCKED: MySQL 8.0.1+,
	// MariaDB 10.6+), so that neither the purge nor a claim ever waits on
	// the other. Under READ COMMITTED InnoDB takes no gap locks. The
	// delete repeats the conditions; the rows are locked, so they hold.
	purgePick: compile(`SELECT tenant_id, idem_key FROM idem_keys
WHERE expires_at <= UTC_TIMESTAMP(6)
  AND NOT (state = 'in_flight' AND locked_until > UTC_TIMESTAMP(6))
ORDER BY expires_at, tenant_id, idem_key LIMIT @limit
FOR UPDATE SKIP LOCKED`, positional),
	// Run once per picked row, by primary key: a DELETE of the whole batch
	// at once (IN a list of keys) may be planned as a scan of the table,
	// which waits on the very rows the pick skipped.
	purge: compile(`DELETE FROM idem_keys
WHERE tenant_id = @tenant AND idem_key = @key
  AND expires_at <= UTC_TIMESTAMP(6)
  AND NOT (state = 'in_flight' AND locked_until > UTC_TIMESTAMP(6))`, positional),
	purgeInTx:      true,
	purgeIsolation: sql.LevelReadCommitted,

	changedRows: true,
	maxTenant:   512, // tenant_id VARBINARY(512)
	utcWall:     true,
}
