//go:build linux

package dbcrash

import (
	"context"
	"crypto/sha256"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/internal/testenv"
)

// pgTx is the handler's transaction, through idempg's accessor.
func pgTx(ctx context.Context) pgx.Tx { return idempg.TxFromContext(ctx) }

// postgres is a private PostgreSQL cluster.
type postgres struct {
	srv *server
	url string
}

// startPostgres creates a cluster in a temporary directory (initdb) and
// starts it on a free port, durable as PostgreSQL is by default (fsync
// and synchronous_commit on), with settings ("name=value") on top.
func startPostgres(t *testing.T, settings ...string) *postgres {
	t.Helper()
	var initdbs, postgreses []string
	for _, d := range postgresBinDirs() {
		initdbs = append(initdbs, filepath.Join(d, "initdb"))
		postgreses = append(postgreses, filepath.Join(d, "postgres"))
	}
	initdb := findBinary(t, "PostgreSQL's initdb", append(initdbs, "initdb")...)
	bin := findBinary(t, "PostgreSQL's postgres", append(postgreses, "postgres")...)
	cred := unprivileged(t)
	dir := privateDir(t, "idem-dbcrash-pg-", cred)
	data := filepath.Join(dir, "data")
	// --no-sync: initdb's own files need not reach the disk, since the
	// fault here is the server's death, not the machine's; the server
	// itself runs with fsync on.
	if err := runAs(cred, initdb, "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	conf := map[string]string{
		"listen_addresses":   "127.0.0.1",
		"fsync":              "on",
		"synchronous_commit": "on",
		"full_page_writes":   "on",
		"max_connections":    "60",
		"shared_buffers":     "32MB",
	}
	if mutant() == "pg-async-commit" {
		conf["synchronous_commit"] = "off"
	}
	for _, s := range settings {
		name, value, _ := strings.Cut(s, "=")
		conf[name] = value
	}
	argv := []string{bin, "-D", data, "-p", fmt.Sprint(port), "-k", dir}
	for name, value := range conf {
		argv = append(argv, "-c", name+"="+value)
	}
	pg := &postgres{
		srv: &server{name: "postgres", argv: argv, log: filepath.Join(dir, "postgres.log"), cred: cred,
			stopSignal: syscall.SIGINT, tree: true},
		url: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", port),
	}
	t.Cleanup(func() {
		if err := pg.srv.stop(); err != nil {
			t.Errorf("stop the private PostgreSQL: %v", err)
		}
	})
	if err := pg.target(nil).restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	return pg
}

// ready waits until the server accepts queries.
func (pg *postgres) ready(ctx context.Context) error {
	return pollReady(ctx, pg.srv, func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, pg.url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		return conn.Ping(ctx)
	})
}

// pool opens a pool on the cluster, closed when the test ends, with the
// idem tables and the orders table created.
func (pg *postgres) pool(t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pg.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := idempg.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// No unique index on the key, on purpose: a second execution shows
	// up as a second row instead of a constraint error.
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (tenant_id text NOT NULL, idem_key text NOT NULL, nonce text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

// target is the cluster with an idempg store on pool (nil: none yet).
func (pg *postgres) target(pool *pgxpool.Pool) *target {
	tg := &target{
		name:  "PostgreSQL (idempg)",
		srv:   pg.srv,
		ready: pg.ready,
		insert: func(ctx context.Context, key, nonce string) error {
			_, err := pgTx(ctx).Exec(ctx, `INSERT INTO orders (tenant_id, idem_key, nonce) VALUES ($1, $2, $3)`, tenant, key, nonce)
			return err
		},
		read: pg.read,
	}
	if pool != nil {
		tg.store = testenv.Must(idempg.NewStore(pool, nil))
	}
	return tg
}

// read reads the business rows and the records on a connection of its
// own.
func (pg *postgres) read(ctx context.Context) (*dbState, error) {
	conn, err := pgx.Connect(ctx, pg.url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	st := &dbState{orders: map[string][]string{}, records: map[string]dbRecord{}}
	rows, err := conn.Query(ctx, `SELECT idem_key, nonce FROM orders WHERE tenant_id = $1 ORDER BY nonce`, tenant)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var key, n string
		if err := rows.Scan(&key, &n); err != nil {
			return nil, err
		}
		st.orders[key] = append(st.orders[key], n)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = conn.Query(ctx, `SELECT idem_key, state, lease_token, coalesce(response_body, ''::bytea),
		CASE WHEN state = 'in_flight' AND locked_until > now()
			THEN (extract(epoch FROM locked_until - now()) * 1000000)::bigint ELSE 0 END,
		now()
		FROM idem_keys WHERE tenant_id = $1`, tenant)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var key string
		var rec dbRecord
		var body []byte
		var waitMicros int64
		if err := rows.Scan(&key, &rec.state, &rec.token, &body, &waitMicros, &st.now); err != nil {
			return nil, err
		}
		rec.body = string(body)
		st.records[key] = rec
		st.maxWait = max(st.maxWait, time.Duration(waitMicros)*time.Microsecond)
	}
	return st, rows.Err()
}

// TestPostgresCrash runs concurrent operations, duplicates at one
// barrier and late retries through idempg while the PostgreSQL server is
// killed (SIGKILL to the postmaster and every process of it) at random
// moments and restarted, each client retrying its operation until it gets
// an answer. No acknowledged operation may lose its order or its record,
// none may run twice, and no key may stay in flight.
func TestPostgresCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: kills a private PostgreSQL for seconds (-short)")
	}
	pg := startPostgres(t)
	runCrashes(t, pg.target(pg.pool(t, 24)))
}

// lsns reads the WAL's insert and flush positions, in bytes.
func lsns(t *testing.T, conn *pgx.Conn) (insert, flush int64) {
	t.Helper()
	err := conn.QueryRow(context.Background(), `SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint,
		(pg_current_wal_flush_lsn() - '0/0')::bigint`).Scan(&insert, &flush)
	if err != nil {
		t.Fatal(err)
	}
	return insert, flush
}

// TestPostgresClaimFlushedByBusinessCommit shows, step by step, why
// idempg's asynchronous claim is safe. With the WAL writer stopped
// (SIGSTOP), so that nothing but a synchronous commit flushes the WAL:
//
//  1. a claim returns won while its commit record is not flushed;
//  2. a later business transaction (claim, order, completion) commits
//     synchronously, and its flush covers the earlier claim;
//  3. a claim made after it returns won, unflushed again;
//
// then the server is killed. After the restart, the business transaction
// and the earlier claim are there, the last claim is gone, and the
// client's retry of that operation runs it, once.
func TestPostgresClaimFlushedByBusinessCommit(t *testing.T) {
	pg := startPostgres(t, "autovacuum=off")
	pool := pg.pool(t, 4)
	ctx := context.Background()
	store := testenv.Must(idempg.NewStore(pool, &idempg.Config{ClaimBatchSize: 1}))
	engine, err := idem.NewEngine(store, &idem.Config{Lease: time.Minute, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = engine.Close(context.Background()) })
	tg := pg.target(pool)

	observer, err := pgx.Connect(ctx, pg.url)
	if err != nil {
		t.Fatal(err)
	}
	var walwriter int
	if err := observer.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'`).Scan(&walwriter); err != nil {
		t.Fatal(err)
	}
	if _, err := observer.Exec(ctx, `CHECKPOINT`); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(walwriter, syscall.SIGSTOP); err != nil {
		t.Fatalf("stop the WAL writer: %v", err)
	}
	// A clean shutdown waits for the WAL writer: should the test end
	// before the crash, let it go on (after the crash the pid is gone).
	t.Cleanup(func() {
		if alive(walwriter) {
			_ = syscall.Kill(walwriter, syscall.SIGCONT)
		}
	})
	// kill returns once the signal is sent; the process stops a moment
	// later, and could flush what comes next in between.
	for deadline := time.Now().Add(time.Minute); procState(walwriter) != 'T'; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the WAL writer (pid %d) did not stop: state %q", walwriter, procState(walwriter))
		}
	}

	fp := func(key string) []byte { s := sha256.Sum256([]byte(key)); return s[:] }
	claim := func(key string, token int64) {
		t.Helper()
		res, err := store.Claim(ctx, idem.ClaimParams{Tenant: tenant, Key: key, Fingerprint: fp(key), Token: token,
			Lease: time.Minute, Retention: time.Hour})
		if err != nil || !res.Won {
			t.Fatalf("claim %s: won %v, %v", key, res.Won, err)
		}
	}

	// 1. An asynchronous claim.
	before, _ := lsns(t, observer)
	claim("earlier", 1001)
	afterEarlier, flushed := lsns(t, observer)
	if flushed > before {
		t.Fatalf("the claim returned after its WAL was flushed (flush %d, insert before the claim %d): it is not asynchronous", flushed, before)
	}

	// 2. A business transaction through the engine.
	var answer string
	out, err := engine.Do(ctx, idem.Operation{Tenant: tenant, Key: "business", Fingerprint: fp("business")},
		func(ctx context.Context) (idem.Result, error) {
			answer = nonce()
			return idem.Result{Status: 201, Body: []byte(answer)}, tg.insert(ctx, "business", answer)
		})
	if err != nil {
		t.Fatal(err)
	}
	if _, flushed := lsns(t, observer); flushed < afterEarlier {
		t.Fatalf("the business commit returned with the WAL flushed to %d, short of the earlier claim (%d)", flushed, afterEarlier)
	}

	// 3. A claim after it, asynchronous again.
	before, _ = lsns(t, observer)
	claim("later", 1002)
	if _, flushed := lsns(t, observer); flushed > before {
		t.Fatalf("the later claim returned after its WAL was flushed (flush %d, insert before the claim %d)", flushed, before)
	}
	observer.Close(ctx)

	if err := pg.srv.crash(); err != nil {
		t.Fatal(err)
	}
	if err := tg.restart(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := pg.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rec := st.records["business"]; rec.state != string(idem.StateComplete) || rec.body != answer || len(st.orders["business"]) != 1 || string(out.Result.Body) != answer {
		t.Errorf("the acknowledged operation after the crash: record %+v, orders %v; answered %q", rec, st.orders["business"], answer)
	}
	if rec, ok := st.records["earlier"]; !ok || rec.state != string(idem.StateInFlight) || rec.token != 1001 {
		t.Errorf("the claim before the business commit after the crash: %+v (present %v), want in flight under token 1001", rec, ok)
	}
	if rec, ok := st.records["later"]; ok {
		t.Errorf("the unflushed claim survived the crash: %+v; this run did not test what it means to", rec)
	}

	// The client of the erased claim retries, and the operation runs
	// once. The pool's connections died with the server: retry those.
	ran := 0
	for attempt := 0; ; attempt++ {
		out, err = engine.Do(ctx, idem.Operation{Tenant: tenant, Key: "later", Fingerprint: fp("later")},
			func(ctx context.Context) (idem.Result, error) {
				ran++
				answer = nonce()
				return idem.Result{Status: 201, Body: []byte(answer)}, tg.insert(ctx, "later", answer)
			})
		if err == nil || attempt == 20 {
			break
		}
	}
	if err != nil || out.Replayed || string(out.Result.Body) != answer {
		t.Fatalf("retry of the erased claim: %+v, %v", out, err)
	}
	if st, err = pg.read(ctx); err != nil {
		t.Fatal(err)
	}
	if rows := st.orders["later"]; len(rows) != 1 || rows[0] != answer {
		t.Errorf("retry of the erased claim: orders %v, answered %q (handler started %d times)", rows, answer, ran)
	}
}
