package idemgrpc_test

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

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/internal/atonce"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

var quiet = slog.New(slog.DiscardHandler)

const (
	methodCreate = "/idemgrpc.test.Orders/Create"
	methodGet    = "/idemgrpc.test.Orders/Get"
)

// The test service's schema, registered so that the interceptors find
// Get's idempotency_level (NO_SIDE_EFFECTS).
func init() {
	bytesType := ".google.protobuf.BytesValue"
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name: proto.String("idemgrpc/test/orders.proto"), Package: proto.String("idemgrpc.test"), Syntax: proto.String("proto3"),
		Dependency: []string{"google/protobuf/wrappers.proto"},
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name: proto.String("Orders"),
			Method: []*descriptorpb.MethodDescriptorProto{
				{Name: proto.String("Create"), InputType: &bytesType, OutputType: &bytesType},
				{Name: proto.String("Get"), InputType: &bytesType, OutputType: &bytesType, Options: &descriptorpb.MethodOptions{
					IdempotencyLevel: descriptorpb.MethodOptions_NO_SIDE_EFFECTS.Enum(),
				}},
			},
		}},
	}, protoregistry.GlobalFiles)
	if err != nil {
		panic(err)
	}
	if err := protoregistry.GlobalFiles.RegisterFile(fd); err != nil {
		panic(err)
	}
}

// handlerFunc is a test method's body.
type handlerFunc func(ctx context.Context, req *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error)

// testServer is a real grpc-go server on loopback serving Create and Get
// with h behind the interceptor, counting the attempts it receives and
// the keys they carry.
type testServer struct {
	addr     string
	engine   *idem.Engine
	attempts atomic.Int64
	mu       sync.Mutex
	keys     []string
}

func (s *testServer) seenKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

func newServer(t *testing.T, store idem.Store, cfg idemgrpc.Config, h handlerFunc) *testServer {
	t.Helper()
	if store == nil {
		store = idemmem.NewStore(nil)
	}
	engine, err := idem.NewEngine(store, &idem.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TenantFunc == nil {
		cfg.TenantFunc = tenantOf
	}
	cfg.Logger = quiet
	in, err := idemgrpc.New(engine, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &testServer{engine: engine}
	count := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		s.attempts.Add(1)
		md, _ := metadata.FromIncomingContext(ctx)
		s.mu.Lock()
		s.keys = append(s.keys, md.Get(idemgrpc.MetadataKey)...)
		s.mu.Unlock()
		return next(ctx, req)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(count, in.UnaryServerInterceptor()))
	method := func(name, full string) grpc.MethodDesc {
		return grpc.MethodDesc{MethodName: name, Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			req := new(wrapperspb.BytesValue)
			if err := dec(req); err != nil {
				return nil, err
			}
			return icpt(ctx, req, &grpc.UnaryServerInfo{FullMethod: full}, func(ctx context.Context, req any) (any, error) {
				return h(ctx, req.(*wrapperspb.BytesValue))
			})
		}}
	}
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "idemgrpc.test.Orders", HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{method("Create", methodCreate), method("Get", methodGet)},
	}, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(func() {
		srv.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = engine.Close(ctx)
	})
	s.addr = lis.Addr().String()
	return s
}

func tenantOf(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) == 1 && len(v[0]) > len("Bearer ") && v[0][:7] == "Bearer " {
		return v[0][7:], nil
	}
	return "", errors.New("no bearer token")
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// as returns ctx calling as tenant with key ("" for none).
func as(ctx context.Context, tenant, key string) context.Context {
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tenant)
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
	}
	return ctx
}

type answer struct {
	body            string
	code            codes.Code
	header, trailer metadata.MD
	replayed        bool
	reason          string
	retryAfter      time.Duration
	err             error
}

func call(ctx context.Context, conn *grpc.ClientConn, method, body string) answer {
	var a answer
	resp := new(wrapperspb.BytesValue)
	a.err = conn.Invoke(ctx, method, wrapperspb.Bytes([]byte(body)), resp, grpc.Header(&a.header), grpc.Trailer(&a.trailer))
	a.body = string(resp.GetValue())
	st := status.Convert(a.err)
	a.code = st.Code()
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == idemgrpc.ErrorDomain {
				a.reason = d.GetReason()
			}
		case *errdetails.RetryInfo:
			a.retryAfter = d.GetRetryDelay().AsDuration()
		}
	}
	a.replayed = len(a.header.Get(idemgrpc.MetadataReplayed)) == 1 && a.header.Get(idemgrpc.MetadataReplayed)[0] == "true"
	return a
}

// Duplicates released at one barrier over real connections: one
// execution, every other copy the replay of its answer (the wait mode is
// on by default).
func TestDuplicatesAtOneBarrier(t *testing.T) {
	var runs atomic.Int64
	s := newServer(t, nil, idemgrpc.Config{}, func(ctx context.Context, req *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		n := runs.Add(1)
		time.Sleep(20 * time.Millisecond) // hold the key while the others arrive
		return wrapperspb.Bytes([]byte("order " + strconv.FormatInt(n, 10))), nil
	})
	const n = 8
	conns := make([]*grpc.ClientConn, n)
	for i := range conns {
		conns[i] = dial(t, s.addr)
	}
	answers := make([]answer, n)
	atonce.Run(n, func(i int) {
		answers[i] = call(as(t.Context(), "acme", "k1"), conns[i], methodCreate, "cart-1")
	})
	fresh := 0
	for i, a := range answers {
		if a.err != nil {
			t.Fatalf("copy %d: %v", i, a.err)
		}
		if a.body != "order 1" {
			t.Errorf("copy %d: body %q, want the one execution's", i, a.body)
		}
		if !a.replayed {
			fresh++
		}
	}
	if fresh != 1 || runs.Load() != 1 {
		t.Fatalf("%d answers without the replay marker, %d executions; want 1 and 1", fresh, runs.Load())
	}
}

// The answers of the interceptor's own, in gRPC's codes.
func TestAnswers(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	s := newServer(t, nil, idemgrpc.Config{WaitInFlight: -1, RetryAfter: 2 * time.Second}, func(ctx context.Context, req *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		switch string(req.GetValue()) {
		case "block":
			started <- struct{}{}
			<-release
		case "missing":
			return nil, status.Error(codes.NotFound, "no such cart")
		case "busy":
			return nil, status.Error(codes.Unavailable, "downstream busy")
		}
		return wrapperspb.Bytes(req.GetValue()), nil
	})
	conn := dial(t, s.addr)
	ctx := t.Context()

	if a := call(as(ctx, "acme", "k"), conn, methodCreate, "a"); a.err != nil || a.replayed {
		t.Fatalf("first call: %+v", a)
	}
	if a := call(as(ctx, "acme", "k"), conn, methodCreate, "other"); a.code != codes.FailedPrecondition || a.reason != "IDEMPOTENCY_KEY_REUSED" {
		t.Fatalf("another request under the key: %v %q, want FAILED_PRECONDITION IDEMPOTENCY_KEY_REUSED", a.code, a.reason)
	}
	if a := call(metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, "k"), conn, methodCreate, "a"); a.code != codes.Unauthenticated {
		t.Fatalf("no tenant: %v, want UNAUTHENTICATED", a.code)
	}
	if a := call(as(ctx, "acme", "has space"), conn, methodCreate, "a"); a.code != codes.InvalidArgument || a.reason != "IDEMPOTENCY_KEY_INVALID" {
		t.Fatalf("a malformed key: %v %q, want INVALID_ARGUMENT", a.code, a.reason)
	}
	two := metadata.AppendToOutgoingContext(as(ctx, "acme", "k2"), idemgrpc.MetadataKey, "k3")
	if a := call(two, conn, methodCreate, "a"); a.code != codes.InvalidArgument {
		t.Fatalf("two keys: %v, want INVALID_ARGUMENT", a.code)
	}

	// A deterministic error is stored; a transient one is not.
	for i := 0; i < 2; i++ {
		a := call(as(ctx, "acme", "nf"), conn, methodCreate, "missing")
		if a.code != codes.NotFound || a.replayed != (i == 1) {
			t.Fatalf("NOT_FOUND, call %d: %v replayed=%v", i, a.code, a.replayed)
		}
	}
	for i := 0; i < 2; i++ {
		a := call(as(ctx, "acme", "busy"), conn, methodCreate, "busy")
		if a.code != codes.Unavailable || a.replayed || a.reason != "" {
			t.Fatalf("UNAVAILABLE of the handler, call %d: %v replayed=%v reason %q: want it sent again, never stored", i, a.code, a.replayed, a.reason)
		}
	}

	// In flight: UNAVAILABLE with RetryInfo and the pushback trailer.
	done := make(chan answer, 1)
	go func() { done <- call(as(ctx, "acme", "slow"), conn, methodCreate, "block") }()
	<-started
	a := call(as(ctx, "acme", "slow"), conn, methodCreate, "block")
	close(release)
	if a.code != codes.Unavailable || a.reason != "IDEMPOTENCY_KEY_IN_FLIGHT" || a.retryAfter != 2*time.Second {
		t.Fatalf("in flight: %v %q RetryInfo %v, want UNAVAILABLE IDEMPOTENCY_KEY_IN_FLIGHT 2s", a.code, a.reason, a.retryAfter)
	}
	if got := a.trailer.Get(idemgrpc.MetadataPushback); len(got) != 1 || got[0] != "2000" {
		t.Fatalf("in flight: pushback trailer %q, want 2000", got)
	}
	if first := <-done; first.err != nil {
		t.Fatalf("the call in flight: %v", first.err)
	}
}

// Header and trailer metadata of the handler's: all of it with the fresh
// answer, the allowlisted part with a replay.
func TestReplayMetadataAllowlist(t *testing.T) {
	s := newServer(t, nil, idemgrpc.Config{ReplayMetadata: []string{"x-order-id", "X-Total", "x-sig-bin"}}, func(ctx context.Context, req *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-order-id", "o-1", "x-trace", "t-1"))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-total", "1200", "x-sig-bin", "\x00\xff"))
		return wrapperspb.Bytes([]byte("ok")), nil
	})
	conn := dial(t, s.addr)
	first := call(as(t.Context(), "acme", "k"), conn, methodCreate, "a")
	again := call(as(t.Context(), "acme", "k"), conn, methodCreate, "a")
	if first.err != nil || again.err != nil {
		t.Fatal(first.err, again.err)
	}
	if first.header.Get("x-trace")[0] != "t-1" || first.replayed {
		t.Fatalf("the fresh answer's header: %v", first.header)
	}
	if !again.replayed || len(again.header.Get("x-trace")) != 0 {
		t.Fatalf("the replay's header %v: want the marker and no x-trace", again.header)
	}
	for _, c := range []struct {
		md         metadata.MD
		name, want string
	}{{again.header, "x-order-id", "o-1"}, {again.trailer, "x-total", "1200"}, {again.trailer, "x-sig-bin", "\x00\xff"}} {
		if got := c.md.Get(c.name); len(got) != 1 || got[0] != c.want {
			t.Errorf("replayed %s = %q, want %q", c.name, got, c.want)
		}
	}
	if len(again.header.Get("x-total")) != 0 {
		t.Error("a trailer was replayed as a header")
	}
}

// Methods whose idempotency_level is NO_SIDE_EFFECTS pass through, and
// the client gives them no key.
func TestNoSideEffectsPassThrough(t *testing.T) {
	var runs atomic.Int64
	s := newServer(t, nil, idemgrpc.Config{}, func(ctx context.Context, req *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		runs.Add(1)
		return wrapperspb.Bytes([]byte("read")), nil
	})
	conn := dial(t, s.addr, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)))
	for range 2 {
		if a := call(as(t.Context(), "acme", "k"), conn, methodGet, "a"); a.err != nil || a.replayed {
			t.Fatalf("Get: %+v", a)
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("Get ran %d times, want 2: it is not protected", runs.Load())
	}
	call(as(t.Context(), "acme", ""), conn, methodGet, "a")
	call(as(t.Context(), "acme", ""), conn, methodCreate, "a")
	keys := s.seenKeys()
	if len(keys) != 3 || keys[0] != "k" || keys[1] != "k" {
		t.Fatalf("keys seen %q: want the two set by hand, none for Get, one for Create", keys)
	}
}

// downStore fails its first claims, as a store that cannot be reached.
type downStore struct {
	idem.Store
	fail atomic.Int64
}

func (s *downStore) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if s.fail.Add(-1) >= 0 {
		return idem.ClaimResult{}, idem.NotApplied(errors.New("store down"))
	}
	return s.Store.Claim(ctx, p)
}

// grpc-go's own retry policy (service config) on UNAVAILABLE: the store
// down, then an execution in flight. Each attempt carries the one key the
// client interceptor gave the call, and the handler runs once.
func TestGRPCRetryPolicy(t *testing.T) {
	const serviceConfig = `{"methodConfig": [{"name": [{"service": "idemgrpc.test.Orders"}], "retryPolicy": {
		"maxAttempts": 5, "initialBackoff": "0.01s", "maxBackoff": "0.05s", "backoffMultiplier": 2,
		"retryableStatusCodes": ["UNAVAILABLE"]}}]}`
	store := &downStore{Store: idemmem.NewStore(nil)}
	store.fail.Store(2)
	var runs atomic.Int64
	release := make(chan struct{})
	s := newServer(t, store, idemgrpc.Config{WaitInFlight: -1, RetryAfter: 20 * time.Millisecond}, func(ctx context.Context, req *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		runs.Add(1)
		if string(req.GetValue()) == "block" {
			<-release
		}
		return wrapperspb.Bytes([]byte("done")), nil
	})
	conn := dial(t, s.addr, grpc.WithDefaultServiceConfig(serviceConfig), grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)))

	a := call(as(t.Context(), "acme", ""), conn, methodCreate, "a")
	if a.err != nil || runs.Load() != 1 || s.attempts.Load() != 3 {
		t.Fatalf("store down twice: %v, %d runs, %d attempts; want an answer, 1 run, 3 attempts", a.err, runs.Load(), s.attempts.Load())
	}
	keys := s.seenKeys()
	if keys[0] == "" || keys[0] != keys[1] || keys[1] != keys[2] {
		t.Fatalf("attempts carried keys %q, want one key", keys)
	}

	// In flight: the duplicate's attempts are answered UNAVAILABLE with a
	// pushback, until the first execution answers and the retry gets
	// its replay.
	s.attempts.Store(0)
	first := make(chan answer, 1)
	go func() { first <- call(as(t.Context(), "acme", "slow"), conn, methodCreate, "block") }()
	for s.attempts.Load() < 1 || runs.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	dup := make(chan answer, 1)
	go func() { dup <- call(as(t.Context(), "acme", "slow"), conn, methodCreate, "block") }()
	for s.attempts.Load() < 3 { // the first, and two attempts of the duplicate
		time.Sleep(time.Millisecond)
	}
	close(release)
	if a := <-first; a.err != nil {
		t.Fatal(a.err)
	}
	d := <-dup
	if d.err != nil || !d.replayed || d.body != "done" {
		t.Fatalf("the retried duplicate: %+v, want the replay", d)
	}
	if runs.Load() != 2 {
		t.Fatalf("%d runs, want 2 (one per key)", runs.Load())
	}
}

// Hedged copies as gRFC A6 sends them: the same call and metadata at
// once, the losers cancelled once one answers. The execution running
// must not be cancelled with them, and no copy may get a fatal status
// (one outside UNAVAILABLE) that would cancel the others.
func TestHedgedCopies(t *testing.T) {
	for _, wait := range []bool{true, false} {
		t.Run("wait="+strconv.FormatBool(wait), func(t *testing.T) {
			var runs atomic.Int64
			var handlerCancelled atomic.Bool
			cfg := idemgrpc.Config{}
			if !wait {
				cfg.WaitInFlight = -1
			}
			s := newServer(t, nil, cfg, func(ctx context.Context, req *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
				runs.Add(1)
				time.Sleep(30 * time.Millisecond)
				handlerCancelled.Store(ctx.Err() != nil)
				return wrapperspb.Bytes([]byte("paid")), nil
			})
			conn := dial(t, s.addr)
			const copies = 3
			callCtx := as(t.Context(), "acme", "hedged")
			ctxs := make([]context.Context, copies)
			cancels := make([]context.CancelFunc, copies)
			for i := range ctxs {
				ctxs[i], cancels[i] = context.WithCancel(callCtx)
			}
			answers := make([]answer, copies)
			var once sync.Once
			winner := -1
			atonce.Run(copies, func(i int) {
				answers[i] = call(ctxs[i], conn, methodCreate, "charge")
				if answers[i].err == nil {
					once.Do(func() {
						winner = i
						for j, c := range cancels {
							if j != i {
								c()
							}
						}
					})
				}
			})
			for _, c := range cancels {
				c()
			}
			if winner < 0 {
				t.Fatalf("no copy got an answer: %+v", answers)
			}
			for i, a := range answers {
				if a.err != nil && a.code != codes.Unavailable && a.code != codes.Canceled {
					t.Errorf("copy %d: %v, a fatal status that would cancel the running copy", i, a.code)
				}
			}
			if answers[winner].body != "paid" || runs.Load() != 1 || handlerCancelled.Load() {
				t.Fatalf("winner %+v, %d runs, handler cancelled %v", answers[winner], runs.Load(), handlerCancelled.Load())
			}
			again := call(callCtx, conn, methodCreate, "charge")
			if again.err != nil && again.code == codes.Unavailable {
				time.Sleep(50 * time.Millisecond)
				again = call(callCtx, conn, methodCreate, "charge")
			}
			if again.err != nil || !again.replayed || runs.Load() != 1 {
				t.Fatalf("a later copy: %+v, %d runs; want the replay", again, runs.Load())
			}
		})
	}
}

// go-grpc-middleware's retry interceptor after idemgrpc's in the chain
// keeps the call's key across attempts; before it, every attempt gets a
// key of its own, and the handler runs for each.
func TestMiddlewareRetryOrder(t *testing.T) {
	for _, keyFirst := range []bool{true, false} {
		t.Run("keyFirst="+strconv.FormatBool(keyFirst), func(t *testing.T) {
			var runs atomic.Int64
			s := newServer(t, nil, idemgrpc.Config{}, func(ctx context.Context, req *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
				if runs.Add(1) == 1 {
					return nil, status.Error(codes.Unavailable, "warming up")
				}
				return wrapperspb.Bytes([]byte("ok")), nil
			})
			key := idemgrpc.UnaryClientInterceptor(nil)
			retrying := retry.UnaryClientInterceptor(retry.WithCodes(codes.Unavailable), retry.WithMax(3), retry.WithBackoff(retry.BackoffLinear(time.Millisecond)))
			chain := []grpc.UnaryClientInterceptor{key, retrying}
			if !keyFirst {
				chain = []grpc.UnaryClientInterceptor{retrying, key}
			}
			conn := dial(t, s.addr, grpc.WithChainUnaryInterceptor(chain...))
			if a := call(as(t.Context(), "acme", ""), conn, methodCreate, "a"); a.err != nil {
				t.Fatal(a.err)
			}
			keys := s.seenKeys()
			if len(keys) != 2 {
				t.Fatalf("keys %q, want two attempts", keys)
			}
			if same := keys[0] == keys[1]; same != keyFirst {
				t.Fatalf("keys %q: one key across attempts = %v, want %v", keys, same, keyFirst)
			}
		})
	}
}

// Config.KeyFunc reads the key from the request (AIP-155's request_id
// style) instead of the metadata: here the request's first byte names it.
func TestKeyFromTheRequest(t *testing.T) {
	var runs atomic.Int64
	s := newServer(t, nil, idemgrpc.Config{KeyFunc: func(_ context.Context, method string, req any) (string, error) {
		v := req.(*wrapperspb.BytesValue).GetValue()
		if len(v) == 0 {
			return "", nil
		}
		if v[0] == '!' {
			return "", errors.New("request_id is not a UUID")
		}
		return "req-" + string(v[:1]), nil
	}}, func(ctx context.Context, req *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		return wrapperspb.Bytes([]byte(strconv.FormatInt(runs.Add(1), 10))), nil
	})
	conn := dial(t, s.addr)
	ctx := as(t.Context(), "acme", "")
	first, again := call(ctx, conn, methodCreate, "a1"), call(ctx, conn, methodCreate, "a1")
	if first.err != nil || again.err != nil || !again.replayed || again.body != first.body {
		t.Fatalf("two calls with one request_id: %+v then %+v, want the replay", first, again)
	}
	if a := call(ctx, conn, methodCreate, "a2"); a.code != codes.FailedPrecondition {
		t.Fatalf("another request with the same request_id: %v, want FAILED_PRECONDITION", a.code)
	}
	if a := call(ctx, conn, methodCreate, "!x"); a.code != codes.InvalidArgument || a.reason != "IDEMPOTENCY_KEY_INVALID" {
		t.Fatalf("a KeyFunc error: %v %q, want INVALID_ARGUMENT", a.code, a.reason)
	}
	// The metadata key is ignored when KeyFunc decides.
	if a := call(as(t.Context(), "acme", "ignored"), conn, methodCreate, ""); a.err != nil || a.replayed {
		t.Fatalf("no request_id: %+v, want it run unprotected", a)
	}
	if runs.Load() != 2 {
		t.Fatalf("%d runs, want 2", runs.Load())
	}
}

// A handler's own error that is no status is UNKNOWN: sent, not stored.
func TestPlainErrorNotStored(t *testing.T) {
	var runs atomic.Int64
	s := newServer(t, nil, idemgrpc.Config{}, func(ctx context.Context, req *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		if runs.Add(1) == 1 {
			return nil, errors.New("database said no")
		}
		return wrapperspb.Bytes([]byte("ok")), nil
	})
	conn := dial(t, s.addr)
	if a := call(as(t.Context(), "acme", "k"), conn, methodCreate, "a"); a.code != codes.Unknown {
		t.Fatalf("a plain error: %v, want UNKNOWN", a.code)
	}
	if a := call(as(t.Context(), "acme", "k"), conn, methodCreate, "a"); a.err != nil || a.replayed || a.body != "ok" {
		t.Fatalf("the retry: %+v, want it run", a)
	}
}
