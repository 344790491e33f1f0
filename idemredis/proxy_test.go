package idemredis

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// faultMode is what a faultProxy does with the replies to a command that
// carries its mark.
type faultMode int32

const (
	pass faultMode = iota // replies go through
	drop                  // replies are read and thrown away: the command ran, its reply never comes
	cut                   // the client's connection is closed when the reply comes: the command ran, the client sees the connection end
)

// faultProxy stands between a client and a Redis server. Commands go
// through untouched; once a connection has sent a command holding mark,
// the replies on that connection meet the proxy's mode. Connections that
// never send mark (the handshake, other calls) are not touched, so that a
// test loses exactly the replies it means to.
type faultProxy struct {
	addr   string
	mark   []byte
	mode   atomic.Int32
	marked atomic.Int64 // commands holding mark sent to the server

	mu    sync.Mutex
	conns []net.Conn
}

func startFaultProxy(t *testing.T, upstream string, mark string, mode faultMode) *faultProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{addr: l.Addr().String(), mark: []byte(mark)}
	p.mode.Store(int32(mode))
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = l.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = client.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, client, server)
			p.mu.Unlock()
			var sent atomic.Bool
			wg.Go(func() { p.requests(client, server, &sent) })
			wg.Go(func() { p.replies(server, client, &sent) })
		}
	})
	return p
}

func (p *faultProxy) setMode(m faultMode) { p.mode.Store(int32(m)) }

// requests copies the client's commands to the server, noting when one
// holds the mark. A mark split across two reads is missed; the tests'
// commands are far smaller than one read.
func (p *faultProxy) requests(client, server net.Conn, sent *atomic.Bool) {
	defer server.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			if c := bytes.Count(buf[:n], p.mark); c > 0 {
				sent.Store(true)
				p.marked.Add(int64(c))
			}
			if _, werr := server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// replies copies the server's replies to the client, unless the
// connection sent the mark and the mode says otherwise.
func (p *faultProxy) replies(server, client net.Conn, sent *atomic.Bool) {
	defer client.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 && sent.Load() {
			switch faultMode(p.mode.Load()) {
			case drop:
				n = 0
			case cut:
				return
			}
		}
		if n > 0 {
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
