package idemcli

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"

	_ "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/demo"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemmysql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
)

// conn is an open --db: the handle of its dialect. Exactly one of db and
// pool is set.
type conn struct {
	target dbTarget
	db     *sql.DB       // SQLite, MySQL/MariaDB
	pool   *pgxpool.Pool // PostgreSQL
	rdb    *redis.Client // --keys redis://…, when given
}

// openOptions says what a command needs from the database.
type openOptions struct {
	// mustExist refuses a SQLite path that is not there, rather than
	// creating an empty database (purge has nothing to do on one).
	mustExist bool
	// sqliteSynchronous is SQLite's synchronous setting (idemsqlite's
	// Options.Synchronous); empty keeps idemsqlite.Open's, FULL.
	sqliteSynchronous string
}

// openDB connects to the database a --db value names and checks that the
// server answers.
func openDB(ctx context.Context, db string, o openOptions) (*conn, error) {
	target, err := parseDB(db)
	if err != nil {
		return nil, err
	}
	c := &conn{target: target}
	switch target.dialect {
	case dialectSQLite:
		if o.mustExist {
			if _, err := os.Stat(target.path); errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("SQLite file %s does not exist", target.path)
			}
		}
		db, err := idemsqlite.OpenWith(target.path, &idemsqlite.Options{Synchronous: o.sqliteSynchronous})
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", target.describe(), err)
		}
		c.db = db
	case dialectMySQL:
		silenceMySQL()
		db, err := sql.Open("mysql", target.dsn)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", target.describe(), err)
		}
		c.db = db
	case dialectPostgres:
		pool, err := openPool(ctx, target.url)
		if err != nil {
			return nil, fmt.Errorf("open %s: %s", target.describe(), target.redact(err.Error()))
		}
		c.pool = pool
	default:
		return nil, fmt.Errorf("unknown database %q", target.dialect)
	}
	pctx, cancel := reachContext(ctx)
	defer cancel()
	if err := c.ping(pctx); err != nil {
		c.Close() //nolint:errcheck // the ping error is the one to report
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("cannot reach %s: no answer in %s from a server that accepted the connection (is it a %s server?)", target.describe(), reachTimeout, target.dialect)
		}
		return nil, fmt.Errorf("cannot reach %s: %s", target.describe(), target.redact(pgConnectError(err)))
	}
	return c, nil
}

func (c *conn) ping(ctx context.Context) error {
	if c.pool != nil {
		return c.pool.Ping(ctx)
	}
	return c.db.PingContext(ctx)
}

// Close closes what openDB and useRedis opened.
func (c *conn) Close() error {
	var errs []error
	if c.rdb != nil {
		errs = append(errs, c.rdb.Close())
	}
	if c.pool != nil {
		c.pool.Close()
	}
	if c.db != nil {
		errs = append(errs, c.db.Close())
	}
	return errors.Join(errs...)
}

// migrationDialect is the idemmigrate dialect of a database/sql target.
func (c *conn) migrationDialect() idemmigrate.Dialect {
	switch c.target.dialect {
	case dialectSQLite:
		return idemmigrate.SQLite
	case dialectMySQL:
		return idemmigrate.MySQL
	}
	return idemmigrate.Postgres
}

// sqlDialect is the idemsql dialect of a database/sql target.
func (c *conn) sqlDialect() idemsql.Dialect {
	if c.target.dialect == dialectMySQL {
		return idemmysql.Dialect
	}
	return idemsql.SQLite
}

// migrateKeys creates or updates the idempotency records table.
func (c *conn) migrateKeys(ctx context.Context) error {
	if c.pool != nil {
		return idempg.Migrate(ctx, c.pool)
	}
	return idemmigrate.Migrate(ctx, c.db, c.migrationDialect())
}

// keyStore returns the idem.Store on the records table of the database.
func (c *conn) keyStore() (idem.Store, error) {
	if c.pool != nil {
		return idempg.NewStore(c.pool, nil)
	}
	return idemsql.NewStore(c.db, c.sqlDialect())
}

// demoConfig returns the demo's configuration with the database handle
// set, for the orders.
func (c *conn) demoConfig() demo.Config {
	if c.pool != nil {
		return demo.Config{Pool: c.pool}
	}
	d := demo.SQLite
	if c.target.dialect == dialectMySQL {
		d = demo.MySQL
	}
	return demo.Config{DB: c.db, Dialect: d}
}

// useRedis connects to the Redis URL of --keys and returns the store on it.
// The records then live in Redis while the orders stay in --db: a crash
// between the order's commit and the record's completion leaves an order
// whose key a retry may run again once the lease ends (see docs/DEMO.md).
func (c *conn) useRedis(ctx context.Context, rawURL string, cfg *idemredis.Config) (idem.Store, error) {
	opts, err := parseRedisURL(rawURL)
	if err != nil {
		return nil, err
	}
	if c.rdb == nil {
		rdb, err := dialRedis(ctx, opts, rawURL)
		if err != nil {
			return nil, err
		}
		c.rdb = rdb
	}
	return idemredis.NewStore(c.rdb, cfg)
}

// dialRedis connects to Redis and checks that it answers, before anything
// else is opened: a --keys that fails must leave nothing behind (no SQLite
// file created for --db).
func dialRedis(ctx context.Context, opts *redis.Options, rawURL string) (*redis.Client, error) {
	quietRedisOnce.Do(func() { redis.SetLogger(quietRedis{}) })
	rdb := redis.NewClient(opts)
	err := rdb.Ping(ctx).Err()
	if err == nil {
		return rdb, nil
	}
	rdb.Close() //nolint:errcheck // the ping's error is the one to report
	msg := redactURL(err.Error(), rawURL)
	var serverErr redis.Error
	if errors.As(err, &serverErr) {
		// Redis answered: it was reached, and refused. A database number
		// past its "databases" setting is the usual one.
		if strings.Contains(msg, "DB index is out of range") {
			return nil, fmt.Errorf("--keys: Redis at %s has no database %d (out of range: it has 16 unless its \"databases\" setting says otherwise; try /0)", opts.Addr, opts.DB)
		}
		return nil, fmt.Errorf("--keys: Redis at %s refused the connection's setup: %s", opts.Addr, msg)
	}
	return nil, fmt.Errorf("cannot reach Redis at %s: %s", opts.Addr, msg)
}

// quietRedis drops what go-redis logs. go-redis writes its connection
// failures to stderr through a logger of its own, process-wide, before
// the command reports the same failure on its one line; the idem command
// line says everything on that line.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

var quietRedisOnce sync.Once

// parseRedisURL reads a --keys value. Its errors never show a password.
func parseRedisURL(rawURL string) (*redis.Options, error) {
	if !strings.HasPrefix(rawURL, "redis://") && !strings.HasPrefix(rawURL, "rediss://") {
		return nil, usagef("--keys %s: want redis://[user:password@]host:port/db or rediss://…", schemeOnly(rawURL))
	}
	if err := checkURLShape("--keys", rawURL); err != nil {
		return nil, err
	}
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, usagef("--keys: %s", redactURL(err.Error(), rawURL))
	}
	return opts, nil
}

// defaultPoolConns is the PostgreSQL pool's size when the URL sets no
// pool_max_conns. pgxpool's own default is the number of CPUs (at least
// 4): on a small machine, four requests that hold a connection (a slow
// handler, or a duplicate waiting on the first execution's lock in the
// single-transaction mode) would stall every other key behind them.
const defaultPoolConns = 16

// openPool opens the PostgreSQL pool of a --db URL, with
// defaultPoolConns unless the URL says otherwise.
func openPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = max(cfg.MaxConns, defaultPoolConns)
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}
