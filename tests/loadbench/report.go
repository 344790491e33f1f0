package main

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/idem-go/idem/idempg"
)

// machine is what a reader needs to judge the figures: the numbers mean
// little without the cores, the load and the database's commit settings.
type machine struct {
	cpus       int
	cpuModel   string
	goVersion  string
	pgVersion  string
	pgSettings string
	loadBefore string
	loadAfter  string
	hot        []string // HOT updates of idem_keys, per schema
}

func describeMachine(ctx context.Context, db *database) machine {
	m := machine{cpus: runtime.NumCPU(), cpuModel: cpuModel(), goVersion: runtime.Version(), loadBefore: loadAverage()}
	if db.sql != nil {
		describeSQL(ctx, db, &m)
		return m
	}
	_ = db.pool.QueryRow(ctx, `SELECT current_setting('server_version')`).Scan(&m.pgVersion)
	var settings []string
	for _, name := range []string{"synchronous_commit", "fsync", "wal_sync_method", "shared_buffers", "max_connections"} {
		var v string
		if err := db.pool.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v); err == nil {
			settings = append(settings, name+"="+v)
		}
	}
	m.pgSettings = strings.Join(settings, ", ")
	return m
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if name, value, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(name) == "model name" {
			return strings.TrimSpace(value)
		}
	}
	return "unknown"
}

// loadAverage returns the 1, 5 and 15 minute load averages, as uptime
// prints them.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func median[T int | float64 | time.Duration](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func us(d time.Duration) string { return fmt.Sprintf("%d µs", d.Microseconds()) }

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

// baseline returns the throughput of p's baseline in p's round: every
// ratio is against the bare handler (or the scenario's base) measured in
// the same round.
func baseline(phases []*phase, p *phase) float64 {
	if a := roundBaseline(phases, p); a != nil {
		return a.throughput()
	}
	return 0
}

func roundBaseline(phases []*phase, of *phase) *phase {
	base := cmp.Or(of.scenario.base, "a")
	for _, p := range phases {
		if p.round == of.round && p.scenario.id == base {
			return p
		}
	}
	return nil
}

// cpuRatio is the CPU a request of (a) costs, this process and its
// backends together, over what a request of p costs: the throughput ratio
// a dedicated machine bound by CPU would show. On a shared one the
// throughput ratio also depends on how much CPU the other tenants leave
// each scenario, which varies with how many threads it keeps runnable.
func cpuRatio(phases []*phase, p *phase) float64 {
	a := roundBaseline(phases, p)
	if a == nil {
		return 0
	}
	ua, up := a.cpuUse(), p.cpuUse()
	if up.selfPerReq+up.pgPerReq == 0 {
		return 0
	}
	return float64(ua.selfPerReq+ua.pgPerReq) / float64(up.selfPerReq+up.pgPerReq)
}

func writeReport(w io.Writer, m machine, b *bench, rounds, conns int, slice time.Duration, phases []*phase, dups []*pairs) {
	if b.db.sql != nil {
		writeSQLReport(w, m, b, rounds, conns, slice, phases, dups)
		return
	}
	fmt.Fprintf(w, "## Loopback HTTP on PostgreSQL\n\n")
	fmt.Fprintf(w, "- machine: %d CPUs, %s; %s\n", m.cpus, m.cpuModel, m.goVersion)
	fmt.Fprintf(w, "- PostgreSQL %s on loopback: %s\n", m.pgVersion, m.pgSettings)
	fmt.Fprintf(w, "- load average (1 5 15 min): %s before, %s after\n", m.loadBefore, m.loadAfter)
	fmt.Fprintf(w, "- %d clients, pool of %d connections, %s per scenario per round in slices of %s (scenarios alternate every slice, order rotated), %d rounds\n",
		b.clients, conns, b.duration, slice, rounds)
	if b.rtt > 0 {
		fmt.Fprintf(w, "- simulated round-trip time to PostgreSQL (-rtt): %s on every pool connection\n", b.rtt)
	}
	fmt.Fprintf(w, "- idempg.Config for (b) and (c): ClaimBatchSize %d, ClaimConcurrency %d (0: idempg's defaults, %d and %d)\n",
		b.claimBatch, b.claimConcurrency, idempg.DefaultClaimBatchSize, idempg.DefaultClaimConcurrency)
	if b.variant != nil {
		fmt.Fprintf(w, "- (b') runs on a second schema with ClaimBatchSize %d, ClaimConcurrency %d\n", b.variantClaimBatch, b.variantClaimConcurrency)
	}
	if b.variantSQL != "" {
		fmt.Fprintf(w, "- (b') runs on a second schema where, after the migrations: `%s`\n", b.variantSQL)
	}
	if len(m.hot) > 0 {
		fmt.Fprintf(w, "- HOT updates of idem_keys (the completions): %s\n", strings.Join(m.hot, "; "))
	}
	fmt.Fprintln(w)

	fmt.Fprintf(w, "| scenario | req/s | p50 | p99 | × (a), median | × (a), min–max | PG round trips/req | Go CPU/req | PG CPU/req | × (a) by CPU/req | failures |\n")
	fmt.Fprintf(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, sc := range b.scenarios {
		var rps, ratios, cpuRatios, trips []float64
		var p50, p99, goCPU, pgCPU []time.Duration
		failures := 0
		for _, p := range phases {
			if p.scenario.id != sc.id {
				continue
			}
			rps = append(rps, p.throughput())
			ratios = append(ratios, p.throughput()/baseline(phases, p))
			cpuRatios = append(cpuRatios, cpuRatio(phases, p))
			trips = append(trips, p.perRequest(p.writes))
			p50 = append(p50, p.percentile(0.50))
			p99 = append(p99, p.percentile(0.99))
			goCPU = append(goCPU, p.cpuUse().selfPerReq)
			pgCPU = append(pgCPU, p.cpuUse().pgPerReq)
			failures += p.failures
		}
		if len(rps) == 0 {
			continue
		}
		fmt.Fprintf(w, "| (%s) %s | %.0f | %s | %s | **%.2f** | %.2f–%.2f | %.2f | %s | %s | %.2f (%.2f–%.2f) | %d |\n", sc.id, sc.name,
			median(rps), ms(median(p50)), ms(median(p99)), median(ratios),
			slices.Min(ratios), slices.Max(ratios), median(trips), us(median(goCPU)), us(median(pgCPU)),
			median(cpuRatios), slices.Min(cpuRatios), slices.Max(cpuRatios), failures)
	}
	fmt.Fprintf(w, "\nMedians over the rounds; each ratio is taken within its round against (a) of that round, then its median and range reported. Go CPU is this whole process: HTTP server, handlers, idem, pgx and the HTTP clients. PG CPU is the pool's backends only.\n\n")

	fmt.Fprintf(w, "<details><summary>Every round</summary>\n\n")
	fmt.Fprintf(w, "| round | scenario | requests | req/s | p50 | p99 | × (a) | PG round trips/req | PG reads/req | Go CPU/req | PG CPU/req | machine busy | others' share | statuses |\n")
	fmt.Fprintf(w, "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, p := range phases {
		u := p.cpuUse()
		fmt.Fprintf(w, "| %d | (%s) | %d | %.0f | %s | %s | %.2f | %.2f | %.2f | %s | %s | %.0f%% | %.0f%% | %s |\n", p.round, p.scenario.id,
			p.requests, p.throughput(), ms(p.percentile(0.50)), ms(p.percentile(0.99)),
			p.throughput()/baseline(phases, p), p.perRequest(p.writes), p.perRequest(p.reads), us(u.selfPerReq), us(u.pgPerReq),
			100*u.machineBusy, 100*u.otherBusy, statuses(p))
	}
	fmt.Fprintf(w, "\n</details>\n\n")
	writePeerReport(w, b, phases)
	writeDups(w, dups)
}

// writeDups reports the duplicate-pair loads.
func writeDups(w io.Writer, dups []*pairs) {
	if len(dups) == 0 {
		return
	}
	fmt.Fprintf(w, "### Duplicate pairs: every key sent by two clients at the same instant\n\n")
	fmt.Fprintf(w, "| route | round | keys | fresh 2xx | replayed 2xx | 409 | other | orders | keys with >1 order | duplicate orders |\n")
	fmt.Fprintf(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, d := range dups {
		fmt.Fprintf(w, "| (%s) %s | %d | %d | %d | %d | %d | %d | %d | %d | %d |\n", d.scenario.id, d.scenario.name,
			d.round, d.keys, d.fresh, d.replays, d.conflict, d.other, d.orders, d.duplicateKeys, d.extraOrders)
	}
	fmt.Fprintln(w)
}

func statuses(p *phase) string {
	codes := make([]int, 0, len(p.statuses))
	for c := range p.statuses {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	var parts []string
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d×%d", c, p.statuses[c]))
	}
	if p.replays > 0 {
		parts = append(parts, fmt.Sprintf("%d replayed", p.replays))
	}
	for e, n := range p.errors {
		parts = append(parts, fmt.Sprintf("%d× %s", n, e))
	}
	return strings.Join(parts, ", ")
}
