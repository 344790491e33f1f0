package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The single-transaction mode of idempg (Config.SingleTransaction), its
// hand-built alternative that writes the record once without a lock, and
// a handler closer to a real service than one INSERT.
const (
	// routeSingle is the orders route behind idemhttp on idempg in the
	// single-transaction mode (-single).
	routeSingle = "/single/orders"
	// routeWriteOnce reads the key first, runs the handler, and inserts
	// the completed record with the COMMIT, the unique index deciding
	// between duplicates (-writeonce; not idem's design).
	routeWriteOnce = "/writeonce/orders"
	// The realistic handler (-realistic): bare, idem in the default mode,
	// idem in the single-transaction mode.
	routeCheckoutBare   = "/bare/checkout"
	routeCheckoutIdem   = "/idem/checkout"
	routeCheckoutSingle = "/single/checkout"
)

var (
	singleScenarios = []scenario{
		{id: "f", name: "idem, single transaction, fresh keys (-single)", route: routeSingle},
		{id: "g", name: "idem, single transaction, replays (-single)", route: routeSingle, replay: true},
	}
	writeOnceScenario  = scenario{id: "w", name: "write once: read, handler, INSERT with COMMIT, unique index decides (not idem's design; -writeonce)", route: routeWriteOnce}
	realisticScenarios = []scenario{
		{id: "ra", name: "realistic handler (3 statements, 1 ms of waiting), bare", route: routeCheckoutBare},
		{id: "rb", name: "realistic handler, idem, fresh keys", route: routeCheckoutIdem, base: "ra"},
		{id: "rf", name: "realistic handler, idem single transaction, fresh keys", route: routeCheckoutSingle, base: "ra"},
	}
)

// singleWait is how long a duplicate waits for the first execution in the
// single-transaction routes: the wait is where such a duplicate gets its
// replay.
const singleWait = 10 * time.Second

// realisticSQL is the catalogue the realistic handler reads and updates.
const realisticSQL = `CREATE TABLE products (id int PRIMARY KEY, price_cents bigint NOT NULL, stock bigint NOT NULL);
INSERT INTO products SELECT g, 100 + g, 1000000000 FROM generate_series(1, 1000) g;`

// checkout is the realistic handler: read a product's price, wait 1 ms
// (a call to another service, a template, some computing: time the
// transaction stays open), insert the order, decrement the stock. Three
// statements where createOrder has one, so that what idem adds can be
// read against a handler of a real service's size.
func checkout(inTx txFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req orderRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req); err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		o := order{TenantID: tenant, CartID: req.CartID}
		key := r.Header.Get(idemhttp.HeaderKey)
		product := 1 + rand.IntN(1000) // spread: no two requests queue on one row
		err := inTx(r.Context(), func(tx querier) error {
			var price int64
			if err := tx.QueryRow(r.Context(), `SELECT price_cents FROM products WHERE id = $1`, product).Scan(&price); err != nil {
				return err
			}
			time.Sleep(time.Millisecond)
			o.TotalCents = price
			if err := tx.QueryRow(r.Context(), insertOrder, tenant, req.CartID, price, key).Scan(&o.ID, &o.CreatedAt); err != nil {
				return err
			}
			var stock int64
			return tx.QueryRow(r.Context(), `UPDATE products SET stock = stock - 1 WHERE id = $1 RETURNING stock`, product).Scan(&stock)
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		body, _ := json.Marshal(o)
		w.Header()["Content-Type"] = []string{"application/json"}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	}
}

// addSingleRoutes adds the routes of this file to mux.
func addSingleRoutes(mux *http.ServeMux, pool *pgxpool.Pool, config *idempg.Config) error {
	own := func(ctx context.Context, fn func(querier) error) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fn(tx) })
	}
	engineTx := func(ctx context.Context, fn func(querier) error) error {
		return fn(idempg.TxFromContext(ctx))
	}
	defaultMode, err := idemMiddleware(pool, config, 0)
	if err != nil {
		return err
	}
	singleConfig := idempg.Config{SingleTransaction: true}
	if config != nil {
		singleConfig.ClaimBatchSize, singleConfig.ClaimConcurrency = config.ClaimBatchSize, config.ClaimConcurrency
	}
	single, err := idemMiddleware(pool, &singleConfig, singleWait)
	if err != nil {
		return err
	}
	mux.Handle("POST "+routeSingle, single.Handler(createOrder(engineTx)))
	mux.Handle("POST "+routeWriteOnce, writeOnce(pool, createOrder(oneTxQuerier)))
	mux.Handle("POST "+routeCheckoutBare, checkout(own))
	mux.Handle("POST "+routeCheckoutIdem, defaultMode.Handler(checkout(engineTx)))
	mux.Handle("POST "+routeCheckoutSingle, single.Handler(checkout(engineTx)))
	return nil
}

// idemMiddleware is idemhttp on idempg with every default but the store's
// config and the wait for a duplicate in flight.
func idemMiddleware(pool *pgxpool.Pool, config *idempg.Config, wait time.Duration) (*idemhttp.Middleware, error) {
	store, err := idempg.NewStore(pool, config)
	if err != nil {
		return nil, err
	}
	engine, err := idem.NewEngine(store, nil)
	if err != nil {
		return nil, err
	}
	return idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true, WaitInFlight: wait})
}

const (
	writeOnceRead = `SELECT fingerprint, status_code, response_headers, response_body FROM single_keys
WHERE tenant_id = $1 AND idem_key = $2`
	writeOnceInsert = `INSERT INTO single_keys (tenant_id, idem_key, fingerprint, state, lease_token, locked_until,
	status_code, response_headers, response_body, completed_at, expires_at)
VALUES ($1, $2, $3, 'complete', 0, now(), $4, $5, $6, now(), now() + interval '24 hours')`
)

// writeOnce is the record written once, without a lock: BEGIN and a read
// of the key in one round trip (a replay is that read, and a ROLLBACK);
// the handler in that transaction; the completed record inserted with the
// COMMIT. Two executions of one key both run the handler; the second's
// INSERT waits on the unique index for the first transaction, fails, and
// rolls its own writes back, and it answers the winner's record. Exactly
// once for effects inside the transaction only: anything the handler does
// elsewhere (a call to another service) happens once per duplicate.
func writeOnce(pool *pgxpool.Pool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		key := r.Header.Get(idemhttp.HeaderKey)
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h := sha256.New()
		io.WriteString(h, r.Method+" "+r.URL.EscapedPath()+"\n")
		h.Write(body)
		fingerprint := h.Sum(nil)
		r.Body = io.NopCloser(bytes.NewReader(body))

		conn, err := pool.Acquire(ctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer conn.Release()
		answer := func(storedFP []byte, status int, header map[string][]string, respBody []byte) {
			if !bytes.Equal(storedFP, fingerprint) {
				http.Error(w, "key reused with another request", http.StatusUnprocessableEntity)
				return
			}
			for k, v := range header {
				w.Header()[k] = v
			}
			w.Header().Set(idemhttp.HeaderReplayed, "true")
			w.WriteHeader(status)
			_, _ = w.Write(respBody)
		}
		replay := func() {
			var storedFP, respBody []byte
			var status int
			var header map[string][]string
			b := &pgx.Batch{}
			b.Queue("ROLLBACK")
			b.Queue(writeOnceRead, tenant, key)
			br := conn.SendBatch(ctx, b)
			_, err := br.Exec()
			if err == nil {
				err = br.QueryRow().Scan(&storedFP, &status, &header, &respBody)
			}
			if cerr := br.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			answer(storedFP, status, header, respBody)
		}

		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(writeOnceRead, tenant, key)
		br := conn.SendBatch(ctx, b)
		_, err = br.Exec()
		found := false
		var storedFP, respBody []byte
		var status int
		var header map[string][]string
		if err == nil {
			err = br.QueryRow().Scan(&storedFP, &status, &header, &respBody)
			found = err == nil
			if errors.Is(err, pgx.ErrNoRows) {
				err = nil
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if found {
			// A replay: the read answered; end the empty transaction.
			if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			answer(storedFP, status, header, respBody)
			return
		}
		rec := &recorder{header: http.Header{}}
		next.ServeHTTP(rec, r.WithContext(context.WithValue(ctx, oneTxKey{}, conn)))
		if rec.status >= 500 {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
			http.Error(w, "handler failed", http.StatusServiceUnavailable)
			return
		}
		recHeader, err := json.Marshal(rec.header)
		if err != nil {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		b = &pgx.Batch{}
		b.Queue(writeOnceInsert, tenant, key, fingerprint, rec.status, recHeader, rec.body)
		b.Queue("COMMIT")
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "23505" {
				replay() // a duplicate committed first: ours rolls back
				return
			}
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.body)
	})
}
