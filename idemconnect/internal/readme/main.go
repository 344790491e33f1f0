// A Connect handler whose unary calls carrying an Idempotency-Key run once.
package main

import (
	"context"
	"errors"
	"log"
	"net/http"

	"connectrpc.com/connect"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemconnect"
	"github.com/idem-go/idem/idemmem"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func main() {
	engine, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		log.Fatal(err)
	}
	in, err := idemconnect.New(engine, &idemconnect.Config{TenantFunc: func(_ context.Context, h http.Header) (string, error) {
		if v := h.Get("Authorization"); v != "" { // stands for your authentication
			return v, nil
		}
		return "", errors.New("unauthenticated")
	}})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux() // or your generated NewXxxServiceHandler(svc, connect.WithInterceptors(in))
	mux.Handle("/orders.v1.Orders/Create", connect.NewUnaryHandler("/orders.v1.Orders/Create",
		func(ctx context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
			return connect.NewResponse(wrapperspb.String("order for " + req.Msg.GetValue())), nil
		}, connect.WithInterceptors(in)))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}
