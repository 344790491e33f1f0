package idemhttp

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"unsafe"
)

// fingerprintVersion starts every hashed input, so that a future change of
// the layout can never produce the fingerprint of the old one.
const fingerprintVersion = "idemhttp.fingerprint.v1"

// Fingerprint returns the SHA-256 of what r asks for: its method, its path
// (escaped form, so /a%2Fb and /a/b differ), its query in canonical order,
// body, the values of the named request headers, and its media type: the
// type/subtype of its Content-Type, lowercased, without parameters, so
// that the same bytes sent as JSON and as a form differ, while
// "application/json; charset=utf-8" and "Application/JSON" do not. This
// is what the middleware computes, unless Config.IgnoreMediaType is set.
//
// The query is canonical by parameter name, each name and value decoded
// (a=%41 is a=A, as the handler sees it); the values of a repeated
// parameter keep their order (a=1&a=2 is not a=2&a=1, since handlers may
// read them as a list). A query part that the handler's parser drops (one
// that does not decode, or holds a raw ';') never fingerprints like the
// decoded text it resembles. A query of more parameters than the handler's
// parser accepts (10,000: past that url.ParseQuery returns none) is hashed
// as it was sent. Every field is prefixed by its length, so no two
// different requests can hash the same input by moving bytes from one
// field to the next. A header that is absent and one that is present but
// empty differ too. The cost is linear in the size of the request, but
// for the sort of at most 10,000 parameters.
func Fingerprint(r *http.Request, body []byte, headers []string) []byte {
	return fingerprint(make([]byte, 0, sha256.Size), r, body, headers, true, false)
}

// fingerprinter is a reusable hash and buffer: hashing a request costs
// no allocation but the returned sum. The fields are laid out in buf and
// hashed in one Write (the body apart, without a copy), since each Write
// to the hash has a fixed cost.
type fingerprinter struct {
	h      hash.Hash
	buf    []byte
	params []queryParam
}

type queryParam struct {
	name, value string
	mark        int // what kept the part raw: markSemicolon | markRawName | markRawValue
	index       int // the place in the query, which orders a repeated name
}

// The marks of a query part the handler's parser drops (see putQuery).
const (
	markSemicolon = 1 << iota
	markRawName
	markRawValue
)

var fingerprinters = sync.Pool{New: func() any {
	return &fingerprinter{h: sha256.New(), buf: make([]byte, 0, 512)}
}}

// maxPooledFingerprintBuf bounds the buffer kept for reuse: a huge query
// or header must not stay pinned in the pool.
const maxPooledFingerprintBuf = 4 << 10

// maxPooledParams bounds the parameter list kept for reuse, likewise.
const maxPooledParams = 64

// Markers written where a length stands, which no length can be.
const (
	// markRawQuery stands for the query's parameter count when the query
	// is hashed as sent.
	markRawQuery = -1
	// markMediaType starts the media type, after the headers.
	markMediaType = -2
	// markCanonicalJSON stands before the body's length when the body is
	// the canonical form of a JSON body.
	markCanonicalJSON = -3
)

// maxQueryParams is how many parameters url.ParseQuery accepts; past it,
// it returns none, and the handler sees an empty query.
const maxQueryParams = 10000

// fingerprint appends the fingerprint of r to dst. mediaType adds the
// request's media type. canonical says body is the canonical form of a
// JSON body (Config.CanonicalJSON), marked so that it never hashes like
// a body of the same bytes.
func fingerprint(dst []byte, r *http.Request, body []byte, headers []string, mediaType, canonical bool) []byte {
	f := fingerprinters.Get().(*fingerprinter)
	f.h.Reset()

	f.buf = f.buf[:0]
	f.putString(fingerprintVersion)
	f.putString(r.Method)
	f.putString(r.URL.EscapedPath())
	f.putQuery(r.URL.RawQuery)
	if canonical {
		f.putLen(markCanonicalJSON)
	}
	f.putLen(len(body))
	f.h.Write(f.buf)
	f.h.Write(body)

	f.buf = f.buf[:0]
	f.putLen(len(headers))
	for _, name := range headers {
		name = http.CanonicalHeaderKey(name)
		f.putString(name)
		values, ok := r.Header[name]
		if !ok {
			// -1 tells "absent" from "present with no value".
			f.putLen(-1)
			continue
		}
		f.putLen(len(values))
		for _, v := range values {
			f.putString(v)
		}
	}
	if mediaType {
		// After the headers, which end where their count says: a request
		// without a Content-Type hashes as it did before media types
		// counted.
		if values := r.Header["Content-Type"]; len(values) > 0 {
			f.putLen(markMediaType)
			f.putMediaType(values[0])
		}
	}
	f.h.Write(f.buf)
	dst = f.h.Sum(dst)

	if cap(f.buf) > maxPooledFingerprintBuf {
		f.buf = make([]byte, 0, 512)
	}
	fingerprinters.Put(f)
	return dst
}

func (f *fingerprinter) putLen(n int) {
	f.buf = binary.BigEndian.AppendUint64(f.buf, uint64(int64(n)))
}

// directMin is the length from which putString hashes a string where it
// is rather than copy it into buf.
const directMin = 512

func (f *fingerprinter) putString(s string) {
	f.putLen(len(s))
	if len(s) < directMin {
		f.buf = append(f.buf, s...)
		return
	}
	// The same input to the hash, without copying a long string (a query
	// of a megabyte) into a buffer that would then be dropped.
	f.h.Write(f.buf)
	f.buf = f.buf[:0]
	f.h.Write(unsafe.Slice(unsafe.StringData(s), len(s))) // the hash only reads it
}

// putMediaType lays out the type/subtype of a Content-Type value,
// lowercased, without its parameters or surrounding blanks.
func (f *fingerprinter) putMediaType(v string) {
	v, _, _ = strings.Cut(v, ";")
	v = strings.Trim(v, " \t")
	f.putLen(len(v))
	for i := 0; i < len(v); i++ {
		c := v[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		f.buf = append(f.buf, c)
	}
}

// putQuery lays out the parameters sorted by decoded name, each value
// decoded, in their order within a name.
//
// A part that the handler's parser (url.ParseQuery) drops is not the same
// as the decoded text it resembles: a=%zz (undecodable, dropped) is not
// a=%25zz (a = "%zz"), and a=1;b=2 (a raw semicolon, dropped) is not
// a=1%3Bb=2 (a = "1;b=2"). Such a part keeps its raw text and is marked:
// a negative number, which no length can be, written before it. Parts
// without a mark hash as they always have, so the fingerprints of
// ordinary requests stay what earlier versions stored.
func (f *fingerprinter) putQuery(raw string) {
	if strings.Count(raw, "&")+1 > maxQueryParams {
		// The handler's parser refuses it whole: nothing to canonicalize,
		// and sorting a megabyte of parameters would cost more than
		// hashing it.
		f.putLen(markRawQuery)
		f.putString(raw)
		return
	}
	params := f.params[:0]
	// Most queries hold nothing to decode: skip the decoder for them.
	// (Two IndexByte scans run at memory speed; ContainsAny goes byte by
	// byte, slower than hashing the query.)
	encoded := strings.IndexByte(raw, '%') >= 0 || strings.IndexByte(raw, '+') >= 0
	for raw != "" {
		var part string
		part, raw, _ = strings.Cut(raw, "&")
		if part == "" {
			continue
		}
		var mark int
		if strings.IndexByte(part, ';') >= 0 {
			mark |= markSemicolon
		}
		name, value, _ := strings.Cut(part, "=")
		if encoded {
			if n, err := url.QueryUnescape(name); err == nil {
				name = n
			} else {
				mark |= markRawName
			}
			if v, err := url.QueryUnescape(value); err == nil {
				value = v
			} else {
				mark |= markRawValue
			}
		}
		params = append(params, queryParam{name, value, mark, len(params)})
	}
	// By name, then by place: a stable sort's order, at the cost of an
	// unstable one (a stable sort moves elements O(n log² n) times).
	slices.SortFunc(params, func(a, b queryParam) int {
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		return cmp.Compare(a.index, b.index)
	})
	f.putLen(len(params))
	for _, p := range params {
		if p.mark != 0 {
			f.putLen(-1 - p.mark)
		}
		f.putString(p.name)
		f.putString(p.value)
	}
	clear(params) // drop the strings: the pool must not keep the request alive
	f.params = params[:0]
	if cap(params) > maxPooledParams {
		f.params = nil
	}
}
