package idemsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// The step journal (SQLite only).
//
// A recovery point must be durable when SaveStep returns, and must not
// depend on the handler's transaction, whose rollback would otherwise
// forget that the step's effect (a card charged) happened. On PostgreSQL
// and MySQL SaveStep is an UPDATE of its own on another connection. On
// SQLite it cannot always be: from its first statement to its end, the
// handler's transaction holds the database's only write lock, so a write
// on any other connection waits for that transaction, which waits for the
// handler, which waits in idem.Step for the write: a deadlock. Writing on
// the handler's own connection would not survive its rollback.
//
// So a step saved while the execution's own transaction holds the lock is
// written to a second database file beside the main one, the journal
// (the main file's name followed by journalSuffix), which has a lock of
// its own. Its rows are (tenant, key, lease token, step), appended in
// order. They are kept correct by three rules:
//
//   - A row is written only while the record is in flight under its token
//     and that execution's transaction holds the main file's write lock,
//     checked before the write (Store.saveStep): until that transaction
//     ends, no other writer, of any process, can take the key over,
//     release it or purge it, so the check holds while the row is
//     written. The unit of work waits for the saves under way before it
//     gives the lock up (gate.disown).
//   - The steps of a record are its steps column followed by the journal's
//     rows of the token that holds it (lease_token), in order. Rows of any
//     other token belong to an execution that no longer holds the key:
//     it was taken over (and the takeover moved its rows, below), or the
//     record was deleted (released without steps, purged) or replaced
//     past its retention since. Tokens are random and never reused, so
//     such rows never come back to life.
//   - Rows move into the steps column at the first write that could change
//     the holder, in the same transaction: when the unit of work ends
//     (unit.foldJournal, before it commits or gives up the lock), when a
//     claim takes the record over (claimExisting), when the execution
//     releases the key (Store.Release). They are deleted afterwards; should
//     that fail, they are read twice, and idem.UnmarshalSteps keeps a
//     step's first value.
//
// Only a crash, of the process or of SQLite's transaction, between a step
// and the end of the handler's transaction leaves rows to be moved by the
// next claim. Purge deletes the rows of tokens that hold no record.
//
// A database that is not a file (":memory:") has no journal: a step saved
// while the handler's transaction holds the lock then fails.

// journalSuffix follows the main database file's name in the journal's.
const journalSuffix = "-idem-steps"

// journalSchema creates the journal. seq, the rowid, numbers the rows in
// the order they were written: a new row gets a rowid above every row
// there, so the rows of one token, deleted only together, stay in order.
const journalSchema = `CREATE TABLE IF NOT EXISTS idem_steps (
    seq         INTEGER PRIMARY KEY,
    tenant_id   TEXT    NOT NULL,
    idem_key    TEXT    NOT NULL,
    lease_token INTEGER NOT NULL,
    step        BLOB    NOT NULL
);
CREATE INDEX IF NOT EXISTS idem_steps_lease ON idem_steps (tenant_id, idem_key, lease_token, seq)`

// journal is the Store's handle on the step journal, opened at its first
// use.
type journal struct {
	mu   sync.Mutex
	path string  // "" until known
	db   *sql.DB // nil until opened
	// sweepAfter is the seq after which Purge's next sweep starts.
	sweepAfter int64
}

// errNoJournal is returned when a step must go to the journal of a
// database that is not a file.
var errNoJournal = errors.New("idemsql: the SQLite database is not a file, so it has no step journal: a step cannot be saved while the handler's transaction holds the write lock (make the step before the handler's first statement, or use a database file)")

// journalDB returns the journal, opening it when needed. When create is
// false and the journal does not exist yet, it returns nil: there are no
// rows to read. It finds the main file through q when it must (the pool,
// or the connection of a transaction when the pool may have no other).
func (s *Store) journalDB(ctx context.Context, q querier, create bool) (*sql.DB, error) {
	j := s.journal
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.db != nil {
		return j.db, nil
	}
	if j.path == "" {
		var file string
		err := q.QueryRowContext(ctx, `SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&file)
		if err != nil {
			return nil, fmt.Errorf("idemsql: step journal: %w", err)
		}
		if file == "" {
			if create {
				return nil, errNoJournal
			}
			return nil, nil
		}
		j.path = file + journalSuffix
	}
	if !create {
		// Reading, not writing: a journal that does not exist holds no
		// rows. Asked again at every read until it exists, since another
		// process may create it.
		if _, err := os.Stat(j.path); errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
	}
	db, err := s.openJournal(ctx, j.path)
	if err != nil {
		return nil, fmt.Errorf("idemsql: step journal %s: %w", j.path, err)
	}
	j.db = db
	return db, nil
}

// openJournal opens (creating it if needed) the journal at path through
// the main database's own driver, with its busy timeout, in WAL mode.
func (s *Store) openJournal(ctx context.Context, path string) (*sql.DB, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	c := &journalConnector{
		drv: s.db.Driver(),
		// A file: URI, so that a name holding '?' or '#' is escaped
		// rather than cut; drivers open it with SQLITE_OPEN_URI.
		dsn:  (&url.URL{Scheme: "file", Path: filepath.ToSlash(abs)}).String(),
		busy: s.writeLimit(ctx).Milliseconds(),
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(4)
	db.SetMaxIdleConns(4)
	var mode string
	if err := db.QueryRowContext(ctx, `PRAGMA journal_mode = WAL`).Scan(&mode); err != nil {
		db.Close()
		return nil, err
	}
	if _, err := db.ExecContext(ctx, journalSchema); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// querier is what reads a row: a *sql.DB or a *sql.Conn.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// syncWAL flushes the main database's WAL file to the disk, and with it
// every commit written to it, when claims commit without waiting for the
// disk (see Store.asyncClaim). A WAL file that is not there holds nothing:
// its frames were checkpointed into the database file, which the
// checkpoint flushed.
func (s *Store) syncWAL() error {
	if s.claimSync.Load() <= 0 {
		return nil
	}
	s.journal.mu.Lock()
	path := strings.TrimSuffix(s.journal.path, journalSuffix)
	s.journal.mu.Unlock()
	f, err := os.Open(path + "-wal")
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// journalConnector opens connections to the journal and sets their busy
// timeout, whatever the driver's own settings in a DSN.
type journalConnector struct {
	drv  driver.Driver
	dsn  string
	busy int64 // milliseconds
}

// Connect implements driver.Connector.
func (c *journalConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	if err := execDriver(ctx, conn, "PRAGMA busy_timeout = "+strconv.FormatInt(c.busy, 10)); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// Driver implements driver.Connector.
func (c *journalConnector) Driver() driver.Driver { return c.drv }

// execDriver runs a statement without arguments on a driver's connection.
func execDriver(ctx context.Context, conn driver.Conn, q string) error {
	if e, ok := conn.(driver.ExecerContext); ok {
		_, err := e.ExecContext(ctx, q, nil)
		if !errors.Is(err, driver.ErrSkip) {
			return err
		}
	}
	stmt, err := conn.Prepare(q)
	if err != nil {
		return err
	}
	defer stmt.Close()
	//lint:ignore SA1019 the fallback of a driver without ExecerContext
	_, err = stmt.Exec(nil)
	return err
}

// journalSteps returns the journal's rows for the execution holding
// (tenant, key) under token, concatenated in order: encoded steps, nil
// for none. q is as for journalDB.
func (s *Store) journalSteps(ctx context.Context, q querier, tenant, key string, token int64) ([]byte, error) {
	j, err := s.journalDB(ctx, q, false)
	if err != nil || j == nil {
		return nil, err
	}
	rows, err := j.QueryContext(ctx, `SELECT step FROM idem_steps
WHERE tenant_id = ? AND idem_key = ? AND lease_token = ? ORDER BY seq`, tenant, key, token)
	if err != nil {
		return nil, fmt.Errorf("idemsql: step journal: %w", err)
	}
	defer rows.Close()
	var out []byte
	for rows.Next() {
		var step []byte
		if err := rows.Scan(&step); err != nil {
			return nil, fmt.Errorf("idemsql: step journal: %w", err)
		}
		out = append(out, step...)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idemsql: step journal: %w", err)
	}
	return out, nil
}

// dropJournal deletes the journal's rows of (tenant, key, token), once
// they are in the steps column. A failure leaves rows that are read
// twice, which is harmless (see the journal's rules), until Purge's sweep.
func (s *Store) dropJournal(ctx context.Context, tenant, key string, token int64) {
	j, err := s.journalDB(ctx, s.db, false)
	if err != nil || j == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = s.retry(ctx, func() error {
		_, err := j.ExecContext(ctx, `DELETE FROM idem_steps WHERE tenant_id = ? AND idem_key = ? AND lease_token = ?`,
			tenant, key, token)
		return err
	})
}

// sweepJournal deletes, among at most limit journal rows, those of tokens
// that hold no record: rows a crash or a failed delete left behind. A row
// found so can never be read again (see the journal's rules), so the sweep
// needs no lock on the main file. It walks the journal from where the
// previous sweep stopped, so that rows still in use do not hold it up.
func (s *Store) sweepJournal(ctx context.Context, limit int64) error {
	j, err := s.journalDB(ctx, s.db, false)
	if err != nil || j == nil {
		return err
	}
	s.journal.mu.Lock()
	after := s.journal.sweepAfter
	s.journal.mu.Unlock()
	rows, err := j.QueryContext(ctx, `SELECT seq, tenant_id, idem_key, lease_token FROM idem_steps
WHERE seq > ? ORDER BY seq LIMIT ?`, after, limit)
	if err != nil {
		return fmt.Errorf("idemsql: sweep step journal: %w", err)
	}
	type holder struct {
		tenant, key string
		token       int64
	}
	var seen []holder
	known := map[holder]bool{}
	n, last := int64(0), after
	for rows.Next() {
		var h holder
		if err := rows.Scan(&last, &h.tenant, &h.key, &h.token); err != nil {
			rows.Close()
			return fmt.Errorf("idemsql: sweep step journal: %w", err)
		}
		n++
		if !known[h] {
			known[h] = true
			seen = append(seen, h)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("idemsql: sweep step journal: %w", err)
	}
	if n < limit {
		last = 0 // the end: start again from the beginning next time
	}
	for _, h := range seen {
		var one int
		err := s.db.QueryRowContext(ctx, `SELECT 1 FROM idem_keys WHERE tenant_id = $1 AND idem_key = $2 AND lease_token = $3`,
			h.tenant, h.key, h.token).Scan(&one)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			s.dropJournal(ctx, h.tenant, h.key, h.token)
		case err != nil:
			return fmt.Errorf("idemsql: sweep step journal: %w", err)
		}
	}
	s.journal.mu.Lock()
	s.journal.sweepAfter = last
	s.journal.mu.Unlock()
	return nil
}
