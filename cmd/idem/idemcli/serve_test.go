package idemcli

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
)

// closedWithin reads conn until the server closes it, and fails t if that
// has not happened by the deadline (a bound on failure only: the server's
// own timeouts are far shorter).
func closedWithin(t *testing.T, conn net.Conn, r io.Reader, deadline time.Duration) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(deadline))
	_, err := io.Copy(io.Discard, r)
	var ne net.Error
	switch {
	case err == nil, errors.Is(err, syscall.ECONNRESET):
		// closed by the server (EOF, or a reset after unread input)
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, os.ErrDeadlineExceeded):
		t.Fatalf("the server kept the stalled connection open for %s", deadline)
	default:
		t.Fatalf("read: %v", err)
	}
}

// TestStalledConnectionsAreClosed: a client that stops sending halfway
// through its headers or its body, or keeps a connection idle, has it
// closed after the read or idle timeout; the half-sent request claims no
// key.
func TestStalledConnectionsAreClosed(t *testing.T) {
	db := sqliteDB(t)
	p := serveInProcess(t, serveOpts{db: db, readTimeout: 300 * time.Millisecond, idleTimeout: 300 * time.Millisecond})
	const failAfter = 30 * time.Second
	dial := func(t *testing.T) net.Conn {
		t.Helper()
		conn, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	t.Run("body", func(t *testing.T) {
		conn := dial(t)
		io.WriteString(conn, "POST /orders HTTP/1.1\r\nHost: idem\r\nContent-Type: application/json\r\n"+
			"Idempotency-Key: stalled\r\nContent-Length: 1000\r\n\r\n{\"cart_id\":")
		closedWithin(t, conn, conn, failAfter)
	})
	t.Run("headers", func(t *testing.T) {
		conn := dial(t)
		io.WriteString(conn, "POST /orders HTTP/1.1\r\nHost: idem\r\nIdempotency-Key: stalled\r\n")
		closedWithin(t, conn, conn, failAfter)
	})
	t.Run("idle", func(t *testing.T) {
		// A server of its own, whose read timeout cannot close the
		// connection before the test, descheduled on a busy machine,
		// has sent its first request: only the idle timeout is short.
		idle := serveInProcess(t, serveOpts{db: sqliteDB(t), readTimeout: 2 * time.Minute, idleTimeout: 300 * time.Millisecond})
		conn, err := net.Dial("tcp", idle.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		io.WriteString(conn, "GET /orders HTTP/1.1\r\nHost: idem\r\n\r\n")
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("GET /orders: %d, close %v; want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
		}
		closedWithin(t, conn, br, failAfter)
	})

	cn, err := openDB(context.Background(), db, openOptions{mustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cn.Close()
	if rec, err := testenv.Must(cn.keyStore()).Get(context.Background(), defaultTenant, "stalled"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("record of the stalled request: %+v, %v; want none", rec, err)
	}
}

func TestServeTimeouts(t *testing.T) {
	o := serveOpts{readTimeout: 30 * time.Second, handlerDelay: 2 * time.Second, idleTimeout: time.Minute}
	if rh, r, w, i := o.timeouts(); rh != 10*time.Second || r != 30*time.Second || w != 62*time.Second || i != time.Minute {
		t.Fatalf("timeouts() = %s, %s, %s, %s; want 10s, 30s, 1m2s, 1m0s", rh, r, w, i)
	}
	o = serveOpts{readTimeout: time.Second, writeTimeout: 5 * time.Second, idleTimeout: time.Minute}
	if rh, r, w, _ := o.timeouts(); rh != time.Second || r != time.Second || w != 5*time.Second {
		t.Fatalf("timeouts() = %s, %s, %s; want 1s, 1s, 5s", rh, r, w)
	}
}
