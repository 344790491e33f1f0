// Package proto holds the demo's protobuf schema. The generated Go code is
// committed in ../demov1, so that building needs no protoc; regenerate it
// after a schema change with, from this directory:
//
//	go generate .
//
// (protoc, protoc-gen-go, protoc-gen-go-grpc and protoc-gen-connect-go on
// PATH).
package proto

//go:generate protoc --go_out=.. --go_opt=module=github.com/idem-go/idem/cmd/idem/internal/demo --go-grpc_out=.. --go-grpc_opt=module=github.com/idem-go/idem/cmd/idem/internal/demo --connect-go_out=.. --connect-go_opt=module=github.com/idem-go/idem/cmd/idem/internal/demo idem/demo/v1/orders.proto
