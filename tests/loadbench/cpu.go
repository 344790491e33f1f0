package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// On a small machine shared by PostgreSQL, the server and the clients,
// throughput is bound by CPU rather than by round trips or the disk, so
// what decides a ratio is the CPU a request takes, in this process and in
// its PostgreSQL backends. These counters measure it per phase, and how
// much of the machine the other tenants took meanwhile.

// clockTick is the unit of /proc's times, USER_HZ, 100 on every Linux
// architecture Go supports.
const clockTick = 10 * time.Millisecond

// cpuSample is a reading of the CPU clocks.
type cpuSample struct {
	self     time.Duration // this process: HTTP server, handlers, idem and clients
	postgres time.Duration // the backends serving this process's pool
	busy     time.Duration // the whole machine, every core, not idle
	total    time.Duration // the whole machine, every core
}

func sampleCPU(backends []uint32) cpuSample {
	var s cpuSample
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.postgres = backendCPU(backends)
	s.busy, s.total = machineCPU()
	return s
}

// backendCPU sums the user and system time of the PostgreSQL backends
// with these process ids. Only the pool's own backends count: the server
// is shared with other programs (tests of other packages), whose backends
// would blur the figure. The WAL writer and checkpointer are left out for
// the same reason; a synchronous commit flushes from its own backend.
func backendCPU(pids []uint32) time.Duration {
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/stat")
		if err != nil {
			continue // the backend ended, or PostgreSQL is on another host
		}
		s := string(b)
		end := strings.LastIndexByte(s, ')')
		if end < 0 {
			continue
		}
		// After the command: state is field 3; utime and stime are
		// fields 14 and 15.
		f := strings.Fields(s[end+1:])
		if len(f) < 13 {
			continue
		}
		for _, v := range f[11:13] {
			n, _ := strconv.ParseInt(v, 10, 64)
			ticks += n
		}
	}
	return time.Duration(ticks) * clockTick
}

// machineCPU reads the first line of /proc/stat: the time of every core,
// by kind.
func machineCPU() (busy, total time.Duration) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0
	}
	var sum, idle int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i >= 8 {
			break // guest times are already counted in user and nice
		}
		sum += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	return time.Duration(sum-idle) * clockTick, time.Duration(sum) * clockTick
}

func (s cpuSample) sub(o cpuSample) cpuSample {
	return cpuSample{self: s.self - o.self, postgres: s.postgres - o.postgres, busy: s.busy - o.busy, total: s.total - o.total}
}

func (s cpuSample) add(o cpuSample) cpuSample {
	return cpuSample{self: s.self + o.self, postgres: s.postgres + o.postgres, busy: s.busy + o.busy, total: s.total + o.total}
}

// cpuUse is what a phase cost, per request, and how busy the machine was.
type cpuUse struct {
	selfPerReq, pgPerReq time.Duration
	machineBusy          float64 // share of all cores not idle, 0 to 1
	// otherBusy is the share of all cores used neither by this process
	// nor by the pool's backends: the other tenants of the machine (and
	// PostgreSQL's own background processes).
	otherBusy float64
}

func (p *phase) cpuUse() cpuUse {
	var u cpuUse
	d := p.cpu
	if p.requests > 0 {
		u.selfPerReq = d.self / time.Duration(p.requests)
		u.pgPerReq = d.postgres / time.Duration(p.requests)
	}
	if d.total > 0 {
		u.machineBusy = float64(d.busy) / float64(d.total)
		u.otherBusy = max(float64(d.busy-d.self-d.postgres)/float64(d.total), 0)
	}
	return u
}
