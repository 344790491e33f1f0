// Package ideminbox gives message consumers exactly-once effects on top of
// at-least-once delivery: the idempotent-consumer (inbox) pattern, on the
// same engine and stores as HTTP idempotency keys.
//
// Brokers deduplicate publishes within a short window (JetStream's
// Nats-Msg-Id, two minutes by default) and do nothing against consumer
// redelivery: a consumer that crashes after its database commit and before
// its acknowledgement gets the message again. The inbox recognises it.
//
// # How a message is processed
//
// Inbox.Process takes the message id as key and the consumer name as
// tenant, and:
//
//  1. claims the key in one atomic store operation;
//  2. runs the handler with a context carrying the store's transaction
//     (idemsql.TxFromContext(ctx), idempg.Tx(ctx)), where it makes its writes;
//  3. commits the dedup record in that same transaction;
//  4. returns a Decision, and only then does the adapter acknowledge.
//
// A duplicate of a processed message is acknowledged without running. A
// message in flight in another instance is negatively acknowledged with a
// delay, never dropped. A handler error rolls the transaction back and
// releases the key, so the redelivery runs again: unlike a deduplicator
// that marks a message seen before its handler runs, a failed message is
// never silently lost.
//
// # Poison messages
//
// When the handler fails on delivery Config.MaxAttempts or later (the
// broker's count: JetStream NumDelivered, RabbitMQ x-delivery-count; an
// in-memory count where the broker keeps none), the message is recorded as
// complete with a poison marker, its payload and its last error, and
// Config.DeadLetterFunc is called inside that transaction. The delivery is
// then acknowledged. Later duplicates are acknowledged without running;
// Inbox.Status shows the record.
//
// # Retention
//
// Consumer keys are kept for Config.Retention (7 days by default), far
// beyond any broker window, and purged like HTTP keys by idem.Janitor.
//
// # Adapters
//
// The core knows no broker. Subpackages turn decisions into broker calls:
// idemjetstream (NATS JetStream: Ack, NakWithDelay, Term) and idemamqp
// (RabbitMQ: Ack, Nack with requeue, Reject).
package ideminbox
