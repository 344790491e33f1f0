// Package idemredis is an idem.Store on Redis, through go-redis
// (github.com/redis/go-redis/v9): a single server, Sentinel or Cluster.
//
//	store, err := idemredis.NewStore(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}), nil)
//	engine, err := idem.NewEngine(store, nil)
//
// # What it guarantees
//
// Claim, takeover of an expired lease, the fingerprint check, Extend,
// Release, a recovery point and completion are each one Lua script, so each is one atomic
// step on the server: two processes claiming one key at the same instant
// get one winner, and an execution whose lease was taken over cannot
// complete, because every write is fenced by its lease token. Nothing is
// ever read in Go and then written back.
//
// Lease deadlines and retention are decided by the server's clock (TIME,
// inside the scripts), never by the application servers' clocks.
//
// # What it cannot guarantee
//
// Redis cannot commit the stored result in the same transaction as a
// business row kept in another database. The engine completes the record
// after the handler returns, so the handler's own commit comes first. If
// the process dies between the two, or Redis stays unreachable (or
// refuses writes) for longer than Config.CompleteTimeout then, the key
// stays in flight: retries get 409 until the lease expires, then a retry
// takes the key over and runs the operation again. That is a duplicate,
// the very thing the key was meant to prevent. The window is short, but
// it is there, and the unit of work gives the handler no transaction to
// close it. docs/STORES.md lists every such window.
//
// The safer alternative is to keep the keys in the business database and
// complete the record in the business transaction: idemsql (PostgreSQL,
// MySQL/MariaDB, SQLite) or idempg. Either the business write and the
// stored result both commit, or neither does. Redis fits where the
// operation has no database write of its own to protect (a call to an
// idempotent downstream API, a cache fill), or where that window is
// accepted.
//
//	                                 idemredis                  idemsql / idempg
//	atomic claim                     yes (Lua script)           yes (INSERT … ON CONFLICT)
//	completion in the business tx    no                         yes
//	clock                            Redis TIME                 database now()
//	survives a restart               only with AOF/replication  yes
//	eviction risk                    unless noeviction          none
//	expired records                  TTL deletes them           Janitor purges them
//
// docs/STORES.md compares every store.
//
// # Restarts, flushes, full memory and eviction
//
// A record that Redis loses is forgotten: a FLUSHDB, a restart without
// persistence, a failover to a replica that had not received it, or an
// eviction. Requests after it run again. Executions in flight at that
// moment cannot complete (their record is gone, so the fenced completion
// finds no token and returns idem.ErrLeaseLost, HTTP 409), never a
// silent success; their retries run afresh. To keep records, run Redis
// with appendonly yes and maxmemory-policy noeviction. With appendfsync
// always a restarted Redis replays every answer it acknowledged; with
// everysec it does after a crash of its process while its disk keeps up,
// and may lose the last second or two otherwise (a slow fsync, a crash of
// the machine). Replication helps, but it
// is asynchronous, so a failover can lose the last writes. New logs a
// warning when the policy can evict records: every record has a TTL, so
// volatile-* policies can evict them as well as allkeys-* ones.
//
// A server at its memory limit (noeviction) starts no new work: a claim
// that would write is refused (the engine answers 503, the handler does
// not run), while replays, 409s and 422s are still answered. On Redis 7
// and later the work under way finishes: its lease is still extended, its
// answer stored (memory then exceeds maxmemory by the answers of the
// executions in flight when the server filled up), a release still frees
// its key. Before Redis 7, scripts carry no flags: the extension and the
// completion are refused as well. A recovery point (idem.Step) is refused
// on every version, since steps are as many and as large as handlers make
// them: the handler fails with idem.ErrStepNotSaved, its earlier steps
// stay recorded, and a retry runs the refused step again (pass
// idem.DownstreamKey to the service it calls).
//
// # Recovery points
//
// The store implements idem.StepStore: idem.Step records a step's result
// in the record's steps field (SaveStep, one script fenced by the lease
// token, durable as far as the server's persistence is), and a name
// recorded twice keeps its first value. A release does not delete a
// record that holds steps: it ends its lease, so the next claim with the
// same fingerprint takes it over (ClaimResult.Takeover) and gets the
// steps (ClaimResult.Steps, and idem.Execution in the handler), and the
// steps it recorded are not run again. Such a record lives until its
// retention ends, as any other; another fingerprint is refused meanwhile.
//
// # Waiting for a key
//
// Store.Watch tells a caller when a record may have changed: completed or
// released by any process, its lease ended. The completion and the
// release announce themselves on a pub/sub channel named as the record's
// key; the store keeps one pub/sub connection for all its watchers (one
// per master on a Cluster, where the announcement is sharded, SPUBLISH,
// so it stays on the record's shard) and one subscription per watched
// key, however many watch it. On a Cluster of servers before Redis 7,
// which lack sharded pub/sub, watchers poll instead, every
// Config.WatchPollInterval.
//
// # Key layout
//
// A record is one hash at
//
//	<prefix>:{<length of tenant>:<tenant>:<key>}
//
// with '%', '{' and '}' percent-encoded in tenant and key. The braces are a
// Cluster hash tag, so everything for one (tenant, key) is in one slot; the
// length prefix keeps a tenant holding ':' from colliding with another.
// Its fields (state, token, fingerprint, locked_until, created_at,
// expires_at, steps once a step is recorded, and once complete:
// completed_at, mode, status, header, body, reference, completion_id) read
// plainly with HGETALL, but for steps, which holds idemcodec.MarshalSteps's
// encoding; times are microseconds since the Unix epoch on the server's
// clock. The channel Watch listens on has the record's key for its name,
// so on a Cluster it is in the record's slot.
//
// # Cluster and Sentinel
//
// The store takes a redis.UniversalClient, so a redis.ClusterClient or a
// Sentinel failover client works as a single server's client does. The
// tests start both topologies from the machine's redis-server: a Cluster
// of three masters (the conformance suite, records spread over every
// master, 50 duplicates released at once on keys of each) and a master
// with a replica under a Sentinel (the conformance suite, and a failover:
// the promoted replica, which never loaded the scripts, takes claims
// through the EVAL fallback; a completed key replays there and an
// in-flight key stays fenced, because the writes had reached the replica,
// which the test makes sure of with WAIT). Replication is asynchronous: a
// claim or completion the replica had not received when it was promoted is
// lost with the old master, as after a flush (see below); where that
// matters, keep the keys in the business database.
//
// # Retention and purge
//
// Each record's TTL (PEXPIRE) ends with its retention, or with its lease
// when that ends later (a heartbeat moves both), so Redis deletes expired
// records by itself and Purge always returns 0. The scripts also compare the stored
// expires_at with TIME, so a record past its retention counts as absent
// to the microsecond even before its TTL fires. Get returns
// idem.ErrNotFound for a record that is not there.
//
// # Failures
//
// When Redis cannot be reached, Claim returns the error and the engine
// fails closed: the handler does not run (HTTP 503). The claim is sent
// once, without go-redis's resends, so that its error tells whether it
// may have run: the store marks it idem.ErrNotApplied only when the
// server refused it or never received it whole; otherwise (a lost reply,
// a connection cut after sending) the engine releases the key, fenced by
// the token. A completion, whatever becomes of its caller, resends
// itself, under the same completion id, for up to Config.CompleteTimeout.
// go-redis may resend the other scripts too: each is written so that a
// resent command has the effect of the first one (a resent completion
// still succeeds), while a second call is refused.
package idemredis
