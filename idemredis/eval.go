package idemredis

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// allowOOM is the flag of the scripts that run on a server over
// maxmemory (see scripts.go).
const allowOOM = "allow-oom"

// script is one store operation in Lua, in the two forms a server may
// need: with its flags declared on a "#!lua" first line, which Redis 7
// reads, and without, for older servers, which take that line for a
// syntax error. A script without flags has one form only.
type script struct {
	flagged, plain source
}

// source is a script's text and its SHA1 digest, the name EVALSHA knows
// it by.
type source struct {
	text, sha string
}

func newSource(text string) source {
	sum := sha1.Sum([]byte(text))
	return source{text: text, sha: hex.EncodeToString(sum[:])}
}

// newScript returns the script of body with flags ("" for none).
func newScript(flags, body string) *script {
	plain := newSource(body)
	if flags == "" {
		return &script{flagged: plain, plain: plain}
	}
	return &script{flagged: newSource("#!lua flags=" + flags + "\n" + body), plain: plain}
}

// sendOnce is an EVALSHA or EVAL that go-redis must not resend: its
// error is the only attempt's (see Store.Claim).
type sendOnce struct{ *redis.Cmd }

// NoRetry tells go-redis not to resend the command after a failed
// attempt. It still redirects it after MOVED or ASK, which the server
// answers without running it.
func (sendOnce) NoRetry() bool { return true }

// run runs sc on key with args, through the store's client, with
// go-redis's resends.
func (s *Store) run(ctx context.Context, sc *script, key string, args ...any) *redis.Cmd {
	return s.eval(ctx, sc, false, []string{key}, args...)
}

// eval runs sc with keys and args: EVALSHA, then EVAL when the
// server does not have the script (NOSCRIPT). The flagged form is sent
// until a server refuses it as a syntax error (before Redis 7); from then
// on the store sends the plain forms. once sends each command a single
// time, without go-redis's resends.
func (s *Store) eval(ctx context.Context, sc *script, once bool, keys []string, args ...any) *redis.Cmd {
	plain := s.plain.Load() || sc.flagged.sha == sc.plain.sha
	src := sc.flagged
	if plain {
		src = sc.plain
	}
	cmd := s.send(ctx, "evalsha", src.sha, once, keys, args)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd = s.send(ctx, "eval", src.text, once, keys, args)
	}
	if !plain && shebangUnknown(cmd.Err()) {
		s.plain.Store(true)
		return s.eval(ctx, sc, once, keys, args...)
	}
	return cmd
}

func (s *Store) send(ctx context.Context, name, payload string, once bool, keys []string, args []any) *redis.Cmd {
	all := make([]any, 0, 3+len(keys)+len(args))
	all = append(all, name, payload, len(keys))
	for _, k := range keys {
		all = append(all, k)
	}
	all = append(all, args...)
	cmd := redis.NewCmd(ctx, all...)
	cmd.SetFirstKeyPos(3) // the slot of a Cluster is the key's
	if once {
		_ = s.client.Process(ctx, sendOnce{cmd})
	} else {
		_ = s.client.Process(ctx, cmd)
	}
	return cmd
}

// shebangUnknown reports whether err is a server's refusal to compile a
// script that starts with "#!": Redis before 7 reads the whole text as
// Lua ("user_script:1: unexpected symbol near '#'"). The script did not
// run.
func shebangUnknown(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	return strings.Contains(msg, "Error compiling script") && strings.Contains(msg, "near '#'")
}
