package idemconnect

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc/idemrpc"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// HeaderKey is the header carrying a call's key; HeaderReplayed marks a
// replay.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// Config configures the interceptor. Only TenantFunc is required (or
// SharedKeySpace). The fields mean what idemgrpc.Config's do.
type Config struct {
	// TenantFunc names the caller from the request's context and
	// headers, after authentication. An error answers UNAUTHENTICATED.
	TenantFunc func(ctx context.Context, header http.Header) (string, error)
	// SharedKeySpace: every caller shares one key space.
	SharedKeySpace bool
	// KeyFunc, when set, reads the key from the request message
	// (AIP-155's request_id) instead of the Idempotency-Key header.
	KeyFunc func(ctx context.Context, procedure string, req any) (string, error)
	// RequireKey answers a call without a key INVALID_ARGUMENT.
	RequireKey bool
	// Procedures, when set, says which procedures are protected; by
	// default every unary one but those marked NO_SIDE_EFFECTS.
	Procedures func(procedure string) bool
	// WaitInFlight bounds a duplicate's wait for the execution in flight
	// (within the caller's deadline); zero means
	// idemrpc.DefaultWaitInFlight, negative answers at once.
	WaitInFlight time.Duration
	// RetryAfter is the delay advised with UNAVAILABLE; defaults to 1s.
	RetryAfter time.Duration
	// StoredCodes are the handler's error codes stored as its answer;
	// nil means the deterministic ones (idemrpc.DefaultStoredCodes).
	StoredCodes []connect.Code
	// ReplayHeaders lists the response headers and trailers stored and
	// replayed with the answer; none by default.
	ReplayHeaders []string
	// MaxRequestBytes and MaxResponseBytes bound the request message
	// (proto.Size) and the stored answer.
	MaxRequestBytes, MaxResponseBytes int
	// Shutdown ends the handlers still running once the server stops.
	Shutdown context.Context
	// Logger; nil uses slog.Default.
	Logger *slog.Logger
}

// Interceptor is the connect.Interceptor; build it with New.
type Interceptor struct {
	core   *idemrpc.Core
	cfg    Config
	tenant func(ctx context.Context, header http.Header) (string, error)
}

var _ connect.Interceptor = (*Interceptor)(nil)

// New returns the interceptor over engine.
func New(engine *idem.Engine, cfg *Config) (*Interceptor, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	if cfg.TenantFunc == nil && !cfg.SharedKeySpace {
		return nil, errors.New("idemconnect: TenantFunc is required (or SharedKeySpace for a service with one caller)")
	}
	opts := idemrpc.Options{
		SharedKeySpace: cfg.SharedKeySpace, TenantPerCall: true, RequireKey: cfg.RequireKey,
		WaitInFlight: cfg.WaitInFlight, RetryAfter: cfg.RetryAfter, ReplayMetadata: cfg.ReplayHeaders,
		MaxRequestBytes: cfg.MaxRequestBytes, MaxResponseBytes: cfg.MaxResponseBytes,
		Shutdown: cfg.Shutdown, Logger: cfg.Logger, Front: "idemconnect", Protocol: "connect",
	}
	if cfg.StoredCodes != nil {
		opts.StoredCodes = []uint32{}
		for _, c := range cfg.StoredCodes {
			opts.StoredCodes = append(opts.StoredCodes, uint32(c))
		}
	}
	core, err := idemrpc.New(engine, opts)
	if err != nil {
		return nil, err
	}
	return &Interceptor{core: core, cfg: *cfg, tenant: cfg.TenantFunc}, nil
}

// NewInterceptor is New, panicking on a configuration error.
func NewInterceptor(engine *idem.Engine, cfg *Config) *Interceptor {
	in, err := New(engine, cfg)
	if err != nil {
		panic(err)
	}
	return in
}

// WrapStreamingClient passes streams through.
func (in *Interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler passes streams through: a stream has no one
// answer to store.
func (in *Interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// WrapUnary protects the unary procedures of a handler (a client's
// calls pass through).
func (in *Interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		procedure := req.Spec().Procedure
		if req.Spec().IsClient || req.Spec().StreamType != connect.StreamTypeUnary {
			return next(ctx, req)
		}
		if in.cfg.Procedures != nil {
			if !in.cfg.Procedures(procedure) {
				return next(ctx, req)
			}
		} else if !in.core.Protected(procedure) {
			return next(ctx, req)
		}
		msg, _ := req.Any().(proto.Message)
		call := idemrpc.Call{Procedure: procedure, Request: msg}
		if in.cfg.KeyFunc != nil {
			key, err := in.cfg.KeyFunc(ctx, procedure, req.Any())
			call.KeyErr = err
			if key != "" {
				call.Keys = []string{key}
			}
		} else {
			call.Keys = req.Header().Values(HeaderKey)
		}
		if in.tenant != nil {
			call.Tenant = func(ctx context.Context) (string, error) { return in.tenant(ctx, req.Header()) }
		}
		var freshResp connect.AnyResponse
		var freshErr error
		r := in.core.Serve(ctx, call, func(ctx context.Context) idemrpc.Reply {
			freshResp, freshErr = next(ctx, req)
			return reply(freshResp, freshErr)
		})
		if r.Fresh {
			return freshResp, freshErr
		}
		return build(r)
	}
}

// reply reads the handler's answer in the core's words.
func reply(resp connect.AnyResponse, err error) idemrpc.Reply {
	if err != nil {
		var ce *connect.Error
		if !errors.As(err, &ce) {
			ce = connect.NewError(connect.CodeOf(err), err)
		}
		st := &spb.Status{Code: int32(ce.Code()), Message: ce.Message()}
		for _, d := range ce.Details() {
			st.Details = append(st.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
		}
		return idemrpc.Reply{Status: st, Header: ce.Meta()}
	}
	if resp == nil {
		return idemrpc.Reply{}
	}
	m, _ := resp.Any().(proto.Message)
	return idemrpc.Reply{Message: m, Header: resp.Header(), Trailer: resp.Trailer()}
}

// replayedMessage carries a stored message as a response: Connect's
// codecs marshal any proto.Message, and the handler's concrete response
// type cannot be named from an interceptor.
type replayedMessage struct{ proto.Message }

// build makes a reply a response or an error.
func build(r idemrpc.Reply) (connect.AnyResponse, error) {
	if r.Status != nil {
		ce := connect.NewError(connect.Code(r.Status.GetCode()), errors.New(r.Status.GetMessage()))
		for _, d := range r.Status.GetDetails() {
			m, err := d.UnmarshalNew()
			if err != nil {
				continue // a detail of a type this program does not know
			}
			if detail, err := connect.NewErrorDetail(m); err == nil {
				ce.AddDetail(detail)
			}
		}
		for k, vs := range r.Header {
			ce.Meta()[http.CanonicalHeaderKey(k)] = vs
		}
		for k, vs := range r.Trailer {
			ce.Meta()[http.CanonicalHeaderKey(k)] = vs
		}
		return nil, ce
	}
	resp := connect.NewResponse(&replayedMessage{r.Message})
	for k, vs := range r.Header {
		resp.Header()[http.CanonicalHeaderKey(k)] = vs
	}
	for k, vs := range r.Trailer {
		resp.Trailer()[http.CanonicalHeaderKey(k)] = vs
	}
	return resp, nil
}
