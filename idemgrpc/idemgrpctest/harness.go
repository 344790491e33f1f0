// Package idemgrpctest runs the front-end conformance suite
// (idemfronttest) against idemgrpc, over a real grpc-go server and
// client on loopback TCP:
//
//	func TestConformance(t *testing.T) {
//		idemfronttest.Exercise(t, idemgrpctest.Harness{}, idemgrpctest.Features, nil)
//	}
//
// The suite's handler is served as the unary method Method, whose
// request and response are google.protobuf.BytesValue; Decode reads an
// answer back in the kit's words, for a harness of another RPC front end
// (idemconnect's).
package idemgrpctest

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemgrpc/idemrpc"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Method is the full name of the suite's method.
const Method = "/idemgrpctest.Suite/Call"

// Features is what idemgrpc cannot do for the suite: a handler that ends
// its goroutine (runtime.Goexit) leaves grpc-go's stream unfinished, so
// the call is never answered and the case would hang.
var Features = idemfronttest.Features{NoGoexit: true}

// The metadata carrying the suite's tenant (binary, so that any byte
// reaches the tenant rule) and the call's name (so that Send knows when
// the server saw the call end).
const (
	MetadataTenant = "idemfronttest-tenant-bin"
	metadataCall   = "idemfronttest-call"
)

// Harness is idemfronttest.Harness for idemgrpc.
type Harness struct {
	// Config is the interceptor's base configuration; Serve sets
	// TenantFunc, WaitInFlight, the limits and a discarding Logger.
	Config idemgrpc.Config
}

// TenantFromMetadata is the suite's tenant rule: the tenant the call's
// MetadataTenant names.
func TenantFromMetadata(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(MetadataTenant)
	if len(v) != 1 {
		return "", errors.New("idemgrpctest: no tenant")
	}
	return v[0], nil
}

// RequestBytes and ResponseBytes translate the suite's limits, on the
// body, into idemgrpc's: the size of the request message, and of the
// stored answer.
func RequestBytes(body int64) int {
	return proto.Size(wrapperspb.Bytes(make([]byte, body)))
}

// ResponseBytes: see RequestBytes.
func ResponseBytes(body int64) int {
	a, _ := anypb.New(wrapperspb.Bytes(make([]byte, body)))
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(a)
	return len(b)
}

// Handle runs the suite's handler on a request, answering as the suite's
// method does: the body in a BytesValue; a refusal as INVALID_ARGUMENT,
// a transient failure as UNAVAILABLE, each carrying the body as a
// BytesValue detail.
func Handle(ctx context.Context, handler idemfronttest.Handler, req *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
	r := handler(ctx, req.GetValue())
	code := codes.OK
	switch {
	case r.Transient:
		code = codes.Unavailable
	case r.Rejected:
		code = codes.InvalidArgument
	}
	if code == codes.OK {
		return wrapperspb.Bytes(r.Body), nil
	}
	st, err := status.New(code, "idemgrpctest: the handler's answer").WithDetails(wrapperspb.Bytes(r.Body))
	if err != nil {
		return nil, err
	}
	return nil, st.Err()
}

// Serve implements idemfronttest.Harness.
func (h Harness) Serve(t *testing.T, engine *idem.Engine, opts idemfronttest.Options, handler idemfronttest.Handler) idemfronttest.Client {
	t.Helper()
	cfg := h.Config
	cfg.TenantFunc = TenantFromMetadata
	cfg.SharedKeySpace = false
	cfg.WaitInFlight = opts.WaitInFlight
	if opts.WaitInFlight == 0 {
		cfg.WaitInFlight = -1
	}
	if opts.MaxRequestBody > 0 {
		cfg.MaxRequestBytes = RequestBytes(opts.MaxRequestBody)
	}
	if opts.MaxResponseBody > 0 {
		cfg.MaxResponseBytes = ResponseBytes(opts.MaxResponseBody)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	in, err := idemgrpc.New(engine, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &client{ended: map[string]chan struct{}{}}
	watch := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get(metadataCall); len(v) == 1 {
			if ch := c.endedChan(v[0]); ch != nil {
				context.AfterFunc(ctx, func() { close(ch) })
			}
		}
		return next(ctx, req)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(watch, in.UnaryServerInterceptor()))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "idemgrpctest.Suite",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Call",
			Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
				req := new(wrapperspb.BytesValue)
				if err := dec(req); err != nil {
					return nil, err
				}
				run := func(ctx context.Context, req any) (any, error) {
					return Handle(ctx, handler, req.(*wrapperspb.BytesValue))
				}
				return icpt(ctx, req, &grpc.UnaryServerInfo{FullMethod: Method}, run)
			},
		}},
	}, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	c.conn = conn
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
	})
	return c
}

type client struct {
	conn  *grpc.ClientConn
	next  atomic.Int64
	mu    sync.Mutex
	ended map[string]chan struct{}
}

func (c *client) endedChan(id string) chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended[id]
}

// Send implements idemfronttest.Client.
func (c *client) Send(ctx context.Context, call idemfronttest.Call) (idemfronttest.Reply, error) {
	id := strconv.FormatInt(c.next.Add(1), 10)
	ended := make(chan struct{})
	c.mu.Lock()
	c.ended[id] = ended
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.ended, id)
		c.mu.Unlock()
	}()
	ctx = metadata.AppendToOutgoingContext(ctx, MetadataTenant, call.Tenant, metadataCall, id)
	if call.Key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, call.Key)
	}
	var header, trailer metadata.MD
	resp := new(wrapperspb.BytesValue)
	err := c.conn.Invoke(ctx, Method, wrapperspb.Bytes(call.Body), resp, grpc.Header(&header), grpc.Trailer(&trailer))
	if ctx.Err() != nil {
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
		}
		return idemfronttest.Reply{}, ctx.Err()
	}
	var st *spb.Status
	if err != nil {
		s, ok := status.FromError(err)
		if !ok {
			return idemfronttest.Reply{}, err
		}
		st = s.Proto()
	}
	return Decode(st, resp, len(header.Get(idemgrpc.MetadataReplayed)) == 1 && header.Get(idemgrpc.MetadataReplayed)[0] == "true"), nil
}

// Decode reads an answer back as a Reply: st, the status (nil for a
// response resp), and whether the answer was marked replayed.
func Decode(st *spb.Status, resp *wrapperspb.BytesValue, replayed bool) idemfronttest.Reply {
	kind := idemfront.Executed
	if replayed {
		kind = idemfront.Replayed
	}
	if st == nil || st.GetCode() == 0 {
		return idemfronttest.Reply{Kind: kind, Body: resp.GetValue()}
	}
	if k, after, ok := idemrpc.Explain(st); ok {
		return idemfronttest.Reply{Kind: k, RetryAfter: after}
	}
	r := idemfronttest.Reply{Kind: kind}
	for _, d := range st.GetDetails() {
		var b wrapperspb.BytesValue
		if d.UnmarshalTo(&b) == nil {
			r.Body = b.GetValue()
		}
	}
	switch codes.Code(st.GetCode()) {
	case codes.InvalidArgument:
		r.Rejected = true
	case codes.Unavailable:
		r.Transient = true
	default:
		r.Kind = idemfront.Internal
		r.Body = []byte(codes.Code(st.GetCode()).String() + ": " + st.GetMessage())
	}
	return r
}
