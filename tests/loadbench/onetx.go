package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/idem-go/idem/idemhttp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The one-transaction claim is the design idem does not take, measured
// to know what it would buy: the claim is the first statement of the
// business transaction, pipelined with its BEGIN, and the completion rides
// with its COMMIT. There is no separate claim transaction, no commit of
// its own and no lease. A duplicate does not get 409: its INSERT waits on
// the unique index until the first transaction ends, then finds the
// completed record (or claims, if the first rolled back). The price is a
// row lock held for the handler's whole run, and no takeover or
// heartbeat: a hung handler holds its key until its connection dies.

// oneTxSQL makes single_keys the same shape as idem_keys (columns, CHECK
// constraints, indexes), so that the comparison is of designs, not of
// tables.
const oneTxSQL = `CREATE TABLE single_keys (LIKE idem_keys INCLUDING ALL)`

const (
	oneTxClaim = `INSERT INTO single_keys (tenant_id, idem_key, fingerprint, state, lease_token, locked_until, expires_at)
VALUES ($1, $2, $3, 'in_flight', 0, now(), now() + interval '24 hours')
ON CONFLICT (tenant_id, idem_key) DO NOTHING RETURNING true`
	oneTxComplete = `UPDATE single_keys SET state = 'complete', status_code = $3, response_headers = $4,
	response_body = $5, completed_at = now()
WHERE tenant_id = $1 AND idem_key = $2`
	oneTxRead = `SELECT fingerprint, status_code, response_headers, response_body FROM single_keys
WHERE tenant_id = $1 AND idem_key = $2`
)

type oneTxKey struct{}

// oneTxQuerier hands the handler the connection whose transaction oneTx
// opened.
func oneTxQuerier(ctx context.Context, fn func(querier) error) error {
	conn, ok := ctx.Value(oneTxKey{}).(*pgxpool.Conn)
	if !ok {
		return errors.New("no one-transaction claim in the context")
	}
	return fn(conn)
}

func oneTx(pool *pgxpool.Pool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		key := r.Header.Get(idemhttp.HeaderKey)
		if key == "" {
			next.ServeHTTP(w, r)
			return
		}
		// Fingerprint as idemhttp does in substance (method, path, body),
		// so that the Go side does comparable work.
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
		fail := func(err error) {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}

		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(oneTxClaim, tenant, key, fingerprint)
		br := conn.SendBatch(ctx, b)
		_, err = br.Exec()
		var won bool
		if err == nil {
			err = br.QueryRow().Scan(&won)
			if errors.Is(err, pgx.ErrNoRows) {
				err = nil // lost: the key is held by a committed record
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			fail(err)
			return
		}

		if !won {
			// Replay, in one round trip with the ROLLBACK of the empty
			// transaction.
			b := &pgx.Batch{}
			b.Queue("ROLLBACK")
			b.Queue(oneTxRead, tenant, key)
			br := conn.SendBatch(ctx, b)
			_, err := br.Exec()
			var storedFP, respBody []byte
			var status int
			var header map[string][]string
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
			if string(storedFP) != string(fingerprint) {
				http.Error(w, "key reused with another request", http.StatusUnprocessableEntity)
				return
			}
			for k, v := range header {
				w.Header()[k] = v
			}
			w.Header().Set(idemhttp.HeaderReplayed, "true")
			w.WriteHeader(status)
			_, _ = w.Write(respBody)
			return
		}

		rec := &recorder{header: http.Header{}}
		next.ServeHTTP(rec, r.WithContext(context.WithValue(ctx, oneTxKey{}, conn)))
		if rec.status >= 500 {
			fail(errors.New("handler failed"))
			return
		}
		header, err := json.Marshal(rec.header)
		if err != nil {
			fail(err)
			return
		}
		b = &pgx.Batch{}
		b.Queue(oneTxComplete, tenant, key, rec.status, header, rec.body)
		b.Queue("COMMIT")
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			fail(err)
			return
		}
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.body)
	})
}
