package idemredis

// The Lua scripts below are the store. Each store operation is exactly one
// script, so Redis runs it as one atomic step: no other client's command
// interleaves between the read and the write, which is what makes the
// claim a claim and the fencing a fence. They are sent with EVALSHA,
// falling back to EVAL when the server answers NOSCRIPT (after a restart
// or SCRIPT FLUSH); eval.go says how.
//
// Every script reads the clock with TIME, on the server: leases and
// retention are decided by one clock whatever the application servers
// think the time is. Redis replicates scripts by their effects (the
// HSET/PEXPIRE they issue; the default since Redis 5, the only way since
// Redis 7), so a non-deterministic TIME is allowed and replicas and the
// AOF receive the resulting values.
//
// A server over maxmemory (with noeviction, the policy New asks for)
// refuses new work and lets the work under way finish: the claim is
// refused before it writes anything, so no handler starts, while an
// extension, a completion and a release still run (flag allow-oom, Redis
// 7 and later), so that a handler already running keeps its lease and its
// answer is stored rather than run a second time once memory is freed.
// What they add beyond the limit is bounded by the executions in flight
// when the server filled up: a completion adds the stored answer, an
// extension rewrites fields of the same size, a release frees memory.
// Before Redis 7 scripts carry no flags, and the server refuses a
// script's first write that may grow memory: the claim, the extension
// and the completion are refused there, the release runs.
//
// Times are stored as microseconds since the Unix epoch, formatted with
// %.0f because Lua's tostring would round them (it prints 14 significant
// digits).
//
// Each script is also safe to run twice with the same arguments: go-redis
// resends a command whose reply was lost (a read timeout, a broken
// connection), and the first run may have happened. Extend and Release
// are idempotent as they are. A resent Complete finds the record complete
// under its token with its own completion id, a random number drawn for
// each Complete call, and reports success; a second Complete call
// (another id) gets ErrLeaseLost, as idem.UnitOfWork requires. The claim
// is sent without resends (see Store.Claim), but a second run would find
// the record in flight under its own token, which no other execution
// holds (tokens are fresh per execution), and report the claim won.
//
// Record fields: tenant, key, fingerprint, state, token, locked_until,
// created_at, expires_at, and once complete: completed_at, mode, status,
// header, body, reference, completion_id.

// luaPrelude is shared by every script: the server's clock and the number
// formatting.
const luaPrelude = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function int(n) return string.format('%.0f', n) end
local function ms(us) return math.ceil(us / 1000) end
`

// claimScript claims KEYS[1]. It is the one script without flags (see
// script): Redis then checks the memory limit at its first write, not
// before it starts, so that a full server still answers the claims that
// write nothing (a replay, a key in flight, another fingerprint) and
// refuses the ones that would write. That first write must therefore be
// a command Redis refuses when it is over maxmemory: HSET is; DEL is not,
// and after a DEL every later write of the script would go through.
//
// ARGV: tenant, key, fingerprint, token, lease (µs), retention (µs).
// Returns {1} when the claim is won, {0, HGETALL} when it is lost.
var claimScript = newScript("", luaPrelude+`
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'locked_until', 'expires_at', 'fingerprint')
-- A record past its stored retention counts as absent even if its TTL has
-- not fired yet; the two agree to the millisecond, this makes it exact.
if cur[1] and (tonumber(cur[4]) or 0) > now then
	if cur[1] == 'in_flight' and cur[2] == ARGV[4] then
		return {1}
	end
	local takeover = cur[1] == 'in_flight'
		and (tonumber(cur[3]) or 0) <= now
		and (cur[5] or '') == ARGV[3]
	if not takeover then
		return {0, redis.call('HGETALL', KEYS[1])}
	end
end
-- A fresh record. HSET comes first: see above.
local lease_end = now + tonumber(ARGV[5])
local expires = now + tonumber(ARGV[6])
redis.call('HSET', KEYS[1],
	'tenant', ARGV[1], 'key', ARGV[2], 'fingerprint', ARGV[3],
	'state', 'in_flight', 'token', ARGV[4],
	'locked_until', int(lease_end),
	'created_at', int(now), 'expires_at', int(expires))
-- Nothing of a taken-over or expired record (a completed_at, a body)
-- survives into the fresh one.
redis.call('HDEL', KEYS[1], 'completed_at', 'mode', 'status', 'header', 'body', 'reference', 'completion_id')
-- The key lives until the later of retention and lease: a retention
-- shorter than the lease makes the key count as absent (expires_at above),
-- but Redis must not delete a record a live handler still holds.
redis.call('PEXPIRE', KEYS[1], ms(math.max(expires, lease_end) - now))
return {1}
`)

// extendScript moves the lease of KEYS[1] to now+lease when it is held
// under the token, and the retention (and the TTL) to at least the end of
// the lease. Like Complete, it does not look at the retention: a record
// held under the token is the holder's, and one that another execution
// claimed after its retention holds another token.
//
// ARGV: token, lease (µs). Returns 1, or 0 when the lease is lost.
var extendScript = newScript(allowOOM, luaPrelude+`
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'expires_at')
if cur[1] ~= 'in_flight' or cur[2] ~= ARGV[1] then
	return 0
end
local lease_end = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'locked_until', int(lease_end))
if (tonumber(cur[3]) or 0) < lease_end then
	redis.call('HSET', KEYS[1], 'expires_at', int(lease_end))
	redis.call('PEXPIRE', KEYS[1], ms(lease_end - now))
end
return 1
`)

// releaseScript deletes KEYS[1] when it is in flight under the token.
//
// ARGV: token. Returns 1 when deleted, 0 otherwise.
var releaseScript = newScript(allowOOM, `
local cur = redis.call('HMGET', KEYS[1], 'state', 'token')
if cur[1] == 'in_flight' and cur[2] == ARGV[1] then
	redis.call('DEL', KEYS[1])
	return 1
end
return 0
`)

// completeScript stores the result in KEYS[1] when it is in flight under
// the token. The retention is left as it is: it counts from the claim.
//
// ARGV: token, mode, status, header, body, reference, completion id.
// Returns 1, or 0 when the lease is lost.
var completeScript = newScript(allowOOM, luaPrelude+`
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'completion_id')
if cur[2] ~= ARGV[1] then
	return 0
end
if cur[1] == 'complete' and cur[3] == ARGV[7] then
	return 1
end
if cur[1] ~= 'in_flight' then
	return 0
end
redis.call('HSET', KEYS[1],
	'state', 'complete', 'completed_at', int(now),
	'mode', ARGV[2], 'status', ARGV[3], 'header', ARGV[4],
	'body', ARGV[5], 'reference', ARGV[6], 'completion_id', ARGV[7])
return 1
`)
