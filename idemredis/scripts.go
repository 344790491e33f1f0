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
// created_at, expires_at, steps once a recovery point is saved, and once
// complete: completed_at, mode, status, header, body, reference,
// completion_id.
//
// A recovery point (SaveStep) is refused on a full server, like a claim,
// whatever the version: its script has no flags and its first write is
// an HSET. Unlike a completion, which adds one answer per execution in
// flight, steps are as many and as large as the handlers make them, so
// letting them through would let a full server grow without bound. The
// handler then fails with idem.ErrStepNotSaved and the step's effect is
// not recorded: its retry runs the step again, which its downstream key
// (idem.DownstreamKey) makes safe.
//
// The completion and the release announce the change on a pub/sub
// channel named as the record's key (PUBLISH, or SPUBLISH on a Cluster,
// where the channel lives in the record's slot); Store.Watch listens
// there (watch.go). The announcement is sent with redis.pcall and its
// failure ignored: a server that does not know SPUBLISH still completes.

// luaPrelude is shared by every script: the server's clock and the number
// formatting.
const luaPrelude = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function int(n) return string.format('%.0f', n) end
local function ms(us) return math.ceil(us / 1000) end
`

// luaNotify announces a change of KEYS[1] to its watchers: cmd is PUBLISH
// or SPUBLISH (the store's choice, see Store.notify), "" for none.
const luaNotify = `
local function notify(cmd, what)
	if cmd and cmd ~= '' then
		redis.pcall(cmd, KEYS[1], what)
	end
end
`

// luaSteps reads the encoding of recorded steps (idemcodec.MarshalSteps: for
// each step, its name and its value, each a uvarint length and its
// bytes).
const luaSteps = `
local function uvarint(s, i)
	local n, mul = 0, 1
	while true do
		local b = string.byte(s, i)
		if not b then
			return nil
		end
		i = i + 1
		if b < 128 then
			return n + b * mul, i
		end
		n = n + (b - 128) * mul
		mul = mul * 128
	end
end
-- recorded reports whether steps holds a step named name. Malformed
-- steps hold none: the store then appends, and reading them reports the
-- damage.
local function recorded(steps, name)
	local i = 1
	while i <= #steps do
		local n, j = uvarint(steps, i)
		if not n then
			return false
		end
		local found = string.sub(steps, j, j + n - 1) == name
		local v, k = uvarint(steps, j + n)
		if not v then
			return false
		end
		if found then
			return true
		end
		i = k + v
	end
	return false
end
`

// claimScript claims KEYS[1]. It is the one script without flags (see
// script): Redis then checks the memory limit at its first write, not
// before it starts, so that a full server still answers the claims that
// write nothing (a replay, a key in flight, another fingerprint) and
// refuses the ones that would write. That first write must therefore be
// a command Redis refuses when it is over maxmemory: HSET is; DEL is not,
// and after a DEL every later write of the script would go through.
//
// A takeover (the record is in flight, its lease ended, the fingerprint
// the same) keeps the record's recovery points and returns them; a record
// past its retention counts as absent, and its steps go with it.
//
// ARGV: tenant, key, fingerprint, token, lease (µs), retention (µs).
// Returns {1} when the claim is won afresh, {1, 1, steps} when it is won
// by a takeover (steps "" when none were recorded), {0, HGETALL} when it
// is lost.
var claimScript = newScript("", luaPrelude+`
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'locked_until', 'expires_at', 'fingerprint')
-- A record past its stored retention counts as absent even if its TTL has
-- not fired yet; the two agree to the millisecond, this makes it exact.
local takeover = false
if cur[1] and (tonumber(cur[4]) or 0) > now then
	if cur[1] == 'in_flight' and cur[2] == ARGV[4] then
		return {1}
	end
	takeover = cur[1] == 'in_flight'
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
if takeover then
	-- The steps of the executions before this one are this one's.
	return {1, 1, redis.call('HGET', KEYS[1], 'steps') or ''}
end
-- A record past its retention is forgotten, steps included.
redis.call('HDEL', KEYS[1], 'steps')
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

// releaseScript deletes KEYS[1] when it is in flight under the token and
// holds no recovery points. One that holds some is kept in flight under
// the same token with its lease ended now, so that the next claim takes
// it over and gets them; its TTL still ends with its retention. A resend
// finds the lease already ended and changes nothing. A late step of the
// released execution is still recorded (SaveStep is fenced by the token,
// not the lease); a takeover changes the token and refuses it.
//
// Before Redis 7 (no flags) a full server refuses the HSET that ends a
// lease, so the key stays held until its lease ends: it is never freed
// without its steps.
//
// ARGV: token, notify command. Returns 1 when deleted, 2 when the lease
// was ended, 0 otherwise.
var releaseScript = newScript(allowOOM, luaPrelude+luaNotify+`
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'steps', 'locked_until')
if cur[1] ~= 'in_flight' or cur[2] ~= ARGV[1] then
	return 0
end
if cur[3] and cur[3] ~= '' then
	if (tonumber(cur[4]) or 0) > now then
		redis.call('HSET', KEYS[1], 'locked_until', int(now))
	end
	notify(ARGV[2], 'released')
	return 2
end
redis.call('DEL', KEYS[1])
notify(ARGV[2], 'released')
return 1
`)

// completeScript stores the result in KEYS[1] when it is in flight under
// the token. The retention is left as it is: it counts from the claim.
//
// ARGV: token, mode, status, header, body, reference, completion id,
// notify command. Returns 1, or 0 when the lease is lost.
var completeScript = newScript(allowOOM, luaPrelude+luaNotify+`
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
notify(ARGV[8], 'complete')
return 1
`)

// saveStepScript appends one recovery point to the record in KEYS[1] when
// it is in flight under the token, unless a step of that name is already
// recorded (the first value stays, and a resend changes nothing). Like
// Complete, it looks neither at the lease nor at the retention: a record
// held under the token is the holder's, and the step's effect happened.
//
// It has no flags: its first write, an HSET, is refused on a full server
// before anything is written (see above).
//
// ARGV: token, name, the step encoded by idemcodec.AppendStep. Returns 1, or 0
// when the lease is lost.
var saveStepScript = newScript("", luaSteps+`
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'steps')
if cur[1] ~= 'in_flight' or cur[2] ~= ARGV[1] then
	return 0
end
local steps = cur[3] or ''
if recorded(steps, ARGV[2]) then
	return 1
end
redis.call('HSET', KEYS[1], 'steps', steps .. ARGV[3])
return 1
`)

// leaseScript tells a watcher how long the record in KEYS[1] stays held:
// the time left (µs) until its lease ends, or -1 when it is not held in
// flight (absent, past its retention, or complete). It writes nothing.
var leaseScript = newScript("", luaPrelude+`
local cur = redis.call('HMGET', KEYS[1], 'state', 'locked_until', 'expires_at')
if cur[1] ~= 'in_flight' or (tonumber(cur[3]) or 0) <= now then
	return -1
end
return math.max(0, (tonumber(cur[2]) or 0) - now)
`)
