// Package idemrpc is the protocol-neutral core of idem's RPC front ends,
// idemgrpc (grpc-go) and idemconnect (Connect): the key and tenant
// rules, the canonical fingerprint of a protobuf request, what is stored
// (the response message, or a deterministic error status) and how each
// answer of the kit (idemfront) is told in gRPC's status codes and
// google.rpc details. Both front ends use it; a program uses idemgrpc or
// idemconnect, not this package.
//
// It imports protobuf and the google.rpc types only, never grpc-go or
// Connect: a Connect service does not build grpc-go.
package idemrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The gRPC status codes the core answers with (Connect uses the same
// numbers).
const (
	OK                 uint32 = 0
	Canceled           uint32 = 1
	Unknown            uint32 = 2
	InvalidArgument    uint32 = 3
	DeadlineExceeded   uint32 = 4
	NotFound           uint32 = 5
	AlreadyExists      uint32 = 6
	PermissionDenied   uint32 = 7
	ResourceExhausted  uint32 = 8
	FailedPrecondition uint32 = 9
	Aborted            uint32 = 10
	OutOfRange         uint32 = 11
	Unimplemented      uint32 = 12
	Internal           uint32 = 13
	Unavailable        uint32 = 14
	DataLoss           uint32 = 15
	Unauthenticated    uint32 = 16
)

// MetadataKey is the metadata entry (or, in Connect's protocol, the
// header) carrying a call's key.
const MetadataKey = "idempotency-key"

// MetadataReplayed is the header metadata set to "true" on a replay.
const MetadataReplayed = "idempotent-replayed"

// MetadataPushback is the trailer grpc-go's retry policy reads (gRFC
// A6): the delay before the next attempt, in milliseconds.
const MetadataPushback = "grpc-retry-pushback-ms"

// ErrorDomain is the domain of the google.rpc.ErrorInfo on the front
// end's own answers, which tells them from the handler's.
const ErrorDomain = "idem-go.github.io"

// The ErrorInfo reasons of the front end's own answers, by kind.
var reasons = map[idemfront.Kind]string{
	idemfront.KeyRequired:       "IDEMPOTENCY_KEY_REQUIRED",
	idemfront.InvalidKey:        "IDEMPOTENCY_KEY_INVALID",
	idemfront.Mismatch:          "IDEMPOTENCY_KEY_REUSED",
	idemfront.InFlight:          "IDEMPOTENCY_KEY_IN_FLIGHT",
	idemfront.Unauthenticated:   "IDEMPOTENCY_TENANT_UNKNOWN",
	idemfront.InvalidTenant:     "IDEMPOTENCY_TENANT_INVALID",
	idemfront.StoreUnavailable:  "IDEMPOTENCY_STORE_UNAVAILABLE",
	idemfront.RequestTooLarge:   "IDEMPOTENCY_REQUEST_TOO_LARGE",
	idemfront.ResponseTooLarge:  "IDEMPOTENCY_RESPONSE_TOO_LARGE",
	idemfront.Cancelled:         "IDEMPOTENCY_CANCELLED",
	idemfront.LeaseLost:         "IDEMPOTENCY_LEASE_LOST",
	idemfront.StepNotSaved:      "IDEMPOTENCY_STEP_NOT_SAVED",
	idemfront.Panicked:          "IDEMPOTENCY_HANDLER_PANIC",
	idemfront.ReplayFailed:      "IDEMPOTENCY_REPLAY_FAILED",
	idemfront.Closed:            "IDEMPOTENCY_CLOSED",
	idemfront.Internal:          "IDEMPOTENCY_INTERNAL",
	idemfront.RequestUnreadable: "IDEMPOTENCY_REQUEST_UNREADABLE",
}

// Reason returns the ErrorInfo reason of the front end's answers of kind
// k ("" for an answer that is the handler's).
func Reason(k idemfront.Kind) string { return reasons[k] }

// KindOfReason returns the kind whose answers carry reason.
func KindOfReason(reason string) (idemfront.Kind, bool) {
	for k, r := range reasons {
		if r == reason {
			return k, true
		}
	}
	return 0, false
}

// Code returns the status code of the front end's answers of kind k.
// Every "retry later" is UNAVAILABLE, never ABORTED: gRPC's retry design
// (gRFC A6) cancels every hedged copy of a call once one gets a status
// outside the non-fatal list, and UNAVAILABLE is the status clients
// retry by default; a duplicate answered ABORTED would cancel the
// execution still running.
func Code(k idemfront.Kind) uint32 {
	switch k {
	case idemfront.KeyRequired, idemfront.InvalidKey:
		return InvalidArgument
	case idemfront.Mismatch:
		return FailedPrecondition
	case idemfront.InFlight, idemfront.StoreUnavailable, idemfront.Closed,
		idemfront.LeaseLost, idemfront.StepNotSaved:
		return Unavailable
	case idemfront.Unauthenticated:
		return Unauthenticated
	case idemfront.RequestTooLarge, idemfront.ResponseTooLarge:
		return ResourceExhausted
	case idemfront.Cancelled:
		return Canceled
	case idemfront.RequestUnreadable:
		return InvalidArgument
	}
	return Internal
}

var messages = map[idemfront.Kind]string{
	idemfront.KeyRequired:       "an idempotency-key is required",
	idemfront.InvalidKey:        "the idempotency-key is malformed: 1 to 255 visible ASCII characters, exactly one",
	idemfront.Mismatch:          "the idempotency-key was used for another request; use a new key for a new operation",
	idemfront.InFlight:          "a call with this idempotency-key is in progress; retry with the same key later",
	idemfront.Unauthenticated:   "the caller could not be identified",
	idemfront.InvalidTenant:     "the server could not name the caller's key space",
	idemfront.StoreUnavailable:  "the idempotency store is unavailable; retry with the same key later",
	idemfront.RequestTooLarge:   "the request is larger than the server accepts",
	idemfront.ResponseTooLarge:  "the answer was too large to record; nothing was kept",
	idemfront.Cancelled:         "the call was cancelled",
	idemfront.LeaseLost:         "another execution took the call over; retry with the same key",
	idemfront.StepNotSaved:      "the call's progress could not be recorded; retry with the same key later",
	idemfront.Panicked:          "the handler failed",
	idemfront.ReplayFailed:      "the stored answer could not be rebuilt",
	idemfront.Closed:            "the server is stopping; retry with the same key",
	idemfront.Internal:          "internal error",
	idemfront.RequestUnreadable: "the request could not be read",
}

// DefaultStoredCodes are the handler's error statuses stored and replayed
// as the operation's answer: deterministic refusals that a retry of the
// same request would get again. Every other status (UNAVAILABLE,
// DEADLINE_EXCEEDED, CANCELED, RESOURCE_EXHAUSTED, ABORTED, INTERNAL,
// UNKNOWN, UNAUTHENTICATED, UNIMPLEMENTED, DATA_LOSS) says the operation
// did not complete or may complete on a retry: sent, never stored, the
// handler's writes rolled back, the key released.
var DefaultStoredCodes = []uint32{InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, PermissionDenied, OutOfRange}

// Defaults of Options.
const (
	// DefaultWaitInFlight bounds the wait for the execution in flight
	// when the caller set no deadline.
	DefaultWaitInFlight = 10 * time.Second
	// DefaultMaxResponseBytes bounds a stored answer.
	DefaultMaxResponseBytes = 1 << 20
	// waitMargin is kept before the caller's deadline, so that a
	// duplicate's wait ends with UNAVAILABLE and RetryInfo the caller
	// can still read, not with its own DEADLINE_EXCEEDED.
	waitMargin = 50 * time.Millisecond
)

// Options configure a Core; idemgrpc.Config and idemconnect.Config
// document each field.
type Options struct {
	TenantFunc       func(ctx context.Context) (string, error)
	SharedKeySpace   bool
	RequireKey       bool
	WaitInFlight     time.Duration
	RetryAfter       time.Duration
	StoredCodes      []uint32
	ReplayMetadata   []string
	MaxRequestBytes  int
	MaxResponseBytes int
	Shutdown         context.Context
	Logger           *slog.Logger
	// TenantPerCall: every Call names its tenant (Call.Tenant).
	TenantPerCall bool
	// Front names the front end in logs ("idemgrpc"); Protocol in traces
	// ("grpc", "connect").
	Front, Protocol string
}

// Core serves calls for a front end. Safe for concurrent use.
type Core struct {
	engine  *idem.Engine
	front   *idemfront.Front
	opts    Options
	headers *idemfront.Headers
	stored  map[uint32]bool
	tracer  idemfront.RequestTracer
	skip    Skipper
}

// New returns the core over engine.
func New(engine *idem.Engine, opts Options) (*Core, error) {
	if opts.TenantFunc == nil && !opts.SharedKeySpace && !opts.TenantPerCall {
		return nil, errors.New(opts.Front + ": TenantFunc is required (or SharedKeySpace for a service with one caller)")
	}
	front, err := idemfront.NewFront(engine, &idemfront.Config{RetryAfter: opts.RetryAfter})
	if err != nil {
		return nil, err
	}
	headers, err := idemfront.NewHeaders(opts.ReplayMetadata, []string{
		MetadataReplayed, MetadataPushback, MetadataKey, "set-cookie", "date",
		"content-type", "content-length", "grpc-status", "grpc-message", "grpc-status-details-bin",
	})
	if err != nil {
		return nil, err
	}
	if opts.WaitInFlight == 0 {
		opts.WaitInFlight = DefaultWaitInFlight
	}
	if opts.MaxResponseBytes <= 0 {
		opts.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	stored := opts.StoredCodes
	if stored == nil {
		stored = DefaultStoredCodes
	}
	c := &Core{engine: engine, front: front, opts: opts, headers: headers, stored: map[uint32]bool{}}
	for _, code := range stored {
		if code == OK {
			continue
		}
		c.stored[code] = true
	}
	c.tracer = idemfront.RequestTracerOf(engine.Config().Tracer)
	return c, nil
}

// Protected reports whether calls of procedure ("/pkg.Service/Method")
// go through the engine: not when the method's idempotency_level is
// NO_SIDE_EFFECTS in the protobuf registry (a read that needs no key).
func (c *Core) Protected(procedure string) bool {
	return c.skip.Protected(procedure)
}

func noSideEffects(procedure string) bool {
	if len(procedure) < 2 || procedure[0] != '/' {
		return false
	}
	name := procedure[1:]
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '/' {
			name = name[:i] + "." + name[i+1:]
			break
		}
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
	if err != nil {
		return false
	}
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return false
	}
	opts, ok := md.Options().(*descriptorpb.MethodOptions)
	return ok && opts.GetIdempotencyLevel() == descriptorpb.MethodOptions_NO_SIDE_EFFECTS
}

// Skipper reports which procedures a client gives a key, caching the
// registry's answer. The zero value is ready.
type Skipper struct{ skip sync.Map }

// Protected reports whether procedure's idempotency_level is not
// NO_SIDE_EFFECTS.
func (s *Skipper) Protected(procedure string) bool {
	if v, ok := s.skip.Load(procedure); ok {
		return !v.(bool)
	}
	skip := noSideEffects(procedure)
	s.skip.Store(procedure, skip)
	return !skip
}

// Reply is an answer: the handler's, or the front end's own.
type Reply struct {
	// Message is the response, when Status is nil.
	Message proto.Message
	// Status is the error status (its code is not OK), nil for a
	// response.
	Status *spb.Status
	// Header and Trailer are the metadata sent with the answer.
	Header, Trailer map[string][]string
	// Fresh: this is the handler's own answer, as Handler returned it
	// (executed, not stored, or passed through): a front end may send
	// what its handler returned instead of rebuilding it.
	Fresh bool
}

// Handler runs the protected method on ctx and returns its answer, with
// the header and trailer metadata it set.
type Handler func(ctx context.Context) Reply

// Call is one call the front end serves.
type Call struct {
	Procedure string
	Request   proto.Message
	// Keys are the values of the key's field (nil: none); KeyErr a
	// failure of the configured key function, answered INVALID_ARGUMENT.
	Keys   []string
	KeyErr error
	// Tenant, when set, names the caller instead of Options.TenantFunc
	// (for a protocol whose request carries what its context does not).
	Tenant func(ctx context.Context) (string, error)
}

// Serve runs call through the engine (or, without a key, straight
// through when none is required), on a context its caller's going away
// does not cancel, and returns what to answer.
func (c *Core) Serve(caller context.Context, call Call, h Handler) Reply {
	if c.tracer == nil {
		r, _ := c.serve(caller, call, h, nil)
		return r
	}
	ctx := c.tracer.TraceRequestStart(caller, idemfront.TraceRequestStartData{Method: "POST", Route: call.Procedure, Protocol: c.opts.Protocol})
	var t trace
	r, kind := c.serve(ctx, call, h, &t)
	code := OK
	if r.Status != nil {
		code = uint32(r.Status.Code)
	}
	c.tracer.TraceRequestEnd(ctx, idemfront.TraceRequestEndData{
		Method: "POST", Route: call.Procedure, Protocol: c.opts.Protocol,
		Kind: kind, Status: int(code), Execution: t.execution, Err: t.err,
	})
	return r
}

type trace struct {
	execution time.Duration
	err       error
}

func (c *Core) serve(caller context.Context, call Call, h Handler, t *trace) (Reply, idemfront.Kind) {
	if call.KeyErr != nil {
		return c.refuse(idemfront.InvalidKey, call.KeyErr), idemfront.InvalidKey
	}
	key, err := idemfront.OneKey(call.Keys)
	if err != nil {
		return c.refuse(idemfront.InvalidKey, err), idemfront.InvalidKey
	}
	if key == "" {
		if c.opts.RequireKey {
			return c.refuse(idemfront.KeyRequired, nil), idemfront.KeyRequired
		}
		r := h(caller)
		r.Fresh = true
		return r, idemfront.Passthrough
	}
	tenant := ""
	if !c.opts.SharedKeySpace {
		tenantFunc := c.opts.TenantFunc
		if call.Tenant != nil {
			tenantFunc = call.Tenant
		}
		tenant, err = tenantFunc(caller)
		if err != nil {
			return c.refuse(idemfront.Unauthenticated, err), idemfront.Unauthenticated
		}
		if err := idemfront.ValidateTenant(tenant); err != nil {
			a := c.front.Refuse(idemfront.InvalidTenant, err)
			a.Log(caller, c.opts.Logger, c.opts.Front, key)
			return c.answer(a), idemfront.InvalidTenant
		}
	}
	if c.opts.MaxRequestBytes > 0 && call.Request != nil && proto.Size(call.Request) > c.opts.MaxRequestBytes {
		return c.refuse(idemfront.RequestTooLarge, nil), idemfront.RequestTooLarge
	}
	op := idem.Operation{
		Tenant: tenant, Key: key,
		Fingerprint: Fingerprint(call.Procedure, call.Request),
		WaitContext: caller,
	}
	if c.opts.WaitInFlight > 0 {
		op.WaitInFlight = c.opts.WaitInFlight
		if d, ok := caller.Deadline(); ok {
			if until := time.Until(d) - waitMargin; until < op.WaitInFlight {
				op.WaitInFlight = max(until, 0)
			}
		}
	}
	ctx, stop := idemfront.Detach(caller, c.opts.Shutdown)
	defer stop()
	ran := false
	var fresh Reply
	var started time.Time
	out, err := c.engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		ran = true
		started = time.Now()
		fresh = h(ctx)
		return c.result(ctx, fresh)
	})
	if t != nil {
		if ran {
			t.execution = time.Since(started)
		}
		t.err = err
	}
	if err != nil {
		a := c.front.Classify(err, idemfront.State{Ran: ran, Ctx: ctx, CallerCtx: caller})
		a.Log(caller, c.opts.Logger, c.opts.Front, key)
		return c.answer(a), a.Kind
	}
	fresh.Fresh = true
	switch {
	case out.NotStored:
		return fresh, idemfront.NotStored
	case !out.Replayed:
		return fresh, idemfront.Executed
	}
	r, err := c.replay(out.Result)
	if err != nil {
		a := c.front.Refuse(idemfront.ReplayFailed, err)
		c.opts.Logger.LogAttrs(caller, slog.LevelError, c.opts.Front+": stored answer could not be rebuilt", slog.String("key", key), slog.Any("error", err))
		return c.answer(a), idemfront.ReplayFailed
	}
	return r, idemfront.Replayed
}

// trailerPrefix files a trailer in the stored metadata: '~' is a token
// character no gRPC metadata key holds, so a trailer never collides with
// a header of the same name.
const trailerPrefix = "~"

// result makes the handler's answer the stored result, or marks it not
// stored.
func (c *Core) result(ctx context.Context, r Reply) (idem.Result, error) {
	var inner proto.Message = r.Message
	code := OK
	if r.Status != nil && r.Status.Code != 0 {
		code = uint32(r.Status.Code)
		if !c.stored[code] {
			idem.NotExecuted(ctx)
			return idem.Result{Mode: idem.ModeResponse, Status: int(code)}, nil
		}
		inner = r.Status
	}
	if inner == nil {
		// A handler answering a nil message: nothing to replay from.
		return idem.Result{}, errors.New("idemrpc: the handler returned neither a message nor an error")
	}
	packed, err := anypb.New(inner)
	if err != nil {
		return idem.Result{}, err
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(packed)
	if err != nil {
		return idem.Result{}, err
	}
	if len(body) > c.opts.MaxResponseBytes {
		return idem.Result{}, idemfront.ErrResponseTooLarge
	}
	res := idem.Result{Mode: idem.ModeResponse, Status: int(code), Body: body}
	c.keep(&res, r.Header, "")
	c.keep(&res, r.Trailer, trailerPrefix)
	return res, nil
}

// keep files the allowlisted metadata of md in res.Header. Binary
// metadata ("-bin") is stored as base64, the way gRPC sends it.
func (c *Core) keep(res *idem.Result, md map[string][]string, prefix string) {
	for name, values := range md {
		if !c.headers.Stored(name) || len(values) == 0 {
			continue
		}
		if res.Header == nil {
			res.Header = map[string][]string{}
		}
		res.Header[prefix+lower(name)] = append([]string(nil), values...)
	}
}

// replay rebuilds a stored answer.
func (c *Core) replay(res idem.Result) (Reply, error) {
	var packed anypb.Any
	if err := proto.Unmarshal(res.Body, &packed); err != nil {
		return Reply{}, fmt.Errorf("stored answer: %w", err)
	}
	inner, err := packed.UnmarshalNew()
	if err != nil {
		return Reply{}, fmt.Errorf("stored answer of type %q: %w", packed.GetTypeUrl(), err)
	}
	r := Reply{Header: map[string][]string{MetadataReplayed: {"true"}}}
	if res.Status != int(OK) {
		st, ok := inner.(*spb.Status)
		if !ok || uint32(st.Code) != uint32(res.Status) {
			return Reply{}, fmt.Errorf("stored status %d holds a %s", res.Status, packed.GetTypeUrl())
		}
		r.Status = st
	} else {
		r.Message = inner
	}
	for name, values := range res.Header {
		into := r.Header
		if len(name) > len(trailerPrefix) && name[:len(trailerPrefix)] == trailerPrefix {
			name = name[len(trailerPrefix):]
			if r.Trailer == nil {
				r.Trailer = map[string][]string{}
			}
			into = r.Trailer
		}
		if !c.headers.Replayable(name) {
			continue
		}
		into[name] = values
	}
	return r, nil
}

// refuse answers a call refused before the engine saw it.
func (c *Core) refuse(k idemfront.Kind, err error) Reply {
	return c.answer(c.front.Refuse(k, err))
}

// answer tells a from the front end in gRPC's words: its code, an
// ErrorInfo with its reason, RetryInfo and the pushback trailer when it
// advises to retry later.
func (c *Core) answer(a idemfront.Answer) Reply {
	info := &errdetails.ErrorInfo{Reason: reasons[a.Kind], Domain: ErrorDomain}
	if a.Ran {
		info.Metadata = map[string]string{"handler_ran": "true", "undone": strconv.FormatBool(a.Undone)}
	}
	st := &spb.Status{Code: int32(Code(a.Kind)), Message: messages[a.Kind]}
	if st.Message == "" {
		st.Message = a.Kind.String()
	}
	details := []proto.Message{info}
	var trailer map[string][]string
	if a.Retry == idemfront.RetryLater && a.RetryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(a.RetryAfter)})
		trailer = map[string][]string{MetadataPushback: {strconv.FormatInt(a.RetryAfter.Milliseconds(), 10)}}
	}
	for _, d := range details {
		if packed, err := anypb.New(d); err == nil {
			st.Details = append(st.Details, packed)
		}
	}
	return Reply{Status: st, Trailer: trailer}
}

// Explain reads the front end's own answer back from a status: its kind
// and advised delay (ok false for a status of the handler's).
func Explain(st *spb.Status) (kind idemfront.Kind, retryAfter time.Duration, ok bool) {
	for _, d := range st.GetDetails() {
		m, err := d.UnmarshalNew()
		if err != nil {
			continue
		}
		switch m := m.(type) {
		case *errdetails.ErrorInfo:
			if m.GetDomain() == ErrorDomain {
				kind, ok = KindOfReason(m.GetReason())
			}
		case *errdetails.RetryInfo:
			retryAfter = m.GetRetryDelay().AsDuration()
		}
	}
	return kind, retryAfter, ok
}

func lower(s string) string {
	b := []byte(s)
	for i, ch := range b {
		if 'A' <= ch && ch <= 'Z' {
			b[i] = ch + 'a' - 'A'
		}
	}
	return string(b)
}
