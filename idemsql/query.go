package idemsql

import (
	"fmt"
	"strconv"
	"strings"
)

// query is a statement written once with @name markers and compiled to a
// dialect's placeholders, so that every dialect's SQL reads the same way
// and arguments are passed by name, not by a position that MySQL's
// repeated "?" would make easy to get wrong.
type query struct {
	text  string
	names []string // the argument for each placeholder, in order
}

// placeholderStyle says how a dialect spells parameters.
type placeholderStyle int

const (
	// numbered: $1, $2… A name used twice reuses its number (PostgreSQL;
	// SQLite accepts it too).
	numbered placeholderStyle = iota
	// positional: one "?" per occurrence (MySQL).
	positional
)

// compile replaces each @name in src. Names are lower-case letters and
// underscores; src holds no other "@".
func compile(src string, style placeholderStyle) query {
	var b strings.Builder
	var q query
	index := map[string]int{}
	for i := 0; i < len(src); i++ {
		if src[i] != '@' {
			b.WriteByte(src[i])
			continue
		}
		j := i + 1
		for j < len(src) && (src[j] == '_' || 'a' <= src[j] && src[j] <= 'z') {
			j++
		}
		name := src[i+1 : j]
		if name == "" {
			panic("idemsql: bare @ in query: " + src)
		}
		i = j - 1
		switch style {
		case positional:
			b.WriteByte('?')
			q.names = append(q.names, name)
		case numbered:
			n, ok := index[name]
			if !ok {
				q.names = append(q.names, name)
				n = len(q.names)
				index[name] = n
			}
			b.WriteString("$" + strconv.Itoa(n))
		}
	}
	q.text = b.String()
	return q
}

// args returns the arguments in placeholder order.
func (q query) args(values map[string]any) []any {
	out := make([]any, len(q.names))
	for i, name := range q.names {
		v, ok := values[name]
		if !ok {
			panic(fmt.Sprintf("idemsql: no value for @%s in %s", name, q.text))
		}
		out[i] = v
	}
	return out
}
