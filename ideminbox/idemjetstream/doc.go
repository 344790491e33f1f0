// Package idemjetstream connects ideminbox to NATS JetStream consumers
// (github.com/nats-io/nats.go/jetstream).
//
// The key of a message is its Nats-Msg-Id header, the id publishers set
// for JetStream's own publish deduplication, so a message published twice
// (after the stream's duplicate window, or to two streams) and a message
// redelivered to the consumer are both recognised. A message without the
// header is keyed by its stream and stream sequence, which protects it
// against redelivery only. Config.KeyFunc replaces both.
//
// The delivery number comes from the message metadata (NumDelivered). The
// acknowledgement follows the inbox's decision, sent after the commit:
// Ack for processed, duplicate and poison messages, NakWithDelay for a
// failed or in-flight one, Term for one that cannot be keyed.
//
// Give the JetStream consumer a MaxDeliver of -1 (unlimited), or above both
// the inbox's MaxAttempts and its InFlightDeliveries (deliveries answered
// "in flight" count, and a holder that crashed keeps the key for a whole
// lease), so that the inbox, not the server, decides when a message is
// poison; Consume refuses a consumer that could drop messages first. Its AckWait bounds how long a delivery may stay unacknowledged
// before the server sends it again, to this or another instance; while a
// handler runs, Consume reports the message in progress every third of
// AckWait (Config.ProgressInterval), so that a slow handler keeps its
// message. A copy sent anyway (the process stalled, a report was lost) is
// answered "in flight" by the inbox while the first one runs.
package idemjetstream
