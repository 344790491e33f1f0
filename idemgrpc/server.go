package idemgrpc

import (
	"context"
	"encoding/base64"
	"strings"
	"sync"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc/idemrpc"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Interceptor is the server side: build it once with New and install
// UnaryServerInterceptor after the interceptor that authenticates.
type Interceptor struct {
	core    *idemrpc.Core
	keyFunc func(ctx context.Context, fullMethod string, req any) (string, error)
	methods func(fullMethod string) bool
}

// New returns the server interceptor over engine.
func New(engine *idem.Engine, cfg *Config) (*Interceptor, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	opts := idemrpc.Options{
		TenantFunc: cfg.TenantFunc, SharedKeySpace: cfg.SharedKeySpace, RequireKey: cfg.RequireKey,
		WaitInFlight: cfg.WaitInFlight, RetryAfter: cfg.RetryAfter, ReplayMetadata: cfg.ReplayMetadata,
		MaxRequestBytes: cfg.MaxRequestBytes, MaxResponseBytes: cfg.MaxResponseBytes,
		Shutdown: cfg.Shutdown, Logger: cfg.Logger, Front: "idemgrpc", Protocol: "grpc",
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
	return &Interceptor{core: core, keyFunc: cfg.KeyFunc, methods: cfg.Methods}, nil
}

// UnaryServerInterceptor returns the interceptor of unary calls.
func (in *Interceptor) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return in.intercept
}

// UnaryServerInterceptor is New(engine, cfg).UnaryServerInterceptor(),
// panicking on a configuration error (a missing TenantFunc).
func UnaryServerInterceptor(engine *idem.Engine, cfg *Config) grpc.UnaryServerInterceptor {
	in, err := New(engine, cfg)
	if err != nil {
		panic(err)
	}
	return in.intercept
}

func (in *Interceptor) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if in.methods != nil {
		if !in.methods(info.FullMethod) {
			return handler(ctx, req)
		}
	} else if !in.core.Protected(info.FullMethod) {
		return handler(ctx, req)
	}
	msg, _ := req.(proto.Message)
	call := idemrpc.Call{Procedure: info.FullMethod, Request: msg}
	if in.keyFunc != nil {
		key, err := in.keyFunc(ctx, info.FullMethod, req)
		call.KeyErr = err
		if key != "" {
			call.Keys = []string{key}
		}
	} else {
		md, _ := metadata.FromIncomingContext(ctx)
		call.Keys = md.Get(MetadataKey)
	}
	var freshResp any
	var freshErr error
	r := in.core.Serve(ctx, call, func(ctx context.Context) idemrpc.Reply {
		rec := &recorder{method: info.FullMethod}
		resp, err := handler(grpc.NewContextWithServerTransportStream(ctx, rec), req)
		freshResp, freshErr = resp, err
		rec.mu.Lock()
		defer rec.mu.Unlock()
		out := idemrpc.Reply{Header: fromMD(rec.header), Trailer: fromMD(rec.trailer)}
		if err != nil {
			out.Status = status.Convert(err).Proto()
			if out.Status.GetCode() == 0 {
				// An error whose status says OK: grpc-go answers it
				// UNKNOWN.
				out.Status = &spb.Status{Code: int32(idemrpc.Unknown), Message: err.Error()}
			}
			return out
		}
		out.Message, _ = resp.(proto.Message)
		return out
	})
	if len(r.Header) > 0 {
		_ = grpc.SetHeader(ctx, toMD(r.Header))
	}
	if len(r.Trailer) > 0 {
		_ = grpc.SetTrailer(ctx, toMD(r.Trailer))
	}
	if r.Fresh {
		// The handler's own answer, as it returned it: an interceptor
		// outside this one sees its error unchanged (errors.Is).
		return freshResp, freshErr
	}
	if r.Status != nil {
		return nil, status.ErrorProto(r.Status)
	}
	return r.Message, nil
}

// recorder stands for the call's stream while the handler runs, so that
// the metadata it sets (grpc.SetHeader, SendHeader, SetTrailer) is
// recorded, stored through the allowlist, and sent once with the answer.
// SendHeader is deferred too: the headers of a replay must be the ones
// stored, and a handler that runs on after its caller left has no stream
// to send on.
type recorder struct {
	method          string
	mu              sync.Mutex
	header, trailer metadata.MD
}

func (r *recorder) Method() string { return r.method }

func (r *recorder) SetHeader(md metadata.MD) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.header = metadata.Join(r.header, md)
	return nil
}

func (r *recorder) SendHeader(md metadata.MD) error { return r.SetHeader(md) }

func (r *recorder) SetTrailer(md metadata.MD) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trailer = metadata.Join(r.trailer, md)
	return nil
}

// fromMD returns md as stored metadata: binary values ("-bin") in
// base64, as gRPC sends them, since a store keeps text.
func fromMD(md metadata.MD) map[string][]string {
	if len(md) == 0 {
		return nil
	}
	out := make(map[string][]string, len(md))
	for k, vs := range md {
		if strings.HasSuffix(k, "-bin") {
			enc := make([]string, len(vs))
			for i, v := range vs {
				enc[i] = base64.RawStdEncoding.EncodeToString([]byte(v))
			}
			vs = enc
		}
		out[k] = vs
	}
	return out
}

// toMD is fromMD's inverse.
func toMD(m map[string][]string) metadata.MD {
	md := metadata.MD{}
	for k, vs := range m {
		k = strings.ToLower(k)
		if strings.HasSuffix(k, "-bin") {
			for _, v := range vs {
				b, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(v, "="))
				if err == nil {
					md.Append(k, string(b))
				}
			}
			continue
		}
		md.Append(k, vs...)
	}
	return md
}
