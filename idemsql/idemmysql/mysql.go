// Package idemmysql is idemsql's dialect for MySQL and MariaDB through
// github.com/go-sql-driver/mysql:
//
//	db, err := sql.Open("mysql", dsn)
//	…
//	store, err := idemsql.NewStore(db, idemmysql.Dialect)
//
// It is a package of its own so that programs on SQLite or PostgreSQL do
// not link the MySQL driver. The DSN needs nothing special: parseTime,
// loc and clientFoundRows may be set either way.
package idemmysql

import (
	"errors"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/idemsql"
)

// Dialect is MySQL 8.0.16+ and MariaDB 10.6+ on InnoDB, reading the
// server's error numbers from the driver's *mysql.MySQLError (see
// idemsql.MySQLDialect).
var Dialect = idemsql.MySQLDialect(ErrorNumber)

// ErrorNumber returns the server's error number carried by err (a
// *mysql.MySQLError, possibly wrapped), or false when it carries none (a
// lost connection, a cancelled context).
func ErrorNumber(err error) (uint16, bool) {
	var e *mysql.MySQLError
	if errors.As(err, &e) {
		return e.Number, true
	}
	return 0, false
}
