package idemcheck

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"

	"github.com/google/uuid"
)

const (
	nameConcurrent = "concurrent duplicates"
	nameRetry      = "retry after completion"
	nameOtherBody  = "same key, other body"
	nameFreshKey   = "fresh key"
	nameCount      = "resources per key"
	nameDisconnect = "disconnect, then retry"
)

// judgeConcurrent judges check 1 from its answers, and returns the original
// answer, the one that replays must match (nil when nothing succeeded).
// countConcurrent then weighs in the count.
func judgeConcurrent(answers []answer) (Result, *answer) {
	r := Result{ID: 1, Name: nameConcurrent, Statuses: map[string]int{}}
	var fresh, replays, conflicts, unexpected []*answer
	for i := range answers {
		a := &answers[i]
		r.Statuses[a.statusText()]++
		switch {
		case a.success() && a.replayed():
			replays = append(replays, a)
		case a.success():
			fresh = append(fresh, a)
		case a.err == nil && a.status == http.StatusConflict:
			conflicts = append(conflicts, a)
		default:
			unexpected = append(unexpected, a)
		}
	}
	successes := append(append([]*answer{}, fresh...), replays...)
	var original *answer
	if len(fresh) > 0 {
		original = fresh[0]
	} else if len(replays) > 0 {
		original = replays[0]
	}

	// Distinct successful answers: each one is an execution of its own.
	groups := map[string][]*answer{}
	var order []string
	for _, a := range successes {
		sig := signature(a)
		if _, ok := groups[sig]; !ok {
			order = append(order, sig)
		}
		groups[sig] = append(groups[sig], a)
	}
	tally := fmt.Sprintf("%d requests at once: %s", len(answers), tallyStatuses(r.Statuses))
	switch {
	case len(successes) == 0:
		r.Status = Fail
		r.Evidence = tally + "; no request succeeded"
	case len(groups) > 1:
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%s; %d different successful answers: the operation ran more than once (duplicates)", tally, len(groups))
		for i, sig := range order {
			if i == maxDetails {
				r.Details = append(r.Details, fmt.Sprintf("… and %d more different answers", len(order)-i))
				break
			}
			r.Details = append(r.Details, fmt.Sprintf("%d× %s", len(groups[sig]), groups[sig][0].describe()))
		}
	case len(fresh) > 1 && len(replays) > 0:
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%s; %d answers not marked %s while others are: the operation ran %d times", tally, len(fresh), headerReplayed, len(fresh))
	case len(fresh) == 0:
		r.Status = Warn
		r.Evidence = fmt.Sprintf("%s; %d identical replays but no fresh answer: the execution's own answer was not seen", tally, len(replays))
	case len(fresh) > 1:
		r.Status = Warn
		r.Evidence = fmt.Sprintf("%s; %d identical successful answers, none marked %s: replays cannot be told from executions", tally, len(fresh), headerReplayed)
		r.Unproven = "replays cannot be told from executions"
	default:
		r.Status = Pass
		r.Evidence = fmt.Sprintf("%s; 1 fresh %d, %d identical replays, %d×409", tally, original.status, len(replays), len(conflicts))
	}
	if len(unexpected) > 0 && r.Status != Fail {
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%s; %d unexpected answers (only a replay or 409 may answer a duplicate)", tally, len(unexpected))
	}
	for _, a := range unexpected {
		if len(r.Details) >= maxDetails {
			break
		}
		r.Details = append(r.Details, "unexpected: "+a.describe())
	}
	if r.Status != Fail && original != nil {
		// Identical bodies may still carry different result headers.
		for _, a := range successes[1:] {
			if st, diff := compareHeaders(original.header, a.header); st != Pass {
				r.Status = worse(r.Status, st)
				r.Details = append(r.Details, "headers differ: "+diff)
				break
			}
		}
	}
	return r, original
}

// countConcurrent weighs the resources counted after check 1's requests
// (delta, when counted) into its verdict. Answers alone never prove one
// execution: a server may run every duplicate and answer them all with
// the first stored answer, one fresh and the rest marked as replays. So
// without a count a check that looked right is not a pass.
func countConcurrent(r *Result, counting, counted bool, delta int) {
	if r.Status == Fail {
		return
	}
	switch {
	case !counting:
		r.Status = worse(r.Status, Warn)
		r.Evidence += "; executions not counted (no --count-url): a server that runs every duplicate and answers with the first answer looks the same"
		r.Unproven = "executions not counted (give --count-url)"
	case !counted:
		r.Status = Fail
		r.Evidence += "; counting failed (check 5)"
	case delta > 1:
		r.Status = Fail
		r.Evidence += fmt.Sprintf("; %d resources created: the operation ran %d times for one key", delta, delta)
	case delta < 1:
		r.Status = Fail
		r.Evidence += "; no resource counted: want +1"
	default:
		r.Evidence += "; 1 resource created"
		if r.Unproven != "" && len(r.Details) == 0 {
			// The answers could not tell; the count did.
			r.Status = Pass
		}
		r.Unproven = ""
	}
}

func judgeRetry(original *answer, a answer) Result {
	r := Result{ID: 2, Name: nameRetry, Statuses: map[string]int{a.statusText(): 1}}
	if original == nil {
		r.Status = Skip
		r.Evidence = "no successful answer to replay"
		r.Unproven = "no successful answer to replay (check 1)"
		return r
	}
	if a.err != nil {
		r.Status = Fail
		r.Evidence = "no answer: " + errText(a.err)
		return r
	}
	if a.status == http.StatusConflict {
		r.Status = Fail
		r.Evidence = "409: still in flight after every request had answered"
		return r
	}
	if a.status != original.status {
		r.Status = Fail
		r.Evidence = fmt.Sprintf("status %d, the original was %d", a.status, original.status)
		r.Details = []string{"got: " + a.describe(), "original: " + original.describe()}
		return r
	}
	if !sameBody(original, &a) {
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%d with a different body (%s vs %s, %s): not a replay", a.status, a.sizeText(), original.sizeText(), bodyDiff(original, &a))
		r.Details = []string{"got: " + a.describe(), "original: " + original.describe()}
		return r
	}
	st, diff := compareHeaders(original.header, a.header)
	r.Status = st
	r.Evidence = fmt.Sprintf("%d replayed, body identical (%s)", a.status, a.sizeText())
	if diff != "" {
		r.Details = []string{"headers differ: " + diff}
	}
	if !a.replayed() {
		r.Status = worse(r.Status, Warn)
		r.Evidence += ", but not marked " + headerReplayed + ": true"
		r.Unproven = "the same answer, not marked as a replay: it may have run again"
	} else {
		r.Evidence += ", marked " + headerReplayed
	}
	return r
}

func judgeOtherBody(a answer) Result {
	r := Result{ID: 3, Name: nameOtherBody, Statuses: map[string]int{a.statusText(): 1}}
	switch {
	case a.err != nil:
		r.Status = Fail
		r.Evidence = "no answer: " + errText(a.err)
	case a.status == http.StatusUnprocessableEntity:
		r.Status = Pass
		r.Evidence = "422: the reused key was refused"
		if ct := a.header.Get("Content-Type"); ct != "" {
			r.Evidence += " (" + clip([]byte(ct)) + ")"
		}
	case a.status >= 400 && a.status < 500:
		r.Status = Warn
		r.Evidence = fmt.Sprintf("%d: refused, but 422 is the expected status for a key reused with another request", a.status)
	case a.success() && a.replayed():
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%d replay: the answer of another request was returned (the fingerprint is not checked)", a.status)
	case a.success():
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%d: a different request ran under a used key", a.status)
	default:
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%d: want 422", a.status)
	}
	if r.Status == Fail && a.err == nil {
		r.Details = []string{"got: " + a.describe()}
	}
	return r
}

func judgeFreshKey(original *answer, a answer) Result {
	r := Result{ID: 4, Name: nameFreshKey, Statuses: map[string]int{a.statusText(): 1}}
	loc, origLoc := a.header.Get("Location"), ""
	if original != nil {
		origLoc = original.header.Get("Location")
	}
	switch {
	case a.err != nil:
		r.Status = Fail
		r.Evidence = "no answer: " + errText(a.err)
	case !a.success():
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%d: a fresh key must run the operation again", a.status)
		r.Details = []string{"got: " + a.describe()}
	case a.replayed():
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%d marked %s: another key's answer was replayed (the key is ignored)", a.status, headerReplayed)
	case original == nil:
		r.Status = Pass
		r.Evidence = fmt.Sprintf("%d, a fresh execution", a.status)
	case loc != "" && loc == origLoc:
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%d with the first key's Location %s: the fresh key got the same resource, not a new one", a.status, clip([]byte(loc)))
	case loc != "":
		r.Status = Pass
		r.Evidence = fmt.Sprintf("%d, a new resource (Location %s, the first key's was %s)", a.status, clip([]byte(loc)), clip([]byte(origLoc)))
	case !sameBody(&a, original):
		r.Status = Pass
		r.Evidence = fmt.Sprintf("%d, a new resource (the body differs from the first key's)", a.status)
	default:
		r.Status = Warn
		r.Evidence = fmt.Sprintf("%d with the same answer as the first key: a new resource cannot be told apart (check 5 counts it)", a.status)
		r.Unproven = "the answer is the same as the first key's"
	}
	return r
}

// judgeCounts judges check 5 from the counts before, after the first key
// and after the second.
func judgeCounts(countURL string, counts []int, err error) Result {
	r := Result{ID: 5, Name: nameCount}
	switch {
	case countURL == "":
		r.Status = Skip
		r.Evidence = "no --count-url to count resources with"
		r.Unproven = "nothing to count with (give --count-url)"
	case err != nil:
		r.Status = Fail
		r.Evidence = "counting failed: " + errText(err)
	default:
		d1, d2 := counts[1]-counts[0], counts[2]-counts[1]
		r.Evidence = fmt.Sprintf("%d before, %d after the first key (%+d), %d after the second (%+d)", counts[0], counts[1], d1, counts[2], d2)
		if d1 == 1 && d2 == 1 {
			r.Status = Pass
		} else {
			r.Status = Fail
			r.Evidence += "; want +1 for each key"
			if d1 > 1 {
				r.Evidence += fmt.Sprintf(": %d duplicates", d1-1)
			}
		}
	}
	return r
}

// legitimatelyDiffer are the headers two answers to one operation may
// differ in: the moment, the connection, the session, request ids, and the
// replay marker itself.
var legitimatelyDiffer = map[string]bool{
	"Date": true, "Set-Cookie": true, "Idempotent-Replayed": true, "Content-Length": true,
	"Connection": true, "Keep-Alive": true, "Transfer-Encoding": true, "Age": true,
	"Retry-After": true, "Server-Timing": true, "Request-Id": true, "X-Request-Id": true,
	"X-Correlation-Id": true, "Traceparent": true, "Tracestate": true, "X-Trace-Id": true,
	"X-Amzn-Trace-Id": true, "X-Amzn-Requestid": true, "Cf-Ray": true, "Via": true,
	"X-Response-Time": true, "X-Runtime": true, "Alt-Svc": true, "Report-To": true, "Nel": true,
	"Expires": true, "X-Cache": true,
}

// resultHeaders describe the result itself: a difference there is a
// different answer.
var resultHeaders = map[string]bool{"Location": true, "Content-Type": true, "Content-Location": true, "Content-Encoding": true}

// compareHeaders compares two answers' headers, leaving out those that
// legitimately differ. A difference in a result header fails; in another
// one it warns.
func compareHeaders(a, b http.Header) (Status, string) {
	names := map[string]bool{}
	for n := range a {
		names[n] = true
	}
	for n := range b {
		names[n] = true
	}
	var diffs []string
	st := Pass
	for n := range names {
		l := strings.ToLower(n)
		if legitimatelyDiffer[n] || strings.HasPrefix(l, "x-ratelimit-") || strings.HasPrefix(l, "ratelimit") {
			continue
		}
		va, vb := strings.Join(a.Values(n), ", "), strings.Join(b.Values(n), ", ")
		if va == vb {
			continue
		}
		diffs = append(diffs, fmt.Sprintf("%s %s vs %s", clip([]byte(n)), clip([]byte(va)), clip([]byte(vb))))
		if resultHeaders[n] {
			st = Fail
		} else {
			st = worse(st, Warn)
		}
	}
	sort.Strings(diffs)
	if len(diffs) > maxDetails {
		diffs = append(diffs[:maxDetails], fmt.Sprintf("… and %d more", len(diffs)-maxDetails))
	}
	return st, strings.Join(diffs, "; ")
}

func worse(a, b Status) Status {
	rank := map[Status]int{Skip: 0, Pass: 1, Warn: 2, Fail: 3}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

// otherBody derives a body that asks for something else, keeping it
// acceptable to the endpoint's parser: a JSON object gets one more field,
// a form one more parameter, anything else a trailing newline. A server
// fingerprints bytes or a canonical form; either way these differ.
func otherBody(body []byte, contentType string) ([]byte, bool) {
	if len(body) == 0 {
		return nil, false
	}
	nonce := "idem-check-" + uuid.NewString()[:8]
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) == nil && obj != nil {
		obj["idem_check_nonce"], _ = json.Marshal(nonce)
		out, err := json.Marshal(obj)
		return out, err == nil
	}
	if strings.HasPrefix(contentType, "application/x-www-form-urlencoded") || looksLikeForm(body) {
		return append(append([]byte{}, body...), "&idem_check_nonce="+nonce...), true
	}
	return append(append([]byte{}, body...), '\n'), true
}

func looksLikeForm(body []byte) bool {
	v, err := url.ParseQuery(string(body))
	return err == nil && len(v) > 0 && !strings.ContainsAny(string(body), " \n{}[]")
}

func tallyStatuses(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d×%s", m[k], k))
	}
	return strings.Join(parts, ", ")
}
