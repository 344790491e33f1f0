module github.com/idem-go/idem/idemconnect

go 1.26.0

toolchain go1.26.8

require github.com/idem-go/idem v0.0.0-00010101000000-000000000000

require (
	connectrpc.com/connect v1.21.1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/idem-go/idem => ../

replace github.com/idem-go/idem/idemgrpc => ../idemgrpc
