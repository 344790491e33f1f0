package idemsql

import (
	"database/sql"
	"errors"

	"github.com/idem-go/idem/idemmigrate"
)

// Dialect is the SQL dialect of the database a Store works on. Use
// SQLite, Postgres, or idemmysql.Dialect for MySQL and MariaDB; the zero
// Dialect is not usable.
type Dialect struct{ d *dialect }

// The dialects whose driver errors idemsql reads without importing the
// driver: SQLite's result codes through the error's Code method
// (modernc.org/sqlite), PostgreSQL's SQLSTATE through its SQLState method
// (github.com/jackc/pgx/v5/stdlib, github.com/lib/pq).
var (
	// SQLite is SQLite 3.42 or later, through modernc.org/sqlite (open it
	// with idemsqlite.Open) or another driver set up the same way. Times
	// are integer Unix microseconds from SQLite's own clock.
	SQLite = Dialect{sqliteDialect}
	// Postgres is PostgreSQL through a database/sql driver, such as
	// github.com/jackc/pgx/v5/stdlib (driver "pgx"), for programs built on
	// database/sql, sqlx, ent or gorm. Programs on pgx itself use idempg.
	Postgres = Dialect{postgresDialect}
)

// MySQLDialect returns the dialect of MySQL 8.0.16+ and MariaDB 10.6+ on
// InnoDB, for a driver whose errors carry the server's error number:
// errorNumber returns it, or false for an error that carries none.
// idemmysql.Dialect is this dialect for github.com/go-sql-driver/mysql:
// use it. Times are DATETIME(6) holding UTC from UTC_TIMESTAMP(6). Tenants
// are limited to 512 bytes.
//
// The error numbers tell a deadlock (run again) and the errors after which
// InnoDB rolled the whole transaction back (the handler's transaction is
// then over) from the others.
func MySQLDialect(errorNumber func(error) (uint16, bool)) Dialect {
	if errorNumber == nil {
		panic("idemsql: MySQLDialect needs a function that reads the error number; use idemmysql.Dialect")
	}
	d := *mysqlDialect
	d.errorNumber = errorNumber
	return Dialect{&d}
}

// Name returns the dialect's name: "sqlite", "mysql" or "postgres".
func (d Dialect) Name() string {
	if d.d == nil {
		return ""
	}
	return d.d.name
}

// MigrateDialect returns the idemmigrate dialect whose files create the
// tables this dialect works on.
func (d Dialect) MigrateDialect() idemmigrate.Dialect {
	if d.d == nil {
		return ""
	}
	return d.d.migrate
}

// String returns Name.
func (d Dialect) String() string { return d.Name() }

// dialect holds one dialect's statements, compiled once. Every statement
// takes its arguments by name (see query):
//
//	claim         tenant key fingerprint token lease retention (µs)
//	claimRead     tenant key fingerprint
//	claimReplace  tenant key fingerprint token lease retention (µs) steps old
//	peek          tenant key
//	get           tenant key
//	complete      tenant key token mode status headers body ref
//	completeUnit  the same, and unit (Postgres)
//	extend        tenant key token lease (µs)
//	held          tenant key token
//	release       tenant key token
//	releaseKeep   tenant key token
//	saveStep      tenant key token step
//	stepsOf       tenant key token
//	purge         limit
type dialect struct {
	name    string
	migrate idemmigrate.Dialect

	// storeName is the name Store.Info reports.
	storeName string
	// placeholders is how the dialect spells parameters.
	placeholders placeholderStyle

	// rules is what the dialect does differently beyond its statements:
	// how the handler's transaction begins, ends and is found ended, and
	// how a claim runs (see rules).
	rules

	// claim is the one claiming statement. With claimReturns it returns a
	// row when it won (INSERT … ON CONFLICT … RETURNING lease_token,
	// steps, whether it took over); without, the outcome is read from the
	// statement's last insert id, which the statement sets to 1 when it
	// won, 2 when it won over an in-flight record (a takeover), and 0 when
	// it lost (MySQL), and a takeover's steps from stepsOf.
	//
	// SQLite claims differently (see claim_sqlite.go): claim inserts a new
	// record or does nothing, and a key that has a record is claimed in a
	// transaction that holds the write lock.
	claim        query
	claimReturns bool
	stepsOf      query
	claimRead    query // SQLite
	claimReplace query // SQLite

	// peek reads the record before a claim, and whether it is complete
	// and within its retention: a claim would lose to such a record, and
	// its replay needs nothing more, so a replay costs this one read (see
	// Store.Claim). It takes no lock and waits for none.
	peek query

	get query
	// state is get without the result and the recovery points (GetState).
	state query
	// complete is the fenced completion, in a transaction the caller owns
	// (CompleteTx) or alone. completeUnit is the one in the handler's
	// transaction, which may also check that the transaction is still the
	// one the unit of work began (Postgres).
	complete     query
	completeUnit query
	extend       query
	// held selects 1 when the record is in flight under the token; it
	// settles a zero rows-affected count where that is ambiguous.
	held query
	// release deletes the record held under the token when it holds no
	// recovery points; releaseKeep ends the lease of one that holds some,
	// and keeps it in flight. Where releaseKeep is empty, release does
	// both in one statement (PostgreSQL).
	release     query
	releaseKeep query
	// saveStep appends @step to the steps of the record held under the
	// token (StepStore.SaveStep).
	saveStep query
	purge    query
	// purgeIsolation is the isolation of the purge's transaction, when it
	// needs one (MySQL: READ COMMITTED takes no gap locks).
	purgeIsolation sql.IsolationLevel
	purgeInTx      bool
	// purgePick, when set, picks the batch first (tenant_id, idem_key,
	// locking them, skipping rows other sessions hold) and purge then
	// deletes each picked row (@tenant, @key), in the same
	// transaction: MySQL's DELETE … LIMIT cannot skip locked rows, and
	// would wait on one, holding every row it passed, until its lock wait
	// timed out and undid the whole batch.
	purgePick query

	// errorNumber reads the server's error number from a driver's error
	// (MySQL); nil where the dialect reads errors through interfaces.
	errorNumber func(error) (uint16, bool)

	// changedRows is true when rows affected may count changed rows rather
	// than matched ones (MySQL without CLIENT_FOUND_ROWS), so that an
	// UPDATE writing the values already there may report zero.
	changedRows bool
	// maxTenant is the longest tenant the table holds, in bytes; 0 for no
	// limit. Claim refuses longer ones rather than let a non-strict MySQL
	// truncate them into another tenant's key space.
	maxTenant int
	// utcWall is true when the database returns times as a wall clock in
	// UTC without a zone (MySQL DATETIME).
	utcWall bool
}

// recordColumns is the select list that scanRecord reads.
const recordColumns = `tenant_id, idem_key, fingerprint, state, lease_token, locked_until,
    storage_mode, status_code, response_headers, response_body, resource_ref,
    created_at, completed_at, expires_at, steps`

// stateColumns is recordColumns with the result and the recovery points
// read as NULL, for GetState: scanRecord reads both lists.
const stateColumns = `tenant_id, idem_key, fingerprint, state, lease_token, locked_until,
    0, NULL, NULL, NULL, NULL,
    created_at, completed_at, expires_at, NULL`

// Error numbers and codes the store acts on. Errors are told apart by
// these, never by their text.
const (
	// MySQL: ER_LOCK_DEADLOCK. InnoDB rolled the whole transaction back.
	mysqlDeadlock = 1213
	// MySQL: ER_LOCK_WAIT_TIMEOUT. InnoDB rolled back the statement, or
	// the whole transaction when innodb_rollback_on_timeout is on.
	mysqlLockWaitTimeout = 1205
	// MySQL: ER_DUP_ENTRY, a unique key met.
	mysqlDuplicate = 1062
	// MariaDB: ER_STATEMENT_TIMEOUT, the statement ran past its
	// max_statement_time and was rolled back, not the transaction.
	mariaStatementTimeout = 1969
	// MySQL: ER_UNSUPPORTED_PS, a statement the server cannot prepare.
	mysqlUnsupportedPS = 1295
	// MySQL: ER_LOCK_TABLE_FULL. InnoDB rolled the whole transaction back.
	mysqlLockTableFull = 1206
	// MySQL: ER_SP_DOES_NOT_EXIST, which RELEASE SAVEPOINT answers for a
	// savepoint that is not there.
	mysqlNoSavepoint = 1305

	// SQLite primary result codes (an extended code's low byte).
	sqliteError = 1 // generic: RELEASE of a savepoint that is not there
	sqliteBusy  = 5 // the lock could not be taken; the statement did nothing

	// PostgreSQL: in_failed_sql_transaction. A statement failed earlier
	// and the transaction accepts nothing but ROLLBACK.
	postgresTxAborted = "25P02"
	// PostgreSQL: class 40, transaction rollback (40001
	// serialization_failure, 40P01 deadlock_detected, …).
	postgresRollbackClass = "40"
)

// sqliteCode returns the primary SQLite result code of err, read through
// the Code method of the driver's error (modernc.org/sqlite: the extended
// code), or -1.
func sqliteCode(err error) int {
	var e interface{ Code() int }
	if errors.As(err, &e) {
		return e.Code() & 0xff
	}
	return -1
}

// postgresState returns the SQLSTATE of err, read through the SQLState
// method of the driver's error (pgx, lib/pq), or "".
func postgresState(err error) string {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		return e.SQLState()
	}
	return ""
}

// number returns the MySQL error number of err.
func (d *dialect) number(err error) (uint16, bool) {
	if d.errorNumber == nil || err == nil {
		return 0, false
	}
	return d.errorNumber(err)
}

// retryable reports an error after which a statement of the store's own
// (a claim, an extension, a release, a purge, a completion alone) did
// nothing and may simply run again (rules.retryable).
func (d *dialect) retryable(err error) bool {
	return d.rules.retryable != nil && d.rules.retryable(d, err)
}

// retryAttempts bounds the runs of a statement that keeps failing with a
// retryable error (rules.attempts).
func (d *dialect) retryAttempts() int { return d.attempts }
