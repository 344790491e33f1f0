package idemmigrate

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

//go:embed postgres/*.sql sqlite/*.sql mysql/*.sql
var embedded embed.FS

// Files returns the plain SQL migrations of dialect, named NNNN_name.sql,
// for teams that run their own migration tool (goose, golang-migrate,
// Atlas, Flyway…): apply them in name order. It returns an empty FS for an
// unknown dialect.
func Files(dialect Dialect) fs.FS {
	if dialect.check() != nil {
		return emptyFS{}
	}
	sub, err := fs.Sub(embedded, string(dialect))
	if err != nil {
		// fs.Sub only fails on an invalid path, and the dialect names are
		// valid ones.
		panic(err)
	}
	return sub
}

type emptyFS struct{}

func (emptyFS) Open(name string) (fs.File, error) {
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
}

// migration is one embedded file.
type migration struct {
	version int64
	name    string // file name without ".sql", e.g. "0001_idem_keys"
	sql     string
}

// migrations returns the embedded migrations of dialect in version order.
// It refuses a badly named file or two files with one version, so that such
// a mistake fails the build's tests rather than a deployment.
func migrations(dialect Dialect) ([]migration, error) {
	if err := dialect.check(); err != nil {
		return nil, err
	}
	fsys := Files(dialect)
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	out := make([]migration, 0, len(names))
	seen := map[int64]string{}
	for _, file := range names {
		base := strings.TrimSuffix(path.Base(file), ".sql")
		digits, _, ok := strings.Cut(base, "_")
		if !ok {
			return nil, fmt.Errorf("idemmigrate: %s/%s: want NNNN_name.sql", dialect, file)
		}
		version, err := strconv.ParseInt(digits, 10, 64)
		if err != nil || version <= 0 {
			return nil, fmt.Errorf("idemmigrate: %s/%s: want NNNN_name.sql with NNNN > 0", dialect, file)
		}
		if other, dup := seen[version]; dup {
			return nil, fmt.Errorf("idemmigrate: %s: %s and %s share version %d", dialect, other, file, version)
		}
		seen[version] = file
		body, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: version, name: base, sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}
