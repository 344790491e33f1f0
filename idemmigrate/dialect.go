package idemmigrate

import (
	"fmt"
	"strings"
)

// Dialect names the SQL dialect of a database, and so the set of migration
// files that fits it.
type Dialect string

// The dialects with embedded migrations.
const (
	// Postgres is PostgreSQL, whatever the driver (pgx, lib/pq).
	Postgres Dialect = "postgres"
	// SQLite is SQLite 3.42 or later (modernc.org/sqlite or cgo drivers).
	SQLite Dialect = "sqlite"
	// MySQL is MySQL 8.0.16 or later, or MariaDB 10.6 or later, on InnoDB.
	MySQL Dialect = "mysql"
)

// Dialects lists the dialects with embedded migrations.
func Dialects() []Dialect { return []Dialect{Postgres, SQLite, MySQL} }

// String returns the dialect's name, which is also its directory in Files.
func (d Dialect) String() string { return string(d) }

func (d Dialect) check() error {
	switch d {
	case Postgres, SQLite, MySQL:
		return nil
	}
	return fmt.Errorf("idemmigrate: unknown dialect %q (want %q, %q or %q)", string(d), Postgres, SQLite, MySQL)
}

// ParseDialect reads a dialect name as a command line or a configuration
// file gives it: "postgres" (or "postgresql", "pg", "pgx"), "sqlite" (or
// "sqlite3") and "mysql" (or "mariadb"), in any case.
func ParseDialect(name string) (Dialect, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "postgres", "postgresql", "pg", "pgx":
		return Postgres, nil
	case "sqlite", "sqlite3":
		return SQLite, nil
	case "mysql", "mariadb":
		return MySQL, nil
	}
	return "", Dialect(name).check()
}
