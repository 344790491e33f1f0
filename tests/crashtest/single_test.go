package crashtest

import (
	"database/sql"
	"net/url"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/internal/testenv"
)

// TestCrashSingleTransaction is TestCrash with `idem serve
// --single-transaction`, on PostgreSQL, SQLite and MariaDB (MySQL): the
// claim is the first statement of the order's transaction and the
// transaction's hold on the record (SQLite: on the write lock) is the
// lease. Killed with SIGKILL before the commit, the process leaves nothing
// (the server rolls its transaction back when its connection dies, SQLite
// discards the uncommitted end of its WAL when the file is opened again),
// and the key is free at once; killed after it, the committed answer is
// replayed. Either way the retrying client gets one order and a 201, and
// so does a duplicate sent at the same time, with the same order.
func TestCrashSingleTransaction(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: builds the idem binary and kills it repeatedly (-short)")
	}
	if *iterations < 1 {
		t.Fatalf("-crashtest.iterations=%d: want at least 1", *iterations)
	}
	bin := idemBinary(t)
	stores := []struct {
		name string
		open func(t *testing.T) *store
	}{
		{"postgres", openPostgres},
		{"sqlite", openSQLite},
		{"mariadb", openMariaDB},
	}
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			st := sc.open(t)
			st.bin = bin
			st.addr = "127.0.0.1:0"
			st.serveArgs, st.single, st.duplicates = []string{"--single-transaction", "--wait-in-flight", "5s"}, true, true
			for _, point := range points {
				t.Run(point, func(t *testing.T) {
					var s stats
					for i := range *iterations {
						st.crashOnce(t, point, i, &s)
						if t.Failed() {
							return
						}
					}
					t.Logf("%s --single-transaction %s: %s", sc.name, point, &s)
				})
			}
		})
	}
}

// openMariaDB is a fresh database on the shared MariaDB (or MySQL) server,
// for idem serve --db mysql://…
func openMariaDB(t *testing.T) *store {
	dsn := testenv.MySQLDSN(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	user := url.User(cfg.User)
	if cfg.Passwd != "" {
		user = url.UserPassword(cfg.User, cfg.Passwd)
	}
	u := url.URL{Scheme: "mysql", User: user, Host: cfg.Addr, Path: "/" + cfg.DBName}
	return &store{name: "mariadb", dbArg: u.String(), db: db, ph: func(int) string { return "?" }}
}
