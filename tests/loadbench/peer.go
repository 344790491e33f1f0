package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The peer is what a careful Go team writes by hand with pgx instead of
// using idem (-peer): a table of keys; a claim with a lease in an
// autocommit statement of its own; a read of the row when the claim lost
// (the replay, a 409 while the lease lives, a takeover once it ended);
// then the business transaction, which completes the key by hand before
// its COMMIT, so that the order and the stored answer commit together.
// It answers as the idem routes do: the handler's status, headers and
// body, the key echoed, and a replay byte for byte with
// Idempotent-Replayed.

// routePeer is the orders route behind the peer.
const routePeer = "/peer/orders"

var peerScenarios = []scenario{
	{id: "p", name: "hand-written peer, fresh keys (-peer)", route: routePeer},
	{id: "q", name: "hand-written peer, replays (-peer)", route: routePeer, replay: true},
}

// peerSQL is the peer's table: what such a team keeps, no more. status is
// NULL while the key is in flight; locked_until is its lease, NULL once
// complete.
const peerSQL = `CREATE TABLE peer_keys (
	tenant       text NOT NULL,
	key          text NOT NULL,
	fingerprint  bytea NOT NULL,
	status       int,
	body         bytea,
	headers      bytea,
	locked_until timestamptz,
	PRIMARY KEY (tenant, key)
)`

// peerLease is how long a claim holds its key before a retry may take it
// over: idem's default lease, so that both give a crashed execution the
// same window.
const peerLease = "90 seconds"

const (
	// peerClaim returns the lease when the key was free. The lease's
	// exact value is the claim's token: the completion matches it, so an
	// execution whose lease was taken over cannot complete the key.
	peerClaim = `INSERT INTO peer_keys (tenant, key, fingerprint, locked_until)
VALUES ($1, $2, $3, now() + interval '` + peerLease + `')
ON CONFLICT (tenant, key) DO NOTHING RETURNING locked_until`
	peerRead = `SELECT fingerprint, status, body, headers, coalesce(locked_until > now(), false) FROM peer_keys
WHERE tenant = $1 AND key = $2`
	peerTakeOver = `UPDATE peer_keys SET fingerprint = $3, locked_until = now() + interval '` + peerLease + `'
WHERE tenant = $1 AND key = $2 AND status IS NULL AND locked_until <= now() RETURNING locked_until`
	peerComplete = `UPDATE peer_keys SET status = $4, body = $5, headers = $6, locked_until = NULL
WHERE tenant = $1 AND key = $2 AND locked_until = $3`
	// peerRelease frees a key whose execution failed, so that a retry
	// runs at once rather than after the lease.
	peerRelease = `DELETE FROM peer_keys WHERE tenant = $1 AND key = $2 AND status IS NULL AND locked_until = $3`
)

type peerTxKey struct{}

// peerQuerier hands the handler the business transaction the peer began.
func peerQuerier(ctx context.Context, fn func(querier) error) error {
	tx, ok := ctx.Value(peerTxKey{}).(pgx.Tx)
	if !ok {
		return errors.New("no peer transaction in the context")
	}
	return fn(tx)
}

func peer(pool *pgxpool.Pool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		key := r.Header.Get(idemhttp.HeaderKey)
		if key == "" {
			next.ServeHTTP(w, r)
			return
		}
		// Every answer to a request with a key echoes it, as idemhttp
		// does.
		w.Header()[idemhttp.HeaderKey] = []string{key}
		// Fingerprint as the other hand-built routes do (method, path,
		// body).
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

		var lease time.Time
		err = pool.QueryRow(ctx, peerClaim, tenant, key, fingerprint).Scan(&lease)
		if errors.Is(err, pgx.ErrNoRows) {
			// Lost: the key has a row. Replay it, refuse it, or take over
			// an ended lease.
			var storedFP, respBody, header []byte
			var status *int
			var locked bool
			err = pool.QueryRow(ctx, peerRead, tenant, key).Scan(&storedFP, &status, &respBody, &header, &locked)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				// Released between the claim and the read: the retry
				// claims it.
				peerConflict(w)
				return
			case err != nil:
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			case !bytes.Equal(storedFP, fingerprint) && (status != nil || locked):
				http.Error(w, "key reused with another request", http.StatusUnprocessableEntity)
				return
			case status != nil:
				var stored map[string][]string
				if err := json.Unmarshal(header, &stored); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				for k, v := range stored {
					w.Header()[k] = v
				}
				w.Header()[idemhttp.HeaderReplayed] = []string{"true"}
				w.WriteHeader(*status)
				_, _ = w.Write(respBody)
				return
			case locked:
				peerConflict(w)
				return
			}
			// In flight, its lease ended: the holder crashed or hangs.
			err = pool.QueryRow(ctx, peerTakeOver, tenant, key, fingerprint).Scan(&lease)
			if errors.Is(err, pgx.ErrNoRows) {
				peerConflict(w) // another retry took it over first
				return
			}
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}

		release := func() {
			_, _ = pool.Exec(context.WithoutCancel(ctx), peerRelease, tenant, key, lease)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			release()
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		// A no-op after the COMMIT.
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		rec := &recorder{header: http.Header{}}
		next.ServeHTTP(rec, r.WithContext(context.WithValue(ctx, peerTxKey{}, tx)))
		if rec.status >= 500 {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			release()
			http.Error(w, "handler failed", http.StatusServiceUnavailable)
			return
		}
		header, err := json.Marshal(rec.header)
		if err == nil {
			var tag pgconn.CommandTag
			tag, err = tx.Exec(ctx, peerComplete, tenant, key, lease, rec.status, rec.body, header)
			if err == nil && tag.RowsAffected() == 0 {
				// The lease was taken over: the other execution's answer
				// stands, and this one's writes roll back.
				err = errors.New("lease lost")
			}
		}
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			release()
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

// peerConflict answers a request whose key is held by an execution in
// flight.
func peerConflict(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	http.Error(w, "a request with this key is in flight", http.StatusConflict)
}

// writePeerReport writes the table idem against the peer: within each
// round, idem's throughput over the peer's, fresh keys against (p) and
// replays against (q), then their medians and ranges; the PostgreSQL CPU
// and round trips of a request of each.
func writePeerReport(w io.Writer, b *bench, phases []*phase) {
	has := func(id string) bool {
		return slices.ContainsFunc(b.scenarios, func(sc scenario) bool { return sc.id == id })
	}
	if !has("p") && !has("q") {
		return
	}
	// of returns the phases of scenario id, by round.
	of := func(id string) map[int]*phase {
		m := map[int]*phase{}
		for _, p := range phases {
			if p.scenario.id == id {
				m[p.round] = p
			}
		}
		return m
	}
	// ratio is f(x)/f(y) in each round both ran, as "median (min–max)".
	ratio := func(x, y string, f func(*phase) float64) string {
		px, py := of(x), of(y)
		var rs []float64
		for r, p := range px {
			if q, ok := py[r]; ok && f(q) > 0 {
				rs = append(rs, f(p)/f(q))
			}
		}
		if len(rs) == 0 {
			return "—"
		}
		return fmt.Sprintf("**%.2f** (%.2f–%.2f)", median(rs), slices.Min(rs), slices.Max(rs))
	}
	// each is the median over the rounds of f(phase of id), shown by show.
	each := func(id string, f func(*phase) float64, show func(float64) string) string {
		var vs []float64
		for _, p := range of(id) {
			vs = append(vs, f(p))
		}
		if len(vs) == 0 {
			return "—"
		}
		return show(median(vs))
	}
	throughput := (*phase).throughput
	pgCPU := func(p *phase) float64 { return float64(p.cpuUse().pgPerReq) }
	goCPU := func(p *phase) float64 { return float64(p.cpuUse().selfPerReq) }
	trips := func(p *phase) float64 { return p.perRequest(p.writes) }
	cpu := func(v float64) string { return us(time.Duration(v)) }
	count := func(v float64) string { return fmt.Sprintf("%.2f", v) }

	fmt.Fprintf(w, "### idem against the peer\n\n")
	fmt.Fprintf(w, "| | (a) bare handler | idem, default mode: (b) fresh, (c) replays | idem, single transaction: (f) fresh, (g) replays | peer: (p) fresh, (q) replays |\n")
	fmt.Fprintf(w, "|---|--:|--:|--:|--:|\n")
	fmt.Fprintf(w, "| fresh keys, req/s × (p) | %s | %s | %s | 1.00 |\n",
		ratio("a", "p", throughput), ratio("b", "p", throughput), ratio("f", "p", throughput))
	fmt.Fprintf(w, "| replays, req/s × (q) | | %s | %s | 1.00 |\n",
		ratio("c", "q", throughput), ratio("g", "q", throughput))
	fmt.Fprintf(w, "| PG CPU per fresh request | %s | %s | %s | %s |\n",
		each("a", pgCPU, cpu), each("b", pgCPU, cpu), each("f", pgCPU, cpu), each("p", pgCPU, cpu))
	fmt.Fprintf(w, "| PG CPU per fresh request × (p) | %s | %s | %s | 1.00 |\n",
		ratio("a", "p", pgCPU), ratio("b", "p", pgCPU), ratio("f", "p", pgCPU))
	fmt.Fprintf(w, "| PG CPU per replay | | %s | %s | %s |\n",
		each("c", pgCPU, cpu), each("g", pgCPU, cpu), each("q", pgCPU, cpu))
	fmt.Fprintf(w, "| Go CPU per fresh request | %s | %s | %s | %s |\n",
		each("a", goCPU, cpu), each("b", goCPU, cpu), each("f", goCPU, cpu), each("p", goCPU, cpu))
	fmt.Fprintf(w, "| PG round trips per fresh request | %s | %s | %s | %s |\n",
		each("a", trips, count), each("b", trips, count), each("f", trips, count), each("p", trips, count))
	fmt.Fprintf(w, "| PG round trips per replay | | %s | %s | %s |\n",
		each("c", trips, count), each("g", trips, count), each("q", trips, count))
	fmt.Fprintf(w, "\nRatios taken within each round, then their median and range; CPU and round trips are medians over the rounds. Above 1.00 idem is faster, or costs more CPU.\n\n")
}
