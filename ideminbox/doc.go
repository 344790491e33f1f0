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
// Inbox.Process takes the message id as key and Tenant(consumer) as
// tenant, and:
//
//  1. claims the key in one atomic store operation;
//  2. runs the handler with a context carrying the store's transaction
//     (idemsql.TxFromContext(ctx), idempg.TxFromContext(ctx)), where it makes its writes;
//  3. commits the dedup record in that same transaction;
//  4. returns a Decision, and only then does the adapter acknowledge.
//
// A duplicate of a processed message is acknowledged without running. A
// handler error rolls the transaction back and releases the key, so the
// redelivery runs again: unlike a deduplicator that marks a message seen
// before its handler runs, a failed message is never silently lost.
//
// # Holding instead of giving back
//
// Brokers count deliveries, and drop a message past a limit (JetStream's
// MaxDeliver, a quorum queue's delivery-limit). So the inbox gives a
// message back (Nack) only when its handler failed. When the store is
// unreachable, or another execution holds the key, it answers Hold: the
// adapters keep the delivery (reported in progress on JetStream,
// unsettled on RabbitMQ), take no new message while the store is down
// (Inbox.AwaitStore), and process the same delivery again. A store
// outage, however long, then spends none of a message's deliveries, and a
// message in flight elsewhere waits without being counted.
//
// # Poison messages
//
// When the handler fails on attempt Config.MaxAttempts or later, the
// message is recorded as complete with a poison marker, its payload (up to
// Config.MaxPoisonData bytes) and its last error, and Config.DeadLetterFunc
// is called inside that transaction. The delivery is then acknowledged.
// Later duplicates are acknowledged without running; Inbox.Status shows
// the record.
//
// A failure is what the handler did: an error, a panic, or a success it
// answered after a failed statement had aborted its transaction
// (idem.ErrWritesAborted: its writes are lost, so nothing is stored). A
// handler whose transaction the database keeps ending under it (the
// store answers, yet refuses what the handler did, more than three times
// in a row on one delivery) fails too.
//
// Attempts are the broker's delivery numbers (JetStream NumDelivered,
// RabbitMQ x-delivery-count; an in-memory count where the broker keeps
// none), less the deliveries this process knows ended without the handler
// failing. A store failure never counts, even when it made the handler
// fail: after a handler error the inbox checks the store, and holds the
// delivery if the store does not answer.
//
// A delivery nobody answered counts, so that a message that kills its
// consumer every time ends as poison too. The store cannot tell a claim
// whose consumer crashed on the message from one whose handler succeeded
// and whose consumer stopped while the store was down, before the outcome
// could be stored; the second must not make the message poison. So the
// first delivery past MaxAttempts that finds the key still held grants
// the message one last run, recorded in the store: it runs once that
// claim's lease has ended. If that last run does not answer either, the
// next delivery finds the key held by the last run's claim, and records
// the message as poison without running it again, with ErrUnanswered. A
// crash loop so ends after MaxAttempts+1 crashes, on delivery
// MaxAttempts+2.
//
// # What the count cannot tell
//
// A delivery given back without running is counted by the broker all the
// same, and the inbox can take it off only within the process that gave
// it back. That happens when a consumer stops while it holds messages
// (they are given back; RabbitMQ also returns the unacknowledged
// deliveries of a closed channel and counts each), when a process dies,
// and when a held message outlives the broker's patience (a JetStream
// AckWait missed because progress reports stopped; RabbitMQ's
// consumer_timeout, 30 minutes by default, closes the channel). Each such
// event costs one delivery to the messages then held. A broker that
// drops a message past a delivery limit would then drop messages the
// inbox never processed nor recorded as poison: set the limit (JetStream
// MaxDeliver, a quorum queue's x-delivery-limit) to unlimited, or at
// least Inbox.MinDeliveryLimit (MaxAttempts, 2 to end a crash loop, and
// GivenBackMargin for deliveries given back); idemjetstream's Check
// refuses less, and idemamqp's CheckQueueArgs checks a queue's arguments.
// A message given back so often that it comes back past MaxAttempts runs
// once more when its key is free; if it fails then, it is poison at once.
//
// On a store without transactions (idemredis, idemmem), a handler's
// effects cannot be undone: when the store fails after the handler ran
// (its answer could not be stored), or the handler panicked, the key is
// not released but stays held until its lease ends (idem.Config.Lease);
// the message is held meanwhile, and runs a second time after it. With a
// store that has transactions (idemsql, idempg) the handler's writes
// roll back and there is no such window.
//
// # Tenants
//
// Consumer records live under Tenant(consumer): a control character, then
// "inbox:", then the consumer name. HTTP keys and consumer keys may share
// an engine and a store (NewInbox takes the engine): no HTTP tenant can be spelled
// that way, so a request can never claim, replay or block a message's
// key, whatever names either side uses.
//
// # Retention
//
// Consumer keys are kept for Config.Retention (7 days by default), far
// beyond any broker window, and purged like HTTP keys by idemjanitor.Janitor.
//
// # Tracing
//
// Config.Tracer (a MessageTracer) sees every message Process handles and
// the Action it answered; idemprom's Collector and idemotel's Tracer
// implement it. The inbox's operations and store calls go to its engine's
// tracer (idem.Config.Tracer): give a tracer that implements both to
// both.
//
// # Adapters
//
// The core knows no broker. Subpackages turn decisions into broker calls:
// idemjetstream (NATS JetStream: Ack, NakWithDelay, InProgress while
// held, Term) and idemamqp (RabbitMQ: Ack, Nack with requeue, Reject).
// Both run the same delivery loop, Loop: an adapter implements Delivery
// (the message, and Ack, Nak, Term, InProgress) for its broker's message,
// says in LoopConfig whether its broker delays a redelivery and reports
// progress, and calls Loop.Handle or Loop.Consume. The repository's
// broker-adapter suite runs against each adapter on its real broker:
// copies delivered at once take effect once, a failed handler's message
// runs again, a message that keeps failing ends as poison, and a killed
// consumer's message is redelivered without a second effect.
package ideminbox
