// Package idemcheck tells whether an HTTP endpoint really honours
// Idempotency-Key, from the outside, against any API. It is the library
// behind `idem check URL`.
//
// # The checks
//
// Check runs six checks. Each reports pass, warn, fail or skip with its
// evidence:
//
//  1. Concurrent duplicates: Config.Concurrency identical requests with one
//     fresh key, released at the same instant by one barrier. Exactly one
//     answer may be a fresh success; every other one must be an identical
//     replay (same status, identical body, same result headers) or a 409.
//     Two different successful answers mean the operation ran twice: the
//     check-then-write race. Then the resources are counted: exactly one
//     new one.
//  2. Retry after completion: the same request again once all have
//     answered must get an identical replay.
//  3. Same key, another body: must be refused, 422 as the IETF draft and
//     idemhttp answer; another 4xx is a warning, a success a failure (the
//     worst outcome: an answer that belongs to another request).
//  4. Fresh key: must create a new resource, with an answer that differs
//     from the first key's.
//  5. Resources per key: exactly one new resource for each key.
//  6. Disconnect, then retry: a request with a fresh key whose connection
//     is cut once it is written (Config.DisconnectAfter), then the same
//     request again until an answer other than 409 comes (409s are
//     expected while the first still runs; they are retried for up to
//     Config.InFlightWait), then a count: exactly one new resource. A
//     server that runs the operation again after its client went away
//     fails. When the retry's answer is not a replay, the cut request's
//     execution did not keep its key to the end (after a 409, its key was
//     released while it ran), and its work may still commit after the
//     retry was answered: the count is taken again until it has not
//     changed for Config.Settle, and a second resource fails the check.
//
// Sequential duplicates prove nothing, since the first finishes before the
// second looks; that is why check 1 fires its requests together.
//
// # What a run proves
//
// Answers alone never prove that duplicates ran once: a server may run
// every duplicate and answer them all with the first answer, marked as
// replays, and look perfect. Only a count can tell, through
// Config.CountURL, a GET listing the resources (a JSON array, an object
// with a "data" array, or an X-Total-Count header, which wins where the
// API sends one, since lists are often cut to a page). Checks 1, 5 and 6
// need it. Without it check 1 warns at best, checks 5 and 6 are skipped,
// and the run does not pass: Report.Passed is true only when no check
// failed and one execution per key was counted. Report.Proven and
// Report.NotProven say which claims the run observed and which it could
// not, with what would let it. Main exits 0 when the run passed, 1 when a
// check failed or that was not proven, and 2 when the flags are wrong or
// no request could reach the URL. A server that is reached but hangs,
// closes the connection or answers something malformed fails the checks
// (exit 1).
//
// Bodies are compared by their bytes. Headers are compared too, except
// those that legitimately differ between two answers (Date, Set-Cookie,
// Idempotent-Replayed, request ids, hop-by-hop fields, …); a difference in
// Location, Content-Type or Content-Location is a failure, in another
// header a warning. When the retry of check 2 comes back marked
// Idempotent-Replayed, the server marks its replays, so several unmarked
// successes among check 1's answers are several executions, even when
// their bodies are identical. Check 4 fails a fresh key answered with the
// first key's Location.
//
// # A hostile server
//
// What a report prints comes from the server, which may be hostile. Every
// byte it sent is escaped before it is printed or put in a Report (control
// characters, C1 controls such as U+009B and U+009D, bidi overrides, bytes
// that are not UTF-8 appear as \xNN or \uNNNN), so no answer can move the
// cursor, set a window title or write a line of its own. What is read is
// bounded: 64 KiB of header per answer on the default client (a longer
// header block fails the request), 4 MiB of body, of which the first 64
// KiB are kept to show and compare and the rest only hashed (bodies are
// compared on their first 4 MiB, and the connection of a longer one is
// closed), and 16 MiB of the CountURL list, read as a stream.
//
// # Credentials
//
// The credentials a configuration holds are not printed, in reports,
// JSON or errors alike:
//   - A URL's password is shown as xxxxx, and so is a user name alone
//     (https://TOKEN@host), which is often a token; a user name before a
//     password is shown. A URL that does not parse, or has an @ past its
//     authority, is taken to have user info up to its last @ (a password
//     holding an unencoded / ? # or space looks like that), so an error
//     may hide more than the password of such a URL.
//   - The values of query parameters whose names suggest a credential
//     (access_token, api_key, sig, X-Amz-Signature, password, …) are shown
//     as xxxxx.
//   - Header values are never shown, not even in the error about a
//     malformed -H, which names the header instead; nor are arguments
//     that may be a credential the shell split from a flag's value.
//   - The values of those parameters, of the password, and of headers
//     whose names suggest a credential (Authorization, Cookie, X-Api-Key,
//     …) are replaced by xxxxx wherever they appear, answers that echo
//     them included (values of four characters or more: a shorter one
//     would hide counts and statuses).
//
// The request body is never printed either, but an answer that echoes it
// is shown as the server sent it: keep credentials out of -d.
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
// The checks create real resources on the target: three per run when the
// endpoint is correct, up to Concurrency+2 when it is not. Point them at a
// test environment. Checks 1, 5 and 6 count resources through CountURL
// before and after, so other writers to the same collection during the
// run disturb them; scope CountURL (for example ?cart_id=…) to what the
// request creates. Check 6 sends its cut request on a connection of its
// own, as HTTP/1.1, straight to the host (not through a proxy).
package idemcheck
