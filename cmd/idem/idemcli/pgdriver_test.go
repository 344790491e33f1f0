package idemcli_test

// The "pgx" database/sql driver, through which internal/testenv makes
// the tests' PostgreSQL schemas.
import _ "github.com/jackc/pgx/v5/stdlib"
