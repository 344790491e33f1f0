package demo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsql"
)

// Table is the demo's business table. It is not called "orders" so that
// pointing the demo at a real database cannot collide with, or write into,
// an application's own orders table.
const Table = "idem_demo_orders"

// listLimit bounds GET /orders: the demo has no pagination, and an
// unbounded answer would let one request read a whole table.
const listLimit = 1000

// order is one row of the demo's business table and the JSON of the API.
type order struct {
	ID         string    `json:"id"`
	CartID     string    `json:"cart_id"`
	TotalCents int64     `json:"total_cents"`
	CreatedAt  time.Time `json:"created_at"`
}

var errOrderNotFound = errors.New("order not found")

// orderRepo keeps the demo's orders, tenant-scoped. insert writes in the
// idempotency layer's transaction when the request has one (a request with
// an Idempotency-Key on a SQL store), so that the order and the stored
// answer commit together; otherwise (no key, or keys kept in Redis) in a
// statement of its own.
type orderRepo interface {
	migrate(ctx context.Context) error
	insert(ctx context.Context, tenant string, o order) error
	list(ctx context.Context, tenant, cartID string) ([]order, error)
	get(ctx context.Context, tenant, id string) (order, error)
	// count returns how many orders tenant has for cartID (all of them
	// for ""), for the X-Total-Count of a list cut at listLimit, and tests.
	count(ctx context.Context, tenant, cartID string) (int, error)
}

// The schema of the demo table per dialect. created_at leads nothing and
// ends the index so that a cart's orders come back in order from it.
var orderSchema = map[Dialect][]string{
	SQLite: {
		`CREATE TABLE IF NOT EXISTS ` + Table + ` (
			id          TEXT    NOT NULL PRIMARY KEY,
			tenant_id   TEXT    NOT NULL,
			cart_id     TEXT    NOT NULL,
			total_cents INTEGER NOT NULL,
			created_at  TEXT    NOT NULL -- UTC, fixed-width RFC 3339: sorts as text
		)`,
		`CREATE INDEX IF NOT EXISTS ` + Table + `_tenant_cart ON ` + Table + ` (tenant_id, cart_id, created_at)`,
	},
	MySQL: {
		// utf8mb4_bin: cart ids compare byte for byte, as on SQLite and
		// PostgreSQL, rather than case-insensitively.
		`CREATE TABLE IF NOT EXISTS ` + Table + ` (
			id          VARCHAR(64)  NOT NULL PRIMARY KEY,
			tenant_id   VARCHAR(255) NOT NULL,
			cart_id     VARCHAR(255) NOT NULL,
			total_cents BIGINT       NOT NULL,
			created_at  DATETIME(6)  NOT NULL,
			KEY ` + Table + `_tenant_cart (tenant_id, cart_id, created_at)
		) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
	},
	postgres: {
		`CREATE TABLE IF NOT EXISTS ` + Table + ` (
			id          text        NOT NULL PRIMARY KEY,
			tenant_id   text        NOT NULL,
			cart_id     text        NOT NULL,
			total_cents bigint      NOT NULL,
			created_at  timestamptz NOT NULL
		)`,
		`CREATE INDEX IF NOT EXISTS ` + Table + `_tenant_cart ON ` + Table + ` (tenant_id, cart_id, created_at)`,
	},
}

// postgres keys the PostgreSQL schema in orderSchema; PostgreSQL goes
// through pgx (Config.Pool), not a Dialect of database/sql.
const postgres Dialect = -1

// sqliteTime is the stored form of created_at on SQLite: UTC with a fixed
// number of digits, so that text order is time order.
const sqliteTime = "2006-01-02T15:04:05.000000Z"

// sqlOrders keeps orders through database/sql (SQLite, MySQL/MariaDB).
type sqlOrders struct {
	db      *sql.DB
	dialect Dialect
}

func (r *sqlOrders) migrate(ctx context.Context) error {
	for _, stmt := range orderSchema[r.dialect] {
		if _, err := r.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("create the demo's %s table: %w", Table, err)
		}
	}
	return nil
}

func (r *sqlOrders) timeArg(t time.Time) any {
	if r.dialect == SQLite {
		return t.UTC().Format(sqliteTime)
	}
	return t.UTC()
}

func (r *sqlOrders) insert(ctx context.Context, tenant string, o order) error {
	const q = `INSERT INTO ` + Table + ` (id, tenant_id, cart_id, total_cents, created_at) VALUES (?, ?, ?, ?, ?)`
	args := []any{o.ID, tenant, o.CartID, o.TotalCents, r.timeArg(o.CreatedAt)}
	// The idem execution's transaction when the request carries a key,
	// the database otherwise.
	_, err := idemsql.DB(ctx, r.db).ExecContext(ctx, q, args...)
	return err
}

func (r *sqlOrders) scan(row interface{ Scan(...any) error }) (order, error) {
	var o order
	if r.dialect == SQLite {
		var created string
		if err := row.Scan(&o.ID, &o.CartID, &o.TotalCents, &created); err != nil {
			return order{}, err
		}
		t, err := time.Parse(sqliteTime, created)
		if err != nil {
			return order{}, fmt.Errorf("order %s: stored created_at %q: %w", o.ID, created, err)
		}
		o.CreatedAt = t
		return o, nil
	}
	if err := row.Scan(&o.ID, &o.CartID, &o.TotalCents, &o.CreatedAt); err != nil {
		return order{}, err
	}
	o.CreatedAt = o.CreatedAt.UTC()
	return o, nil
}

func (r *sqlOrders) list(ctx context.Context, tenant, cartID string) ([]order, error) {
	q := `SELECT id, cart_id, total_cents, created_at FROM ` + Table + ` WHERE tenant_id = ?`
	args := []any{tenant}
	if cartID != "" {
		q += ` AND cart_id = ?`
		args = append(args, cartID)
	}
	q += fmt.Sprintf(` ORDER BY created_at, id LIMIT %d`, listLimit)
	rows, err := r.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []order{}
	for rows.Next() {
		o, err := r.scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, rows.Err()
}

func (r *sqlOrders) get(ctx context.Context, tenant, id string) (order, error) {
	row := r.db.QueryRowContext(ctx, `SELECT id, cart_id, total_cents, created_at FROM `+Table+` WHERE tenant_id = ? AND id = ?`, tenant, id)
	o, err := r.scan(row)
	if errors.Is(err, sql.ErrNoRows) {
		return order{}, errOrderNotFound
	}
	return o, err
}

func (r *sqlOrders) count(ctx context.Context, tenant, cartID string) (int, error) {
	q, args := `SELECT COUNT(*) FROM `+Table+` WHERE tenant_id = ?`, []any{tenant}
	if cartID != "" {
		q += ` AND cart_id = ?`
		args = append(args, cartID)
	}
	var n int
	err := r.db.QueryRowContext(ctx, q, args...).Scan(&n)
	return n, err
}

// pgOrders keeps orders through pgx, in the same pgx transaction as the
// idempotency record (idempg).
type pgOrders struct {
	pool *pgxpool.Pool
}

func (r *pgOrders) migrate(ctx context.Context) error {
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("create the demo's %s table: %w", Table, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // harmless after Commit
	// Two servers starting together on one database would otherwise race
	// in CREATE TABLE IF NOT EXISTS, which PostgreSQL does not make atomic
	// (a unique violation in pg_type). The lock is per database; the
	// schema is named in the key so that tests on separate schemas do not
	// wait for each other.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('idem_demo_orders.' || current_schema()))`); err != nil {
		return fmt.Errorf("create the demo's %s table: %w", Table, err)
	}
	for _, stmt := range orderSchema[postgres] {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("create the demo's %s table: %w", Table, err)
		}
	}
	return tx.Commit(ctx)
}

func (r *pgOrders) insert(ctx context.Context, tenant string, o order) error {
	const q = `INSERT INTO ` + Table + ` (id, tenant_id, cart_id, total_cents, created_at) VALUES ($1, $2, $3, $4, $5)`
	// The idem execution's transaction when the request carries a key,
	// the pool otherwise.
	_, err := idempg.DB(ctx, r.pool).Exec(ctx, q, o.ID, tenant, o.CartID, o.TotalCents, o.CreatedAt)
	return err
}

func scanPG(row pgx.Row) (order, error) {
	var o order
	if err := row.Scan(&o.ID, &o.CartID, &o.TotalCents, &o.CreatedAt); err != nil {
		return order{}, err
	}
	o.CreatedAt = o.CreatedAt.UTC()
	return o, nil
}

func (r *pgOrders) list(ctx context.Context, tenant, cartID string) ([]order, error) {
	q := `SELECT id, cart_id, total_cents, created_at FROM ` + Table + ` WHERE tenant_id = $1`
	args := []any{tenant}
	if cartID != "" {
		q += ` AND cart_id = $2`
		args = append(args, cartID)
	}
	q += fmt.Sprintf(` ORDER BY created_at, id LIMIT %d`, listLimit)
	rows, err := r.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []order{}
	for rows.Next() {
		o, err := scanPG(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, rows.Err()
}

func (r *pgOrders) get(ctx context.Context, tenant, id string) (order, error) {
	o, err := scanPG(r.pool.QueryRow(ctx, `SELECT id, cart_id, total_cents, created_at FROM `+Table+` WHERE tenant_id = $1 AND id = $2`, tenant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return order{}, errOrderNotFound
	}
	return o, err
}

func (r *pgOrders) count(ctx context.Context, tenant, cartID string) (int, error) {
	q, args := `SELECT COUNT(*) FROM `+Table+` WHERE tenant_id = $1`, []any{tenant}
	if cartID != "" {
		q += ` AND cart_id = $2`
		args = append(args, cartID)
	}
	var n int
	err := r.pool.QueryRow(ctx, q, args...).Scan(&n)
	return n, err
}
