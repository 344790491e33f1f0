module github.com/idem-go/idem/idemredis

go 1.26.0

toolchain go1.26.8

require (
	github.com/idem-go/idem v0.0.0-00010101000000-000000000000
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)

replace github.com/idem-go/idem => ..

replace github.com/idem-go/idem/idempg => ../idempg

replace github.com/idem-go/idem/idemsql => ../idemsql

replace github.com/idem-go/idem/ideminbox/internal/inboxtest => ../ideminbox/internal/inboxtest

replace github.com/idem-go/idem/ideminbox/idemjetstream => ../ideminbox/idemjetstream

replace github.com/idem-go/idem/ideminbox/idemamqp => ../ideminbox/idemamqp

replace github.com/idem-go/idem/cmd/idem => ../cmd/idem
