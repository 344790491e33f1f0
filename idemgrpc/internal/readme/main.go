// A gRPC server whose unary calls carrying an idempotency-key run once.
package main

import (
	"context"
	"errors"
	"log"
	"net"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemmem"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

func main() {
	engine, err := idem.NewEngine(idemmem.NewStore(nil), nil) // idemsql or idempg: the handler's writes commit with the answer
	if err != nil {
		log.Fatal(err)
	}
	in, err := idemgrpc.New(engine, &idemgrpc.Config{TenantFunc: func(ctx context.Context) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx) // stands for your authentication, which runs first
		if v := md.Get("authorization"); len(v) == 1 {
			return v[0], nil
		}
		return "", errors.New("unauthenticated")
	}})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(in.UnaryServerInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer()) // register your services here
	lis, err := net.Listen("tcp", "127.0.0.1:50051")
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(srv.Serve(lis))
}
