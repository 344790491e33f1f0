package idemfronttest_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/idemfronttest"
)

// refHarness serves the reference front end: a front end of a few dozen
// lines built on idemfront, with calls made in process. It is what a new
// front end does, without a protocol; bugs plants the mistakes a real
// one could make, for TestMutants.
type refHarness struct{ bugs bugs }

// bugs are the planted mistakes, one flag each.
type bugs struct {
	noMarker           bool // a replay is sent without its marker
	replayTrimmed      bool // a replay's body loses its trailing white space
	storesTransient    bool // a transient failure is stored (a 429 or a 409 kept for the retention)
	noFingerprint      bool // the fingerprint is left out: another request under the key is replayed the first's answer
	mismatchAsInFlight bool // another request under the key is told to retry later
	runWhenStoreDown   bool // fails open: the handler runs while the store is down
	runsInFlight       bool // a duplicate that meets the execution in flight runs the handler unprotected
	tenantIgnored      bool // every caller shares one key space
	noTenantCheck      bool // a tenant no store can keep reaches the store
	cancelOnDisconnect bool // the handler runs on its caller's context, and dies with it
	noRetryAfter       bool // "retry later" advises no delay
	noWait             bool // the wait mode is ignored
	noRequestLimit     bool // a request over the limit runs
	truncateResponse   bool // an answer over the limit is stored truncated
	recoversPanic      bool // a handler's panic is answered and stored as a 500
}

// Limits when the suite asks for none.
const defaultLimit = 1 << 20

func (h refHarness) Serve(t *testing.T, engine *idem.Engine, opts idemfronttest.Options, handler idemfronttest.Handler) idemfronttest.Client {
	front, err := idemfront.NewFront(engine, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &refFront{bugs: h.bugs, engine: engine, front: front, opts: opts, handler: handler}
	if f.opts.MaxRequestBody == 0 {
		f.opts.MaxRequestBody = defaultLimit
	}
	if f.opts.MaxResponseBody == 0 {
		f.opts.MaxResponseBody = defaultLimit
	}
	return f
}

type refFront struct {
	bugs
	engine  *idem.Engine
	front   *idemfront.Front
	opts    idemfronttest.Options
	handler idemfronttest.Handler
}

// The statuses the reference front end stores, as HTTP's.
const (
	statusOK        = 200
	statusRejected  = 400
	statusTransient = 503
)

var errNoAnswer = errors.New("reffront: the call ended without an answer")

// Send runs the call on a goroutine of its own, as a server runs each
// request: a caller who leaves gets ctx's error at once, and the call
// goes on without it.
func (f *refFront) Send(ctx context.Context, c idemfronttest.Call) (idemfronttest.Reply, error) {
	type result struct {
		reply idemfronttest.Reply
		err   error
	}
	done := make(chan result, 1)
	go func() {
		answered := false
		defer func() {
			if !answered { // runtime.Goexit
				done <- result{err: errNoAnswer}
			}
		}()
		r := f.serve(ctx, c)
		answered = true
		done <- result{reply: r}
	}()
	select {
	case r := <-done:
		return r.reply, r.err
	case <-ctx.Done():
		return idemfronttest.Reply{}, ctx.Err()
	}
}

func (f *refFront) serve(caller context.Context, c idemfronttest.Call) idemfronttest.Reply {
	var values []string
	if c.Key != "" {
		values = []string{c.Key}
	}
	key, err := idemfront.OneKey(values)
	if err != nil {
		return f.refuse(idemfront.InvalidKey, err)
	}
	if !f.noTenantCheck {
		if err := idemfront.ValidateTenant(c.Tenant); err != nil {
			return f.refuse(idemfront.InvalidTenant, err)
		}
	}
	if int64(len(c.Body)) > f.opts.MaxRequestBody && !f.noRequestLimit {
		return f.refuse(idemfront.RequestTooLarge, nil)
	}
	fp := sha256.Sum256(c.Body)
	op := idem.Operation{Tenant: c.Tenant, Key: key, Fingerprint: fp[:], WaitInFlight: f.opts.WaitInFlight, WaitContext: caller}
	if f.tenantIgnored {
		op.Tenant = ""
	}
	if f.noFingerprint {
		op.Fingerprint = nil
	}
	if f.noWait {
		op.WaitInFlight = 0
	}
	ctx, stop := idemfront.Detach(caller, nil)
	defer stop()
	if f.cancelOnDisconnect {
		ctx = caller
	}
	ran := false
	out, err := f.engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		ran = true
		return f.run(ctx, c.Body)
	})
	if err == nil {
		kind := idemfront.KindOf(out)
		if kind == idemfront.NotStored || (kind == idemfront.Replayed && f.noMarker) {
			kind = idemfront.Executed // the suite reads a fresh answer as executed
		}
		body := out.Result.Body
		if out.Replayed && f.replayTrimmed {
			body = bytes.TrimRight(body, " \t\n")
		}
		return idemfronttest.Reply{Kind: kind, Body: body, Rejected: out.Result.Status == statusRejected, Transient: out.Result.Status == statusTransient}
	}
	a := f.front.Classify(err, idemfront.State{Ran: ran, Ctx: ctx, CallerCtx: caller})
	switch {
	case f.runWhenStoreDown && a.Kind == idemfront.StoreUnavailable && !ran,
		f.runsInFlight && a.Kind == idemfront.InFlight:
		r := f.handler(caller, c.Body)
		return idemfronttest.Reply{Kind: idemfront.Executed, Body: r.Body}
	case f.mismatchAsInFlight && a.Kind == idemfront.Mismatch:
		a = f.front.Refuse(idemfront.InFlight, err)
	}
	return f.answer(a)
}

// run calls the handler under the engine and makes its answer a result.
func (f *refFront) run(ctx context.Context, body []byte) (res idem.Result, err error) {
	if f.recoversPanic {
		defer func() {
			if v := recover(); v != nil {
				res, err = idem.Result{Mode: idem.ModeResponse, Status: 500, Body: []byte("internal error")}, nil
			}
		}()
	}
	r := f.handler(ctx, body)
	if int64(len(r.Body)) > f.opts.MaxResponseBody {
		if !f.truncateResponse {
			return idem.Result{}, idemfront.ErrResponseTooLarge
		}
		r.Body = r.Body[:f.opts.MaxResponseBody]
	}
	res = idem.Result{Mode: idem.ModeResponse, Status: statusOK, Body: r.Body}
	switch {
	case r.Transient:
		res.Status = statusTransient
		if !f.storesTransient {
			idem.NotExecuted(ctx)
		}
	case r.Rejected:
		res.Status = statusRejected
	}
	return res, nil
}

func (f *refFront) refuse(kind idemfront.Kind, err error) idemfronttest.Reply {
	return f.answer(f.front.Refuse(kind, err))
}

func (f *refFront) answer(a idemfront.Answer) idemfronttest.Reply {
	r := idemfronttest.Reply{Kind: a.Kind, RetryAfter: a.RetryAfter}
	if f.noRetryAfter {
		r.RetryAfter = 0
	}
	return r
}
