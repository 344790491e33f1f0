package idemcli

import (
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

const singleTransactionHelp = "claim each key inside the order's own transaction (PostgreSQL only): one commit per request,\n" +
	"no lease; a retry during the first run waits up to --wait-in-flight for its answer, then gets 409;\n" +
	"a request in flight is invisible to idem inspect until it commits"

// singleTransactionStore returns the records store of --single-transaction:
// idempg in its single-transaction mode.
func (c *conn) singleTransactionStore() (idem.Store, error) {
	if c.pool == nil {
		return nil, usagef("--single-transaction needs a PostgreSQL --db (a postgres:// URL)")
	}
	return idempg.NewStore(c.pool, &idempg.Config{SingleTransaction: true})
}
