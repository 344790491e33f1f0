// Package idemcheck tells whether an HTTP endpoint really honours
// Idempotency-Key, from the outside, against any API. It is the library
// behind `idem check URL`.
//
// # The checks
//
// Check runs the test the seed article ends with, made precise. Each check
// reports pass, warn, fail or skip with its evidence:
//
//  1. Concurrent duplicates: Config.Concurrency identical requests with one
//     fresh key, released at the same instant by one barrier. Exactly one
//     answer may be a fresh success; every other one must be an identical
//     replay (same status, byte-identical body, same result headers) or
//     a 409. Two different successful answers mean the operation ran twice:
//     the check-then-write race.
//  2. Retry after completion: the same request again once all have
//     answered must get an identical replay.
//  3. Same key, another body: must be refused, 422 as the IETF draft and
//     idemhttp answer; another 4xx is a warning, a success a failure (the
//     worst outcome: an answer that belongs to another request).
//  4. Fresh key: must create a new resource, with an answer that differs
//     from the first key's.
//  5. Resources per key (with Config.CountURL, a GET answering a JSON
//     array): exactly one new resource for each key.
//
// Sequential duplicates prove nothing, since the first finishes before the
// second looks; that is why check 1 fires its requests together.
//
// Bodies are compared byte for byte. Headers are compared too, except
// those that legitimately differ between two answers (Date, Set-Cookie,
// Idempotent-Replayed, request ids, hop-by-hop fields, …); a difference in
// Location, Content-Type or Content-Location is a failure, in another
// header a warning.
//
// A warning does not fail the run, but warnings alone prove nothing: Main
// exits 0 when no check failed and at least one passed, 1 otherwise (a
// failure, or nothing proven), and 2 when the flags are wrong or no
// request could reach the URL. A server that is reached but does not
// answer in time fails the checks (exit 1): hanging on concurrent
// duplicates is a bug of its own.
//
// Check 1 judges unmarked successes with check 2's help: when the retry
// comes back marked Idempotent-Replayed, the server marks its replays, so
// several unmarked successes among the duplicates are several executions,
// even when their bodies are identical. Check 4 fails a fresh key answered
// with the first key's Location. With --count-url, an X-Total-Count header
// on the list, where the API sends one, is the count (lists cut to a page
// would otherwise stop growing).
//
// # Load mode
//
// Load sends requests from Concurrency workers for a Duration, each with a
// fresh key (or, with Replay, one key per worker, so that every request
// after a worker's first is a replay), and reports throughput, latency
// percentiles and a latency histogram.
//
// # Side effects
//
// The checks create real resources on the target: two per run when the
// endpoint is correct, up to Concurrency+1 when it is not. Point them at a
// test environment. Check 5 counts resources through CountURL before and
// after, so other writers to the same collection during the run disturb
// it; scope CountURL (for example ?cart_id=…) to what the request creates.
package idemcheck
