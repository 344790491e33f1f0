package idempg

import (
	"context"

	"github.com/idem-go/idem/idemmigrate"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// Migrate brings the schema that pool's connections use (their
// search_path) to the latest idem version: the idem_keys table and the
// idem_complete function. It runs idemmigrate's PostgreSQL migrations, so
// concurrent calls from several processes wait for each other and apply
// each file once. Teams with their own migration tool apply
// idemmigrate.Files(idemmigrate.Postgres) instead.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	db := stdlib.OpenDBFromPool(pool)
	// Closing the database/sql handle leaves the pool open.
	defer db.Close()
	return idemmigrate.Migrate(ctx, db, idemmigrate.Postgres)
}
