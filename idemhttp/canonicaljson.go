package idemhttp

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// JSONPointers is a compiled set of JSON Pointers (RFC 6901): the members
// a JSON fingerprint leaves out. Build it with ParseJSONPointers; the zero
// value and nil leave nothing out.
type JSONPointers struct {
	root ptrNode
}

// ptrNode is one reference token of the pointers: its children by token,
// and whether a pointer ends here.
type ptrNode struct {
	children map[string]*ptrNode
	end      bool
}

// ParseJSONPointers compiles pointers such as "/created_at" or
// "/payment/nonce" (RFC 6901: "~1" stands for "/" and "~0" for "~" within
// a token; a token that is a decimal index without leading zeros also
// names that element of an array). The empty pointer, which names the
// whole document, is refused: leaving it out would fingerprint every
// body alike.
func ParseJSONPointers(pointers ...string) (*JSONPointers, error) {
	p := &JSONPointers{}
	for _, ptr := range pointers {
		if ptr == "" {
			return nil, errors.New(`idemhttp: JSON Pointer "" names the whole body; leaving it out would make every body alike`)
		}
		if ptr[0] != '/' {
			return nil, fmt.Errorf("idemhttp: JSON Pointer %q does not start with /", ptr)
		}
		n := &p.root
		for _, tok := range strings.Split(ptr[1:], "/") {
			dec, err := unescapePointerToken(tok)
			if err != nil {
				return nil, fmt.Errorf("idemhttp: JSON Pointer %q: %w", ptr, err)
			}
			if n.children == nil {
				n.children = make(map[string]*ptrNode)
			}
			c := n.children[dec]
			if c == nil {
				c = &ptrNode{}
				n.children[dec] = c
			}
			n = c
		}
		n.end = true
	}
	return p, nil
}

func unescapePointerToken(tok string) (string, error) {
	if strings.IndexByte(tok, '~') < 0 {
		return tok, nil
	}
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		if tok[i] != '~' {
			b.WriteByte(tok[i])
			continue
		}
		if i+1 >= len(tok) || (tok[i+1] != '0' && tok[i+1] != '1') {
			return "", errors.New(`"~" must be followed by 0 or 1`)
		}
		if tok[i+1] == '0' {
			b.WriteByte('~')
		} else {
			b.WriteByte('/')
		}
		i++
	}
	return b.String(), nil
}

// ErrNotJSON is what AppendCanonicalJSON returns for a body that is not
// one JSON text, or that nests more than 64 levels deep.
var ErrNotJSON = errors.New("idemhttp: the body is not one JSON text")

// maxJSONDepth bounds the nesting AppendCanonicalJSON walks: it recurses
// once per level, and a megabyte of "[" must not exhaust the stack. 64 is
// deeper than the bodies APIs take; a deeper body is treated as not JSON
// (its bytes are fingerprinted).
const maxJSONDepth = 64

// The tags of the canonical form, one before each value.
const (
	tagObject  = 'o'
	tagArray   = 'a'
	tagString  = 's'
	tagWTF8    = 'w' // a string holding a lone surrogate escape
	tagNumber  = 'n'
	tagTrue    = 't'
	tagFalse   = 'f'
	tagNull    = 'z'
	tagLeftOut = 'x' // an array element named by a pointer
	tagDigest  = 'h' // the SHA-256 of a long member name or value
)

// AppendCanonicalJSON appends to dst the canonical form of body, a JSON
// text (RFC 8259), and returns it, or ErrNotJSON. Two bodies have the same
// canonical form when they differ only in the order of object members,
// insignificant whitespace, the escapes that spell a string (`"\u0061"` is
// `"a"`), and in the members leaveOut names; nil leaves nothing out.
//
// Numbers are compared as written: 1, 1.0 and 1e0 are three different
// bodies, since a handler may read them differently (as an integer, a
// decimal of some precision) and the canonical form must never make two
// requests alike that a handler could tell apart. The members of an
// object with a repeated name keep their order among themselves, since
// decoders keep the last (or the first) one. A left-out object member
// counts as absent, whatever its value; a left-out array element counts
// as an element, whatever its value, so that the indexes after it still
// name what they named.
//
// The form is a tagged, length-prefixed encoding meant for hashing, not
// JSON: within an object, a long member name or value stands as its
// SHA-256.
func AppendCanonicalJSON(dst, body []byte, leaveOut *JSONPointers) ([]byte, error) {
	p := jsonParser{in: body}
	var root *ptrNode
	if leaveOut != nil {
		root = &leaveOut.root
	}
	start := len(dst)
	p.skipSpace()
	out, ok := p.value(dst, root, 0)
	if ok {
		p.skipSpace()
		ok = p.pos == len(p.in)
	}
	if !ok {
		return dst[:start], ErrNotJSON
	}
	return out, nil
}

type jsonParser struct {
	in      []byte
	pos     int
	members []member // the members of the objects being read, innermost last
	tmp     []byte   // where out-of-order members are copied aside
}

func (p *jsonParser) skipSpace() {
	for p.pos < len(p.in) {
		switch p.in[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func putCanonLen(dst []byte, n int) []byte {
	return binary.AppendUvarint(dst, uint64(n))
}

// child is the pointer node under tok, nil when no pointer goes there.
func (n *ptrNode) child(tok []byte) *ptrNode {
	if n == nil || n.children == nil {
		return nil
	}
	return n.children[string(tok)] // no allocation: a map index
}

// value appends the canonical form of the value at p.pos. ptr is the
// pointer node of this value's place, nil when no pointer reaches below.
func (p *jsonParser) value(dst []byte, ptr *ptrNode, depth int) ([]byte, bool) {
	if p.pos >= len(p.in) || depth > maxJSONDepth {
		return dst, false
	}
	switch c := p.in[p.pos]; {
	case c == '{':
		return p.object(dst, ptr, depth)
	case c == '[':
		return p.array(dst, ptr, depth)
	case c == '"':
		return p.str(dst)
	case c == 't':
		return p.literal(dst, "true", tagTrue)
	case c == 'f':
		return p.literal(dst, "false", tagFalse)
	case c == 'n':
		return p.literal(dst, "null", tagNull)
	case c == '-' || ('0' <= c && c <= '9'):
		return p.number(dst)
	}
	return dst, false
}

func (p *jsonParser) literal(dst []byte, word string, tag byte) ([]byte, bool) {
	if len(p.in)-p.pos < len(word) || string(p.in[p.pos:p.pos+len(word)]) != word {
		return dst, false
	}
	p.pos += len(word)
	return append(dst, tag), true
}

// number checks the RFC 8259 grammar and appends the number as written.
func (p *jsonParser) number(dst []byte) ([]byte, bool) {
	start := p.pos
	in := p.in
	i := p.pos
	if i < len(in) && in[i] == '-' {
		i++
	}
	switch {
	case i < len(in) && in[i] == '0':
		i++
	case i < len(in) && '1' <= in[i] && in[i] <= '9':
		for i < len(in) && '0' <= in[i] && in[i] <= '9' {
			i++
		}
	default:
		return dst, false
	}
	if i < len(in) && in[i] == '.' {
		i++
		d := i
		for i < len(in) && '0' <= in[i] && in[i] <= '9' {
			i++
		}
		if i == d {
			return dst, false
		}
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			i++
		}
		d := i
		for i < len(in) && '0' <= in[i] && in[i] <= '9' {
			i++
		}
		if i == d {
			return dst, false
		}
	}
	p.pos = i
	dst = append(dst, tagNumber)
	dst = putCanonLen(dst, i-start)
	return append(dst, in[start:i]...), true
}

// str appends the decoded string at p.pos, length first. Bytes that are
// not UTF-8 and lone surrogates are kept as they are (a lone surrogate
// escape as its WTF-8 bytes), never replaced by U+FFFD: the canonical
// form may tell apart what a decoder would merge, never the reverse.
//
// A string holding a lone surrogate escape gets its own tag: its WTF-8
// bytes could otherwise be the same as raw bytes (not UTF-8) of another
// string, which a decoder reads differently.
func (p *jsonParser) str(dst []byte) ([]byte, bool) {
	s, lone, ok := p.decodeString()
	if !ok {
		return dst, false
	}
	return appendCanonString(dst, s, lone), true
}

func appendCanonString[T string | []byte](dst []byte, s T, lone bool) []byte {
	if lone {
		dst = append(dst, tagWTF8)
	} else {
		dst = append(dst, tagString)
	}
	dst = putCanonLen(dst, len(s))
	return append(dst, s...)
}

// decodeString decodes the string at p.pos (its opening quote), and says
// whether it held a lone surrogate escape. The result aliases the input
// when the string holds no escape.
func (p *jsonParser) decodeString() (s []byte, lone, ok bool) {
	in := p.in
	i := p.pos + 1
	start := i
	var b []byte // nil until the first escape
	for {
		if i >= len(in) {
			return nil, false, false
		}
		c := in[i]
		switch {
		case c == '"':
			p.pos = i + 1
			if b == nil {
				return in[start:i], false, true
			}
			return append(b, in[start:i]...), lone, true
		case c < 0x20:
			return nil, false, false
		case c != '\\':
			i++
			continue
		}
		// An escape.
		if b == nil {
			b = make([]byte, 0, i-start+16)
		}
		b = append(b, in[start:i]...)
		if i+1 >= len(in) {
			return nil, false, false
		}
		switch e := in[i+1]; e {
		case '"', '\\', '/':
			b = append(b, e)
			i += 2
		case 'b':
			b, i = append(b, '\b'), i+2
		case 'f':
			b, i = append(b, '\f'), i+2
		case 'n':
			b, i = append(b, '\n'), i+2
		case 'r':
			b, i = append(b, '\r'), i+2
		case 't':
			b, i = append(b, '\t'), i+2
		case 'u':
			r, ok := hex4(in, i+2)
			if !ok {
				return nil, false, false
			}
			i += 6
			if utf16.IsSurrogate(r) && r < 0xdc00 {
				// A high surrogate: paired with the low one that follows,
				// if any.
				if r2, ok := hex4(in, i+2); ok && i+1 < len(in) && in[i] == '\\' && in[i+1] == 'u' {
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						b = utf8.AppendRune(b, dec)
						i += 6
						break
					}
				}
			}
			if utf16.IsSurrogate(r) {
				// Lone: its WTF-8 bytes, which utf8.AppendRune would turn
				// into U+FFFD, merging it with an escaped U+FFFD.
				b = append(b, 0xe0|byte(r>>12), 0x80|byte(r>>6)&0x3f, 0x80|byte(r)&0x3f)
				lone = true
				break
			}
			b = utf8.AppendRune(b, r)
		default:
			return nil, false, false
		}
		start = i
	}
}

func hex4(in []byte, at int) (rune, bool) {
	if at+4 > len(in) {
		return 0, false
	}
	var r rune
	for _, c := range in[at : at+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// maxInlineMember is the longest canonical form of a member's name or
// value kept as it is within its object; a longer one stands as its
// digest.
const maxInlineMember = 64

// appendDigest appends the digest that stands for a member's name or
// value of canonical form c. c may alias dst's spare capacity: it is
// hashed before anything is written.
func appendDigest(dst, c []byte) []byte {
	sum := sha256.Sum256(c)
	dst = append(dst, tagDigest)
	return append(dst, sum[:]...)
}

// member is an object member while its object is canonicalized: its
// decoded name and the span of dst that holds its canonical form (name
// and value).
type member struct {
	name       []byte // aliases the body, or the decoded copy
	lone       bool
	start, end int
}

func compareMembers(a, b member) int {
	if c := bytes.Compare(a.name, b.name); c != 0 {
		return c
	}
	switch {
	case a.lone == b.lone:
		return 0
	case a.lone:
		return 1
	}
	return -1
}

// object appends the canonical form of the object at p.pos: its tag, its
// members in the order of their names, and an end tag no member starts
// with (a member starts with its name's string tag).
//
// The members are laid out in dst as they come; when they are out of
// order, their span is copied aside once and written back sorted. A name
// or a value whose canonical form is longer than maxInlineMember stands
// as its SHA-256 instead, so that what an object holds, and copies to
// sort it, is a few dozen bytes per member, however large and deep its
// values: every byte of the body is copied and hashed a bounded number
// of times (BenchmarkCanonicalJSONDeep), with one scratch buffer and one
// member list shared by every level.
func (p *jsonParser) object(dst []byte, ptr *ptrNode, depth int) ([]byte, bool) {
	p.pos++ // {
	dst = append(dst, tagObject)
	base := len(p.members)
	defer func() { p.members = p.members[:base] }()
	sorted := true
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		return append(dst, '}'), true
	}
	for {
		if p.pos >= len(p.in) || p.in[p.pos] != '"' {
			return dst, false
		}
		name, lone, ok := p.decodeString()
		if !ok {
			return dst, false
		}
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != ':' {
			return dst, false
		}
		p.pos++
		p.skipSpace()
		var c *ptrNode
		if !lone {
			c = ptr.child(name)
		}
		start := len(dst)
		dst = appendCanonString(dst, name, lone)
		if len(dst)-start > maxInlineMember {
			dst = appendDigest(dst[:start], dst[start:])
		}
		valueStart := len(dst)
		dst, ok = p.value(dst, c, depth+1)
		if !ok {
			return dst, false
		}
		if len(dst)-valueStart > maxInlineMember {
			dst = appendDigest(dst[:valueStart], dst[valueStart:])
		}
		if c != nil && c.end {
			dst = dst[:start] // left out: absent, whatever it was
		} else {
			m := member{name, lone, start, len(dst)}
			if n := len(p.members); n > base && compareMembers(p.members[n-1], m) > 0 {
				sorted = false
			}
			p.members = append(p.members, m)
		}
		p.skipSpace()
		if p.pos >= len(p.in) {
			return dst, false
		}
		if p.in[p.pos] == '}' {
			p.pos++
			break
		}
		if p.in[p.pos] != ',' {
			return dst, false
		}
		p.pos++
		p.skipSpace()
	}
	if !sorted {
		members := p.members[base:]
		from := members[0].start
		p.tmp = append(p.tmp[:0], dst[from:]...)
		// Stable: members of one name keep their order.
		slices.SortStableFunc(members, compareMembers)
		out := dst[:from]
		for _, m := range members {
			out = append(out, p.tmp[m.start-from:m.end-from]...)
		}
		dst = out
	}
	return append(dst, '}'), true
}

func (p *jsonParser) array(dst []byte, ptr *ptrNode, depth int) ([]byte, bool) {
	p.pos++ // [
	dst = append(dst, tagArray)
	// The count is unknown until the end: elements are separated by the
	// tags themselves, and the array ends with a tag no value starts with.
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		return append(dst, ']'), true
	}
	for i := 0; ; i++ {
		var c *ptrNode
		if ptr != nil && ptr.children != nil {
			c = ptr.children[strconv.Itoa(i)]
		}
		start := len(dst)
		var ok bool
		dst, ok = p.value(dst, c, depth+1)
		if !ok {
			return dst, false
		}
		if c != nil && c.end {
			dst = append(dst[:start], tagLeftOut)
		}
		p.skipSpace()
		if p.pos >= len(p.in) {
			return dst, false
		}
		if p.in[p.pos] == ']' {
			p.pos++
			return append(dst, ']'), true
		}
		if p.in[p.pos] != ',' {
			return dst, false
		}
		p.pos++
		p.skipSpace()
	}
}
