// Package idemjetstream connects ideminbox to NATS JetStream consumers
// (github.com/nats-io/nats.go/jetstream).
//
// The key of a message is its Nats-Msg-Id header, the id publishers set
// for JetStream's own publish deduplication, so a message published twice
// (after the stream's duplicate window, or to two streams) and a message
// redelivered to the consumer are both recognised. A message without the
// header is keyed by its stream, its stream sequence and the time the
// server stored it: that protects it against redelivery only, and keeps
// apart the messages of a stream created again (whose sequences start
// from 1 again). Config.KeyFunc replaces both.
//
// The delivery number comes from the message metadata (NumDelivered). The
// acknowledgement follows the inbox's decision, sent after the commit:
// Ack for processed, duplicate and poison messages, NakWithDelay for a
// failed one, Term for one that cannot be keyed; a held message is
// reported in progress until it is processed again.
//
// # The JetStream consumer
//
// Check (which Consume runs) refuses a consumer the inbox cannot work
// over: its ack policy must be explicit (AckAll would acknowledge a failed
// message along with a later one, AckNone never redelivers: either loses
// failed messages), and its MaxDeliver must be -1 (unlimited, the
// advice) or at least the inbox's MinDeliveryLimit (MaxAttempts + 12 for
// the deliveries that end a crash loop and those a consumer gives back
// without running when it stops, crashes or misses AckWait while the
// store is down), so that the inbox, not the server, decides what
// becomes of every message: past MaxDeliver the server stops delivering
// a message, which is then neither processed nor recorded as poison.
// Handle refuses the messages of a consumer Check has not accepted.
//
// Consume pulls one message at a time, when it can process it, so that no
// message waits in a client buffer while its AckWait runs out behind a
// slow handler. Every message it holds (its handler running, waiting for
// the store to come back, waiting for another instance to finish it, or
// fetched and waiting its turn) is reported in progress every third of
// AckWait (Config.ProgressInterval), so that the server neither sends it
// to another instance nor counts it again. A copy sent anyway (the
// process stalled, a report was lost) is held by the inbox while the
// first one runs, then acknowledged as a duplicate.
package idemjetstream
