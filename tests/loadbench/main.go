// Command loadbench measures idem over loopback HTTP on PostgreSQL, the
// loopback part of docs/BENCHMARKS.md.
//
// It starts, in one process, an HTTP server on 127.0.0.1 whose routes
// create an order in a fresh schema: (a) a bare handler, in its own
// transaction; (b) the same handler behind idemhttp on idempg, with a
// fresh key per request; (c) the same route replaying completed keys; (d)
// a naive check-then-write; with -onetx, (e) a claim inside the business
// transaction, for comparison; with -variant, (b') route (b) on a schema
// altered by the given SQL; with -single, (f) and (g), idem in the
// single-transaction mode (fresh keys, replays); with -peer, (p) and (q),
// the same handler behind what a careful team writes by hand with pgx
// (peer.go), fresh keys and replays; with -writeonce, (w), the
// record written once with no lock, the unique index deciding; with
// -realistic, (ra), (rb) and (rf), a handler of three statements and 1 ms
// of waiting, bare, behind idem, and behind idem in the single-transaction
// mode, their ratios taken against (ra).
//
// Clients drive every scenario for a fixed duration per round, in slices
// that alternate between the scenarios, and every figure is reported as a
// ratio against (a) of the same round: on a shared machine the absolute
// numbers drift, the ratios much less. Beside throughput and latency it
// counts round trips to PostgreSQL and the CPU each request costs, here
// and in the pool's backends, since on a small machine CPU is what bounds
// throughput. Then every key is sent by two clients at the same instant,
// on (d), (b) and (e), and the orders per key are counted. Last, each
// piece of a request runs alone, serially, to price it.
//
//	go run ./tests/loadbench -duration 10s -clients 16 -rounds 5 \
//	    -db postgres://postgres@127.0.0.1:5432/test?sslmode=disable
//	go run ./tests/loadbench -store mysql -mysql 'root@tcp(127.0.0.1:3306)/test' -duration 6s -rounds 1
//	go run ./tests/loadbench -store sqlite -duration 6s -rounds 1
package main

import (
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsql/idemsqlite"

	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "loadbench:", err)
		os.Exit(1)
	}
}

const (
	defaultDB    = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	defaultMySQL = "root@tcp(127.0.0.1:3306)/test"
)

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("db", cmp.Or(os.Getenv("IDEM_TEST_POSTGRES"), defaultDB), "PostgreSQL URL; a fresh schema is created in it and dropped at the end")
	store := fs.String("store", "postgres", "where the routes keep their data: postgres (pgx, idempg), mysql (MariaDB or MySQL through database/sql, idemsql) or sqlite (a temporary file, idemsql)")
	mysqlDSN := fs.String("mysql", cmp.Or(os.Getenv("IDEM_TEST_MYSQL"), defaultMySQL), "MySQL DSN for -store mysql; a fresh database is created on the server and dropped at the end")
	duration := fs.Duration("duration", 10*time.Second, "how long each scenario runs, per round")
	clients := fs.Int("clients", 16, "concurrent HTTP clients")
	rounds := fs.Int("rounds", 3, "how many times the whole set of scenarios runs")
	conns := fs.Int("conns", 0, "PostgreSQL pool size (default: -clients)")
	slice := fs.Duration("slice", time.Second, "scenarios alternate every slice within a round")
	warmup := fs.Duration("warmup", 2*time.Second, "unmeasured load per scenario before the first round")
	dup := fs.Duration("dup", 5*time.Second, "duration of each duplicate-pair load; 0 skips them")
	variantSQL := fs.String("variant", "", "SQL run on a second schema after the migrations, measured as scenario (b') beside (b); for example \"ALTER TABLE idem_keys SET (fillfactor = 50)\"")
	rtt := fs.Duration("rtt", 0, "simulated round-trip time between the application and PostgreSQL (loopback has almost none); 0 measures plain loopback")
	claimBatch := fs.Int("claim-batch", 0, "idempg.Config.ClaimBatchSize of the idem routes (b) and (c); 0 is idempg's default, 1 sends each claim alone")
	claimConcurrency := fs.Int("claim-concurrency", 0, "idempg.Config.ClaimConcurrency of (b) and (c); 0 is idempg's default")
	variantClaimConcurrency := fs.Int("variant-claim-concurrency", 0, "idempg.Config.ClaimConcurrency of (b'); setting it adds (b') even without -variant")
	variantClaimBatch := fs.Int("variant-claim-batch", 0, "idempg.Config.ClaimBatchSize of (b'); setting it adds (b') even without -variant")
	withOneTx := fs.Bool("onetx", false, "also measure (e), a claim inside the business transaction (not idem's design), fresh keys and duplicate pairs")
	withSingle := fs.Bool("single", false, "also measure (f) and (g): idem in the single-transaction mode (idempg Config.SingleTransaction), fresh keys and replays, and its duplicate pairs")
	withWriteOnce := fs.Bool("writeonce", false, "also measure (w): the record written once without a lock, the unique index deciding between duplicates (not idem's design), and its duplicate pairs")
	withPeer := fs.Bool("peer", false, "also measure (p) and (q): the hand-written peer (a pgx table of keys, a claim with a lease in its own statement, completed by hand in the business transaction), fresh keys and replays, its duplicate pairs, and the table idem against the peer")
	withRealistic := fs.Bool("realistic", false, "also measure (ra), (rb) and, with -single, (rf): a handler of three statements and 1 ms of waiting, bare and behind idem; their ratios are against (ra)")
	only := fs.String("only", "", "comma-separated scenarios to run (a,b,b',c,d, and e,f,g,w,p,q,ra,rb,rf with their flags), for profiling one of them or comparing a few; default all")
	costRuns := fs.Int("cost", 2000, "runs of each piece in the serial cost measurement; 0 skips it")
	profile := fs.String("cpuprofile", "", "file for a CPU profile of the measured rounds, labelled by route (server) and scenario (clients): go tool pprof -tagfocus route=/idem/orders")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *clients < 2 || *rounds < 1 || *duration <= 0 || *slice <= 0 {
		return errors.New("need -clients ≥ 2, -rounds ≥ 1 and a positive -duration and -slice")
	}
	if *conns <= 0 {
		*conns = *clients
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	var db *database
	var err error
	if *store == "postgres" {
		db, err = openDatabase(ctx, *dbURL, *conns, "", *rtt)
	} else {
		// The pgx-only measurements have no database/sql counterpart.
		if *variantSQL != "" || *variantClaimBatch != 0 || *variantClaimConcurrency != 0 || *withOneTx || *withWriteOnce || *withRealistic || *withPeer || *rtt != 0 {
			return errors.New("-variant, -variant-claim-*, -onetx, -writeonce, -realistic, -peer and -rtt measure idempg: use them with -store postgres (-single works on every store)")
		}
		*costRuns = 0
		if *store == "sqlite" {
			*conns = idemsqlite.MaxOpenConns // idemsqlite.Open's pool
		}
		db, err = openSQLDatabase(ctx, *store, *mysqlDSN, *conns)
	}
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer db.close()
	var variant *database
	if *variantSQL != "" || *variantClaimBatch != 0 || *variantClaimConcurrency != 0 {
		variant, err = openDatabase(ctx, *dbURL, *conns, *variantSQL, *rtt)
		if err != nil {
			return fmt.Errorf("database: %w", err)
		}
		defer variant.close()
	}

	mux, err := newMux(db, variant, &idempg.Config{ClaimBatchSize: *claimBatch, ClaimConcurrency: *claimConcurrency}, &idempg.Config{ClaimBatchSize: *variantClaimBatch, ClaimConcurrency: *variantClaimConcurrency})
	if err != nil {
		return err
	}
	// A random port on loopback: nothing leaves the machine, and runs
	// side by side never collide.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	var handler http.Handler = mux
	if *profile != "" {
		// Server goroutines do not inherit the clients' labels: label each
		// request by its route, so the profile splits by scenario.
		handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			pprof.Do(r.Context(), pprof.Labels("route", r.URL.Path), func(ctx context.Context) {
				mux.ServeHTTP(w, r.WithContext(ctx))
			})
		})
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	b := &bench{
		db: db, variant: variant, variantSQL: *variantSQL, rtt: *rtt, claimBatch: *claimBatch, variantClaimBatch: *variantClaimBatch,
		claimConcurrency: *claimConcurrency, variantClaimConcurrency: *variantClaimConcurrency, scenarios: slices.Clone(baseScenarios), baseURL: "http://" + ln.Addr().String(), clients: *clients,
		duration: *duration, client: newClient(*clients), runID: db.schema,
	}
	if variant != nil {
		b.scenarios = slices.Insert(b.scenarios, 2, variantScenario)
	}
	if *withOneTx {
		b.scenarios = append(b.scenarios, oneTxScenario)
	}
	if *withSingle {
		b.scenarios = append(b.scenarios, singleScenarios...)
	}
	if *withWriteOnce {
		b.scenarios = append(b.scenarios, writeOnceScenario)
	}
	if *withPeer {
		b.scenarios = append(b.scenarios, peerScenarios...)
	}
	if *withRealistic {
		b.scenarios = append(b.scenarios, realisticScenarios[:2]...)
		if *withSingle {
			b.scenarios = append(b.scenarios, realisticScenarios[2])
		}
	}
	if *only != "" {
		ids := strings.Split(*only, ",")
		b.scenarios = slices.DeleteFunc(b.scenarios, func(sc scenario) bool { return !slices.Contains(ids, sc.id) })
		if len(b.scenarios) == 0 {
			return fmt.Errorf("-only %q names no scenario", *only)
		}
	}
	m := describeMachine(ctx, db)
	fmt.Fprintf(stderr, "loadbench: %s, schema %s, %d clients, %d conns, %s × %d scenarios × %d rounds\n",
		b.baseURL, db.schema, *clients, *conns, *duration, len(b.scenarios), *rounds)

	// Warm-up: pgx's statement caches, PostgreSQL's plans and the
	// keep-alive connections are filled before anything is measured.
	if *warmup > 0 {
		if _, err := b.round(ctx, 0, *warmup, *warmup); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	// The tables were created empty for this run, and a PostgreSQL
	// without autovacuum (this machine's) would never gather their
	// statistics: plans made on a never-analyzed table stay cached in
	// every session, and may take another index for the primary key (see
	// docs/BENCHMARKS.md). A deployment's autovacuum analyzes a table
	// within a minute of its first rows; so does the run, once warm.
	for _, d := range []*database{db, variant} {
		if d != nil {
			if err := d.analyze(ctx); err != nil {
				return fmt.Errorf("analyze: %w", err)
			}
		}
	}

	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var phases []*phase
	var dups []*pairs
	for r := 1; r <= *rounds; r++ {
		ps, err := b.round(ctx, r, *duration, *slice)
		if err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
		for _, p := range ps {
			fmt.Fprintf(stderr, "round %d %s: %.0f req/s, p50 %s, p99 %s, %d failures\n", r, p.scenario.id,
				p.throughput(), p.percentile(0.50), p.percentile(0.99), p.failures)
		}
		phases = append(phases, ps...)
		if *dup > 0 {
			pairScenarios := []scenario{scenarioByID("d"), scenarioByID("b")}
			if *withOneTx {
				pairScenarios = append(pairScenarios, oneTxScenario)
			}
			if *withSingle {
				pairScenarios = append(pairScenarios, singleScenarios[0])
			}
			if *withWriteOnce {
				pairScenarios = append(pairScenarios, writeOnceScenario)
			}
			if *withPeer {
				pairScenarios = append(pairScenarios, peerScenarios[0])
			}
			for _, sc := range pairScenarios {
				d, err := b.runPairs(ctx, sc, r, *dup)
				if err != nil {
					return fmt.Errorf("round %d, pairs on %s: %w", r, sc.id, err)
				}
				fmt.Fprintf(stderr, "round %d pairs %s: %d keys, %d orders, %d extra\n", r, sc.id, d.keys, d.orders, d.extraOrders)
				dups = append(dups, d)
			}
		}
	}
	pprof.StopCPUProfile() // the cost measurement is not part of the profile
	var costs []cost
	if *costRuns > 0 {
		costs, err = measureCosts(ctx, db, *costRuns)
		if err != nil {
			return fmt.Errorf("cost: %w", err)
		}
	}
	m.loadAfter = loadAverage()
	for i, d := range b.databases() {
		upd, hot, err := d.hotUpdates(ctx)
		if err == nil {
			m.hot = append(m.hot, fmt.Sprintf("%s %d of %d", []string{"(b), (c)", "(b')"}[i], hot, upd))
		}
	}
	writeReport(stdout, m, b, *rounds, *conns, *slice, phases, dups)
	if len(costs) > 0 {
		writeCosts(stdout, *costRuns, costs)
	}
	return nil
}
