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
		db, err := idemsqlite.Open(target.path)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", target.describe(), err)
		}
		c.db = db
	case dialectMySQL:
		db, err := sql.Open("mysql", target.dsn)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", target.describe(), err)
		}
		c.db = db
	case dialectPostgres:
		pool, err := pgxpool.New(ctx, target.url)
		if err != nil {
			return nil, fmt.Errorf("open %s: %s", target.describe(), target.redact(err.Error()))
		}
		c.pool = pool
	default:
		return nil, fmt.Errorf("unknown database %q", target.dialect)
	}
	if err := c.ping(ctx); err != nil {
		c.Close() //nolint:errcheck // the ping error is the one to report
		return nil, fmt.Errorf("cannot reach %s: %s", target.describe(), target.redact(err.Error()))
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
	quietRedisOnce.Do(func() { redis.SetLogger(quietRedis{}) })
	c.rdb = redis.NewClient(opts)
	if err := c.rdb.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("cannot reach Redis at %s: %s", opts.Addr, redactURL(err.Error(), rawURL))
	}
	return idemredis.NewStore(c.rdb, cfg)
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
