package main

import (
	"context"
	"net/http"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemsql"
)

// addSQLSingleRoutes adds, with -store mysql or sqlite, route (f)/(g):
// the orders route behind idemhttp on idemsql in the single-transaction
// mode (idemsql.SingleTransaction), duplicates waiting singleWait for the
// first execution, as on PostgreSQL.
func addSQLSingleRoutes(mux *http.ServeMux, db *database) error {
	store, err := idemsql.NewStore(db.sql, db.dialect, idemsql.SingleTransaction())
	if err != nil {
		return err
	}
	engine, err := idem.NewEngine(store, nil)
	if err != nil {
		return err
	}
	mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true, WaitInFlight: singleWait})
	if err != nil {
		return err
	}
	engineTx := func(ctx context.Context) (idemsql.DBTX, func(error) error, error) {
		return idemsql.TxFromContext(ctx), func(err error) error { return err }, nil
	}
	mux.Handle("POST "+routeSingle, mw.Handler(createSQLOrder(engineTx)))
	return nil
}
