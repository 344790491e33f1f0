package idemcheck

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// DefaultInFlightWait is how long check 6 keeps retrying while it is
// answered 409.
const DefaultInFlightWait = 30 * time.Second

// DefaultSettle is how long check 6's count must stay the same, after an
// answer that was not a replay, before it is final.
const DefaultSettle = 5 * time.Second

// settleLimit bounds a settling count at this many times Settle: a count
// that keeps changing within one resource is other writers at work.
const settleLimit = 3

// cutOutcome is what happened to the request check 6 cuts.
type cutOutcome struct {
	cut      bool  // the connection was closed before any answer came
	answered bool  // an answer came before the cut
	status   int   // its status, when answered and readable
	err      error // the error of a request that could not be sent
}

// sendCut sends a request with key on a connection of its own, then
// closes the connection: at once when DisconnectAfter is zero, without
// reading anything, so that no answer can come first; else after
// DisconnectAfter, unless an answer has begun by then. The request goes
// straight to the host, as HTTP/1.1 (over TLS for https), not through a
// proxy.
func (c *checker) sendCut(ctx context.Context, key string) cutOutcome {
	req, err := c.newRequest(ctx, key, c.Body)
	if err != nil {
		return cutOutcome{err: err}
	}
	conn, err := c.dial(ctx, req.URL)
	if err != nil {
		return cutOutcome{err: err}
	}
	defer conn.Close()
	_ = conn.SetWriteDeadline(time.Now().Add(c.Timeout))
	if err := req.Write(conn); err != nil {
		return cutOutcome{err: err}
	}
	if c.DisconnectAfter <= 0 {
		return cutOutcome{cut: true}
	}
	_ = conn.SetReadDeadline(time.Now().Add(c.DisconnectAfter))
	var head [64]byte
	n, err := conn.Read(head[:])
	if n > 0 {
		out := cutOutcome{answered: true}
		// "HTTP/1.1 201 Created": the status, when it fits.
		if f := strings.Fields(string(head[:n])); len(f) > 1 && strings.HasPrefix(f[0], "HTTP/") {
			out.status, _ = strconv.Atoi(f[1])
		}
		return out
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return cutOutcome{cut: true}
	}
	return cutOutcome{err: fmt.Errorf("the server closed the connection before the cut: %w", err)}
}

// dial opens a connection to u's host, with the TLS settings of the
// client's transport when it has them.
func (c *checker) dial(ctx context.Context, u *url.URL) (net.Conn, error) {
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	dialer := &net.Dialer{Timeout: c.Timeout}
	if u.Scheme != "https" {
		return dialer.DialContext(ctx, "tcp", host)
	}
	config := &tls.Config{}
	if t, ok := c.Client.Transport.(*http.Transport); ok && t.TLSClientConfig != nil {
		config = t.TLSClientConfig.Clone()
	}
	config.NextProtos = []string{"http/1.1"}
	if config.ServerName == "" {
		config.ServerName = u.Hostname()
	}
	td := &tls.Dialer{NetDialer: dialer, Config: config}
	return td.DialContext(ctx, "tcp", host)
}

// retryInFlight sends the request with key, 100ms after the cut, until its
// answer is not a 409, or InFlightWait has passed since the first 409. The
// pauses double from 50ms to 1s, or follow a longer Retry-After, and end
// with the wait. It returns the last answer and the number of 409s.
func (c *checker) retryInFlight(ctx context.Context, key string) (answer, int) {
	// A moment first, as a client's backoff would: the server takes the
	// cut request up before the retry arrives.
	if !sleep(ctx, firstRetryPause) {
		return answer{err: context.Cause(ctx)}, 0
	}
	pause := 50 * time.Millisecond
	var conflicts int
	var since time.Time
	for {
		a := c.send(ctx, key, c.Body)
		if a.err != nil || a.status != http.StatusConflict {
			return a, conflicts
		}
		conflicts++
		if since.IsZero() {
			since = time.Now()
		}
		left := c.InFlightWait - time.Since(since)
		if left <= 0 {
			return a, conflicts
		}
		wait := pause
		if s, err := strconv.Atoi(strings.TrimSpace(a.header.Get("Retry-After"))); err == nil && s > 0 {
			wait = max(wait, time.Duration(min(s, 3600))*time.Second)
		}
		if !sleep(ctx, min(wait, left)) {
			return a, conflicts
		}
		pause = min(2*pause, time.Second)
	}
}

// firstRetryPause is the pause between check 6's cut and its first retry.
const firstRetryPause = 100 * time.Millisecond

// sleep waits d, or less when ctx ends first, and reports whether it
// waited d.
func sleep(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// settled is a count taken again until it stopped changing.
type settled struct {
	atAnswer int           // the count right after the answer
	n        int           // the last count
	waited   time.Duration // from the first count to the last
	stable   bool          // n did not change for Settle
}

// settle counts again, every Settle/10 (50ms to 500ms), until the count
// has stayed the same for Settle, or is more than want above before (a
// resource too many: no need to wait for more), or settleLimit×Settle has
// passed. n is the count taken right after the answer.
//
// An answer ends the request that got it, not every execution of its key:
// an execution whose key was released before it finished (its client went
// away) may commit after a later request with the key was answered. Only
// a count that stays the same for a while shows that it did not.
func (c *checker) settle(ctx context.Context, before, want, n int) (settled, error) {
	s := settled{atAnswer: n, n: n}
	start := time.Now()
	changed := start
	poll := min(max(c.Settle/10, 50*time.Millisecond), 500*time.Millisecond)
	for s.n-before <= want {
		if time.Since(changed) >= c.Settle {
			s.stable = true
			break
		}
		if time.Since(start) >= settleLimit*c.Settle {
			break
		}
		if !sleep(ctx, poll) {
			return s, context.Cause(ctx)
		}
		m, err := c.count(ctx)
		if err != nil {
			return s, err
		}
		s.waited = time.Since(start)
		if m != s.n {
			s.n, changed = m, time.Now()
		}
	}
	return s, nil
}

// disconnectThenRetry runs check 6 with key: a request cut while the
// server works on it, then retries until answered, then a count, taken
// again until it settles when the retry's answer was not a replay.
// marksReplays says whether the server marks its replays (check 2's retry
// was marked).
func (c *checker) disconnectThenRetry(ctx context.Context, key string, counts *counter, marksReplays bool) Result {
	r := Result{ID: 6, Name: nameDisconnect, Statuses: map[string]int{}}
	if c.CountURL == "" {
		r.Status = Skip
		r.Evidence = "needs --count-url: only a count shows whether the retry ran the operation again"
		r.Unproven = "nothing to count with (give --count-url)"
		return r
	}
	before, ok := counts.last()
	if !ok {
		r.Status = Skip
		r.Evidence = "not run: counting failed (check 5)"
		return r
	}
	first := c.sendCut(ctx, key)
	final, conflicts := c.retryInFlight(ctx, key)
	counts.take(ctx)
	after, ok := counts.last()
	switch {
	case first.cut:
		r.Statuses["cut"]++
	case first.answered:
		r.Statuses[strconv.Itoa(first.status)]++
	default:
		r.Statuses["error"]++
	}
	if final.err != nil || final.status != http.StatusConflict { // a last 409 is among conflicts
		r.Statuses[final.statusText()]++
	}
	if conflicts > 0 {
		r.Statuses["409"] += conflicts
	}

	cutText := "cut as soon as it was written"
	if c.DisconnectAfter > 0 {
		cutText = fmt.Sprintf("cut %v after it was written", c.DisconnectAfter)
	}
	var story string
	switch {
	case first.cut:
		story = "first request " + cutText
	case first.answered:
		story = fmt.Sprintf("first request answered (%d) before its cut", first.status)
	default:
		story = "first request failed before its cut (" + errText(first.err) + ")"
	}
	if conflicts > 0 {
		story += fmt.Sprintf("; %d×409 while it ran", conflicts)
	}
	switch {
	case final.err != nil:
		r.Status = Fail
		r.Evidence = story + "; the retry got no answer: " + errText(final.err)
		return r
	case final.status == http.StatusConflict:
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%s; still 409 after retrying for %v: the cut execution never finished nor released its key", story, c.InFlightWait)
		return r
	case !final.success():
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%s; the retry was answered %d: a retry after a disconnect must get the operation's answer", story, final.status)
		r.Details = []string{"got: " + final.describe()}
		return r
	}
	// A replay is the cut execution's stored answer: it finished, and the
	// count is final. Any other answer is an execution of the retry's own,
	// and the cut one may still be running: its count must settle.
	replay := final.replayed()
	switch {
	case replay:
		story += fmt.Sprintf("; the retry got %d (a replay)", final.status)
	case !marksReplays:
		story += fmt.Sprintf("; the retry got %d, not marked as a replay (nor was check 2's): it may be a fresh execution", final.status)
	case conflicts > 0:
		story += fmt.Sprintf("; the retry got a fresh %d, not a replay, after a 409: the first execution's key was released before that execution stored its answer, and it may still commit", final.status)
	default:
		story += fmt.Sprintf("; the retry got a fresh %d, not a replay: the first execution, if the server ran it, did not keep its key to the end, and may still commit", final.status)
	}
	if !ok {
		r.Status = Fail
		r.Evidence = story + "; counting failed afterwards (check 5)"
		return r
	}
	counted := fmt.Sprintf("%d resources before, %d after", before, after)
	stable := true
	if !replay {
		s, err := c.settle(ctx, before, 1, after)
		if err != nil {
			r.Status = Fail
			r.Evidence = story + "; counting failed while waiting for the count to settle: " + errText(err)
			return r
		}
		after, stable = s.n, s.stable
		switch {
		case s.n != s.atAnswer:
			counted = fmt.Sprintf("%d resources before, %d right after the answer, %d %v later", before, s.atAnswer, s.n, s.waited.Round(time.Millisecond))
		case s.stable:
			counted += fmt.Sprintf(", unchanged for %v", c.Settle)
		}
		counts.n[len(counts.n)-1] = after
	}
	d := after - before
	r.Evidence = fmt.Sprintf("%s; %s (%+d)", story, counted, d)
	switch {
	case d > 1:
		r.Status = Fail
		r.Evidence += fmt.Sprintf(": the operation ran %d times for one key, once more after the disconnect", d)
	case d < 1:
		r.Status = Fail
		r.Evidence += ": want +1, the resource of the answered request"
	case !stable:
		r.Status = Warn
		r.Evidence += fmt.Sprintf("; the count did not stay the same for %v within %v", c.Settle, settleLimit*c.Settle)
		r.Unproven = "the count kept changing after the answer: other writers to the collection? (scope --count-url)"
	case !first.cut:
		r.Status = Warn
		r.Unproven = "the connection was not cut while the server worked"
		if first.answered {
			r.Unproven += ": it answered first (lower --disconnect-after)"
		}
	default:
		r.Status = Pass
	}
	return r
}
