package idemredis

import (
	"strconv"
	"strings"
)

// recordKey returns the Redis key of the record for (tenant, key):
//
//	<prefix>:{<len>:<tenant>:<key>}
//
// The braces make the whole identity a Cluster hash tag, so everything
// about one (tenant, key), now or added later, lives in one slot and a
// single script can touch it. The tenant is length-prefixed so that a
// tenant holding ':' cannot collide with another ("a:b"+"c" against
// "a"+"b:c"), and braces (and '%', the escape itself) are percent-encoded
// so that a tenant or key holding '}' cannot end the hash tag early.
func recordKey(prefix, tenant, key string) string {
	t := escape(tenant)
	k := escape(key)
	var b strings.Builder
	b.Grow(len(prefix) + len(t) + len(k) + 8)
	b.WriteString(prefix)
	b.WriteString(":{")
	b.WriteString(strconv.Itoa(len(t)))
	b.WriteByte(':')
	b.WriteString(t)
	b.WriteByte(':')
	b.WriteString(k)
	b.WriteByte('}')
	return b.String()
}

// escape percent-encodes '%', '{' and '}'. It is injective, so distinct
// inputs keep distinct keys.
func escape(s string) string {
	if !strings.ContainsAny(s, "%{}") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%':
			b.WriteString("%25")
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
