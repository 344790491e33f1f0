package idemsql_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemmysql"
	"github.com/idem-go/idem/internal/testenv"
)

// TestMySQLSessionSettings claims, takes over and completes under DSN
// settings that change how MySQL reads times and runs assignments: the
// store must not depend on them.
func TestMySQLSessionSettings(t *testing.T) {
	base, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	setup := sqlOpen(t, "mysql", base.FormatDSN())
	defer setup.Close()
	if err := idemmigrate.Migrate(ctx, setup, idemmigrate.MySQL); err != nil {
		t.Fatal(err)
	}
	var version, mode string
	if err := setup.QueryRow(`SELECT VERSION(), @@SESSION.sql_mode`).Scan(&version, &mode); err != nil {
		t.Fatal(err)
	}

	variants := map[string]func(c *mysql.Config){
		"parseTime off": func(c *mysql.Config) { c.ParseTime = false },
		"loc far east":  func(c *mysql.Config) { c.Loc = time.FixedZone("UTC+13", 13*3600) },
		"session time zone": func(c *mysql.Config) {
			c.Params = map[string]string{"time_zone": "'-07:00'"}
		},
	}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		// MariaDB can run UPDATE assignments on the old row, the SQL
		// standard way, instead of left to right.
		variants["simultaneous assignment"] = func(c *mysql.Config) {
			c.Params = map[string]string{"sql_mode": "'" + mode + ",SIMULTANEOUS_ASSIGNMENT'"}
		}
	}
	for name, change := range variants {
		t.Run(name, func(t *testing.T) {
			cfg := base.Clone()
			change(cfg)
			connector, err := mysql.NewConnector(cfg)
			if err != nil {
				t.Fatal(err)
			}
			db := sql.OpenDB(connector)
			defer db.Close()
			st := testenv.Must(idemsql.NewStore(db, idemmysql.Dialect))
			checkLifecycle(t, st)
		})
	}
}

// checkLifecycle claims, loses, takes over, completes and replays one key.
func checkLifecycle(t *testing.T, st *idemsql.Store) {
	t.Helper()
	ctx := context.Background()
	var tenant string
	var first idem.ClaimParams
	var claimed time.Time
	var rec *idem.Record
	for lease := shortLease; ; lease *= 2 {
		tenant = newName("tenant")
		first = claimParams(tenant, "order-1", "fp")
		first.Lease = lease
		mustClaim(t, st, first, true)
		claimed = time.Now()
		rec = mustGet(t, st, tenant, "order-1")
		if d := rec.LockedUntil.Sub(rec.CreatedAt); d != first.Lease {
			t.Fatalf("LockedUntil-CreatedAt = %v, want %v", d, first.Lease)
		}
		// The database's UTC clock and this process's agree to well
		// within an hour: a time read in the wrong zone would be hours off.
		if skew := time.Since(rec.CreatedAt); skew > time.Hour || skew < -time.Hour {
			t.Fatalf("CreatedAt %v is %v away from now: read in the wrong time zone", rec.CreatedAt, skew)
		}
		if lostInLease(t, st, claimParams(tenant, "order-1", "fp"), rec.LockedUntil) {
			break
		}
	}
	sleepPast(claimed, first.Lease)
	mustClaim(t, st, claimParams(tenant, "order-1", "other"), false)
	taker := claimParams(tenant, "order-1", "fp")
	mustClaim(t, st, taker, true)
	got := mustGet(t, st, tenant, "order-1")
	if got.LeaseToken != taker.Token || got.State != idem.StateInFlight || !got.LockedUntil.After(rec.LockedUntil) {
		t.Fatalf("after takeover: %+v (before: %+v)", got, rec)
	}
	mustComplete(t, st, tenant, "order-1", taker.Token, idem.Result{Status: 201, Body: []byte("ok")})
	done := mustClaim(t, st, claimParams(tenant, "order-1", "fp"), false)
	if done.State != idem.StateComplete || string(done.Result.Body) != "ok" || done.CompletedAt.Before(done.CreatedAt) {
		t.Fatalf("replay: %+v", done)
	}
	if err := st.Extend(ctx, idem.ExtendParams{Tenant: tenant, Key: "order-1", Token: taker.Token, Lease: time.Minute}); err == nil {
		t.Fatal("Extend of a complete record succeeded")
	}
}

// TestMySQLTenantLength checks that a tenant the table cannot hold is
// refused, never truncated into another tenant's key space.
func TestMySQLTenantLength(t *testing.T) {
	env := newTestDB(t, idemmysql.Dialect)
	long := strings.Repeat("t", 512)
	mustClaim(t, env.store, claimParams(long, "order-1", ""), true)
	if rec := mustGet(t, env.store, long, "order-1"); rec.Tenant != long {
		t.Fatalf("tenant read back as %d bytes", len(rec.Tenant))
	}
	if _, err := env.store.Claim(context.Background(), claimParams(long+"x", "order-1", "")); err == nil {
		t.Fatal("a 513-byte tenant was claimed")
	}
}

// TestMySQLClientFoundRows runs the lifecycle, a race of claims and a
// replay through the engine with the driver's clientFoundRows on, under
// which rows affected count a row kept as it was: the claim must not read
// its outcome from them.
func TestMySQLClientFoundRows(t *testing.T) {
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ClientFoundRows = true
	ctx := context.Background()
	db := sqlOpen(t, "mysql", cfg.FormatDSN())
	defer db.Close()
	if err := idemmigrate.Migrate(ctx, db, idemmigrate.MySQL); err != nil {
		t.Fatal(err)
	}
	st := testenv.Must(idemsql.NewStore(db, idemmysql.Dialect))
	checkLifecycle(t, st)

	tenant := newName("tenant")
	const n = 20
	won := make([]bool, n)
	errs := make([]error, n)
	atOnce(n, func(i int) {
		var res idem.ClaimResult
		res, errs[i] = st.Claim(ctx, claimParams(tenant, "race", "fp"))
		won[i] = res.Won
	})
	winners := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		if won[i] {
			winners++
		}
	}
	if winners != 1 {
		t.Fatalf("%d claims of one key won at once, want 1", winners)
	}

	engine := newEngine(t, st, nil)
	op := idem.Operation{Tenant: tenant, Key: "replayed", Fingerprint: []byte("fp")}
	runs := 0
	for i := range 3 {
		out, err := engine.Do(ctx, op, func(context.Context) (idem.Result, error) {
			runs++
			return idem.Result{Status: 201, Body: []byte("made")}, nil
		})
		if err != nil || out.Result.Status != 201 || out.Replayed != (i > 0) {
			t.Fatalf("Do %d = %+v, %v; want the 201, then replays", i, out, err)
		}
	}
	if runs != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs)
	}
}

// mysqlShop is a MySQL test database with orders and their lines, and two
// rows a handler and another session can deadlock on.
type mysqlShop struct {
	*testDB
	engine, peerEngine *idem.Engine
}

func newMySQLShop(t *testing.T, cfg *idem.Config) *mysqlShop {
	return newMySQLShopAt(t, cfg, testenv.MySQLDSN(t))
}

func newMySQLShopAt(t *testing.T, cfg *idem.Config, dsn string) *mysqlShop {
	env := newTestDBAt(t, idemmysql.Dialect, dsn)
	ctx := context.Background()
	for _, q := range []string{
		`CREATE TABLE orders (order_key VARCHAR(255) NOT NULL, made_by VARCHAR(64) NOT NULL)`,
		`CREATE TABLE order_lines (order_key VARCHAR(255) NOT NULL)`,
		`CREATE TABLE locks (id INT PRIMARY KEY, v INT NOT NULL)`,
		`INSERT INTO locks VALUES (1, 0), (2, 0)`,
		`CREATE TABLE ballast (id INT NOT NULL)`,
	} {
		if _, err := env.db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return &mysqlShop{testDB: env, engine: newEngine(t, env.store, cfg), peerEngine: newEngine(t, env.peer, cfg)}
}

// deadlock runs, in the handler's transaction, a statement that InnoDB
// picks as the victim of a deadlock: the handler holds row 1 and wants row
// 2, another session holds row 2, wants row 1, and has written more, so
// that InnoDB rolls the handler's transaction back (it rolls back the
// lighter one). Whichever of the two waits comes second closes the cycle;
// the order does not matter.
func (s *mysqlShop) deadlock(ctx context.Context) (handlerErr, peerErr error) {
	tx := idemsql.TxFromContext(ctx)
	if _, err := tx.ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 1`); err != nil {
		return err, nil
	}
	peer, err := s.peerDB.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer peer.Rollback() //nolint:errcheck // harmless after Commit
	if _, err := peer.ExecContext(ctx, `INSERT INTO ballast (id) SELECT seq FROM seq_1_to_50`); err != nil {
		// MariaDB's sequence engine; elsewhere, one row at a time.
		for i := range 50 {
			if _, err := peer.ExecContext(ctx, `INSERT INTO ballast (id) VALUES (?)`, i); err != nil {
				return nil, err
			}
		}
	}
	if _, err := peer.ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 2`); err != nil {
		return nil, err
	}
	peerDone := make(chan error, 1)
	go func() {
		_, err := peer.ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 1`)
		peerDone <- err
	}()
	_, handlerErr = tx.ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 2`)
	if handlerErr == nil {
		// The peer was the victim: release the handler's lock so that
		// it can tell.
		return nil, <-peerDone
	}
	if peerErr = <-peerDone; peerErr == nil {
		peerErr = peer.Commit()
	}
	return handlerErr, peerErr
}

func isDeadlock(err error) bool {
	n, ok := idemmysql.ErrorNumber(err)
	return ok && n == 1213
}

// retryDeadlocks is the helper many programs wrap their statements in: run
// again when the database says deadlock.
func retryDeadlocks(first error, fn func() error) error {
	err := first
	for range 3 {
		if !isDeadlock(err) {
			return err
		}
		err = fn()
	}
	return err
}

func (s *mysqlShop) insertOrder(ctx context.Context, key, by string) error {
	_, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO orders (order_key, made_by) VALUES (?, ?)`, key, by)
	return err
}

func (s *mysqlShop) insertLine(ctx context.Context, key string) error {
	_, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO order_lines (order_key) VALUES (?)`, key)
	return err
}

func (s *mysqlShop) count(t *testing.T, table, key string) int {
	t.Helper()
	var n int
	if err := s.db.QueryRow(`SELECT COUNT(*) FROM `+table+` WHERE order_key = ?`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMySQLDeadlockEndsTransaction: a deadlock rolls the handler's whole
// transaction back and leaves the session's transaction over. A handler
// that retries the statement (a common helper) and answers 201 must not
// have that answer stored: its order was rolled back, and the statements
// after the deadlock must not commit on their own.
func TestMySQLDeadlockEndsTransaction(t *testing.T) {
	s := newMySQLShop(t, nil)
	ctx := context.Background()
	op := idem.Operation{Tenant: newName("tenant"), Key: "order-1"}
	var retried, lineErr error
	_, err := s.engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		if err := s.insertOrder(ctx, op.Key, "first"); err != nil {
			return idem.Result{}, err
		}
		first, peerErr := s.deadlock(ctx)
		if peerErr != nil || !isDeadlock(first) {
			t.Errorf("deadlock: handler %v, peer %v; want the handler the victim", first, peerErr)
		}
		retried = retryDeadlocks(first, func() error {
			_, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 2`)
			return err
		})
		lineErr = s.insertLine(ctx, op.Key)
		// A careless handler answers 201 whatever happened.
		return idem.Result{Status: 201}, nil
	})
	if !errors.Is(err, idemsql.ErrTxEnded) {
		t.Errorf("Do = %v, want an error wrapping idemsql.ErrTxEnded", err)
	}
	if !errors.Is(retried, idemsql.ErrTxEnded) || !errors.Is(lineErr, idemsql.ErrTxEnded) {
		t.Errorf("statements after the deadlock: retry %v, line %v; want both refused with ErrTxEnded", retried, lineErr)
	}
	if _, err := s.store.Get(ctx, op.Tenant, op.Key); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get after the refused completion = %v, want ErrNotFound (released, nothing stored)", err)
	}
	if o, l := s.count(t, "orders", op.Key), s.count(t, "order_lines", op.Key); o != 0 || l != 0 {
		t.Errorf("%d orders and %d lines committed, want none", o, l)
	}
}

// TestMySQLDeadlockThenLeaseLost: the same split, then the lease is lost
// and a retry takes the key over and makes its order: exactly one order
// stands, the retry's.
func TestMySQLDeadlockThenLeaseLost(t *testing.T) {
	s := newMySQLShop(t, &idem.Config{Lease: shortLease, Heartbeat: -1})
	ctx := context.Background()
	op := idem.Operation{Tenant: newName("tenant"), Key: "order-1"}
	_, err := s.engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		claimed := time.Now()
		first, _ := s.deadlock(ctx)
		_ = retryDeadlocks(first, func() error {
			_, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 2`)
			return err
		})
		_ = s.insertOrder(ctx, op.Key, "first")
		_ = s.insertLine(ctx, op.Key)
		sleepPast(claimed, shortLease)
		out, err := s.peerEngine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			if err := s.insertOrder(ctx, op.Key, "takeover"); err != nil {
				return idem.Result{}, err
			}
			return idem.Result{Status: 201, Body: []byte("takeover")}, s.insertLine(ctx, op.Key)
		})
		if err != nil || out.Replayed {
			t.Errorf("takeover: %+v, %v", out, err)
		}
		return idem.Result{Status: 201, Body: []byte("first")}, nil
	})
	if err == nil {
		t.Error("the execution taken over completed")
	}
	var by []string
	rows, err := s.db.Query(`SELECT made_by FROM orders WHERE order_key = ?`, op.Key)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var b string
		_ = rows.Scan(&b)
		by = append(by, b)
	}
	rows.Close()
	if len(by) != 1 || by[0] != "takeover" || s.count(t, "order_lines", op.Key) != 1 {
		t.Fatalf("orders made by %q and %d lines; want the takeover's order and line alone", by, s.count(t, "order_lines", op.Key))
	}
}

// TestMySQLDDLInHandler: DDL commits the transaction implicitly. The
// execution can no longer complete: nothing stored, the key released, and
// the statements after the DDL rolled back, lease lost or not.
func TestMySQLDDLInHandler(t *testing.T) {
	for _, loseLease := range []bool{false, true} {
		t.Run(map[bool]string{false: "lease kept", true: "lease lost"}[loseLease], func(t *testing.T) {
			s := newMySQLShop(t, &idem.Config{Lease: shortLease, Heartbeat: -1})
			ctx := context.Background()
			op := idem.Operation{Tenant: newName("tenant"), Key: "order-1"}
			_, err := s.engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
				claimed := time.Now()
				if _, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (order_key VARCHAR(255))`); err != nil {
					return idem.Result{}, err
				}
				if err := s.insertOrder(ctx, op.Key, "first"); err != nil {
					return idem.Result{}, err
				}
				if loseLease {
					sleepPast(claimed, shortLease)
					if _, err := s.peerEngine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
						return idem.Result{Status: 201}, s.insertOrder(ctx, op.Key, "takeover")
					}); err != nil {
						t.Errorf("takeover: %v", err)
					}
				}
				return idem.Result{Status: 201}, nil
			})
			if !errors.Is(err, idemsql.ErrTxEnded) {
				t.Errorf("Do = %v, want an error wrapping idemsql.ErrTxEnded", err)
			}
			want := 0
			if loseLease {
				want = 1 // the takeover's
			}
			if n := s.count(t, "orders", op.Key); n != want {
				t.Errorf("%d orders, want %d", n, want)
			}
			if !loseLease {
				if _, err := s.store.Get(ctx, op.Tenant, op.Key); !errors.Is(err, idem.ErrNotFound) {
					t.Errorf("Get = %v, want ErrNotFound (released)", err)
				}
			}
		})
	}
}

// TestMySQLLockWaitTimeoutKeepsTransaction: with innodb_rollback_on_timeout
// off (the default), a lock wait timeout rolls back the statement alone:
// the handler may go on, and its answer and writes commit together.
func TestMySQLLockWaitTimeoutKeepsTransaction(t *testing.T) {
	s := newMySQLShop(t, nil)
	ctx := context.Background()
	var on bool
	if err := s.db.QueryRow(`SELECT @@innodb_rollback_on_timeout`).Scan(&on); err != nil || on {
		t.Skipf("the server rolls back on timeout (%v, %v)", on, err)
	}
	op := idem.Operation{Tenant: newName("tenant"), Key: "order-1"}
	out, err := s.engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		tx := idemsql.TxFromContext(ctx)
		if err := s.insertOrder(ctx, op.Key, "first"); err != nil {
			return idem.Result{}, err
		}
		if _, err := tx.ExecContext(ctx, `SET SESSION innodb_lock_wait_timeout = 1`); err != nil {
			return idem.Result{}, err
		}
		defer tx.ExecContext(ctx, `SET SESSION innodb_lock_wait_timeout = DEFAULT`) //nolint:errcheck
		peer, err := s.peerDB.BeginTx(ctx, nil)
		if err != nil {
			return idem.Result{}, err
		}
		if _, err := peer.ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 1`); err != nil {
			return idem.Result{}, err
		}
		_, err = tx.ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 1`)
		if n, _ := idemmysql.ErrorNumber(err); n != 1205 || errors.Is(err, idemsql.ErrTxEnded) {
			t.Errorf("the locked UPDATE = %v, want a lock wait timeout that leaves the transaction open", err)
		}
		if err := peer.Commit(); err != nil {
			return idem.Result{}, err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 1`); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{Status: 201}, s.insertLine(ctx, op.Key)
	})
	if err != nil || out.Result.Status != 201 {
		t.Fatalf("Do = %+v, %v", out, err)
	}
	if o, l := s.count(t, "orders", op.Key), s.count(t, "order_lines", op.Key); o != 1 || l != 1 {
		t.Errorf("%d orders and %d lines, want 1 and 1", o, l)
	}
}

// TestMySQLLockWaitTimeoutEndsTransaction: with innodb_rollback_on_timeout
// on (a private server: the setting is global and read-only), a lock wait
// timeout rolls the whole transaction back, as a deadlock does: the
// statements after it are refused and nothing is stored.
func TestMySQLLockWaitTimeoutEndsTransaction(t *testing.T) {
	s := newMySQLShopAt(t, nil, rollbackOnTimeoutDSN(t))
	ctx := context.Background()
	op := idem.Operation{Tenant: newName("tenant"), Key: "order-1"}
	var timedOut, retried, lineErr error
	_, err := s.engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		tx := idemsql.TxFromContext(ctx)
		if err := s.insertOrder(ctx, op.Key, "first"); err != nil {
			return idem.Result{}, err
		}
		if _, err := tx.ExecContext(ctx, `SET SESSION innodb_lock_wait_timeout = 1`); err != nil {
			return idem.Result{}, err
		}
		peer, err := s.peerDB.BeginTx(ctx, nil)
		if err != nil {
			return idem.Result{}, err
		}
		if _, err := peer.ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 1`); err != nil {
			return idem.Result{}, err
		}
		_, timedOut = tx.ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 1`)
		if err := peer.Commit(); err != nil {
			return idem.Result{}, err
		}
		_, retried = tx.ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 1`)
		lineErr = s.insertLine(ctx, op.Key)
		return idem.Result{Status: 201}, nil
	})
	if n, _ := idemmysql.ErrorNumber(timedOut); n != 1205 || !errors.Is(timedOut, idemsql.ErrTxEnded) {
		t.Errorf("the locked UPDATE = %v, want a lock wait timeout reported as ErrTxEnded", timedOut)
	}
	if !errors.Is(retried, idemsql.ErrTxEnded) || !errors.Is(lineErr, idemsql.ErrTxEnded) {
		t.Errorf("statements after the timeout: %v, %v; want both refused with ErrTxEnded", retried, lineErr)
	}
	if !errors.Is(err, idemsql.ErrTxEnded) {
		t.Errorf("Do = %v, want an error wrapping idemsql.ErrTxEnded", err)
	}
	if o, l := s.count(t, "orders", op.Key), s.count(t, "order_lines", op.Key); o != 0 || l != 0 {
		t.Errorf("%d orders and %d lines committed, want none", o, l)
	}
}
