package idemcli

import (
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsql"
)

const singleTransactionHelp = "claim each key inside the order's own transaction: one commit per request,\n" +
	"no lease; a retry during the first run waits up to --wait-in-flight for its answer, then gets 409;\n" +
	"a request in flight is invisible to idem inspect until it commits (on SQLite one request runs at a time)"

// singleTransactionStore returns the records store of --single-transaction:
// idempg, or idemsql for SQLite and MySQL/MariaDB, in its
// single-transaction mode.
func (c *conn) singleTransactionStore() (idem.Store, error) {
	if c.pool != nil {
		return idempg.NewStore(c.pool, &idempg.Config{SingleTransaction: true})
	}
	if c.db == nil {
		return nil, usagef("--single-transaction needs a --db of PostgreSQL, MySQL/MariaDB or SQLite")
	}
	return idemsql.NewStore(c.db, c.sqlDialect(), idemsql.SingleTransaction())
}
