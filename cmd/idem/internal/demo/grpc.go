package demo

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/demo/demov1"
	"github.com/idem-go/idem/cmd/idem/internal/demo/demov1/demov1connect"
	"github.com/idem-go/idem/idemconnect"
	"github.com/idem-go/idem/idemgrpc"
)

// The orders over gRPC (GRPCServer) and Connect (mounted on Handler's
// mux): the same repository, tenants and idempotency as the HTTP API.
//
// The tenant is the <name> of "authorization: Bearer <name>" metadata
// (a header in Connect's protocol). Unlike the HTTP API, which serves a
// request without Authorization as the "default" tenant, an RPC without
// it is refused UNAUTHENTICATED: RPC clients set their credentials per
// call or per connection, and a call that forgot them must not create
// orders under a tenant it did not name. Authentication runs before the
// idempotency layer, so that the refusal is never stored under a key.
//
// CreateOrder runs once per idempotency-key; a duplicate that arrives
// while it runs waits for its answer within its deadline (or
// --wait-in-flight, when set), then gets UNAVAILABLE with RetryInfo.
// ListOrders is marked NO_SIDE_EFFECTS in the schema and passes through.

// rpcService implements both generated interfaces over the App.
type rpcService struct {
	demov1.UnimplementedOrderServiceServer
	a *App
}

// errUnauthenticated is the refusal of a call with unusable credentials.
const unauthenticatedMsg = `send "authorization: Bearer <tenant>" metadata, a tenant name of 1 to 128 letters, digits or -._~+/`

// rpcTenant is the demo's authentication over RPC.
func rpcTenant(values []string) (string, bool) {
	if len(values) == 0 {
		return "", false
	}
	return parseBearer(values)
}

// rpcWait is the wait for an execution in flight: --wait-in-flight when
// set, else idemgrpc's default (within the caller's deadline).
func (a *App) rpcWait() time.Duration {
	if a.cfg.WaitInFlight > 0 {
		return a.cfg.WaitInFlight
	}
	return 0
}

// GRPCServer returns a gRPC server of the orders, with server reflection
// on. The caller serves and stops it.
func (a *App) GRPCServer(opts ...grpc.ServerOption) (*grpc.Server, error) {
	in, err := idemgrpc.New(a.cfg.Engine, &idemgrpc.Config{
		TenantFunc:   func(ctx context.Context) (string, error) { return TenantFrom(ctx), nil },
		RequireKey:   a.cfg.RequireKey,
		WaitInFlight: a.rpcWait(),
		Shutdown:     a.cfg.ShutdownContext,
		Logger:       a.logger,
	})
	if err != nil {
		return nil, err
	}
	auth := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		tenant, ok := rpcTenant(md.Get("authorization"))
		if !ok {
			return nil, status.Error(codes.Unauthenticated, unauthenticatedMsg)
		}
		start := time.Now()
		resp, err := next(context.WithValue(ctx, tenantKey{}, tenant), req)
		a.logger.InfoContext(ctx, "grpc", "method", info.FullMethod, "code", status.Code(err).String(), "duration", time.Since(start))
		return resp, err
	}
	srv := grpc.NewServer(append(opts, grpc.ChainUnaryInterceptor(auth, in.UnaryServerInterceptor()))...)
	demov1.RegisterOrderServiceServer(srv, &rpcService{a: a})
	reflection.Register(srv)
	return srv, nil
}

// withConnect serves the Connect handler of the orders beside next.
func (a *App) withConnect(next http.Handler) http.Handler {
	in, err := idemconnect.New(a.cfg.Engine, &idemconnect.Config{
		TenantFunc:   func(ctx context.Context, _ http.Header) (string, error) { return TenantFrom(ctx), nil },
		RequireKey:   a.cfg.RequireKey,
		WaitInFlight: a.rpcWait(),
		Shutdown:     a.cfg.ShutdownContext,
		Logger:       a.logger,
	})
	if err != nil {
		// Only a missing TenantFunc fails, and it is set.
		panic(err)
	}
	path, h := demov1connect.NewOrderServiceHandler(connectService{&rpcService{a: a}}, connect.WithInterceptors(connectAuth{}, in))
	mux := http.NewServeMux()
	mux.Handle(path, h)
	mux.Handle("/", next)
	return mux
}

// connectAuth is the demo's authentication for Connect, in front of
// idemconnect.
type connectAuth struct{}

func (connectAuth) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		tenant, ok := rpcTenant(req.Header().Values("Authorization"))
		if !ok {
			return nil, connect.NewError(connect.CodeUnauthenticated, errors.New(unauthenticatedMsg))
		}
		return next(context.WithValue(ctx, tenantKey{}, tenant), req)
	}
}

func (connectAuth) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (connectAuth) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// invalid refuses a request before any work began: as over HTTP, the
// refusal is not stored, so that the corrected retry with the same key
// runs.
func invalid(ctx context.Context, msg string) error {
	idem.NotExecuted(ctx)
	return status.Error(codes.InvalidArgument, msg)
}

// CreateOrder implements demov1.OrderServiceServer.
func (s *rpcService) CreateOrder(ctx context.Context, req *demov1.CreateOrderRequest) (*demov1.Order, error) {
	switch {
	case req.GetCartId() == "":
		return nil, invalid(ctx, "cart_id is empty")
	case len(req.GetCartId()) > maxCartID:
		return nil, invalid(ctx, fmt.Sprintf("cart_id is %d bytes long; the limit is %d", len(req.GetCartId()), maxCartID))
	case !plainText(req.GetCartId()):
		return nil, invalid(ctx, "cart_id holds a control character")
	case req.GetTotalCents() < 0:
		return nil, invalid(ctx, "total_cents is negative")
	case req.GetTotalCents() > maxTotalCents:
		return nil, invalid(ctx, fmt.Sprintf("total_cents is larger than %d", int64(maxTotalCents)))
	}
	a := s.a
	if a.delay > 0 {
		// As over HTTP: the key is claimed, the transaction not begun.
		t := time.NewTimer(a.delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, status.Error(codes.Unavailable, "the call ended before the order was written")
		case <-t.C:
		}
	}
	o := order{ID: newOrderID(), CartID: req.GetCartId(), TotalCents: req.GetTotalCents(), CreatedAt: a.now().UTC().Truncate(time.Microsecond)}
	if err := a.repo.insert(ctx, TenantFrom(ctx), o); err != nil {
		a.logger.ErrorContext(ctx, "demo: insert order", "error", err)
		return nil, status.Error(codes.Internal, "the server failed to insert the order")
	}
	return &demov1.Order{Id: o.ID, CartId: o.CartID, TotalCents: o.TotalCents}, nil
}

// ListOrders implements demov1.OrderServiceServer.
func (s *rpcService) ListOrders(ctx context.Context, req *demov1.ListOrdersRequest) (*demov1.ListOrdersResponse, error) {
	if !plainText(req.GetCartId()) {
		return nil, status.Error(codes.InvalidArgument, "cart_id holds a control character or invalid UTF-8")
	}
	orders, err := s.a.repo.list(ctx, TenantFrom(ctx), req.GetCartId())
	if err != nil {
		s.a.logger.ErrorContext(ctx, "demo: list orders", "error", err)
		return nil, status.Error(codes.Internal, "the server failed to list the orders")
	}
	out := &demov1.ListOrdersResponse{}
	for _, o := range orders {
		out.Orders = append(out.Orders, &demov1.Order{Id: o.ID, CartId: o.CartID, TotalCents: o.TotalCents})
	}
	return out, nil
}

// connectCode turns a status error of the service into Connect's.
func connectCode(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	return connect.NewError(connect.Code(st.Code()), errors.New(st.Message()))
}

// connectService adapts rpcService to demov1connect.OrderServiceHandler.
type connectService struct{ s *rpcService }

func (c connectService) CreateOrder(ctx context.Context, req *connect.Request[demov1.CreateOrderRequest]) (*connect.Response[demov1.Order], error) {
	o, err := c.s.CreateOrder(ctx, req.Msg)
	if err != nil {
		return nil, connectCode(err)
	}
	return connect.NewResponse(o), nil
}

func (c connectService) ListOrders(ctx context.Context, req *connect.Request[demov1.ListOrdersRequest]) (*connect.Response[demov1.ListOrdersResponse], error) {
	l, err := c.s.ListOrders(ctx, req.Msg)
	if err != nil {
		return nil, connectCode(err)
	}
	return connect.NewResponse(l), nil
}
