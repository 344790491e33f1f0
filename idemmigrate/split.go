package idemmigrate

import "strings"

// splitStatements cuts a SQL script into statements at the semicolons that
// end them, skipping those inside quotes ('…', "…", `…`) and comments
// (-- …, # …, /* … */). MySQL drivers run one statement per call unless the
// DSN opts into multiStatements, which the migrator must not require.
// Statements that hold nothing but comments and blanks are dropped.
func splitStatements(script string) []string {
	var out []string
	start := 0
	flush := func(end int) {
		stmt := strings.TrimSpace(script[start:end])
		if stmt != "" && !onlyComments(stmt) {
			out = append(out, stmt)
		}
	}
	for i := 0; i < len(script); i++ {
		switch c := script[i]; {
		case c == '\'' || c == '"' || c == '`':
			i = skipQuoted(script, i, c)
		case c == '-' && strings.HasPrefix(script[i:], "--"), c == '#':
			i = skipLine(script, i)
		case c == '/' && strings.HasPrefix(script[i:], "/*"):
			if end := strings.Index(script[i+2:], "*/"); end >= 0 {
				i += 2 + end + 1
			} else {
				i = len(script)
			}
		case c == ';':
			flush(i)
			start = i + 1
		}
	}
	flush(len(script))
	return out
}

// skipQuoted returns the index of the quote closing the one at i. A quote
// doubled, or escaped with a backslash (MySQL's default), does not close.
func skipQuoted(s string, i int, quote byte) int {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			if quote != '`' {
				j++
			}
		case quote:
			if j+1 < len(s) && s[j+1] == quote {
				j++
				continue
			}
			return j
		}
	}
	return len(s)
}

func skipLine(s string, i int) int {
	if end := strings.IndexByte(s[i:], '\n'); end >= 0 {
		return i + end
	}
	return len(s)
}

// onlyComments reports whether stmt holds nothing but comments.
func onlyComments(stmt string) bool {
	for i := 0; i < len(stmt); i++ {
		switch c := stmt[i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
		case c == '-' && strings.HasPrefix(stmt[i:], "--"), c == '#':
			i = skipLine(stmt, i)
		case c == '/' && strings.HasPrefix(stmt[i:], "/*"):
			end := strings.Index(stmt[i+2:], "*/")
			if end < 0 {
				return true
			}
			i += 2 + end + 1
		default:
			return false
		}
	}
	return true
}
