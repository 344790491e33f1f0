// Package capacity measures what docs/SCALING.md reports: the bytes one
// record takes in each storage mode, claims per second on each store as a
// ratio to a bare write on the same server, and how fast a purge deletes
// compared to the rate records are written. It runs only with -capacity:
//
//	go test -count=1 -run TestCapacity -capacity -v ./cmd/idem/internal/capacity
package capacity

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	_ "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // testenv's schema helper speaks database/sql
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdynamo"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemmysql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/internal/testenv"
)

var (
	capacity = flag.Bool("capacity", false, "run the capacity measurements of docs/SCALING.md")
	duration = flag.Duration("capacity.duration", 3*time.Second, "how long each throughput figure is measured")
	workers  = flag.Int("capacity.workers", 8, "concurrent callers per throughput figure")
)

// The answer every measured record stores: the demo's 201 for a created
// order, with its two replayed headers and its 111-byte JSON body.
var (
	demoHeader = map[string][]string{"Content-Type": {"application/json"}, "Location": {"/orders/ord_2be59955f547ce71e20a"}}
	demoBody   = []byte(`{"id":"ord_2be59955f547ce71e20a","cart_id":"c_1","total_cents":100,"created_at":"2026-12-01T21:50:46.067196Z"}` + "\n")
	demoFP     = make([]byte, 32) // a SHA-256 fingerprint
)

func demoResult(mode idem.StorageMode) idem.Result {
	switch mode {
	case idem.ModeReference:
		return idem.Result{Mode: mode, Status: 201, Reference: "ord_2be59955f547ce71e20a"}
	case idem.ModeMarker:
		return idem.Result{Mode: mode, Status: 201}
	}
	return idem.Result{Mode: mode, Status: 201, Header: demoHeader, Body: demoBody}
}

// backend is one store under measurement.
type backend struct {
	name  string
	store idem.Store
	// bare is one write of a row of the same server, without idem: the
	// unit the throughput is given in.
	bare func(ctx context.Context, i int64) error
	// size returns the bytes the record of (tenant, key) takes.
	size func(ctx context.Context, tenant, key string) (int, string)
}

func TestCapacity(t *testing.T) {
	if !*capacity {
		t.Skip("skipping: run with -capacity")
	}
	ctx := context.Background()
	backends := []backend{postgres(t), mysqlBackend(t), sqliteBackend(t), redisBackend(t), dynalite(t)}

	t.Log("bytes per record (demo answer: 201, 2 headers, 111-byte body; 32-byte fingerprint; 13-byte key)")
	t.Logf("%-12s %10s %10s %10s  %s", "store", "response", "reference", "marker", "what is counted")
	for _, b := range backends {
		var cells []string
		var how string
		if b.size == nil {
			t.Logf("%-12s %10s %10s %10s  %s", b.name, "-", "-", "-", "not measured")
			continue
		}
		for _, mode := range []idem.StorageMode{idem.ModeResponse, idem.ModeReference, idem.ModeMarker} {
			tenant, key := "tenant-1", fmt.Sprintf("order-%d-00001", mode) // 13 bytes
			complete(t, b.store, tenant, key, demoResult(mode))
			n, what := b.size(ctx, tenant, key)
			cells = append(cells, strconv.Itoa(n))
			how = what
		}
		t.Logf("%-12s %10s %10s %10s  %s", b.name, cells[0], cells[1], cells[2], how)
	}

	t.Logf("throughput, %d callers for %s each, as a ratio to a bare write on the same server", *workers, *duration)
	t.Logf("%-12s %12s %12s %8s %14s %10s", "store", "bare/s", "claim+done/s", "ratio", "purged/s", "purge/write")
	for _, b := range backends {
		bare := rate(func(i int64) error { return b.bare(ctx, i) })
		engine, err := idem.NewEngine(b.store, &idem.Config{Lease: time.Second, Retention: time.Second, Heartbeat: -1})
		if err != nil {
			t.Fatal(err)
		}
		prefix := testenv.Name()
		executions := rate(func(i int64) error {
			_, err := engine.Do(ctx, idem.Operation{Tenant: prefix, Key: "k" + strconv.FormatInt(i, 10), Fingerprint: demoFP}, func(context.Context) (idem.Result, error) {
				return demoResult(idem.ModeResponse), nil
			})
			return err
		})
		// Every record just written expires within a second: purge them
		// all, in batches of 1000, and time it.
		time.Sleep(2*time.Second + 100*time.Millisecond)
		start := time.Now()
		total := 0
		for {
			n, err := b.store.Purge(ctx, idem.PurgeParams{Limit: 1000})
			if err != nil {
				t.Fatalf("%s: purge: %v", b.name, err)
			}
			total += n
			if n < 1000 {
				break
			}
		}
		purged := "n/a (TTL)"
		ratio := "-"
		if total > 0 {
			pr := float64(total) / time.Since(start).Seconds()
			purged = fmt.Sprintf("%.0f", pr)
			ratio = fmt.Sprintf("%.1fx", pr/executions)
		}
		t.Logf("%-12s %12.0f %12.0f %8.2f %14s %10s", b.name, bare, executions, executions/bare, purged, ratio)
		_ = engine.Close(ctx)
	}
}

func complete(t *testing.T, st idem.Store, tenant, key string, res idem.Result) {
	t.Helper()
	ctx := context.Background()
	c, err := st.Claim(ctx, idem.ClaimParams{Tenant: tenant, Key: key, Fingerprint: demoFP, Token: 7, Lease: time.Minute, Retention: 24 * time.Hour})
	if err != nil || !c.Won {
		t.Fatalf("claim: %+v %v", c, err)
	}
	u, _ := st.Begin(ctx)
	if err := u.Complete(ctx, idem.CompleteParams{Tenant: tenant, Key: key, Token: 7, Result: res}); err != nil {
		t.Fatal(err)
	}
}

// rate runs fn from *workers goroutines for *duration and returns the
// calls per second that succeeded.
func rate(fn func(i int64) error) float64 {
	var next, ok atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(*duration)
	start := time.Now()
	for range *workers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				if fn(next.Add(1)) == nil {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return float64(ok.Load()) / time.Since(start).Seconds()
}

func postgres(t *testing.T) backend {
	url := testenv.PostgresSchema(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := idempg.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE bare (id bigint PRIMARY KEY, body bytea)`); err != nil {
		t.Fatal(err)
	}
	st, err := idempg.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	return backend{
		name: "postgresql", store: st,
		bare: func(ctx context.Context, i int64) error {
			_, err := pool.Exec(ctx, `INSERT INTO bare VALUES ($1, $2)`, i, demoBody)
			return err
		},
		size: func(ctx context.Context, tenant, key string) (int, string) {
			var n int
			if err := pool.QueryRow(ctx, `SELECT pg_column_size(k.*) FROM idem_keys k WHERE tenant_id = $1 AND idem_key = $2`, tenant, key).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n, "pg_column_size of the row (heap tuple; the primary-key index adds about 40 more)"
		},
	}
}

// sqlBackend is a database/sql store with a bare table beside it.
func sqlBackend(t *testing.T, name string, db *sql.DB, dialect idemsql.Dialect, mig idemmigrate.Dialect, insert string) backend {
	ctx := context.Background()
	if err := idemmigrate.Migrate(ctx, db, mig); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE bare (id BIGINT PRIMARY KEY, body BLOB)`); err != nil {
		t.Fatal(err)
	}
	st, err := idemsql.NewStore(db, dialect)
	if err != nil {
		t.Fatal(err)
	}
	return backend{
		name: name, store: st,
		bare: func(ctx context.Context, i int64) error {
			_, err := db.ExecContext(ctx, insert, i, demoBody)
			return err
		},
	}
}

func mysqlBackend(t *testing.T) backend {
	db, err := sql.Open("mysql", testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return sqlBackend(t, "mysql", db, idemmysql.Dialect, idemmigrate.MySQL, `INSERT INTO bare VALUES (?, ?)`)
}

func sqliteBackend(t *testing.T) backend {
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "capacity.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return sqlBackend(t, "sqlite", db, idemsql.SQLite, idemmigrate.SQLite, `INSERT INTO bare VALUES (?, ?)`)
}

func redisBackend(t *testing.T) backend {
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	prefix := testenv.Name()
	st, err := idemredis.NewStore(client, &idemredis.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return backend{
		name: "redis", store: st,
		bare: func(ctx context.Context, i int64) error {
			return client.Set(ctx, prefix+":bare:"+strconv.FormatInt(i, 10), demoBody, time.Minute).Err()
		},
		size: func(ctx context.Context, tenant, key string) (int, string) {
			var found []string
			iter := client.Scan(ctx, 0, prefix+":*", 100).Iterator()
			for iter.Next(ctx) {
				found = append(found, iter.Val())
			}
			for _, k := range found {
				if strings.Contains(k, key) {
					n, err := client.MemoryUsage(ctx, k).Result()
					if err != nil {
						t.Fatal(err)
					}
					return int(n), "MEMORY USAGE of the record's hash (keyspace overhead included)"
				}
			}
			t.Fatalf("no Redis key for %s", key)
			return 0, ""
		},
	}
}

func dynalite(t *testing.T) backend {
	endpoint := testenv.Dynalite(t)
	client := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "idem", SecretAccessKey: "idem"}, nil
		}),
	})
	ctx := context.Background()
	table := testenv.Name()
	if _, err := idemdynamo.CreateTable(ctx, client, table); err != nil && !strings.Contains(err.Error(), "TTL") {
		t.Fatal(err)
	}
	st, err := idemdynamo.NewStore(client, &idemdynamo.Config{Table: table, MaxClockSkew: -1})
	if err != nil {
		t.Fatal(err)
	}
	return backend{
		name: "dynamodb", store: st,
		bare: func(ctx context.Context, i int64) error {
			_, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
				"pk": &types.AttributeValueMemberS{Value: "bare#" + strconv.FormatInt(i, 10)},
				"b":  &types.AttributeValueMemberB{Value: demoBody},
			}})
			return err
		},
		size: func(ctx context.Context, tenant, key string) (int, string) {
			out, err := client.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(table)})
			if err != nil {
				t.Fatal(err)
			}
			for _, item := range out.Items {
				if k, _ := item["k"].(*types.AttributeValueMemberS); k != nil && k.Value == key {
					return itemSize(item), "item size by DynamoDB's published sizing rules (computed, not billed)"
				}
			}
			t.Fatalf("no item for %s", key)
			return 0, ""
		},
	}
}

// itemSize sizes an item as DynamoDB documents it: each attribute's name
// in UTF-8 bytes plus its value (strings and binaries their length,
// numbers 1 byte per two significant digits plus 1, lists 3 bytes plus 1
// per element plus the elements).
func itemSize(item map[string]types.AttributeValue) int {
	n := 0
	for name, v := range item {
		n += len(name) + valueSize(v)
	}
	return n
}

func valueSize(v types.AttributeValue) int {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberB:
		return len(v.Value)
	case *types.AttributeValueMemberN:
		digits := len(strings.TrimLeft(strings.ReplaceAll(strings.TrimPrefix(v.Value, "-"), ".", ""), "0"))
		return (digits+1)/2 + 1
	case *types.AttributeValueMemberL:
		n := 3
		for _, e := range v.Value {
			n += 1 + valueSize(e)
		}
		return n
	case *types.AttributeValueMemberBOOL, *types.AttributeValueMemberNULL:
		return 1
	}
	return 0
}
