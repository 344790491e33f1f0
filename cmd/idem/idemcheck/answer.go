package idemcheck

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Bounds on what is read of one answer. The server chooses what it sends;
// these keep what a run holds small whatever it sends (net/http alone
// would accept 10 MB of header per answer, and the body is unbounded),
// with Concurrency answers held at once.
const (
	// maxHeaderBytes bounds an answer's header block on the default
	// client. A longer one makes the request fail.
	maxHeaderBytes = 64 << 10
	// maxKeptBody is what is kept of a body: shown, and searched for the
	// first difference with another.
	maxKeptBody = 64 << 10
	// maxReadBody is what is read of a body. Past maxKeptBody it is only
	// hashed, so bodies are compared on up to maxReadBody bytes; the rest
	// is not read, and the connection is closed.
	maxReadBody = 4 << 20
)

// answer is what one request got back.
type answer struct {
	status int
	header http.Header
	body   []byte   // the first maxKeptBody bytes of the body
	size   int64    // bytes of the body read, at most maxReadBody
	sum    [32]byte // SHA-256 of the bytes read
	cut    bool     // the body went on past maxReadBody
	err    error
}

// readAnswer reads resp within the bounds above and closes its body.
func readAnswer(resp *http.Response) answer {
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, header: resp.Header}
	h := sha256.New()
	r := io.TeeReader(io.LimitReader(resp.Body, maxReadBody), h)
	body, err := io.ReadAll(io.LimitReader(r, maxKeptBody))
	var rest int64
	if err == nil {
		rest, err = io.Copy(io.Discard, r)
	}
	if err != nil {
		return answer{err: fmt.Errorf("reading the answer: %w", err)}
	}
	a.body, a.size = body, int64(len(body))+rest
	if a.size == maxReadBody {
		var one [1]byte
		n, _ := io.ReadFull(resp.Body, one[:])
		a.cut = n > 0
	}
	copy(a.sum[:], h.Sum(nil))
	return a
}

func (a *answer) success() bool { return a.err == nil && a.status >= 200 && a.status < 400 }
func (a *answer) replayed() bool {
	return a.err == nil && strings.EqualFold(strings.TrimSpace(a.header.Get(headerReplayed)), "true")
}

func (a *answer) statusText() string {
	if a.err != nil {
		return "error"
	}
	return strconv.Itoa(a.status)
}

// sameBody says whether two answers have the same body, as far as read.
func sameBody(a, b *answer) bool {
	return a.size == b.size && a.sum == b.sum && a.cut == b.cut
}

// bodyDiff describes where two different bodies first differ.
func bodyDiff(a, b *answer) string {
	if at := firstDiff(a.body, b.body); at >= 0 {
		return fmt.Sprintf("first difference at byte %d", at)
	}
	return fmt.Sprintf("the first %d bytes are identical", len(a.body))
}

// sizeText is a body's size as read.
func (a *answer) sizeText() string {
	if a.cut {
		return fmt.Sprintf("over %d bytes, compared on the first %d", maxReadBody, maxReadBody)
	}
	return fmt.Sprintf("%d bytes", a.size)
}

func (a *answer) describe() string {
	if a.err != nil {
		return "error: " + errText(a.err)
	}
	s := strconv.Itoa(a.status)
	if loc := a.header.Get("Location"); loc != "" {
		s += " Location " + clip([]byte(loc))
	}
	return s + " body " + clip(a.body)
}

// signature identifies an answer for grouping: status, result headers and
// body.
func signature(a *answer) string {
	return fmt.Sprintf("%d\x00%s\x00%s\x00%s\x00%d\x00%x\x00%v", a.status, a.header.Get("Location"),
		a.header.Get("Content-Type"), a.header.Get("Content-Location"), a.size, a.sum, a.cut)
}

func firstDiff(a, b []byte) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return n
	}
	return -1
}
