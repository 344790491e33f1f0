package ideminbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/idem-go/idem"
)

// The records the inbox keeps under its tenant, in idem.Result:
//
//   - a processed message: a marker (idem.ModeMarker), status 0;
//   - a poison message: a response whose body is the poison format,
//     "ideminbox-poison/1\n", a JSON object (poisonRecord) on one line,
//     "\n", then the payload as it came (up to Config.MaxPoisonData bytes);
//   - the grant of a message's last run (see Inbox.unanswered), under
//     lastRunKey: a response whose body is "ideminbox-last-run/1\n" and a
//     JSON object (lastRunRecord) on one line.
//
// The body says what it holds, and the version after the slash lets a
// later release change the object: no status code nor header carries
// meaning, so the records are the same on every store and in any
// protocol's vocabulary.
const (
	poisonMagic  = "ideminbox-poison/1\n"
	lastRunMagic = "ideminbox-last-run/1\n"
)

// poisonRecord is what a poison record keeps beside the payload.
type poisonRecord struct {
	// Attempt is the delivery on which the message was given up.
	Attempt int `json:"attempt"`
	// Error is the last error, escaped and bounded (fieldText).
	Error string `json:"error"`
	// Subject is where the message came from, escaped and bounded.
	Subject string `json:"subject"`
	// DataSize is the length of the whole payload.
	DataSize int `json:"data_size"`
}

// lastRunRecord is what the grant of a last run keeps.
type lastRunRecord struct {
	// Holder is the lease token of the claim that held the message's key
	// when its last run was granted.
	Holder int64 `json:"holder"`
}

// processedResult is the record of a message whose handler succeeded.
func processedResult() idem.Result { return idem.Result{Mode: idem.ModeMarker} }

// isProcessed reports whether res is the record of a processed message:
// a marker, now with status 0, before with status 200.
func isProcessed(res idem.Result) bool { return res.Mode == idem.ModeMarker }

// poisonResult is the record of a poison message.
func poisonResult(p poisonRecord, data []byte) idem.Result {
	meta, _ := json.Marshal(p) // ints and strings: never fails
	body := make([]byte, 0, len(poisonMagic)+len(meta)+1+len(data))
	body = append(body, poisonMagic...)
	body = append(body, meta...)
	body = append(body, '\n')
	body = append(body, data...)
	return idem.Result{Mode: idem.ModeResponse, Body: body}
}

// decodePoison returns the poison record and payload res holds, and
// whether it holds one.
func decodePoison(res idem.Result) (poisonRecord, []byte, bool) {
	if res.Mode != idem.ModeResponse {
		return poisonRecord{}, nil, false
	}
	if rest, ok := bytes.CutPrefix(res.Body, []byte(poisonMagic)); ok {
		meta, data, found := bytes.Cut(rest, []byte{'\n'})
		var p poisonRecord
		if !found || json.Unmarshal(meta, &p) != nil {
			// Written by this package, so never malformed; should a store
			// have mangled it, the message stays poison (it is never run
			// again), with the body kept whole for a person to read.
			return poisonRecord{Error: "ideminbox: unreadable poison record", DataSize: len(res.Body)}, res.Body, true
		}
		return p, data, true
	}
	return decodeLegacyPoison(res)
}

// isPoison reports whether res is the record of a poison message.
func isPoison(res idem.Result) bool {
	_, _, ok := decodePoison(res)
	return ok
}

// lastRunResult is the record of the grant of a message's last run.
func lastRunResult(holder int64) idem.Result {
	meta, _ := json.Marshal(lastRunRecord{Holder: holder})
	return idem.Result{Mode: idem.ModeResponse, Body: append(append([]byte(lastRunMagic), meta...), '\n')}
}

// decodeLastRun returns the lease token a last-run record holds.
func decodeLastRun(res idem.Result) (int64, error) {
	if rest, ok := bytes.CutPrefix(res.Body, []byte(lastRunMagic)); ok && res.Mode == idem.ModeResponse {
		var r lastRunRecord
		if err := json.Unmarshal(bytes.TrimSuffix(rest, []byte{'\n'}), &r); err == nil {
			return r.Holder, nil
		}
	}
	if holder, ok := decodeLegacyLastRun(res); ok {
		return holder, nil
	}
	return 0, errors.New("not a last-run record")
}

// Records written before the typed format (up to the first release)
// carried HTTP-shaped codes: status 599 with Ideminbox-* headers for a
// poison message, 598 with the lease token in decimal for a last run.
// They are read still, so that a store written by such a build keeps its
// poison messages (their payload may be the only copy) and its grants
// until Retention purges them; nothing writes them any more.
const (
	legacyStatusPoison  = 599
	legacyStatusLastRun = 598

	legacyHeaderError    = "Ideminbox-Error"
	legacyHeaderAttempt  = "Ideminbox-Attempt"
	legacyHeaderSubject  = "Ideminbox-Subject"
	legacyHeaderDataSize = "Ideminbox-Data-Size"
)

func decodeLegacyPoison(res idem.Result) (poisonRecord, []byte, bool) {
	if res.Status != legacyStatusPoison {
		return poisonRecord{}, nil, false
	}
	p := poisonRecord{DataSize: len(res.Body)}
	first := func(name string) string {
		if v := res.Header[name]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	p.Error = first(legacyHeaderError)
	p.Subject = first(legacyHeaderSubject)
	p.Attempt, _ = strconv.Atoi(first(legacyHeaderAttempt))
	if n, err := strconv.Atoi(first(legacyHeaderDataSize)); err == nil {
		p.DataSize = n
	}
	return p, res.Body, true
}

func decodeLegacyLastRun(res idem.Result) (int64, bool) {
	if res.Status != legacyStatusLastRun {
		return 0, false
	}
	n, err := strconv.ParseInt(string(res.Body), 10, 64)
	return n, err == nil
}

// recordError is the error for a record under the inbox's tenant that is
// none of the above.
func recordError(key string, res idem.Result) error {
	return &idem.StoreError{Op: "get", Err: fmt.Errorf("ideminbox: the record of key %q is not an inbox record (mode %s, %d bytes)", key, res.Mode, len(res.Body))}
}
