package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/idem-go/idem/examples/payments/cardnet"
	"github.com/idem-go/idem/idemclient"
)

// attemptTimeout is how long the demo's clients wait for an answer before
// they give up on the attempt and send it again with the same key: less
// than a card call takes, so that most first attempts give up.
const attemptTimeout = 100 * time.Millisecond

// newClient returns a client that gives up on an attempt after
// attemptTimeout and retries it with the same Idempotency-Key. The
// retries of an operation still running are answered 409, which do not
// count against MaxAttempts: 20 bounds the attempts that fail (a timeout,
// a refused connection).
func newClient() *http.Client {
	return idemclient.NewClient(&idemclient.Transport{AttemptTimeout: attemptTimeout, MaxAttempts: 20})
}

// apiCall is one POST a merchant's client sends to the API.
type apiCall struct {
	path     string // /payments or /payments/{id}/refunds
	merchant string
	key      string // the Idempotency-Key; "" lets idemclient make one
	body     any
}

// callResult is what a client got for an apiCall.
type callResult struct {
	status int
	body   []byte
	trace  idemclient.Trace
	err    error
}

// timeouts counts the attempts that gave up.
func (r callResult) timeouts() int {
	n := 0
	for _, a := range r.trace.History {
		if errors.Is(a.Err, idemclient.ErrAttemptTimeout) {
			n++
		}
	}
	return n
}

// conflicts counts the attempts answered 409: the operation was still
// running.
func (r callResult) conflicts() int {
	n := 0
	for _, a := range r.trace.History {
		if a.Status == http.StatusConflict {
			n++
		}
	}
	return n
}

// sendAll sends every call at the same instant, each from a goroutine of
// its own released by one barrier, through client, and returns the
// results in the order of calls.
func sendAll(ctx context.Context, client *http.Client, base string, calls []apiCall) []callResult {
	out := make([]callResult, len(calls))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range calls {
		body, err := json.Marshal(c.body)
		if err != nil {
			panic(err)
		}
		req, err := http.NewRequest(http.MethodPost, base+c.path, bytes.NewReader(body))
		if err != nil {
			out[i].err = err
			continue
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+c.merchant)
		if c.key != "" {
			req.Header.Set("Idempotency-Key", c.key)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r := &out[i]
			resp, err := client.Do(req.WithContext(idemclient.WithTrace(ctx, &r.trace)))
			if err != nil {
				r.err = err
				return
			}
			defer resp.Body.Close()
			r.status = resp.StatusCode
			r.body, r.err = io.ReadAll(resp.Body)
		}()
	}
	close(start)
	wg.Wait()
	return out
}

// demo runs the card network and the API in this process, sends payments
// and then refunds from clients that give up after attemptTimeout, and
// prints what the clients got, what the card network moved, and what the
// database holds.
func demo(ctx context.Context, o options, stdout io.Writer, logger *slog.Logger) error {
	network := cardnet.New(&cardnet.Config{MinLatency: o.latencyMin, MaxLatency: o.latencyMax})
	netLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	netSrv := &http.Server{Handler: network, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = netSrv.Serve(netLn) }()
	defer netSrv.Close()

	s, err := newServer(ctx, serverConfig{
		db: o.db, cardURL: "http://" + netLn.Addr().String(), lease: o.lease,
		cancelOnDisconnect: o.cancelOnDisconnect, logger: logger,
	})
	if err != nil {
		return err
	}
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = s.shutdown()
		return err
	}
	serveCtx, stopServing := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- serveUntil(serveCtx, s, apiLn) }()
	defer func() {
		stopServing()
		<-served
	}()
	base := "http://" + apiLn.Addr().String()

	var b [4]byte
	_, _ = rand.Read(b[:])
	merchant := "demo_" + hex.EncodeToString(b[:])
	client := newClient()
	fmt.Fprintf(stdout, "card network: %v to %v a call; clients give up on an attempt after %v and retry with the same key\n",
		o.latencyMin, o.latencyMax, attemptTimeout)

	n := max(o.payments, 1)
	calls := make([]apiCall, n)
	for i := range calls {
		calls[i] = apiCall{path: "/payments", merchant: merchant, body: paymentRequest{
			AmountCents: int64(1000 + i), Currency: "eur", CardToken: "tok_visa",
		}}
	}
	paid := sendAll(ctx, client, base, calls)
	fmt.Fprintf(stdout, "%d payments: %s\n", n, summarize(paid))

	var refunds []apiCall
	for _, r := range paid[:n-1] {
		var p Payment
		if r.status != http.StatusCreated || json.Unmarshal(r.body, &p) != nil {
			continue
		}
		refunds = append(refunds, apiCall{path: "/payments/" + p.ID + "/refunds", merchant: merchant,
			body: refundRequest{AmountCents: p.AmountCents}})
	}
	refunded := sendAll(ctx, client, base, refunds)
	fmt.Fprintf(stdout, "%d refunds: %s\n", len(refunds), summarize(refunded))

	perKey := map[string]int{}
	kinds := map[string]int{}
	for _, m := range network.Movements() {
		perKey[m.Key]++
		kinds[m.Kind]++
	}
	most := 0
	for _, c := range perKey {
		most = max(most, c)
	}
	perKeyNote := "once per key"
	if most > 1 {
		perKeyNote = fmt.Sprintf("up to %d times under one key", most)
	}
	fmt.Fprintf(stdout, "card network: money moved %d times (%d charges, %d refunds) for %d keys: %s\n",
		kinds["charge"]+kinds["refund"], kinds["charge"], kinds["refund"], len(perKey), perKeyNote)

	var rows, refundRows int
	err = s.pool.QueryRow(ctx, `
		SELECT count(*), (SELECT count(*) FROM refunds r JOIN payments p ON p.id = r.payment_id WHERE p.merchant = $1)
		FROM payments WHERE merchant = $1`, merchant).Scan(&rows, &refundRows)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "database: %d payments, %d refunds (merchant %s)\n", rows, refundRows, merchant)
	return nil
}

// summarize says in one line what a batch of clients got.
func summarize(results []callResult) string {
	statuses := map[int]int{}
	var failed, attempts, timeouts, conflicts int
	for _, r := range results {
		if r.err != nil {
			failed++
		} else {
			statuses[r.status]++
		}
		attempts += r.trace.Attempts
		timeouts += r.timeouts()
		conflicts += r.conflicts()
	}
	s := fmt.Sprintf("%d answered 201", statuses[http.StatusCreated])
	for st, c := range statuses {
		if st != http.StatusCreated {
			s += fmt.Sprintf(", %d answered %d", c, st)
		}
	}
	if failed > 0 {
		s += fmt.Sprintf(", %d got no answer", failed)
	}
	return s + fmt.Sprintf(" in %d attempts (%d gave up after %v, %d answered 409 while the payment ran)",
		attempts, timeouts, attemptTimeout, conflicts)
}
