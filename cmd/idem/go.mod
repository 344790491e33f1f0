module github.com/idem-go/idem/cmd/idem

go 1.26.0

toolchain go1.26.8

require github.com/idem-go/idem v0.0.0-00010101000000-000000000000

require github.com/idem-go/idem/idemprom v0.0.0-00010101000000-000000000000

require github.com/idem-go/idem/idempg v0.0.0-00010101000000-000000000000

require github.com/idem-go/idem/idemsql v0.0.0-00010101000000-000000000000

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/google/uuid v1.6.0
	github.com/idem-go/idem/idemredis v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.13.0
	github.com/prometheus/client_golang v1.25.0
	github.com/redis/go-redis/v9 v9.23.0
	golang.org/x/term v0.48.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
	modernc.org/sqlite v1.62.0 // indirect
)

replace github.com/idem-go/idem => ../..

replace github.com/idem-go/idem/idempg => ../../idempg

replace github.com/idem-go/idem/idemsql => ../../idemsql

replace github.com/idem-go/idem/idemredis => ../../idemredis

replace github.com/idem-go/idem/ideminbox/internal/inboxtest => ../../ideminbox/internal/inboxtest

replace github.com/idem-go/idem/ideminbox/idemjetstream => ../../ideminbox/idemjetstream

replace github.com/idem-go/idem/ideminbox/idemamqp => ../../ideminbox/idemamqp

replace github.com/idem-go/idem/idemprom => ../../idemprom

require (
	connectrpc.com/connect v1.21.1
	github.com/idem-go/idem/idemconnect v0.0.0-00010101000000-000000000000
	github.com/idem-go/idem/idemgrpc v0.0.0-00010101000000-000000000000
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

replace github.com/idem-go/idem/idemgrpc => ../../idemgrpc

replace github.com/idem-go/idem/idemconnect => ../../idemconnect
