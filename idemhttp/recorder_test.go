package idemhttp_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// TestFlushIsRecorded: a Flush inside a protected handler sends nothing;
// the response reaches the client whole, after the commit.
func TestFlushIsRecorded(t *testing.T) {
	e := newEnv(t, nil)
	client := httptest.NewRecorder()
	var sentBeforeReturn bool
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "part 1,")
		w.(http.Flusher).Flush()
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("ResponseController.Flush: %v", err)
		}
		sentBeforeReturn = client.Flushed || client.Body.Len() > 0
		io.WriteString(w, "part 2")
	}))
	h.ServeHTTP(client, request(http.MethodPost, "/", "k1", ""))
	if sentBeforeReturn {
		t.Fatal("Flush sent part of the response before the commit")
	}
	if client.Body.String() != "part 1,part 2" {
		t.Fatalf("body %q", client.Body)
	}
}

// TestReadFromAndWriteString: io.Copy into the writer (io.ReaderFrom) and
// io.WriteString are recorded and replayed like Write.
func TestReadFromAndWriteString(t *testing.T) {
	e := newEnv(t, nil)
	big := strings.Repeat("0123456789", 1000)
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := w.(io.ReaderFrom); !ok {
			t.Error("the writer lost io.ReaderFrom")
		}
		io.WriteString(w, "head:")
		if _, err := io.Copy(w, io.LimitReader(strings.NewReader(big), int64(len(big)))); err != nil {
			t.Errorf("io.Copy: %v", err)
		}
	}))
	first := serve(h, request(http.MethodPost, "/", "k1", ""))
	second := serve(h, request(http.MethodPost, "/", "k1", ""))
	if first.Body.String() != "head:"+big || !bytes.Equal(first.Body.Bytes(), second.Body.Bytes()) {
		t.Fatalf("bodies of %d and %d bytes, want %d", first.Body.Len(), second.Body.Len(), len(big)+5)
	}
}

func TestReadFromTooLarge(t *testing.T) {
	e := newEnv(t, nil)
	var copyErr error
	h := e.handler(t, idemhttp.Config{MaxResponseBody: 1000}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, copyErr = io.Copy(w, strings.NewReader(strings.Repeat("x", 1001)))
	}))
	wantProblem(t, serve(h, request(http.MethodPost, "/", "k1", "")), http.StatusInternalServerError, "response-too-large")
	if !errors.Is(copyErr, idemhttp.ErrResponseTooLarge) {
		t.Fatalf("io.Copy returned %v, want ErrResponseTooLarge", copyErr)
	}
	e.wantAbsent(t, testTenant, "k1")
}

// TestOverRealServer checks what needs a real connection: Hijack refused,
// 103 Early Hints passed through, deadlines reached through Unwrap.
func TestOverRealServer(t *testing.T) {
	e := newEnv(t, nil)
	var hijackErr, deadlineErr error
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_, _, hijackErr = rc.Hijack()
		deadlineErr = rc.SetWriteDeadline(time.Now().Add(time.Minute))
		w.Header().Set("Set-Cookie", "session=1")
		w.Header().Set("Link", "</style.css>; rel=preload; as=style")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "created")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	var hints []textproto.MIMEHeader
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, header textproto.MIMEHeader) error {
			if code == http.StatusEarlyHints {
				hints = append(hints, header)
			}
			return nil
		},
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Set(idemhttp.HeaderKey, "k1")
	as(testTenant, req)
	client := srv.Client()
	client.Timeout = 10 * time.Second
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()

	if !errors.Is(hijackErr, idemhttp.ErrHijack) {
		t.Errorf("Hijack returned %v, want ErrHijack", hijackErr)
	}
	if deadlineErr != nil {
		t.Errorf("SetWriteDeadline through Unwrap: %v", deadlineErr)
	}
	if len(hints) != 1 || hints[0].Get("Link") == "" || hints[0].Get("Set-Cookie") != "" || hints[0].Get(idemhttp.HeaderKey) != "" {
		t.Errorf("early hints %v, want one 103 with the Link only", hints)
	}
	if resp.Header.Get("Set-Cookie") != "session=1" {
		t.Errorf("the fresh answer lost its cookie: %v", resp.Header)
	}
	if resp.StatusCode != http.StatusCreated || string(body) != "created" || resp.Header.Get(idemhttp.HeaderKey) != "k1" {
		t.Fatalf("%d %q %v", resp.StatusCode, body, resp.Header)
	}
	if resp.Header.Get("Link") != "" {
		t.Errorf("the final response kept the hint's Link the handler removed: %v", resp.Header)
	}
}
